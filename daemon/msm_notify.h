/* msm_notify: systemd readiness protocol (libsystemd's sd_notify), a no-op without NOTIFY_SOCKET.
 *
 * Sequence: STATUS= while loading (with EXTEND_TIMEOUT_USEC= every few seconds during long loads,
 * from a helper thread), READY=1 once the model is resident and the sockets listen, WATCHDOG=1 at
 * half of WatchdogSec while the scheduler is healthy, STOPPING=1 on SIGTERM. */
#ifndef MSM_NOTIFY_H
#define MSM_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>

void msm_notify_status(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void msm_notify_ready(const char *status);
void msm_notify_stopping(const char *status);
void msm_notify_watchdog(void);
void msm_notify_extend_timeout(uint64_t usec);
/* The watchdog interval systemd asked for (0 = none). */
uint64_t msm_notify_watchdog_usec(void);

/* Sends EXTEND_TIMEOUT_USEC + STATUS every `period_s` seconds from a helper thread while a long
 * operation (the model load) runs on the caller's thread. */
typedef struct msm_notify_loading msm_notify_loading;
int msm_notify_loading_start(const char *what, int period_s, msm_notify_loading **ret);
/* Appends `progress` ("45%  12.3 of 27.0 GB ...") to the status and sends it now; the periodic
 * updates repeat it. Thread-safe; l may be NULL (then only STATUS= is sent). */
void msm_notify_loading_progress(msm_notify_loading *l, const char *progress);
void msm_notify_loading_stop(msm_notify_loading *l);

#endif

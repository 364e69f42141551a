/* msm_log: the daemon's one logging layer. Lines go to stderr (the journal under systemd, with
 * sd-daemon "<N>" priority prefixes when JOURNAL_STREAM is set) or to log.file, which SIGHUP
 * reopens (logrotate). Thread-safe. */
#ifndef MSM_LOG_H
#define MSM_LOG_H

#include "msm_config.h"

/* path NULL or "" = stderr. Returns 0 or a negative errno (then logging stays on stderr). */
int msm_log_open(const char *path, msm_log_level level);
int msm_log_reopen(void);
void msm_log_close(void);
void msm_log(msm_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define msm_log_error(...) msm_log(MSM_LOG_ERROR, __VA_ARGS__)
#define msm_log_warn(...) msm_log(MSM_LOG_WARN, __VA_ARGS__)
#define msm_log_info(...) msm_log(MSM_LOG_INFO, __VA_ARGS__)
#define msm_log_debug(...) msm_log(MSM_LOG_DEBUG, __VA_ARGS__)

#endif

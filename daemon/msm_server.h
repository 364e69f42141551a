/* msm_server: the libuv side of msmoed. The loop thread owns every socket and handle: the Unix
 * and TCP listeners, the client connections (framing via msm_frame, decoding and validation via
 * msm_api), the optional HTTP /metrics listener, signals and timers. Requests go to the scheduler
 * through msm_sched_submit; the scheduler's events come back through msm_server_emit (a queue +
 * uv_async_send), whose callback drains the whole queue into streamed ServerFrames. */
#ifndef MSM_SERVER_H
#define MSM_SERVER_H

#include <uv.h>

#include "msm_api.h"
#include "msm_config.h"
#include "msm_sched.h"

typedef struct msm_server msm_server;

int msm_server_new(uv_loop_t *loop, const msm_config *cfg, const msm_api_limits *limits,
                   const msm_api_model_info *info, msm_server **ret, msm_err *err);
/* Handles must be closed first (msm_server_run returns only after that). Accepts NULL. */
void msm_server_free(msm_server *s);

/* The scheduler the server submits to (created with msm_server_emit / the server as its emit). */
void msm_server_set_sched(msm_server *s, msm_sched *sched);
/* msm_sched_emit_fn: thread-safe; queues ev and wakes the loop. */
void msm_server_emit(void *server, msm_sched_event *ev);

/* Binds and listens on every configured socket. Errors name the address. */
int msm_server_listen(msm_server *s, msm_err *err);

/* Starts the graceful shutdown (what SIGTERM does): stop accepting, drain in-flight requests
 * within scheduler.drain_timeout_s, then cancel the rest, stop the scheduler, close everything;
 * uv_run then returns. */
void msm_server_shutdown(msm_server *s);

/* Installs SIGTERM/SIGINT (shutdown), SIGHUP (log reopen) handlers and the systemd watchdog timer. */
int msm_server_install_signals(msm_server *s, msm_err *err);

#endif

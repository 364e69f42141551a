/* msm_server: the libuv side of msmoed. The loop thread owns every socket and handle: the Unix
 * and TCP listeners, the client connections (framing via msm_frame, decoding and validation via
 * msm_api), the HTTP listeners (msm_http: the OpenAI API and the metrics port), signals and timers. Requests go to the scheduler
 * of one TP group through msm_sched_submit; the schedulers' events come back through
 * msm_server_emit (a queue + uv_async_send), whose callback drains the whole queue into streamed
 * ServerFrames. */
#ifndef MSM_SERVER_H
#define MSM_SERVER_H

#include <uv.h>

#include "msm_api.h"
#include "msm_config.h"
#include "msm_sched.h"

typedef struct msm_server msm_server;

/* n_groups: the TP groups (one scheduler each) requests are spread over. info->tp_groups should
 * say the same. */
int msm_server_new(uv_loop_t *loop, const msm_config *cfg, const msm_api_limits *limits,
                   const msm_api_model_info *info, int n_groups, msm_server **ret, msm_err *err);
/* Handles must be closed first (msm_server_run returns only after that). Accepts NULL. */
void msm_server_free(msm_server *s);

/* Group g's emit context: create its scheduler with msm_server_emit and this context, then hand
 * the scheduler over with msm_server_set_sched. Every group needs one before listening. */
void *msm_server_group_ctx(msm_server *s, int g);
void msm_server_set_sched(msm_server *s, int g, msm_sched *sched);
/* msm_sched_emit_fn (ctx: a group context): thread-safe; marks ev with its group, queues it and
 * wakes the loop. */
void msm_server_emit(void *group_ctx, msm_sched_event *ev);

/* Spreading: a new Generate goes to msm_sched_pick_group over the groups' loads (the requests each
 * holds, from submit to its finishing event) and their health, and stays there; Cancel and
 * disconnects reach the owning group. Health is serving only while not draining and every group's
 * last engine step succeeded (the status names the first failed group); the systemd watchdog
 * follows the same rule. Metrics sum the groups and add group="N" series (msm_metrics.h). */

/* The directory of the Unix socket path exists, is a directory and is writable (for
 * --check-config; msm_server_listen checks it too). Errors name the path. */
int msm_server_check_socket_dir(const char *path, msm_err *err);

/* Binds and listens on every configured socket. Errors name the address. The Unix socket's path is
 * taken under a lock ("<socket>.lock"): a second daemon on a live socket is refused (a stale
 * socket file is replaced). Every listener's connections share server.max_connections and the
 * idle and write timeouts (msm_listen.h). */
int msm_server_listen(msm_server *s, msm_err *err);

/* Starts the graceful shutdown (what SIGTERM does): stop accepting, drain in-flight requests
 * within scheduler.drain_timeout_s, then cancel the rest, stop the scheduler, close everything;
 * uv_run then returns. */
void msm_server_shutdown(msm_server *s);

/* Closes everything at once, without a drain (a start-up that failed before serving); uv_run then
 * returns. */
void msm_server_close(msm_server *s);

/* The daemon's exit status once uv_run has returned: 0, or 1 when an engine failed for good
 * (-ENOTRECOVERABLE; the shutdown then started by itself). */
int msm_server_exit_status(const msm_server *s);
/* True when a group's engine step never returned: its threads cannot be joined, so the caller
 * must exit without tearing the groups down (msmoed's main does, with status 1). */
bool msm_server_stuck(const msm_server *s);

/* Installs SIGTERM/SIGINT (shutdown), SIGHUP (log reopen) handlers and the systemd watchdog timer. */
int msm_server_install_signals(msm_server *s, msm_err *err);

#endif

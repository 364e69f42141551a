/* msm_listen: a TCP listener on the loop, shared by the API's TCP socket (msm_server) and the
 * HTTP listeners (msm_http). */
#ifndef MSM_LISTEN_H
#define MSM_LISTEN_H

#include <stdbool.h>
#include <uv.h>

#include "msm_err.h"

/* Initialises t on loop (t->data = data) and makes it listen on host:port (an IPv4 or IPv6
 * address) with cb; `what` names the listener in errors and in the log line ("tcp", "metrics
 * http"). *opened turns true once t is a libuv handle, which the caller must then close, even when
 * a later step (bind, listen) fails. */
int msm_listen_tcp(uv_loop_t *loop, uv_tcp_t *t, void *data, const char *host, int port, const char *what,
                   uv_connection_cb cb, bool *opened, msm_err *err);

#endif

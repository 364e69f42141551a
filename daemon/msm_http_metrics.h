/* msm_http_metrics: the optional Prometheus endpoint (server.metrics_port).
 *
 * A minimal HTTP/1.0 listener on the loop thread: one request per connection, GET /metrics (or
 * GET /metrics?...) is answered 200 with the body the owner renders (Prometheus text format),
 * anything else 404; requests over 8 KiB are dropped. The owner (msm_server) creates it, makes it
 * listen, stops it when draining and closes it at shutdown; like every libuv handle it is freed
 * only after the loop has run its close callbacks. (A later change replaces it with an HTTP
 * library: nothing else depends on how it parses.) */
#ifndef MSM_HTTP_METRICS_H
#define MSM_HTTP_METRICS_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "msm_err.h"
#include "msm_listen.h"

typedef struct msm_http_metrics msm_http_metrics;

/* The body of a 200 answer: a malloc'd text of *ret_len bytes, or NULL (out of memory: 404). */
typedef char *(*msm_http_metrics_body_fn)(void *ctx, size_t *ret_len);

/* bytes_out (may be NULL) is increased by every byte written. Its connections count in guards
 * (server.max_connections, idle and write timeouts: msm_listen.h), which must be initialised
 * before it listens. No handle is opened yet. */
int msm_http_metrics_new(uv_loop_t *loop, msm_http_metrics_body_fn body, void *ctx, uint64_t *bytes_out,
                         msm_conn_set *guards, msm_http_metrics **ret, msm_err *err);
/* Binds and listens on host:port (IPv4 or IPv6 address). Errors name the address. After a failure
 * the listener is still closed by msm_http_metrics_close. */
int msm_http_metrics_listen(msm_http_metrics *h, const char *host, int port, msm_err *err);
/* Stops accepting connections (the ones open are still answered). */
void msm_http_metrics_stop(msm_http_metrics *h);
/* Stops accepting and closes every connection once its answer is flushed. */
void msm_http_metrics_close(msm_http_metrics *h);
/* After the loop has run the close callbacks of msm_http_metrics_close. Accepts NULL. */
void msm_http_metrics_free(msm_http_metrics *h);

#endif

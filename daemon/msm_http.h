/* msm_http: the OpenAI-compatible HTTP API of msmoed, and the Prometheus port, on H2O (libh2o,
 * the libuv build) running on the daemon's loop thread (docs/adr/0005-http-library.md).
 *
 * The loop thread owns every socket and handle here: msm_http accepts on its own uv_tcp_t
 * listener, caps the connections, and hands each accepted uv_tcp_t to H2O, which parses HTTP/1.1
 * (HTTP/2 is off) with its own timers on the same loop. Routes (all answers are JSON; errors are
 * OpenAI's {"error": {...}} objects):
 *   POST /v1/completions, /v1/chat/completions   generation (msm_openai.h), streamed as
 *                                                server-sent events with stream: true
 *   GET  /v1/models, /tokenizer_info; POST /tokenize, /detokenize
 *   GET  /health (200 while serving, 503 otherwise), GET /metrics (Prometheus text)
 * With an API key, every route but /health and /metrics needs "Authorization: Bearer KEY"
 * (compared in constant time; 401 otherwise). A metrics-only instance (server.metrics_port)
 * answers GET /metrics alone.
 *
 * Generation: each choice of a request is one scheduler request (conn_id: a fresh id from the
 * host, request_id: choice index + 1) submitted through the host; the scheduler's events come
 * back on the loop thread through msm_http_event. A client that goes away (its response was
 * being streamed, or the request is disposed for any other reason) cancels its choices: their KV
 * blocks return within one scheduler iteration.
 *
 * Limits: the request body (http.max_body_bytes: 413), request line + headers
 * (http.max_header_bytes: 431), the time a request may take to arrive, also the keep-alive idle
 * time (http.read_timeout_ms: the connection is closed), and open connections
 * (http.max_connections: 503 and close). With the daemon's guard set (msm_http_opts.guards,
 * msm_listen.h) each connection also counts against server.max_connections over every listener
 * (503 and close) and is closed when its client takes none of its reply for
 * server.write_timeout_s; its idle time stays H2O's (http.read_timeout_ms). */
#ifndef MSM_HTTP_H
#define MSM_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#include "msm_api.h"
#include "msm_err.h"
#include "msm_listen.h"
#include "msm_sched.h"

/* What msm_http needs from the server that owns the schedulers (msm_server). Loop thread. */
typedef struct msm_http_host {
    void *ctx;
    /* A connection id no socket connection and no other HTTP request uses. */
    uint64_t (*new_conn_id)(void *ctx);
    /* Submits r to a TP group (taking it on success; on failure r is still the caller's). Returns 0
     * and the group, or a negative errno with err (as msm_sched_submit, plus -ESHUTDOWN). */
    int (*submit)(void *ctx, msm_gen_request *r, int *ret_group, msm_err *err);
    /* Cancels every request of conn_id on group. */
    void (*cancel)(void *ctx, int group, uint64_t conn_id);
    /* Serving? why: a short status. */
    bool (*health)(void *ctx, char *why, size_t cap);
    /* The Prometheus text (malloc'ed), or NULL. */
    char *(*metrics_text)(void *ctx, size_t *ret_len);
} msm_http_host;

typedef struct msm_http_opts {
    const char *what;              /* in logs and errors: "http", "metrics http" */
    bool metrics_only;
    int max_body_bytes, max_header_bytes, read_timeout_ms, max_connections;
    const char *api_key_file;      /* NULL or "": no authentication */
    const char *model_name;        /* NULL or "": the last component of info->model */
    const msm_api_limits *limits;  /* copied */
    const msm_api_model_info *info; /* borrowed: must outlive the msm_http */
    msm_conn_set *guards;          /* NULL, or the daemon's connection guard set (borrowed;
                                      initialised before msm_http_listen) */
} msm_http_opts;

typedef struct msm_http msm_http;

/* Reads the API key file and the chat template (tokenizer_config.json beside the tokenizer; a
 * template msmoed cannot render turns chat completions off, with a warning saying why). No
 * handle is opened yet. Errors name the file. */
int msm_http_new(uv_loop_t *loop, const msm_http_opts *o, const msm_http_host *host, msm_http **ret, msm_err *err);
/* Binds and listens on host:port. After a failure msm_http_close still closes what was opened. */
int msm_http_listen(msm_http *h, const char *host, int port, msm_err *err);
/* Stops accepting (draining); the open connections are still answered. */
void msm_http_stop(msm_http *h);
/* Stops accepting and shuts every connection down (the loop then closes them). */
void msm_http_close(msm_http *h);
/* After uv_run has returned. Accepts NULL. */
void msm_http_free(msm_http *h);

/* A scheduler event on the loop thread: true when it belonged to one of this instance's requests
 * (then it is consumed, though still the caller's to free). */
bool msm_http_event(msm_http *h, const msm_sched_event *ev);
/* Ends every choice still running on TP group `group` with an error event (FINISH_ERROR, `error`,
 * msg), as the group's scheduler would have: for a group whose engine step never returned, whose
 * scheduler will send nothing more. Loop thread; h may be NULL. */
void msm_http_fail_group(msm_http *h, int group, int error, const msm_err *msg);

#endif

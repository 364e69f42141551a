/* msm_http_metrics: GET /metrics over a minimal HTTP/1.0 listener (see msm_http_metrics.h).
 *
 * Everything runs on the loop thread. Each connection reads its request into a fixed buffer until
 * the blank line that ends the headers, writes one answer and closes after flushing it. */
#include "msm_http_metrics.h"

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msm_listen.h"
#include "msm_log.h"

#define HTTP_MAX_REQUEST 8192

typedef struct http_conn {
    uv_tcp_t tcp;
    msm_http_metrics *h;
    char req[HTTP_MAX_REQUEST]; /* [len] the request so far, NUL-terminated */
    size_t len;
    bool closing;
    uv_shutdown_t shutdown_req;
    msm_conn_guard guard;       /* the connection limit and timeouts of every listener */
    struct http_conn *prev, *next;
} http_conn;

typedef struct http_write {
    uv_write_t req;
    char *buf;
} http_write;

struct msm_http_metrics {
    uv_loop_t *loop;
    msm_http_metrics_body_fn body;
    void *ctx;
    uint64_t *bytes_out;
    msm_conn_set *guards;
    uv_tcp_t listener;
    bool have_listener;
    http_conn *conns;
};

int msm_http_metrics_new(uv_loop_t *loop, msm_http_metrics_body_fn body, void *ctx, uint64_t *bytes_out,
                         msm_conn_set *guards, msm_http_metrics **ret, msm_err *err) {
    msm_http_metrics *h = calloc(1, sizeof *h);
    if (!h)
        return msm_err_set(err, -ENOMEM, "out of memory");
    h->loop = loop;
    h->body = body;
    h->ctx = ctx;
    h->bytes_out = bytes_out;
    h->guards = guards;
    *ret = h;
    return 0;
}

void msm_http_metrics_free(msm_http_metrics *h) {
    free(h);
}

/* ---- connections ---- */

static void on_conn_closed(uv_handle_t *handle) {
    http_conn *c = handle->data;
    if (c->prev)
        c->prev->next = c->next;
    else
        c->h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    msm_conn_guard_remove(&c->guard);
    free(c);
}

static void on_shutdown(uv_shutdown_t *req, int status) {
    http_conn *c = req->data;
    if (!uv_is_closing((uv_handle_t *)&c->tcp)) {
        msm_conn_guard_remove(&c->guard);
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
    }
}

/* Closes c, after flushing what it has written when flush is set. */
static void conn_close(http_conn *c, bool flush) {
    if (uv_is_closing((uv_handle_t *)&c->tcp))
        return;
    if (!c->closing) {
        c->closing = true;
        uv_read_stop((uv_stream_t *)&c->tcp);
        c->shutdown_req.data = c;
        if (flush && uv_shutdown(&c->shutdown_req, (uv_stream_t *)&c->tcp, on_shutdown) == 0)
            return;
    }
    msm_conn_guard_remove(&c->guard);
    uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
}

static void on_write(uv_write_t *req, int status) {
    http_write *w = (http_write *)req;
    if (status == 0)
        msm_conn_guard_wrote(w->req.data);
    free(w->buf);
    free(w);
}

/* Takes ownership of buf. */
static void conn_write(http_conn *c, char *buf, size_t len) {
    http_write *w = malloc(sizeof *w);
    if (!w) {
        free(buf);
        return;
    }
    w->buf = buf;
    w->req.data = &c->guard;
    uv_buf_t b = uv_buf_init(buf, (unsigned)len);
    msm_conn_guard_write_start(&c->guard);
    if (uv_write(&w->req, (uv_stream_t *)&c->tcp, &b, 1, on_write) < 0) {
        free(buf);
        free(w);
        return;
    }
    if (c->h->bytes_out)
        *c->h->bytes_out += len;
}

static void respond(http_conn *c) {
    msm_http_metrics *h = c->h;
    const char *status = "404 Not Found";
    char *body = NULL;
    size_t body_len = 0;
    if (strncmp(c->req, "GET /metrics ", 13) == 0 || strncmp(c->req, "GET /metrics?", 13) == 0) {
        body = h->body(h->ctx, &body_len);
        if (body)
            status = "200 OK";
    }
    if (!body) {
        body = strdup("not found: try GET /metrics\n");
        body_len = body ? strlen(body) : 0;
    }
    char head[256];
    int hl = snprintf(head, sizeof head,
                      "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: %zu\r\n"
                      "Connection: close\r\n\r\n", status, body_len);
    char *out = malloc((size_t)hl + body_len);
    if (out) {
        memcpy(out, head, (size_t)hl);
        if (body)
            memcpy(out + hl, body, body_len);
        conn_write(c, out, (size_t)hl + body_len);
    }
    free(body);
    conn_close(c, true);
}

/* Reads go straight into the request buffer, after what it holds. */
static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
    http_conn *c = handle->data;
    *buf = uv_buf_init(c->req + c->len, (unsigned)(HTTP_MAX_REQUEST - 1 - c->len));
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
    http_conn *c = stream->data;
    if (c->closing)
        return;
    if (nread < 0 || c->len + (size_t)nread >= HTTP_MAX_REQUEST - 1) {
        conn_close(c, false); /* the peer went away, or the request is too large */
        return;
    }
    msm_conn_guard_read(&c->guard);
    c->len += (size_t)nread;
    c->req[c->len] = 0;
    /* memmem, not strstr: a NUL byte in the request must not hide its end */
    if (memmem(c->req, c->len, "\r\n\r\n", 4) || memmem(c->req, c->len, "\n\n", 2))
        respond(c);
}

static void on_timeout(msm_conn_guard *g, msm_conn_timeout why) {
    conn_close(g->owner, false);
}

static void on_connection(uv_stream_t *listener, int status) {
    msm_http_metrics *h = listener->data;
    if (status < 0) {
        msm_log_warn("metrics http: accept failed: %s", uv_strerror(status));
        return;
    }
    http_conn *c = calloc(1, sizeof *c);
    if (!c) {
        msm_log_error("out of memory accepting a connection");
        return;
    }
    if (uv_tcp_init(h->loop, &c->tcp) < 0) {
        free(c);
        return;
    }
    c->h = h;
    c->tcp.data = c;
    c->next = h->conns;
    if (h->conns)
        h->conns->prev = c;
    h->conns = c;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) < 0) {
        uv_close((uv_handle_t *)&c->tcp, on_conn_closed);
        return;
    }
    if (msm_conn_guard_add(h->guards, &c->guard, (uv_stream_t *)&c->tcp, on_timeout, c) < 0) {
        conn_close(c, false); /* over server.max_connections */
        return;
    }
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* ---- listener ---- */

int msm_http_metrics_listen(msm_http_metrics *h, const char *host, int port, msm_err *err) {
    return msm_listen_tcp(h->loop, &h->listener, h, host, port, "metrics http", on_connection, &h->have_listener, err);
}

void msm_http_metrics_stop(msm_http_metrics *h) {
    if (h->have_listener && !uv_is_closing((uv_handle_t *)&h->listener))
        uv_close((uv_handle_t *)&h->listener, NULL);
}

void msm_http_metrics_close(msm_http_metrics *h) {
    msm_http_metrics_stop(h);
    for (http_conn *c = h->conns; c; c = c->next)
        conn_close(c, true);
}

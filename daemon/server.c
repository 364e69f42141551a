/* msm_server: listeners, connections, request routing over the TP groups, graceful shutdown (see
 * msm_server.h). The HTTP listeners (the OpenAI API of [http], the Prometheus port of
 * server.metrics_port) are msm_http instances (msm_http.h); this file is their host.
 *
 * Threads: everything here runs on the loop thread except msm_server_emit, which the scheduler
 * threads call; it touches only the event queue (under ev_mu) and uv_async_send.
 *
 * Groups: each TP group has its own scheduler. The loop thread counts the requests each group
 * holds (from a successful submit to the event that finishes it, which the group's emit context
 * marks with the group), picks the group of a new request with msm_sched_pick_group, and records
 * it next to the request id in the connection's in-flight list, so a Cancel reaches the owning
 * scheduler and a disconnect only the groups that hold the connection's requests. */
#include "msm_server.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "msm_code.h"
#include "msm_frame.h"
#include "msm_http.h"
#include "msm_listen.h"
#include "msm_log.h"
#include "msm_metrics.h"
#include "msm_notify.h"

#define READ_BUF (64 * 1024)
#define CONN_BUCKETS 1024
/* At shutdown, a connection gets this long to take its last replies before it is dropped. */
#define SHUTDOWN_FLUSH_MS 2000

/* A Generate in flight on a connection: the TP group that owns it, or -1 while its prompt_text
 * is being encoded (then a Cancel only marks it). */
typedef struct inflight {
    uint64_t rid;
    int group;
    bool cancelled;
} inflight;

typedef struct conn {
    union {
        uv_handle_t h;
        uv_stream_t s;
        uv_pipe_t pipe;
        uv_tcp_t tcp;
    } u;
    msm_server *srv;
    uint64_t id;
    msm_frame_reader rd;
    uint8_t *rbuf;              /* [READ_BUF] */
    inflight *inflight;         /* [n_inflight] Generate requests in flight */
    int n_inflight, cap_inflight;
    int n_text_jobs;            /* Tokenize / Detokenize calls being worked on */
    bool closing;               /* no more reads, no more writes except the pending ones */
    bool read_eof;              /* the client half-closed: it still gets the replies in flight */
    bool hashed;
    msm_conn_guard guard;       /* connection limit and timeouts (msm_listen.h) */
    struct conn *hnext;         /* hash chain */
    struct conn *prev, *next;   /* all connections */
    uv_shutdown_t shutdown_req;
} conn;

typedef struct write_req {
    uv_write_t req;
    uint8_t *buf;
    size_t len;
} write_req;

/* One TP group as the loop thread sees it; also the emit context of its scheduler. */
typedef struct group {
    msm_server *srv;
    int index;
    msm_sched *sched;
    int load;                   /* requests submitted and not yet finished (loop thread) */
    bool stuck;                 /* an engine step never returned (on_step_watchdog) */
} group;

struct msm_server {
    uv_loop_t *loop;
    const msm_config *cfg;
    msm_api_limits limits;
    msm_api_model_info info;
    group *groups;              /* [n_groups] */
    int n_groups;
    unsigned rr;                /* round-robin cursor of msm_sched_pick_group */
    int *pick_load;             /* [n_groups] scratch of the pick */
    bool *pick_healthy;         /* [n_groups] */
    msm_metrics metrics;
    msm_conn_set guards;        /* every connection, the HTTP listeners' too */
    bool have_guards;
    int lock_fd;                /* flock on <socket>.lock while we own the socket path; -1 */
    int exit_status;            /* what msmoed exits with (1 after a fatal engine failure) */

    uv_pipe_t unix_listener;
    uv_tcp_t tcp_listener;
    bool have_unix, have_tcp;
    msm_http *http;             /* server.metrics_port (GET /metrics only); NULL when off */
    msm_http *http_api;         /* [http]: the OpenAI-compatible API; NULL when off */

    uv_async_t async;
    pthread_mutex_t ev_mu;
    msm_sched_event *ev_head, *ev_tail;

    uv_signal_t sig_term, sig_int, sig_hup;
    uv_timer_t watchdog, drain_timer, step_watchdog;
    bool have_signals, have_watchdog, have_drain_timer, have_step_watchdog;
    bool stuck;                 /* a group is stuck: its threads cannot be joined (msm_server_stuck) */

    conn *conns;
    conn *buckets[CONN_BUCKETS];
    uint64_t next_conn_id;

    bool draining, drain_cancelled, finished;
    uint64_t drain_deadline_ms;
};

/* ---- connection table ---- */

static void conn_hash_add(msm_server *s, conn *c) {
    conn **b = &s->buckets[c->id % CONN_BUCKETS];
    c->hnext = *b;
    *b = c;
    c->hashed = true;
}

static void conn_hash_del(msm_server *s, conn *c) {
    if (!c->hashed)
        return;
    for (conn **pp = &s->buckets[c->id % CONN_BUCKETS]; *pp; pp = &(*pp)->hnext)
        if (*pp == c) {
            *pp = c->hnext;
            break;
        }
    c->hashed = false;
}

static conn *conn_find(msm_server *s, uint64_t id) {
    for (conn *c = s->buckets[id % CONN_BUCKETS]; c; c = c->hnext)
        if (c->id == id)
            return c;
    return NULL;
}

static int inflight_find(const conn *c, uint64_t rid) {
    for (int i = 0; i < c->n_inflight; i++)
        if (c->inflight[i].rid == rid)
            return i;
    return -1;
}

/* A connection with requests in flight or text being worked on is not idle. */
static void conn_update_busy(conn *c) {
    msm_conn_guard_set_busy(&c->guard, c->n_inflight > 0 || c->n_text_jobs > 0);
}

static void inflight_del(conn *c, uint64_t rid) {
    int i = inflight_find(c, rid);
    if (i >= 0) {
        c->inflight[i] = c->inflight[--c->n_inflight];
        conn_update_busy(c);
    }
}

static int inflight_add(conn *c, uint64_t rid, int grp) {
    if (c->n_inflight == c->cap_inflight) {
        int cap = c->cap_inflight ? c->cap_inflight * 2 : 16;
        inflight *p = realloc(c->inflight, (size_t)cap * sizeof *p);
        if (!p)
            return -ENOMEM;
        c->inflight = p;
        c->cap_inflight = cap;
    }
    c->inflight[c->n_inflight++] = (inflight){.rid = rid, .group = grp};
    conn_update_busy(c);
    return 0;
}

/* A group's scheduler snapshot (zeros before its scheduler is set). */
static void group_stats(msm_server *s, int g, msm_sched_stats *ret) {
    if (s->groups[g].sched)
        msm_sched_get_stats(s->groups[g].sched, ret);
    else
        memset(ret, 0, sizeof *ret);
}

/* Cancels every request of c on the groups that hold one. */
static void inflight_cancel_all(msm_server *s, conn *c) {
    for (int g = 0; g < s->n_groups; g++) {
        if (!s->groups[g].sched)
            continue;
        for (int i = 0; i < c->n_inflight; i++)
            if (c->inflight[i].group == g) {
                msm_sched_cancel_conn(s->groups[g].sched, c->id);
                break;
            }
    }
}

/* The group a new request goes to (see msm_sched_pick_group). */
static int pick_group(msm_server *s) {
    for (int g = 0; g < s->n_groups; g++) {
        msm_sched_stats st;
        group_stats(s, g, &st);
        s->pick_load[g] = s->groups[g].load;
        s->pick_healthy[g] = !st.engine_failed;
    }
    return msm_sched_pick_group(s->pick_load, s->pick_healthy, s->n_groups, &s->rr);
}

/* Health rule: serving only while not draining and every group's last engine step succeeded; the
 * status names the first group that failed. */
static bool health(msm_server *s, char *why, size_t cap) {
    if (s->draining) {
        snprintf(why, cap, "draining");
        return false;
    }
    for (int g = 0; g < s->n_groups; g++) {
        msm_sched_stats st;
        group_stats(s, g, &st);
        if (st.engine_failed) {
            if (s->n_groups > 1)
                snprintf(why, cap, "group %d of %d: engine failed its last step", g, s->n_groups);
            else
                snprintf(why, cap, "engine failed its last step");
            return false;
        }
    }
    if (s->n_groups > 1)
        snprintf(why, cap, "serving (%d groups)", s->n_groups);
    else
        snprintf(why, cap, "serving");
    return true;
}

/* Running and waiting requests over every group (a stuck group's never finish: not counted). */
static void totals(msm_server *s, int *ret_running, int *ret_waiting) {
    int running = 0, waiting = 0;
    for (int g = 0; g < s->n_groups; g++) {
        if (s->groups[g].stuck)
            continue;
        msm_sched_stats st;
        group_stats(s, g, &st);
        running += st.running;
        waiting += st.waiting;
    }
    *ret_running = running;
    *ret_waiting = waiting;
}

/* Metrics samples over every group (malloc'd; *ret_n of them). */
static msm_metric_sample *collect_metrics(msm_server *s, int *ret_n) {
    int cap = msm_metrics_capacity(s->n_groups);
    msm_metric_sample *samples = malloc((size_t)cap * sizeof *samples);
    msm_sched_stats *st = calloc((size_t)s->n_groups, sizeof *st);
    *ret_n = 0;
    s->metrics.connections_refused = s->guards.refused;
    s->metrics.connections_idle_closed = s->guards.timed_out[MSM_CONN_IDLE];
    s->metrics.connections_stalled_closed = s->guards.timed_out[MSM_CONN_STALLED];
    if (samples && st) {
        for (int g = 0; g < s->n_groups; g++)
            group_stats(s, g, &st[g]);
        *ret_n = msm_metrics_collect(&s->metrics, st, s->n_groups, samples, cap);
    }
    free(st);
    return samples;
}

/* The Prometheus text of every metric: the body of GET /metrics (msm_http_host.metrics_text). */
static char *metrics_text(void *ctx, size_t *ret_len) {
    int n;
    msm_metric_sample *samples = collect_metrics(ctx, &n);
    char *body = NULL;
    if (samples) {
        size_t len = msm_metrics_render(samples, n, NULL, 0);
        body = malloc(len + 1);
        if (body) {
            msm_metrics_render(samples, n, body, len + 1);
            *ret_len = len;
        }
    }
    free(samples);
    return body;
}

/* ---- the HTTP listeners' host (msm_http_host) ---- */

static uint64_t http_new_conn_id(void *ctx) {
    msm_server *s = ctx;
    return ++s->next_conn_id;
}

/* An HTTP choice: the same routing as a socket Generate (least-loaded healthy group). */
static int http_submit(void *ctx, msm_gen_request *r, int *ret_group, msm_err *err) {
    msm_server *s = ctx;
    s->metrics.requests_total++;
    if (s->draining)
        return msm_err_set(err, -ESHUTDOWN, "the daemon is shutting down");
    int g = pick_group(s);
    int rc = msm_sched_submit(s->groups[g].sched, &r, err);
    if (rc < 0) {
        msm_code code = msm_code_from_errno(rc);
        if ((unsigned)code < MSM_CODE_LIMIT)
            s->metrics.requests_rejected[code]++;
        return rc;
    }
    s->groups[g].load++;
    *ret_group = g;
    return 0;
}

static void http_cancel(void *ctx, int group, uint64_t conn_id) {
    msm_server *s = ctx;
    if (group >= 0 && group < s->n_groups && s->groups[group].sched)
        msm_sched_cancel_conn(s->groups[group].sched, conn_id);
}

static bool health(msm_server *s, char *why, size_t cap);

static bool http_health(void *ctx, char *why, size_t cap) {
    return health(ctx, why, cap);
}

/* The HTTP listeners the config asks for: [http] and the metrics port. */
static int http_new(msm_server *s, msm_err *err) {
    const msm_config *c = s->cfg;
    msm_http_host host = {.ctx = s, .new_conn_id = http_new_conn_id, .submit = http_submit,
                          .cancel = http_cancel, .health = http_health, .metrics_text = metrics_text};
    msm_http_opts o = {.what = "http", .max_body_bytes = c->http_max_body_bytes,
                       .max_header_bytes = c->http_max_header_bytes, .read_timeout_ms = c->http_read_timeout_ms,
                       .max_connections = c->http_max_connections, .api_key_file = c->http_api_key_file,
                       .model_name = c->http_model_name, .limits = &s->limits, .info = &s->info,
                       .guards = &s->guards};
    int rc = 0;
    if (c->http_enabled)
        rc = msm_http_new(s->loop, &o, &host, &s->http_api, err);
    if (rc == 0 && c->metrics_port) {
        o.what = "metrics http";
        o.metrics_only = true;
        o.max_connections = c->max_connections;
        rc = msm_http_new(s->loop, &o, &host, &s->http, err);
    }
    return rc;
}

/* ---- closing ---- */

static void on_conn_closed(uv_handle_t *h) {
    conn *c = h->data;
    msm_server *s = c->srv;
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->metrics.connections--;
    msm_conn_guard_remove(&c->guard);
    msm_frame_reader_done(&c->rd);
    free(c->rbuf);
    free(c->inflight);
    free(c);
}

/* Stops reading, cancels the connection's requests (their blocks are freed within one scheduler
 * step), and closes the handle, abruptly (pending writes are dropped) or after flushing. */
static void conn_close(conn *c, bool flush);

static void on_shutdown(uv_shutdown_t *req, int status) {
    conn *c = req->data;
    if (!uv_is_closing(&c->u.h)) {
        msm_conn_guard_remove(&c->guard);
        uv_close(&c->u.h, on_conn_closed);
    }
}

static void conn_close(conn *c, bool flush) {
    msm_server *s = c->srv;
    if (uv_is_closing(&c->u.h))
        return;
    if (!c->closing) {
        c->closing = true;
        uv_read_stop(&c->u.s);
        conn_hash_del(s, c);
        inflight_cancel_all(s, c);
        c->n_inflight = 0;
        if (flush) {
            c->shutdown_req.data = c;
            if (uv_shutdown(&c->shutdown_req, &c->u.s, on_shutdown) == 0)
                return;
        }
    }
    msm_conn_guard_remove(&c->guard);
    uv_close(&c->u.h, on_conn_closed);
}

/* ---- writing ---- */

static void on_write(uv_write_t *req, int status) {
    write_req *w = (write_req *)req;
    conn *c = req->data;
    free(w->buf);
    free(w);
    if (status == 0)
        msm_conn_guard_wrote(&c->guard);
    if (status < 0 && status != UV_ECANCELED && !c->closing) {
        msm_log_debug("connection %llu: write failed: %s", (unsigned long long)c->id, uv_strerror(status));
        conn_close(c, false);
    }
}

/* Takes ownership of buf. */
static void conn_write(conn *c, uint8_t *buf, size_t len) {
    if (!buf)
        return;
    if (c->closing) {
        free(buf);
        return;
    }
    write_req *w = malloc(sizeof *w);
    if (!w) {
        free(buf);
        conn_close(c, false);
        return;
    }
    w->buf = buf;
    w->len = len;
    w->req.data = c;
    uv_buf_t b = uv_buf_init((char *)buf, (unsigned)len);
    msm_conn_guard_write_start(&c->guard);
    int rc = uv_write(&w->req, &c->u.s, &b, 1, on_write);
    if (rc < 0) {
        free(buf);
        free(w);
        conn_close(c, false);
        return;
    }
    c->srv->metrics.bytes_out += len;
    /* a client that does not read: the kernel's buffer is full and libuv queues the rest */
    size_t queued = uv_stream_get_write_queue_size(&c->u.s);
    if (queued > (size_t)c->srv->cfg->max_queued_bytes) {
        c->srv->metrics.slow_readers_closed++;
        msm_log_warn("connection %llu: the client is not reading its replies (%zu bytes queued > "
                     "server.max_queued_bytes = %d); closing it and cancelling its %d request(s)",
                     (unsigned long long)c->id, queued, c->srv->cfg->max_queued_bytes, c->n_inflight);
        conn_close(c, false);
    }
}

/* An Error reply to request rid: err (a negative errno) gives its code, msg its message. */
static void reply_error(conn *c, uint64_t rid, int err, const msm_err *msg) {
    size_t len = 0;
    msm_code code = msm_code_from_errno(err);
    if ((unsigned)code < MSM_CODE_LIMIT)
        c->srv->metrics.requests_rejected[code]++;
    msm_log_debug("connection %llu request %llu: %s: %s", (unsigned long long)c->id,
                  (unsigned long long)rid, msm_code_name(code), msg->msg);
    uint8_t *out = msm_api_encode_error(rid, err, msg->msg, &len);
    conn_write(c, out, len);
}

/* Malformed input: one error frame, then the connection closes once it is flushed. */
static void conn_fail(conn *c, int err, const msm_err *msg) {
    if (c->closing)
        return;
    c->srv->metrics.frames_malformed++;
    msm_log_info("connection %llu: %s: %s; closing it", (unsigned long long)c->id,
                 msm_code_name(msm_code_from_errno(err)), msg->msg);
    reply_error(c, 0, err, msg);
    conn_close(c, true);
}

/* ---- requests ---- */

/* A half-closed connection (the client shut its sending side) is closed, after flushing, once the
 * last reply it waits for is out. */
static void conn_maybe_done(conn *c) {
    if (c->read_eof && !c->closing && c->n_inflight == 0 && c->n_text_jobs == 0)
        conn_close(c, true);
}

static void fatal_engine(msm_server *s, int g, const msm_err *why);

/* A Generate admitted on c (its inflight entry made): submitted to the least-loaded group, which
 * owns it from then on. Takes r. */
static void route_generate(conn *c, uint64_t rid, msm_gen_request *r) {
    msm_server *s = c->srv;
    msm_err err = {{0}};
    int rc, i = inflight_find(c, rid);
    r->conn_id = c->id;
    if (s->draining) {
        rc = msm_err_set(&err, -ESHUTDOWN, "the daemon is shutting down");
    } else {
        int g = pick_group(s);
        c->inflight[i].group = g;
        if ((rc = msm_sched_submit(s->groups[g].sched, &r, &err)) == 0)
            s->groups[g].load++;
    }
    if (rc < 0) {
        inflight_del(c, rid);
        reply_error(c, rid, rc, &err);
        msm_gen_request_free(r);
        conn_maybe_done(c);
    }
}

/* A Generate's checks against the connection's limits; on success its inflight entry exists
 * (group -1 until it is routed). */
static int admit_generate(conn *c, uint64_t rid, msm_err *err) {
    msm_server *s = c->srv;
    int limit = s->cfg->max_requests_per_connection, rc;
    s->metrics.requests_total++;
    if (inflight_find(c, rid) >= 0)
        return msm_err_set(err, -EINVAL, "request_id %llu is already in flight on this connection",
                           (unsigned long long)rid);
    if (s->draining)
        return msm_err_set(err, -ESHUTDOWN, "the daemon is shutting down");
    if (c->n_inflight + c->n_text_jobs >= limit)
        return msm_err_set(err, -EAGAIN, "%d requests in flight on this connection (server.max_requests_per_connection "
                           "= %d)", c->n_inflight + c->n_text_jobs, limit);
    if ((rc = inflight_add(c, rid, -1)) < 0)
        return msm_err_set(err, rc, "out of memory");
    return 0;
}

static void cancel_request(conn *c, uint64_t rid) {
    int i = inflight_find(c, rid);
    if (i < 0) {
        msm_err err = {{0}};
        int rc = msm_err_set(&err, -ENOENT, "cancel: request_id %llu is not in flight on this connection",
                             (unsigned long long)rid);
        reply_error(c, rid, rc, &err);
        return;
    }
    if (c->inflight[i].group < 0)
        c->inflight[i].cancelled = true; /* its text is being encoded: it ends when that is done */
    else
        msm_sched_cancel(c->srv->groups[c->inflight[i].group].sched, c->id, rid);
}

static void reply_metrics(conn *c, uint64_t rid) {
    int n;
    size_t len = 0;
    msm_metric_sample *samples = collect_metrics(c->srv, &n);
    if (!samples) {
        msm_err err = {{0}};
        reply_error(c, rid, msm_err_set(&err, -ENOMEM, "out of memory"), &err);
        return;
    }
    uint8_t *out = msm_api_encode_metrics(rid, samples, n, &len);
    free(samples);
    conn_write(c, out, len);
}

/* ---- text work, off the loop thread ----
 * A prompt_text, a Tokenize text or a Detokenize id list can take long to convert (hundreds of
 * milliseconds for a MiB of text), so msm_api_text runs on libuv's thread pool (uv_queue_work,
 * whose completion comes back to this thread through libuv's own queue and async handle). The
 * job carries the connection's id, not a pointer: the connection may be gone when it is done. A
 * Generate's inflight entry exists while its text is encoded, so a duplicate id is refused and a
 * Cancel marks it; Tokenize and Detokenize count in n_text_jobs. Both count against the
 * connection's request limit and keep it from being idle. */
typedef struct text_job {
    uv_work_t work;
    msm_server *srv;
    uint64_t conn_id;
    msm_call call;
    int rc;
    msm_err err;
} text_job;

static void text_work(uv_work_t *w) {
    text_job *j = w->data;
    j->rc = msm_api_text(&j->call, &j->srv->limits, &j->err);
}

/* The reply of a finished text job on c. Takes the call's request. */
static void text_reply(conn *c, text_job *j) {
    msm_call *call = &j->call;
    uint64_t rid = call->request_id;
    uint8_t *out = NULL;
    size_t len = 0;
    if (call->kind == MSM_CALL_GENERATE) {
        msm_gen_request *r = call->gen;
        int i = inflight_find(c, rid);
        call->gen = NULL;
        if (i >= 0 && c->inflight[i].cancelled) {
            /* cancelled before it started: the stream ends here, with nothing generated */
            msm_sched_event ev = {.conn_id = c->id, .request_id = rid, .finish = MSM_FINISH_CANCELLED};
            inflight_del(c, rid);
            out = msm_api_encode_event(&ev, &len);
            msm_gen_request_free(r);
        } else if (i >= 0 && j->rc == 0) {
            route_generate(c, rid, r);
            return;
        } else {
            inflight_del(c, rid);
            msm_gen_request_free(r);
            if (j->rc < 0)
                reply_error(c, rid, j->rc, &j->err);
        }
    } else {
        c->n_text_jobs--;
        conn_update_busy(c);
        if (j->rc < 0)
            reply_error(c, rid, j->rc, &j->err);
        else if (call->kind == MSM_CALL_TOKENIZE)
            out = msm_api_encode_tokenize(rid, call->ids, call->n_ids, &len);
        else
            out = msm_api_encode_detokenize(rid, call->text, &len);
    }
    conn_write(c, out, len);
}

static void text_done(uv_work_t *w, int status) {
    text_job *j = w->data;
    conn *c = conn_find(j->srv, j->conn_id);
    if (c && !c->closing) {
        text_reply(c, j);
        conn_maybe_done(c);
    }
    msm_gen_request_free(j->call.gen);
    msm_call_done(&j->call);
    free(j);
}

/* Hands the text work of call to the thread pool. Takes the call. */
static void queue_text(conn *c, msm_call *call) {
    msm_err err = {{0}};
    text_job *j = calloc(1, sizeof *j);
    int rc = j ? 0 : msm_err_set(&err, -ENOMEM, "out of memory");
    if (j) {
        j->srv = c->srv;
        j->conn_id = c->id;
        j->call = *call;
        j->work.data = j;
        if ((rc = uv_queue_work(c->srv->loop, &j->work, text_work, text_done)) < 0)
            msm_err_set(&err, rc, "cannot queue the text work: %s", uv_strerror(rc));
    }
    if (rc == 0) {
        if (call->kind != MSM_CALL_GENERATE) {
            c->n_text_jobs++;
            conn_update_busy(c);
        }
        return;
    }
    if (call->kind == MSM_CALL_GENERATE)
        inflight_del(c, call->request_id);
    reply_error(c, call->request_id, rc, &err);
    msm_gen_request_free(call->gen);
    msm_call_done(call);
    free(j);
}

static void handle_frame(conn *c, const uint8_t *buf, uint32_t len) {
    msm_server *s = c->srv;
    msm_call call;
    msm_err err = {{0}};
    uint64_t rid;
    int rc = msm_api_parse(buf, len, &s->limits, &call, &rid, &err);
    if (rc == -EBADMSG)
        conn_fail(c, rc, &err);
    else if (rc < 0)
        reply_error(c, rid, rc, &err);
    if (rc < 0)
        return;
    uint8_t *out = NULL; /* the reply of a call answered right here */
    size_t out_len = 0;
    char why[128];
    switch (call.kind) {
    case MSM_CALL_GENERATE:
        if ((rc = admit_generate(c, call.request_id, &err)) < 0) {
            reply_error(c, call.request_id, rc, &err);
            msm_gen_request_free(call.gen);
            break;
        }
        if (call.text_pending) {
            queue_text(c, &call);
            return;
        }
        route_generate(c, call.request_id, call.gen);
        break;
    case MSM_CALL_CANCEL:
        cancel_request(c, call.request_id);
        break;
    case MSM_CALL_HEALTH: {
        bool ok = health(s, why, sizeof why);
        out = msm_api_encode_health(call.request_id, ok, why, &out_len);
        break;
    }
    case MSM_CALL_MODEL_INFO:
        out = msm_api_encode_model_info(call.request_id, &s->info, &out_len);
        break;
    case MSM_CALL_METRICS:
        reply_metrics(c, call.request_id);
        break;
    case MSM_CALL_TOKENIZE:
    case MSM_CALL_DETOKENIZE:
        if (c->n_inflight + c->n_text_jobs >= s->cfg->max_requests_per_connection) {
            rc = msm_err_set(&err, -EAGAIN, "%d requests in flight on this connection "
                             "(server.max_requests_per_connection = %d)", c->n_inflight + c->n_text_jobs,
                             s->cfg->max_requests_per_connection);
            reply_error(c, call.request_id, rc, &err);
            break;
        }
        queue_text(c, &call);
        return;
    }
    conn_write(c, out, out_len);
    msm_call_done(&call);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
    conn *c = h->data;
    *buf = uv_buf_init((char *)c->rbuf, READ_BUF);
}

/* Whether the peer has gone both ways (not merely shut its sending side): a Unix socket whose
 * peer closed polls HUP. (A TCP peer's close looks like a half-close until a write fails.) */
static bool peer_gone(conn *c) {
    uv_os_fd_t fd;
    if (uv_fileno(&c->u.h, &fd) < 0)
        return true;
    struct pollfd p = {.fd = fd, .events = POLLOUT};
    return poll(&p, 1, 0) == 1 && (p.revents & (POLLHUP | POLLERR));
}

/* End of the client's bytes: a truncated frame is malformed; a clean end is a half-close (the
 * client still gets what is in flight) unless the peer is gone. */
static void on_eof(conn *c) {
    if (msm_frame_reader_partial(&c->rd)) {
        uint32_t have, want;
        msm_err err = {{0}};
        msm_frame_reader_progress(&c->rd, &have, &want);
        if (want)
            msm_err_set(&err, -EBADMSG, "truncated frame: connection closed after %u of %u body bytes", have, want);
        else
            msm_err_set(&err, -EBADMSG, "truncated frame: connection closed after %u of 4 header bytes", have);
        conn_fail(c, -EBADMSG, &err);
        return;
    }
    if (peer_gone(c)) {
        conn_close(c, false);
        return;
    }
    c->read_eof = true;
    uv_read_stop(&c->u.s);
    conn_maybe_done(c);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
    conn *c = stream->data;
    if (c->closing)
        return;
    if (nread < 0) {
        if (nread == UV_EOF)
            on_eof(c);
        else
            conn_close(c, false);
        return;
    }
    msm_conn_guard_read(&c->guard);
    c->srv->metrics.bytes_in += (uint64_t)nread;
    const uint8_t *data = (const uint8_t *)buf->base;
    size_t n = (size_t)nread, off = 0;
    while (off < n && !c->closing) {
        size_t used = 0;
        const uint8_t *frame;
        uint32_t len;
        msm_err err;
        int rc = msm_frame_reader_feed(&c->rd, data + off, n - off, &used, &frame, &len, &err);
        off += used;
        if (rc < 0) {
            conn_fail(c, rc, &err);
            return;
        }
        if (rc == 0)
            break;
        handle_frame(c, frame, len);
    }
}

/* ---- accepting ---- */

static conn *conn_new(msm_server *s) {
    conn *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    c->srv = s;
    c->id = ++s->next_conn_id;
    c->rbuf = malloc(READ_BUF);
    if (!c->rbuf) {
        free(c);
        return NULL;
    }
    msm_frame_reader_init(&c->rd, (uint32_t)s->cfg->max_frame_bytes);
    return c;
}

/* A connection over server.max_connections: told why in one frame written at once (into the
 * socket buffer, which a fresh connection has room for), then closed at once, so that a burst of
 * connections cannot run the daemon out of descriptors (libuv would then reset clients without a
 * word). */
static void refuse_connection(conn *c) {
    msm_server *s = c->srv;
    msm_err err = {{0}};
    int rc = msm_err_set(&err, -EMFILE, "too many connections (server.max_connections = %d, over every listener)",
                         s->cfg->max_connections);
    size_t len = 0;
    uint8_t *out = msm_api_encode_error(0, rc, err.msg, &len);
    s->metrics.requests_rejected[msm_code_from_errno(rc)]++;
    if (out) {
        uv_buf_t b = uv_buf_init((char *)out, (unsigned)len);
        if (uv_try_write(&c->u.s, &b, 1) > 0)
            s->metrics.bytes_out += len;
        free(out);
    }
    conn_close(c, false);
}

/* The guard set's verdict (msm_listen.h): closed abruptly, its requests cancelled. */
static void on_conn_timeout(msm_conn_guard *g, msm_conn_timeout why) {
    conn *c = g->owner;
    msm_server *s = c->srv;
    if (why == MSM_CONN_IDLE)
        msm_log_info("connection %llu: idle for server.idle_timeout_s = %d s; closing it", (unsigned long long)c->id,
                     s->cfg->idle_timeout_s);
    else if (!s->finished)
        msm_log_warn("connection %llu: the client took none of its %zu queued reply bytes for server.write_timeout_s = "
                     "%d s; closing it and cancelling its %d request(s)", (unsigned long long)c->id,
                     uv_stream_get_write_queue_size(&c->u.s), s->cfg->write_timeout_s, c->n_inflight);
    else
        msm_log_warn("connection %llu: the client did not take its last %zu reply bytes within %d ms of the shutdown; "
                     "dropping them", (unsigned long long)c->id, uv_stream_get_write_queue_size(&c->u.s),
                     SHUTDOWN_FLUSH_MS);
    conn_close(c, false);
}

static void on_connection(uv_stream_t *listener, int status) {
    msm_server *s = listener->data;
    if (status < 0) {
        msm_log_warn("accept failed: %s", uv_strerror(status));
        return;
    }
    conn *c = conn_new(s);
    if (!c) {
        msm_log_error("out of memory accepting a connection");
        return;
    }
    int rc = listener == (uv_stream_t *)&s->unix_listener ? uv_pipe_init(s->loop, &c->u.pipe, 0)
                                                          : uv_tcp_init(s->loop, &c->u.tcp);
    if (rc < 0) {
        msm_frame_reader_done(&c->rd);
        free(c->rbuf);
        free(c);
        return;
    }
    c->u.h.data = c;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->metrics.connections++;
    if (uv_accept(listener, &c->u.s) < 0) {
        uv_close(&c->u.h, on_conn_closed);
        return;
    }
    s->metrics.connections_total++;
    if (msm_conn_guard_add(&s->guards, &c->guard, &c->u.s, on_conn_timeout, c) < 0) {
        refuse_connection(c);
        return;
    }
    conn_hash_add(s, c);
    uv_read_start(&c->u.s, on_alloc, on_read);
}

/* ---- scheduler events ---- */

void msm_server_emit(void *group_ctx, msm_sched_event *ev) {
    group *grp = group_ctx;
    msm_server *s = grp->srv;
    ev->group = grp->index;
    ev->next = NULL;
    pthread_mutex_lock(&s->ev_mu);
    if (s->ev_tail)
        s->ev_tail->next = ev;
    else
        s->ev_head = ev;
    s->ev_tail = ev;
    pthread_mutex_unlock(&s->ev_mu);
    uv_async_send(&s->async);
}

static void on_async(uv_async_t *a) {
    msm_server *s = a->data;
    pthread_mutex_lock(&s->ev_mu);
    msm_sched_event *ev = s->ev_head;
    s->ev_head = s->ev_tail = NULL;
    pthread_mutex_unlock(&s->ev_mu);
    while (ev) {
        msm_sched_event *next = ev->next;
        /* The group's count drops at every finish, whether or not the connection is still here. */
        if (ev->finish != MSM_FINISH_NONE && ev->group >= 0 && ev->group < s->n_groups)
            s->groups[ev->group].load--;
        if (ev->finish == MSM_FINISH_ERROR && ev->error == -ENOTRECOVERABLE)
            fatal_engine(s, ev->group, &ev->error_msg);
        conn *c = conn_find(s, ev->conn_id);
        if (c && !c->closing) {
            size_t len;
            uint8_t *out = msm_api_encode_event(ev, &len);
            conn_write(c, out, len);
            if (ev->finish != MSM_FINISH_NONE) {
                inflight_del(c, ev->request_id);
                conn_maybe_done(c);
            }
        } else if (!c) {
            msm_http_event(s->http_api, ev); /* an HTTP request's, or one whose client is gone */
        }
        free(ev);
        ev = next;
    }
}

/* ---- lifecycle ---- */

static void server_free_mem(msm_server *s) {
    if (s->lock_fd >= 0)
        close(s->lock_fd);
    msm_http_free(s->http_api);
    msm_http_free(s->http);
    free(s->groups);
    free(s->pick_load);
    free(s->pick_healthy);
    free(s);
}

int msm_server_new(uv_loop_t *loop, const msm_config *cfg, const msm_api_limits *limits,
                   const msm_api_model_info *info, int n_groups, msm_server **ret, msm_err *err) {
    if (n_groups < 1)
        return msm_err_set(err, -EINVAL, "server: %d TP groups", n_groups);
    msm_server *s = calloc(1, sizeof *s);
    if (!s)
        return msm_err_set(err, -ENOMEM, "out of memory");
    s->lock_fd = -1;
    s->groups = calloc((size_t)n_groups, sizeof *s->groups);
    s->pick_load = calloc((size_t)n_groups, sizeof *s->pick_load);
    s->pick_healthy = calloc((size_t)n_groups, sizeof *s->pick_healthy);
    if (!s->groups || !s->pick_load || !s->pick_healthy) {
        server_free_mem(s);
        return msm_err_set(err, -ENOMEM, "out of memory");
    }
    s->n_groups = n_groups;
    for (int g = 0; g < n_groups; g++) {
        s->groups[g].srv = s;
        s->groups[g].index = g;
    }
    s->loop = loop;
    s->cfg = cfg;
    s->limits = *limits;
    s->info = *info;
    pthread_mutex_init(&s->ev_mu, NULL);
    int rc = uv_async_init(loop, &s->async, on_async);
    if (rc < 0) {
        pthread_mutex_destroy(&s->ev_mu);
        server_free_mem(s);
        return msm_err_set(err, rc, "uv_async_init: %s", uv_strerror(rc));
    }
    s->async.data = s;
    if ((rc = http_new(s, err)) < 0) {
        uv_close((uv_handle_t *)&s->async, NULL);
        uv_run(loop, UV_RUN_NOWAIT);
        pthread_mutex_destroy(&s->ev_mu);
        server_free_mem(s);
        return rc;
    }
    *ret = s;
    return 0;
}

void *msm_server_group_ctx(msm_server *s, int g) {
    return g >= 0 && g < s->n_groups ? &s->groups[g] : NULL;
}

void msm_server_set_sched(msm_server *s, int g, msm_sched *sched) {
    if (g >= 0 && g < s->n_groups)
        s->groups[g].sched = sched;
}

void msm_server_free(msm_server *s) {
    if (!s)
        return;
    for (msm_sched_event *ev = s->ev_head, *n; ev; ev = n) {
        n = ev->next;
        free(ev);
    }
    pthread_mutex_destroy(&s->ev_mu);
    server_free_mem(s);
}

/* The socket path belongs to the one daemon holding an exclusive flock on "<socket>.lock" (kept
 * for its life; the lock file stays). A second daemon on the same path is refused, naming the
 * first's pid, instead of unlinking the live socket (and later, on its exit, the socket of the
 * daemon that took over). A socket file left by a daemon that crashed is stale: removed. */
static int lock_socket_path(msm_server *s, msm_err *err) {
    const char *path = s->cfg->socket;
    char lock[sizeof s->cfg->socket + 8], pid[32] = "";
    snprintf(lock, sizeof lock, "%s.lock", path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return msm_err_set(err, -errno, "cannot open %s (the lock of server.socket): %s", lock, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
        int e = errno;
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\n")] = 0;
        close(fd);
        if (e == EWOULDBLOCK)
            return msm_err_set(err, -EADDRINUSE, "server.socket %s is served by another running msmoed (pid %s, "
                               "holding %s); stop it first or choose another path", path, pid[0] ? pid : "?", lock);
        return msm_err_set(err, -e, "cannot lock %s: %s", lock, strerror(e));
    }
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) < 0 || pwrite(fd, pid, (size_t)n, 0) < 0) {
        /* the pid is only for the message above */
    }
    s->lock_fd = fd;
    return 0;
}

/* Whether something accepts connections on the Unix socket at path (a live socket, not a stale
 * file): a non-blocking connect, refused at once when no one listens. */
static bool socket_is_live(const char *path) {
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof sa.sun_path)
        return false; /* msm_config_check refuses such a path */
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return false;
    bool live = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 || errno == EAGAIN || errno == EINPROGRESS;
    close(fd);
    return live;
}

/* The socket's directory must exist (libuv reports a missing one as "permission denied"). */
int msm_server_check_socket_dir(const char *path, msm_err *err) {
    char dir[sizeof ((msm_config *)0)->socket];
    snprintf(dir, sizeof dir, "%s", path);
    const char *d = dirname(dir);
    struct stat st;
    if (stat(d, &st) < 0)
        return msm_err_set(err, -errno, "server.socket %s: the directory %s %s", path, d,
                           errno == ENOENT ? "does not exist (create it; under systemd, RuntimeDirectory= does)"
                                           : strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return msm_err_set(err, -ENOTDIR, "server.socket %s: %s is not a directory", path, d);
    if (access(d, W_OK | X_OK) < 0)
        return msm_err_set(err, -errno, "server.socket %s: cannot create a socket in %s: %s", path, d, strerror(errno));
    return 0;
}

static int listen_unix(msm_server *s, msm_err *err) {
    const char *path = s->cfg->socket;
    struct stat st;
    int rc;
    if ((rc = msm_server_check_socket_dir(path, err)) < 0 || (rc = lock_socket_path(s, err)) < 0)
        return rc;
    if (lstat(path, &st) == 0) {
        if (!S_ISSOCK(st.st_mode))
            return msm_err_set(err, -EEXIST, "server.socket %s exists and is not a socket", path);
        if (socket_is_live(path))
            return msm_err_set(err, -EADDRINUSE, "server.socket %s is in use by another process (not an msmoed "
                               "holding %s.lock); stop it first or choose another path", path, path);
        unlink(path); /* stale: left by a daemon that crashed */
    }
    rc = uv_pipe_init(s->loop, &s->unix_listener, 0);
    if (rc < 0)
        return msm_err_set(err, rc, "uv_pipe_init: %s", uv_strerror(rc));
    s->unix_listener.data = s;
    s->have_unix = true;
    if ((rc = uv_pipe_bind(&s->unix_listener, path)) < 0)
        return msm_err_set(err, rc, "cannot bind server.socket %s: %s", path, uv_strerror(rc));
    if (chmod(path, (mode_t)s->cfg->socket_mode) < 0)
        return msm_err_set(err, -errno, "cannot chmod %s to %o: %s", path, s->cfg->socket_mode, strerror(errno));
    if ((rc = uv_listen((uv_stream_t *)&s->unix_listener, 512, on_connection)) < 0)
        return msm_err_set(err, rc, "cannot listen on %s: %s", path, uv_strerror(rc));
    msm_log_info("listening on unix:%s (mode %04o)", path, s->cfg->socket_mode);
    return 0;
}

int msm_server_listen(msm_server *s, msm_err *err) {
    int rc = msm_conn_set_init(&s->guards, s->loop, s->cfg->max_connections, s->cfg->idle_timeout_s,
                               s->cfg->write_timeout_s, err);
    if (rc < 0)
        return rc;
    s->have_guards = true;
    if (s->cfg->socket[0] && (rc = listen_unix(s, err)) < 0)
        return rc;
    if (s->cfg->tcp_port) {
        if (msm_listen_loopback(s->cfg->tcp_host) == 0)
            msm_log_warn("server.tcp_host = %s is not a loopback address (server.tcp_allow_remote = true): the TCP API "
                         "has no authentication; anyone who can reach %s:%d can use the model",
                         s->cfg->tcp_host, s->cfg->tcp_host, s->cfg->tcp_port);
        if ((rc = msm_listen_tcp(s->loop, &s->tcp_listener, s, s->cfg->tcp_host, s->cfg->tcp_port, "tcp",
                                 on_connection, &s->have_tcp, err)) < 0)
            return rc;
    }
    if (s->http && (rc = msm_http_listen(s->http, s->cfg->metrics_host, s->cfg->metrics_port, err)) < 0)
        return rc;
    if (s->http_api && (rc = msm_http_listen(s->http_api, s->cfg->http_host, s->cfg->http_port, err)) < 0)
        return rc;
    return 0;
}

static void close_listeners(msm_server *s) {
    if (s->have_unix && !uv_is_closing((uv_handle_t *)&s->unix_listener)) {
        uv_close((uv_handle_t *)&s->unix_listener, NULL);
        if (s->lock_fd >= 0)
            unlink(s->cfg->socket); /* ours: we hold its lock */
    }
    if (s->have_tcp && !uv_is_closing((uv_handle_t *)&s->tcp_listener))
        uv_close((uv_handle_t *)&s->tcp_listener, NULL);
    if (s->http)
        msm_http_stop(s->http);
    if (s->http_api)
        msm_http_stop(s->http_api);
}

static void close_if(uv_handle_t *h, bool have) {
    if (have && !uv_is_closing(h))
        uv_close(h, NULL);
}

/* Everything is drained (or cancelled): stop the scheduler, flush and close every handle. */
static void finish_shutdown(msm_server *s) {
    if (s->finished)
        return;
    s->finished = true;
    for (int g = 0; g < s->n_groups; g++)
        if (!s->groups[g].stuck) /* a stuck scheduler thread cannot be joined */
            msm_sched_stop(s->groups[g].sched);
    on_async(&s->async); /* deliver the last events (cancellations) */
    close_listeners(s);
    for (conn *c = s->conns; c; c = c->next)
        conn_close(c, true);
    if (s->http)
        msm_http_close(s->http);
    if (s->http_api)
        msm_http_close(s->http_api);
    /* A client that stopped reading must not hold the exit: the last flush is bounded. */
    if (s->have_guards)
        msm_conn_set_shutdown(&s->guards, SHUTDOWN_FLUSH_MS);
    close_if((uv_handle_t *)&s->drain_timer, s->have_drain_timer);
    close_if((uv_handle_t *)&s->watchdog, s->have_watchdog);
    close_if((uv_handle_t *)&s->step_watchdog, s->have_step_watchdog);
    close_if((uv_handle_t *)&s->sig_term, s->have_signals);
    close_if((uv_handle_t *)&s->sig_int, s->have_signals);
    close_if((uv_handle_t *)&s->sig_hup, s->have_signals);
    /* Closing libuv's signal handles restores the default action; a second SIGTERM (systemd or
     * an impatient operator) during the last clean-up must not turn a clean exit 0 into death by
     * signal, so ignore them from here on. */
    signal(SIGTERM, SIG_IGN);
    signal(SIGINT, SIG_IGN);
    close_if((uv_handle_t *)&s->async, true);
    msm_log_info("shutdown complete");
}

static void on_drain_timer(uv_timer_t *t) {
    msm_server *s = t->data;
    struct { int running, waiting; } st;
    totals(s, &st.running, &st.waiting);
    int inflight = 0;
    for (conn *c = s->conns; c; c = c->next)
        inflight += c->n_inflight;
    uint64_t now = uv_now(s->loop);
    if (st.running == 0 && st.waiting == 0 && inflight == 0) {
        finish_shutdown(s);
        return;
    }
    if (!s->drain_cancelled && now >= s->drain_deadline_ms) {
        msm_log_warn("drain timeout (%d s): cancelling %d running and %d waiting requests",
                     s->cfg->drain_timeout_s, st.running, st.waiting);
        msm_notify_status("drain timeout: cancelling %d requests", st.running + st.waiting);
        s->drain_cancelled = true;
        for (int g = 0; g < s->n_groups; g++)
            if (s->groups[g].sched)
                msm_sched_cancel_all(s->groups[g].sched);
    } else if (s->drain_cancelled && now >= s->drain_deadline_ms + 5000) {
        msm_log_error("requests still in flight 5 s after cancelling them; closing anyway");
        finish_shutdown(s);
    }
}

void msm_server_close(msm_server *s) {
    s->draining = true;
    finish_shutdown(s);
}

int msm_server_exit_status(const msm_server *s) {
    return s->exit_status;
}

/* A group's engine failed for good (its requests have ended with the error): health is no longer
 * serving, and the daemon drains the other groups and exits non-zero, so that systemd restarts
 * it on a fresh device context. */
static void fatal_engine(msm_server *s, int g, const msm_err *why) {
    if (s->exit_status)
        return;
    s->exit_status = 1;
    msm_log_error("group %d: %s; shutting down to be restarted", g, why->msg);
    msm_notify_status("failed: group %d: %s", g, why->msg);
    msm_server_shutdown(s);
}

void msm_server_shutdown(msm_server *s) {
    if (s->draining)
        return;
    s->draining = true;
    struct { int running, waiting; } st;
    totals(s, &st.running, &st.waiting);
    msm_log_info("shutting down: draining %d running and %d waiting requests (up to %d s)", st.running,
                 st.waiting, s->cfg->drain_timeout_s);
    msm_notify_stopping("draining in-flight requests");
    close_listeners(s);
    s->drain_deadline_ms = uv_now(s->loop) + (uint64_t)s->cfg->drain_timeout_s * 1000;
    if (uv_timer_init(s->loop, &s->drain_timer) == 0) {
        s->have_drain_timer = true;
        s->drain_timer.data = s;
        uv_timer_start(&s->drain_timer, on_drain_timer, 0, 50);
    } else {
        finish_shutdown(s);
    }
}

static void on_signal(uv_signal_t *h, int signum) {
    msm_server *s = h->data;
    if (signum == SIGHUP) {
        int rc = msm_log_reopen();
        if (rc < 0)
            msm_log_error("SIGHUP: cannot reopen the log file: %s", strerror(-rc));
        else
            msm_log_info("SIGHUP: log file reopened");
        return;
    }
    msm_log_info("received %s", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    msm_server_shutdown(s);
}

static void on_watchdog(uv_timer_t *t) {
    msm_server *s = t->data;
    /* A group whose engine fails every step is not healthy: let systemd restart us. */
    bool ok = true;
    for (int g = 0; g < s->n_groups && ok; g++) {
        msm_sched_stats st;
        group_stats(s, g, &st);
        ok = !st.engine_failed;
    }
    if (ok)
        msm_notify_watchdog();
}

bool msm_server_stuck(const msm_server *s) {
    return s->stuck;
}

/* How long an engine step may run before its group counts as stuck: every wait inside a step
 * gives up at engine.deadline_ms, so a step still running at twice that (plus a margin for the
 * compute itself) is blocked where no deadline reaches, e.g. inside a collective library's
 * teardown. */
static uint64_t step_limit_ms(const msm_server *s) {
    return 2 * (uint64_t)s->cfg->deadline_ms + 5000;
}

/* A group's engine step never returned: its requests end with INTERNAL now (the scheduler that
 * owns them is blocked inside the step), health stops serving, and the daemon drains the other
 * groups and exits 1 without joining that group's threads (msm_server_stuck; main exits at once),
 * so systemd restarts it on a fresh device context. */
static void stuck_group(msm_server *s, int g, uint64_t ms) {
    group *gr = &s->groups[g];
    gr->stuck = true;
    s->stuck = true;
    s->exit_status = 1;
    msm_err why;
    msm_err_set(&why, -ENOTRECOVERABLE, "group %d: an engine step has not returned for %llu ms (engine.deadline_ms "
                                        "%d): the device or a collective is stuck", g, (unsigned long long)ms,
                s->cfg->deadline_ms);
    msm_log_error("%s; ending its requests and exiting to be restarted", why.msg);
    msm_notify_status("failed: %s", why.msg);
    for (conn *c = s->conns; c; c = c->next) {
        for (int i = 0; i < c->n_inflight;) {
            inflight *f = &c->inflight[i];
            if (f->group != g) {
                i++;
                continue;
            }
            /* the stream's end, as the scheduler would have sent it (FINISH_ERROR, INTERNAL) */
            msm_sched_event ev = {.conn_id = c->id, .request_id = f->rid, .finish = MSM_FINISH_ERROR,
                                  .error = -ENOTRECOVERABLE, .error_msg = why};
            size_t len;
            uint8_t *out = c->closing ? NULL : msm_api_encode_event(&ev, &len);
            if (out)
                conn_write(c, out, len);
            inflight_del(c, f->rid); /* moves the last one here */
        }
        conn_maybe_done(c);
    }
    msm_http_fail_group(s->http_api, g, -ENOTRECOVERABLE, &why);
    gr->load = 0;
    msm_server_shutdown(s);
}

static void on_step_watchdog(uv_timer_t *t) {
    msm_server *s = t->data;
    for (int g = 0; g < s->n_groups; g++) {
        uint64_t ms = s->groups[g].sched && !s->groups[g].stuck ? msm_sched_step_running_ms(s->groups[g].sched) : 0;
        if (ms > step_limit_ms(s))
            stuck_group(s, g, ms);
    }
}

int msm_server_install_signals(msm_server *s, msm_err *err) {
    int rc;
    uv_signal_init(s->loop, &s->sig_term);
    uv_signal_init(s->loop, &s->sig_int);
    uv_signal_init(s->loop, &s->sig_hup);
    s->have_signals = true;
    s->sig_term.data = s->sig_int.data = s->sig_hup.data = s;
    if ((rc = uv_signal_start(&s->sig_term, on_signal, SIGTERM)) < 0 ||
        (rc = uv_signal_start(&s->sig_int, on_signal, SIGINT)) < 0 ||
        (rc = uv_signal_start(&s->sig_hup, on_signal, SIGHUP)) < 0)
        return msm_err_set(err, rc, "cannot install signal handlers: %s", uv_strerror(rc));
    uv_timer_init(s->loop, &s->step_watchdog);
    s->have_step_watchdog = true;
    s->step_watchdog.data = s;
    uv_timer_start(&s->step_watchdog, on_step_watchdog, 500, 500);
    uint64_t wd = msm_notify_watchdog_usec();
    if (wd > 0) {
        uv_timer_init(s->loop, &s->watchdog);
        s->have_watchdog = true;
        s->watchdog.data = s;
        uint64_t ms = wd / 2000;
        uv_timer_start(&s->watchdog, on_watchdog, 0, ms ? ms : 1);
        msm_log_info("systemd watchdog: pinging every %llu ms", (unsigned long long)(ms ? ms : 1));
    }
    return 0;
}

/* msm_http: H2O on the loop, routes, authentication, limits, and the lifecycle of a generation
 * request from its JSON body to its last byte (see msm_http.h).
 *
 * Lifetimes: H2O owns each h2o_req_t and frees its memory pool when the request is done or its
 * connection goes away. A generation request (gen_req) lives from submission until its response
 * is sent or H2O disposes of the h2o_req_t, whichever comes first; a small object in the pool,
 * allocated with a dispose callback, ties the two: when H2O disposes first, the callback cancels the
 * request's choices on the scheduler and frees the gen_req; when the response is sent first, the
 * gen_req unties itself before it is freed. Buffers handed to h2o_send live in the request's pool
 * (H2O writes them after h2o_send returns). Events of a request that is gone find no gen_req and
 * are dropped by the server. Before a gen_req exists, the body is parsed (its text encoded) on
 * libuv's thread pool by a text_job, tied to the h2o_req_t the same way; so are /tokenize and
 * /detokenize. */
#include "msm_http.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include <h2o.h>

#include "msm_chat_template.h"
#include "msm_listen.h"
#include "msm_log.h"
#include "msm_openai.h"
#include "msm_strbuf.h"

#define REQ_BUCKETS 256
#define MAX_API_KEY 4096

typedef struct hconn {
    uv_tcp_t tcp;             /* first: H2O's close callback gets the handle */
    msm_http *h;
    msm_conn_guard guard;     /* server.max_connections and server.write_timeout_s (msm_listen.h) */
    struct hconn *prev, *next;
} hconn;

typedef struct gen_req gen_req;

/* In the h2o_req_t's pool: the dispose callback's way back to the gen_req. */
typedef struct req_link {
    gen_req *q;
} req_link;

struct gen_req {
    h2o_generator_t gen;      /* first: proceed / stop get it */
    msm_http *h;
    h2o_req_t *req;
    req_link *link;
    uint64_t conn_id;
    msm_oai_request r;
    msm_oai_reply rp;
    msm_oai_choice *chs;      /* [n] */
    int *group;               /* [n] the TP group of each submitted choice, -1 before */
    int n, n_done;
    bool started, writing;
    msm_strbuf pending;       /* SSE bytes not handed to H2O yet */
    gen_req *hnext;
};

struct msm_http {
    uv_loop_t *loop;
    msm_http_host host;
    char what[32];
    bool metrics_only;
    int max_header_bytes, max_connections;
    msm_conn_set *guards;     /* NULL: no guard */
    char *api_key;
    size_t api_key_len;
    char model[256];
    msm_api_limits limits;
    const msm_api_model_info *info;
    msm_chat_template *chat;
    char chat_off[600];
    msm_oai_ctx oai;

    h2o_globalconf_t config;
    h2o_context_t ctx;
    h2o_accept_ctx_t accept_ctx;
    bool have_ctx;
    uv_tcp_t listener;
    bool have_listener, stopped;
    hconn *conns;
    int n_conns;
    gen_req *buckets[REQ_BUCKETS];
    uint64_t n_replies;
};

/* ---- small replies ---- */

static const char *reason(int status) {
    switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 401: return "Unauthorized";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    default: return status >= 500 ? "Internal Server Error" : "Error";
    }
}

static void send_body(h2o_req_t *req, int status, const char *type, const char *body, size_t len) {
    req->res.status = status;
    req->res.reason = reason(status);
    req->res.content_length = len;
    h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, type, strlen(type));
    h2o_send_inline(req, body, len);
}

static void send_json(h2o_req_t *req, int status, char *body, size_t len) {
    if (!body) {
        static const char oom[] = "{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,"
                                  "\"code\":null}}";
        send_body(req, 503, "application/json", oom, sizeof oom - 1);
        return;
    }
    send_body(req, status, "application/json", body, len);
    free(body);
}

static void send_error(h2o_req_t *req, const msm_oai_error *e) {
    size_t len = 0;
    char *body = msm_oai_error_json(e, &len);
    send_json(req, e->status, body, len);
}

static int fail(h2o_req_t *req, int status, const char *param, const char *fmt, const char *arg) {
    msm_oai_error e;
    msm_oai_fail(&e, status, param, fmt, arg);
    send_error(req, &e);
    return 0;
}

/* The HTTP status of a submission failure (msm_code.h's errnos). */
static int submit_status(int rc) {
    switch (rc) {
    case -EINVAL: case -ENOSPC: case -ENOTSUP: return 400;
    case -EAGAIN: return 429;
    case -ESHUTDOWN: case -ENOMEM: return 503;
    default: return 500;
    }
}

/* ---- generation requests ---- */

static unsigned bucket_of(uint64_t id) {
    return (unsigned)(id % REQ_BUCKETS);
}

static void req_hash_del(msm_http *h, gen_req *q) {
    for (gen_req **pp = &h->buckets[bucket_of(q->conn_id)]; *pp; pp = &(*pp)->hnext)
        if (*pp == q) {
            *pp = q->hnext;
            return;
        }
}

static gen_req *req_find(msm_http *h, uint64_t conn_id) {
    for (gen_req *q = h->buckets[bucket_of(conn_id)]; q; q = q->hnext)
        if (q->conn_id == conn_id)
            return q;
    return NULL;
}

/* Cancels the choices still running (each group once). */
static void cancel_choices(gen_req *q) {
    for (int k = 0; k < q->n; k++) {
        int g = q->group[k];
        bool seen = g < 0 || q->chs[k].done;
        for (int j = 0; j < k && !seen; j++)
            seen = q->group[j] == g && !q->chs[j].done;
        if (!seen)
            q->h->host.cancel(q->h->host.ctx, g, q->conn_id);
    }
}

static void gen_req_free(gen_req *q) {
    if (!q)
        return;
    for (int k = 0; q->chs && k < q->n; k++)
        msm_oai_choice_done(&q->chs[k]);
    free(q->chs);
    free(q->group);
    msm_oai_request_done(&q->r);
    msm_strbuf_done(&q->pending);
    free(q);
}

/* The response is out (or about to be): untie from the h2o_req_t and free. */
static void gen_req_finish(gen_req *q) {
    if (q->link)
        q->link->q = NULL;
    req_hash_del(q->h, q);
    gen_req_free(q);
}

/* H2O disposes of the request (done, or its connection is gone): cancel what still runs. */
static void on_req_dispose(void *p) {
    req_link *l = p;
    gen_req *q = l->q;
    if (!q)
        return;
    msm_log_debug("http: request %llu went away; cancelling its %d unfinished choice(s)",
                  (unsigned long long)q->conn_id, q->n - q->n_done);
    q->req = NULL;
    q->link = NULL;
    cancel_choices(q);
    req_hash_del(q->h, q);
    gen_req_free(q);
}

static void on_proceed(h2o_generator_t *g, h2o_req_t *req);
static void on_stop(h2o_generator_t *g, h2o_req_t *req) {
    /* the pool's dispose callback (on_req_dispose) does the work */
}

/* Hands the pending SSE bytes to H2O when it is not busy writing; the last call (everything done)
 * sends them as the final part and frees q. */
static void stream_flush(gen_req *q) {
    if (q->writing || !q->req)
        return;
    bool final = q->n_done == q->n;
    if (q->pending.len == 0 && !final)
        return;
    h2o_req_t *req = q->req;
    h2o_iovec_t buf = h2o_strdup(&req->pool, q->pending.data ? q->pending.data : "", q->pending.len);
    q->pending.len = 0;
    if (!q->started) {
        static const char sse[] = "text/event-stream", nc[] = "no-cache";
        req->res.status = 200;
        req->res.reason = "OK";
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CONTENT_TYPE, NULL, sse, sizeof sse - 1);
        h2o_add_header(&req->pool, &req->res.headers, H2O_TOKEN_CACHE_CONTROL, NULL, nc, sizeof nc - 1);
        q->gen.proceed = on_proceed;
        q->gen.stop = on_stop;
        h2o_start_response(req, &q->gen);
        q->started = true;
    }
    if (final) {
        gen_req_finish(q);
        h2o_send(req, &buf, 1, H2O_SEND_STATE_FINAL);
        return;
    }
    q->writing = true;
    h2o_send(req, &buf, 1, H2O_SEND_STATE_IN_PROGRESS);
}

static void on_proceed(h2o_generator_t *g, h2o_req_t *req) {
    gen_req *q = (gen_req *)g;
    q->writing = false;
    stream_flush(q);
}

/* The first failed choice as an error (or 0). */
static int choice_error(const gen_req *q, msm_oai_error *e) {
    for (int k = 0; k < q->n; k++)
        if (q->chs[k].finish == MSM_FINISH_ERROR || q->chs[k].finish == MSM_FINISH_CANCELLED) {
            const msm_oai_choice *ch = &q->chs[k];
            if (ch->finish == MSM_FINISH_CANCELLED)
                return msm_oai_fail(e, 503, "", "the request was cancelled (the daemon is shutting down)");
            return msm_oai_fail(e, submit_status(ch->error) == 500 ? 500 : submit_status(ch->error), "", "%s",
                                ch->error_msg.msg);
        }
    return 0;
}

static void finish_plain(gen_req *q) {
    h2o_req_t *req = q->req;
    msm_oai_error e;
    size_t len = 0;
    char *body;
    int status = 200;
    if (choice_error(q, &e) < 0) {
        status = e.status;
        body = msm_oai_error_json(&e, &len);
    } else {
        body = msm_oai_render(&q->rp, q->chs, q->n, &len);
    }
    gen_req_finish(q);
    send_json(req, status, body, len);
}

void msm_http_fail_group(msm_http *h, int group, int error, const msm_err *msg) {
    if (!h)
        return;
    /* the (conn, choice) pairs first: an event may finish and free its request */
    size_t n = 0, cap = 0;
    struct { uint64_t conn_id; int k; } *todo = NULL;
    for (int b = 0; b < REQ_BUCKETS; b++)
        for (gen_req *q = h->buckets[b]; q; q = q->hnext)
            for (int k = 0; k < q->n; k++) {
                if (q->group[k] != group || q->chs[k].done)
                    continue;
                if (n == cap) {
                    size_t c2 = cap ? 2 * cap : 16;
                    void *t = realloc(todo, c2 * sizeof *todo);
                    if (!t)
                        goto out; /* out of memory: those requests end when the daemon exits */
                    todo = t;
                    cap = c2;
                }
                todo[n].conn_id = q->conn_id;
                todo[n++].k = k;
            }
out:
    for (size_t i = 0; i < n; i++) {
        msm_sched_event ev = {.conn_id = todo[i].conn_id, .request_id = (uint64_t)todo[i].k + 1,
                              .finish = MSM_FINISH_ERROR, .error = error, .error_msg = *msg};
        msm_http_event(h, &ev);
    }
    free(todo);
}

bool msm_http_event(msm_http *h, const msm_sched_event *ev) {
    gen_req *q = h ? req_find(h, ev->conn_id) : NULL;
    if (!q)
        return false;
    int k = (int)ev->request_id - 1;
    if (k < 0 || k >= q->n || q->chs[k].done)
        return true;
    msm_oai_choice *ch = &q->chs[k];
    if (msm_oai_choice_add(ch, ev) < 0 && !ch->done) {
        /* out of memory: this choice ends with an error, the scheduler stops it */
        ch->done = true;
        ch->finish = MSM_FINISH_ERROR;
        ch->error = msm_err_set(&ch->error_msg, -ENOMEM, "out of memory");
        h->host.cancel(h->host.ctx, q->group[k], q->conn_id); /* cancels its siblings too: fine, it failed */
    }
    if (ch->done)
        q->n_done++;
    if (!q->r.stream) {
        if (q->n_done == q->n)
            finish_plain(q);
        return true;
    }
    msm_oai_stream_choice(&q->rp, ch, k, &q->pending);
    if (q->n_done == q->n) {
        msm_oai_error e;
        if (choice_error(q, &e) < 0)
            msm_oai_stream_error(&e, &q->pending);
        msm_oai_stream_end(&q->rp, q->chs, q->n, &q->pending);
    }
    stream_flush(q);
    return true;
}

/* A parsed generation request: one scheduler request per choice; the reply comes from events. */
static void start_generation(msm_http *h, h2o_req_t *req, msm_oai_request *r) {
    gen_req *q = calloc(1, sizeof *q);
    int n = r->n_prompts * r->n;
    if (!q || !(q->chs = calloc((size_t)n, sizeof *q->chs)) || !(q->group = malloc((size_t)n * sizeof *q->group))) {
        gen_req_free(q);
        msm_oai_request_done(r);
        fail(req, 503, "", "%s", "out of memory");
        return;
    }
    q->h = h;
    q->req = req;
    q->r = *r;
    q->n = n;
    q->conn_id = h->host.new_conn_id(h->host.ctx);
    q->rp = (msm_oai_reply){.req = &q->r, .model = h->model, .tok = h->limits.tok, .created = (long long)time(NULL)};
    snprintf(q->rp.id, sizeof q->rp.id, "%s-%llx%06llx", r->kind == MSM_OAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)q->rp.created, (unsigned long long)++h->n_replies);
    for (int k = 0; k < n; k++) {
        q->chs[k].prompt = &q->r.prompts[k / q->r.n];
        q->group[k] = -1;
    }
    for (int k = 0; k < n; k++) {
        msm_err err = {{0}};
        msm_gen_request *g = msm_oai_gen_request(&q->r, k);
        int rc = g ? 0 : msm_err_set(&err, -ENOMEM, "out of memory");
        if (g) {
            g->conn_id = q->conn_id;
            g->request_id = (uint64_t)k + 1;
            if ((rc = h->host.submit(h->host.ctx, g, &q->group[k], &err)) < 0)
                msm_gen_request_free(g);
        }
        if (rc < 0) {
            msm_oai_error e;
            msm_oai_fail(&e, submit_status(rc), "", "%s", err.msg);
            cancel_choices(q);
            gen_req_free(q);
            send_error(req, &e);
            return;
        }
    }
    q->link = h2o_mem_alloc_shared(&req->pool, sizeof *q->link, on_req_dispose);
    q->link->q = q;
    q->hnext = h->buckets[bucket_of(q->conn_id)];
    h->buckets[bucket_of(q->conn_id)] = q;
}

/* ---- routes ---- */

static bool is(h2o_iovec_t v, const char *s) {
    return v.len == strlen(s) && memcmp(v.base, s, v.len) == 0;
}

/* Constant-time comparison of the bearer token (its length leaks, not its bytes). */
static bool authorized(const msm_http *h, h2o_req_t *req) {
    ssize_t i = h2o_find_header(&req->headers, H2O_TOKEN_AUTHORIZATION, -1);
    if (i < 0)
        return false;
    h2o_iovec_t v = req->headers.entries[i].value;
    static const char bearer[] = "Bearer ";
    if (v.len != sizeof bearer - 1 + h->api_key_len || memcmp(v.base, bearer, sizeof bearer - 1) != 0)
        return false;
    volatile unsigned char diff = 0;
    for (size_t k = 0; k < h->api_key_len; k++)
        diff |= (unsigned char)(v.base[sizeof bearer - 1 + k] ^ h->api_key[k]);
    return diff == 0;
}

static size_t header_bytes(const h2o_req_t *req) {
    size_t n = req->input.method.len + req->input.path.len + 16;
    for (size_t i = 0; i < req->headers.size; i++)
        n += req->headers.entries[i].name->len + req->headers.entries[i].value.len + 4;
    return n;
}

typedef enum route { R_NONE, R_HEALTH, R_METRICS, R_MODELS, R_TOKINFO, R_TOKENIZE, R_DETOKENIZE, R_COMPLETIONS,
                     R_CHAT } route;

static route find_route(h2o_iovec_t path, bool *ret_post) {
    static const struct { const char *path; route r; bool post; } table[] = {
        {"/health", R_HEALTH, false},          {"/metrics", R_METRICS, false},
        {"/v1/models", R_MODELS, false},       {"/tokenizer_info", R_TOKINFO, false},
        {"/tokenize", R_TOKENIZE, true},       {"/detokenize", R_DETOKENIZE, true},
        {"/v1/completions", R_COMPLETIONS, true}, {"/v1/chat/completions", R_CHAT, true},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        if (is(path, table[i].path)) {
            *ret_post = table[i].post;
            return table[i].r;
        }
    return R_NONE;
}

/* ---- text work, off the loop thread ----
 * A generation request's parse encodes its prompts (and renders chat messages), /tokenize encodes
 * and /detokenize decodes: up to http.max_body_bytes of text, hundreds of milliseconds a MiB. As
 * on the socket API (docs/adr/0007-hardening.md), that runs on libuv's thread pool, with a copy of
 * the body, and comes back on the loop thread. The parsers only read h->oai and the tokenizer,
 * both immutable. A link in the request's pool ties the job to the h2o_req_t, as for gen_req:
 * when H2O disposes of the request first, the job's answer is dropped. */
typedef struct text_job text_job;

typedef struct text_link {
    text_job *j;
} text_link;

struct text_job {
    uv_work_t work;
    msm_http *h;
    h2o_req_t *req;           /* NULL once H2O disposed of it */
    text_link *link;
    route r;
    char *body;               /* [len + 1] a copy, NUL-terminated */
    size_t len;
    int rc;                   /* completions, chat: the parse's */
    msm_oai_request oreq;     /* completions, chat: the request when rc == 0 */
    char *out;                /* tokenize, detokenize: the JSON answer, or NULL */
    size_t out_len;
    msm_oai_error e;
};

static void on_text_req_dispose(void *p) {
    text_link *l = p;
    if (l->j)
        l->j->req = NULL;
}

static void text_work(uv_work_t *w) {
    text_job *j = w->data;
    const msm_oai_ctx *c = &j->h->oai;
    switch (j->r) {
    case R_CHAT:
        j->rc = msm_oai_parse_chat(c, j->body, j->len, &j->oreq, &j->e);
        break;
    case R_COMPLETIONS:
        j->rc = msm_oai_parse_completion(c, j->body, j->len, &j->oreq, &j->e);
        break;
    case R_TOKENIZE:
        j->out = msm_oai_tokenize(c, j->body, j->len, &j->out_len, &j->e);
        break;
    default:
        j->out = msm_oai_detokenize(c, j->body, j->len, &j->out_len, &j->e);
        break;
    }
}

static void text_done(uv_work_t *w, int status) {
    text_job *j = w->data;
    msm_http *h = j->h;
    h2o_req_t *req = j->req;
    bool generation = j->r == R_CHAT || j->r == R_COMPLETIONS;
    (void)status; /* never cancelled */
    if (req)
        j->link->j = NULL;
    if (!req) {
        if (generation && j->rc == 0)
            msm_oai_request_done(&j->oreq); /* its client is gone */
    } else if (generation && j->rc < 0) {
        msm_log_debug("%s: %.*s: %d %s", h->what, (int)req->path_normalized.len, req->path_normalized.base,
                      j->e.status, j->e.msg.msg);
        send_error(req, &j->e);
    } else if (generation) {
        start_generation(h, req, &j->oreq); /* takes oreq */
    } else if (!j->out) {
        send_error(req, &j->e);
    } else {
        send_json(req, 200, j->out, j->out_len); /* takes out */
        j->out = NULL;
    }
    free(j->out);
    free(j->body);
    free(j);
}

/* Hands route r's text work on the request's body to the thread pool; the answer follows. */
static void queue_text(msm_http *h, h2o_req_t *req, route r) {
    text_job *j = calloc(1, sizeof *j);
    char *body = malloc(req->entity.len + 1);
    if (!j || !body) {
        free(j);
        free(body);
        fail(req, 503, "", "%s", "out of memory");
        return;
    }
    if (req->entity.len)
        memcpy(body, req->entity.base, req->entity.len);
    body[req->entity.len] = 0;
    j->body = body;
    j->len = req->entity.len;
    j->h = h;
    j->req = req;
    j->r = r;
    j->work.data = j;
    int rc = uv_queue_work(h->loop, &j->work, text_work, text_done);
    if (rc < 0) {
        free(j->body);
        free(j);
        fail(req, 503, "", "cannot queue the text work: %s", uv_strerror(rc));
        return;
    }
    j->link = h2o_mem_alloc_shared(&req->pool, sizeof *j->link, on_text_req_dispose);
    j->link->j = j;
}

static int on_req(h2o_handler_t *self, h2o_req_t *req) {
    msm_http *h = *(msm_http **)(self + 1);
    bool post = false;
    route r = find_route(req->path_normalized, &post);
    if (header_bytes(req) > (size_t)h->max_header_bytes) {
        char cap[32];
        snprintf(cap, sizeof cap, "%d", h->max_header_bytes);
        req->http1_is_persistent = 0;
        return fail(req, 431, "", "the request line and headers exceed http.max_header_bytes = %s", cap);
    }
    if (h->metrics_only && r != R_METRICS)
        r = R_NONE;
    if (r == R_NONE)
        return fail(req, 404, "", "no route %s", h2o_strdup(&req->pool, req->path_normalized.base,
                                                             req->path_normalized.len).base);
    bool is_post = is(req->method, "POST");
    if (post != is_post && !(!post && is(req->method, "HEAD")))
        return fail(req, 405, "", "use %s on this route", post ? "POST" : "GET");
    if (h->api_key && r != R_HEALTH && r != R_METRICS && !authorized(h, req))
        return fail(req, 401, "", "%s", "Incorrect or missing API key: send \"Authorization: Bearer <key>\"");
    size_t len = 0;
    char *out = NULL;
    char why[160];
    switch (r) {
    case R_HEALTH: {
        bool ok = h->host.health(h->host.ctx, why, sizeof why);
        char body[256];
        int n = snprintf(body, sizeof body, "{\"status\":\"%s\",\"detail\":\"%s\"}", ok ? "ok" : "unavailable", why);
        send_body(req, ok ? 200 : 503, "application/json", body, (size_t)n);
        return 0;
    }
    case R_METRICS:
        out = h->host.metrics_text(h->host.ctx, &len);
        if (!out)
            return fail(req, 503, "", "%s", "out of memory");
        send_body(req, 200, "text/plain; version=0.0.4; charset=utf-8", out, len);
        free(out);
        return 0;
    case R_MODELS:
        out = msm_oai_models(&h->oai, h->info, (long long)time(NULL), &len);
        send_json(req, 200, out, len);
        return 0;
    case R_TOKINFO:
        out = msm_oai_tokenizer_info(&h->oai, h->info, &len);
        send_json(req, 200, out, len);
        return 0;
    case R_TOKENIZE:
    case R_DETOKENIZE:
    case R_COMPLETIONS:
    case R_CHAT:
        queue_text(h, req, r);
        return 0;
    case R_NONE:
        break;
    }
    return -1;
}

/* ---- connections ---- */

static void on_conn_closed(uv_handle_t *handle) {
    hconn *c = (hconn *)handle;
    msm_http *h = c->h;
    if (c->prev)
        c->prev->next = c->next;
    else
        h->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    h->n_conns--;
    msm_conn_guard_remove(&c->guard);
    free(c);
}

static void on_refused_closed(uv_handle_t *handle) {
    free(handle);
}

/* A connection over a connection cap (`cap` names it): a 503 written at once (into the socket
 * buffer, which a fresh connection has room for), then closed before H2O sees it. */
static void refuse(hconn *c, const char *cap) {
    char body[192], msg[384];
    int n = snprintf(body, sizeof body, "{\"error\":{\"message\":\"too many connections (%s)\","
                     "\"type\":\"server_error\",\"param\":null,\"code\":null}}", cap);
    int m = snprintf(msg, sizeof msg, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Connection: close\r\nContent-Length: %d\r\n\r\n%s", n, body);
    uv_buf_t b = uv_buf_init(msg, (unsigned)m);
    uv_try_write((uv_stream_t *)&c->tcp, &b, 1);
    msm_conn_guard_remove(&c->guard);
    uv_close((uv_handle_t *)&c->tcp, on_refused_closed);
}

/* The guard set's verdict: the client took none of its reply for server.write_timeout_s (or for
 * the last flush at shutdown). H2O has no call that closes a connection from outside: shutting
 * the socket down fails the pending write, and H2O closes the connection its own way. */
static void on_guard_timeout(msm_conn_guard *g, msm_conn_timeout why) {
    hconn *c = g->owner;
    (void)why; /* MSM_CONN_STALLED: the guard is busy for good, never idle */
    msm_log_warn("%s: a client took none of its %zu queued reply bytes in time (server.write_timeout_s, or the "
                 "last flush at shutdown); closing its connection", c->h->what,
                 uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp));
    uv_os_fd_t fd;
    if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
        shutdown(fd, SHUT_RDWR);
}

static void on_connection(uv_stream_t *listener, int status) {
    msm_http *h = listener->data;
    if (status < 0) {
        msm_log_warn("%s: accept failed: %s", h->what, uv_strerror(status));
        return;
    }
    hconn *c = calloc(1, sizeof *c);
    if (!c || uv_tcp_init(h->loop, &c->tcp) < 0) {
        free(c);
        return;
    }
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) < 0) {
        uv_close((uv_handle_t *)&c->tcp, on_refused_closed);
        return;
    }
    if (h->n_conns >= h->max_connections) {
        refuse(c, "http.max_connections");
        return;
    }
    if (h->guards) {
        if (msm_conn_guard_add(h->guards, &c->guard, (uv_stream_t *)&c->tcp, on_guard_timeout, c) < 0) {
            refuse(c, "server.max_connections, over every listener");
            return;
        }
        msm_conn_guard_set_busy(&c->guard, true); /* its idle time is H2O's (http.read_timeout_ms) */
    }
    c->h = h;
    c->next = h->conns;
    if (h->conns)
        h->conns->prev = c;
    h->conns = c;
    h->n_conns++;
    h2o_socket_t *sock = h2o_uv_socket_create((uv_stream_t *)&c->tcp, on_conn_closed);
    h2o_accept(&h->accept_ctx, sock);
}

/* ---- lifecycle ---- */

static int read_api_key(msm_http *h, const char *path, msm_err *err) {
    FILE *f = fopen(path, "r");
    if (!f)
        return msm_err_set(err, -errno, "http.api_key_file %s: cannot open: %s", path, strerror(errno));
    char *buf = malloc(MAX_API_KEY + 2);
    size_t n = buf ? fread(buf, 1, MAX_API_KEY + 1, f) : 0;
    fclose(f);
    if (!buf)
        return msm_err_set(err, -ENOMEM, "out of memory");
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        n--;
    buf[n] = 0;
    if (n == 0 || n > MAX_API_KEY || strlen(buf) != n) {
        free(buf);
        return msm_err_set(err, -EINVAL, "http.api_key_file %s must hold one key of 1..%d bytes (no NUL)", path,
                           MAX_API_KEY);
    }
    h->api_key = buf;
    h->api_key_len = n;
    return 0;
}

/* The chat template from tokenizer_config.json beside the tokenizer; chat is off (with the reason
 * logged and answered as 501) when there is none or msmoed cannot render it. */
static void load_chat_template(msm_http *h) {
    if (!h->info->tokenizer) {
        snprintf(h->chat_off, sizeof h->chat_off, "the daemon has no tokenizer");
        return;
    }
    char path[1200];
    const char *slash = strrchr(h->info->tokenizer, '/');
    int dir = slash ? (int)(slash - h->info->tokenizer) : 1;
    snprintf(path, sizeof path, "%.*s/tokenizer_config.json", dir, slash ? h->info->tokenizer : ".");
    msm_err err = {{0}};
    int rc = msm_chat_template_load(path, &h->chat, &err);
    if (rc == 0) {
        msm_log_info("%s: chat template %s (%s)", h->what, msm_chat_template_name(h->chat), path);
        return;
    }
    snprintf(h->chat_off, sizeof h->chat_off, "%s", err.msg);
    msm_log_warn("%s: /v1/chat/completions is off (it answers 501): %s", h->what, err.msg);
}

/* Handles H2O's context opens on the loop (its timers, its queue's async): unreferenced, so that
 * they do not keep uv_run going once the daemon's own handles are closed. */
typedef struct handle_set {
    uv_handle_t *h[256];
    int n;
} handle_set;

static void collect_handle(uv_handle_t *hd, void *arg) {
    handle_set *s = arg;
    if (s->n < 256)
        s->h[s->n++] = hd;
}

static void unref_new_handles(uv_loop_t *loop, const handle_set *before) {
    handle_set after = {.n = 0};
    uv_walk(loop, collect_handle, &after);
    for (int k = 0; k < after.n; k++) {
        bool old = false;
        for (int i = 0; i < before->n && !old; i++)
            old = before->h[i] == after.h[k];
        if (!old)
            uv_unref(after.h[k]);
    }
}

int msm_http_new(uv_loop_t *loop, const msm_http_opts *o, const msm_http_host *host, msm_http **ret, msm_err *err) {
    msm_http *h = calloc(1, sizeof *h);
    if (!h)
        return msm_err_set(err, -ENOMEM, "out of memory");
    h->loop = loop;
    h->host = *host;
    snprintf(h->what, sizeof h->what, "%s", o->what);
    h->metrics_only = o->metrics_only;
    h->max_header_bytes = o->max_header_bytes;
    h->max_connections = o->max_connections;
    h->guards = o->guards;
    h->limits = *o->limits;
    h->info = o->info;
    const char *model = o->model_name && o->model_name[0] ? o->model_name : NULL;
    if (!model) {
        const char *m = o->info->model ? o->info->model : "msmoed";
        size_t L = strlen(m);
        while (L > 1 && m[L - 1] == '/')
            L--;
        const char *s = m + L;
        while (s > m && s[-1] != '/')
            s--;
        snprintf(h->model, sizeof h->model, "%.*s", (int)(m + L - s), s);
    } else {
        snprintf(h->model, sizeof h->model, "%s", model);
    }
    int rc = 0;
    if (!o->metrics_only && o->api_key_file && o->api_key_file[0])
        rc = read_api_key(h, o->api_key_file, err);
    if (rc < 0) {
        msm_http_free(h);
        return rc;
    }
    if (!o->metrics_only)
        load_chat_template(h);
    h->oai = (msm_oai_ctx){.lim = &h->limits, .model = h->model, .chat = h->chat, .chat_off = h->chat_off};

    /* H2O: one host, one path, our handler; HTTP/1.1 only; the caps and the request timeout. */
    h2o_config_init(&h->config);
    h->config.max_request_entity_size = (size_t)o->max_body_bytes;
    h->config.http1.req_timeout = (uint64_t)o->read_timeout_ms;
    h->config.http1.upgrade_to_http2 = 0;
    h->config.server_name = h2o_iovec_init(H2O_STRLIT("msmoed"));
    h2o_hostconf_t *hc = h2o_config_register_host(&h->config, h2o_iovec_init(H2O_STRLIT("default")), 65535);
    h2o_pathconf_t *pc = h2o_config_register_path(hc, "/", 0);
    h2o_handler_t *hd = h2o_create_handler(pc, sizeof *hd + sizeof h);
    hd->on_req = on_req;
    *(msm_http **)(hd + 1) = h;
    handle_set *before = calloc(1, sizeof *before);
    if (!before) {
        h2o_config_dispose(&h->config);
        msm_http_free(h);
        return msm_err_set(err, -ENOMEM, "out of memory");
    }
    uv_walk(loop, collect_handle, before);
    h2o_context_init(&h->ctx, loop, &h->config);
    unref_new_handles(loop, before);
    free(before);
    h->have_ctx = true;
    h->accept_ctx.ctx = &h->ctx;
    h->accept_ctx.hosts = h->config.hosts;
    *ret = h;
    return 0;
}

int msm_http_listen(msm_http *h, const char *host, int port, msm_err *err) {
    return msm_listen_tcp(h->loop, &h->listener, h, host, port, h->what, on_connection, &h->have_listener, err);
}

void msm_http_stop(msm_http *h) {
    if (h->have_listener && !h->stopped) {
        h->stopped = true;
        uv_close((uv_handle_t *)&h->listener, NULL);
    }
}

void msm_http_close(msm_http *h) {
    msm_http_stop(h);
    /* H2O has no call that closes an HTTP/1 connection from outside; a shut-down socket reads EOF
     * and H2O closes it through its own path. */
    for (hconn *c = h->conns; c; c = c->next) {
        uv_os_fd_t fd;
        if (uv_fileno((uv_handle_t *)&c->tcp, &fd) == 0)
            shutdown(fd, SHUT_RDWR);
    }
}

void msm_http_free(msm_http *h) {
    if (!h)
        return;
    for (int b = 0; b < REQ_BUCKETS; b++)
        for (gen_req *q = h->buckets[b], *n; q; q = n) {
            n = q->hnext;
            if (q->link)
                q->link->q = NULL;
            gen_req_free(q);
        }
    if (h->have_ctx) {
        h2o_context_dispose(&h->ctx); /* runs the loop once (NOWAIT) to close its handles */
        h2o_config_dispose(&h->config);
    }
    msm_chat_template_free(h->chat);
    free(h->api_key);
    free(h);
}

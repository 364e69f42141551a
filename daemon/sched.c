/* msm_sched: continuous batching over the engine (see msm_sched.h for the policy).
 *
 * Ownership: the loop thread only touches the inbox (under s->mu) and the stats snapshot (under
 * s->stats_mu). Everything else — the waiting queue, the running set, every sequence's tokens and
 * block table, the KV pool through the vtable — belongs to whichever thread calls
 * msm_sched_iterate: the scheduler thread in the daemon, the test in the unit tests. */
#include "msm_sched.h"

#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msm_fairq.h"
#include "msm_textstream.h"

typedef struct seq {
    msm_gen_request *req;
    int32_t *tokens;          /* [n_tokens] prompt + generated so far */
    int n_tokens, cap_tokens;
    int n_cached;             /* tokens whose K/V are in the cache */
    int n_generated;
    int n_prompt_lp;          /* prompt positions whose logprobs went out (want_prompt_logprobs) */
    int32_t *blocks;          /* [n_blocks] block table */
    int n_blocks, cap_blocks;
    msm_textstream text;      /* with a tokenizer (engine tok): text deltas and stop strings */
    uint64_t inbox_order;     /* its place among the inbox's requests and cancels */
    struct seq *next;         /* inbox link */
    msm_fairq_node wait;      /* waiting-queue link */
} seq;

#define SEQ_OF(node) ((seq *)((char *)(node) - offsetof(seq, wait)))

typedef enum cancel_kind { CANCEL_ONE, CANCEL_CONN, CANCEL_ALL } cancel_kind;

typedef struct cancel_msg {
    cancel_kind kind;
    uint64_t conn_id, request_id;
    uint64_t inbox_order;     /* it applies to the requests submitted before it, never to later ones */
    struct cancel_msg *next;
} cancel_msg;

typedef struct batch_entry {
    seq *s;
    int n_feed;
    msm_step_output output;
} batch_entry;

struct msm_sched {
    msm_sched_opts o;
    msm_sched_engine e;
    msm_sched_emit_fn emit;
    void *emit_ctx;

    /* Inbox, filled by any thread. */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    seq *in_head, *in_tail;
    cancel_msg *cancels_head, *cancels_tail;
    uint64_t inbox_order;
    bool stop;
    atomic_int n_waiting;     /* inbox + waiting queue, for the max_queue check */
    atomic_bool dead;         /* the engine failed for good (-ENOTRECOVERABLE) */
    _Atomic uint64_t step_since_ms; /* CLOCK_MONOTONIC ms at which the step in progress began; 0: none */

    /* Scheduler-thread state. */
    msm_fairq waitq;          /* waiting requests, round-robin over connections */
    seq **running;            /* [max_seqs] in admission order */
    int n_running;
    batch_entry *batch;       /* [max_seqs] */
    msm_step_seq *step;       /* [max_seqs] */
    bool busy;
    int dead_error;           /* once dead: what every request still here, or arriving, ends with */
    msm_err dead_msg;

    pthread_t thread;
    bool thread_started;

    pthread_mutex_t stats_mu;
    msm_sched_stats stats;
};

const char *msm_finish_name(msm_finish f) {
    static const char *names[] = {"none", "length", "stop", "eos", "cancelled", "error"};
    return (unsigned)f < MSM_FINISH_COUNT_ ? names[f] : "unknown";
}

void msm_gen_request_free(msm_gen_request *r) {
    if (!r)
        return;
    free(r->prompt);
    free(r->stop_ids);
    for (int i = 0; i < r->n_stop_strings; i++)
        free(r->stop_strings ? r->stop_strings[i] : NULL);
    free(r->stop_strings);
    free(r);
}

static void seq_free(seq *q) {
    if (!q)
        return;
    msm_gen_request_free(q->req);
    free(q->tokens);
    free(q->blocks);
    msm_textstream_done(&q->text);
    free(q);
}

/* A sequence for r (not yet owning it): the prompt copied as its first tokens. NULL: no memory. */
static seq *seq_new(const msm_sched *s, msm_gen_request *r) {
    seq *q = calloc(1, sizeof *q);
    if (!q)
        return NULL;
    q->cap_tokens = r->n_prompt + 16;
    q->tokens = malloc((size_t)q->cap_tokens * sizeof *q->tokens);
    if (!q->tokens) {
        free(q);
        return NULL;
    }
    memcpy(q->tokens, r->prompt, (size_t)r->n_prompt * sizeof *q->tokens);
    q->n_tokens = r->n_prompt;
    if (s->e.tok)
        msm_textstream_init(&q->text, s->e.tok, r->stop_strings, r->n_stop_strings);
    return q;
}

int msm_sched_new(const msm_sched_opts *o, const msm_sched_engine *engine, msm_sched_emit_fn emit,
                  void *emit_ctx, msm_sched **ret, msm_err *err) {
    if (o->max_seqs < 1 || o->max_step_tokens < 1 || o->max_queue < 1)
        return msm_err_set(err, -EINVAL, "scheduler: max_seqs, max_step_tokens and max_queue must be >= 1");
    if (!engine->step || !engine->kv_alloc || !engine->kv_release || !engine->kv_n_free ||
        !engine->kv_total || engine->vocab < 1 || engine->max_context < 2)
        return msm_err_set(err, -EINVAL, "scheduler: incomplete engine vtable");
    msm_sched *s = calloc(1, sizeof *s);
    if (!s)
        return msm_err_set(err, -ENOMEM, "scheduler: out of memory");
    s->o = *o;
    s->e = *engine;
    s->emit = emit;
    s->emit_ctx = emit_ctx;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    pthread_mutex_init(&s->stats_mu, NULL);
    atomic_init(&s->n_waiting, 0);
    atomic_init(&s->dead, false);
    msm_fairq_init(&s->waitq);
    s->running = calloc((size_t)o->max_seqs, sizeof *s->running);
    s->batch = calloc((size_t)o->max_seqs, sizeof *s->batch);
    s->step = calloc((size_t)o->max_seqs, sizeof *s->step);
    if (!s->running || !s->batch || !s->step) {
        msm_sched_free(s);
        return msm_err_set(err, -ENOMEM, "scheduler: out of memory");
    }
    s->stats.kv_free = s->e.kv_n_free(s->e.ctx);
    s->stats.kv_used = s->e.kv_total(s->e.ctx) - s->stats.kv_free;
    *ret = s;
    return 0;
}

static void release_blocks(msm_sched *s, seq *q) {
    if (q->n_blocks > 0)
        s->e.kv_release(s->e.ctx, q->blocks, q->n_blocks);
    q->n_blocks = 0;
}

void msm_sched_free(msm_sched *s) {
    if (!s)
        return;
    msm_sched_stop(s);
    for (seq *q = s->in_head, *n; q; q = n) {
        n = q->next;
        seq_free(q);
    }
    for (cancel_msg *c = s->cancels_head, *n; c; c = n) {
        n = c->next;
        free(c);
    }
    for (msm_fairq_node *w; (w = msm_fairq_pop(&s->waitq));)
        seq_free(SEQ_OF(w));
    msm_fairq_done(&s->waitq);
    for (int i = 0; i < s->n_running; i++) {
        release_blocks(s, s->running[i]);
        seq_free(s->running[i]);
    }
    free(s->running);
    free(s->batch);
    free(s->step);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_mutex_destroy(&s->stats_mu);
    free(s);
}

/* ---- submission (any thread) ---- */

int msm_sched_submit(msm_sched *s, msm_gen_request **reqp, msm_err *err) {
    msm_gen_request *r = *reqp;
    if (r->n_prompt < 1)
        return msm_err_set(err, -EINVAL, "generate.prompt_ids is empty");
    if (r->n_prompt >= s->e.max_context)
        return msm_err_set(err, -EINVAL, "prompt has %d tokens; max context is %d tokens (prompt + generated)",
                           r->n_prompt, s->e.max_context);
    if (r->n_stop_strings > 0 && !s->e.tok)
        return msm_err_set(err, -ENOTSUP, "generate.stop_strings need a tokenizer, and this daemon has none "
                           "(no tokenizer.json in the model directory)");
    if (r->max_tokens < 0 || (r->max_tokens == 0 && !r->want_prompt_logprobs))
        return msm_err_set(err, -EINVAL, "max_tokens = %d: must be >= 1 (0 only when scoring the prompt)",
                           r->max_tokens);
    if (r->prompt_top_logprobs < 0 || r->prompt_top_logprobs > MSM_MAX_TOP_LOGPROBS)
        return msm_err_set(err, -EINVAL, "prompt top logprobs = %d: must be in [0, %d]", r->prompt_top_logprobs,
                           MSM_MAX_TOP_LOGPROBS);
    /* The sequence at its longest feeds prompt + max_tokens - 1 tokens (the last is not fed back).
     * It must fit the pool on its own, or preemption could never make room for it. */
    long longest = (long)r->n_prompt + (r->max_tokens > 0 ? r->max_tokens - 1 : 0);
    if (longest > s->e.max_context)
        longest = s->e.max_context;
    int need = msm_kv_blocks_for((int)longest), total = s->e.kv_total(s->e.ctx);
    if (need > total)
        return msm_err_set(err, -ENOSPC, "prompt (%d tokens) + max_tokens (%d) needs %d KV blocks; the pool has "
                           "%d (engine.kv_blocks)", r->n_prompt, r->max_tokens, need, total);
    seq *q = seq_new(s, r);
    if (!q)
        return msm_err_set(err, -ENOMEM, "out of memory");

    pthread_mutex_lock(&s->mu);
    int rc = 0;
    int waiting = atomic_load(&s->n_waiting);
    if (s->stop)
        rc = msm_err_set(err, -ESHUTDOWN, "the daemon is shutting down");
    else if (atomic_load(&s->dead))
        rc = msm_err_set(err, -ESHUTDOWN, "the engine failed and cannot run another step; the daemon is going down");
    else if (waiting >= s->o.max_queue)
        rc = msm_err_set(err, -EAGAIN, "queue is full: %d requests waiting (scheduler.max_queue = %d)", waiting,
                         s->o.max_queue);
    if (rc < 0) {
        pthread_mutex_unlock(&s->mu);
        seq_free(q); /* the request is still the caller's */
        return rc;
    }
    q->req = r;
    *reqp = NULL;
    q->inbox_order = ++s->inbox_order;
    if (s->in_tail)
        s->in_tail->next = q;
    else
        s->in_head = q;
    s->in_tail = q;
    atomic_fetch_add(&s->n_waiting, 1);
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    return 0;
}

static void push_cancel(msm_sched *s, cancel_kind kind, uint64_t conn_id, uint64_t request_id) {
    cancel_msg *c = calloc(1, sizeof *c);
    if (!c)
        return; /* the request then runs to its end; its output is dropped by the consumer */
    c->kind = kind;
    c->conn_id = conn_id;
    c->request_id = request_id;
    pthread_mutex_lock(&s->mu);
    c->inbox_order = ++s->inbox_order;
    if (s->cancels_tail)
        s->cancels_tail->next = c;
    else
        s->cancels_head = c;
    s->cancels_tail = c;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void msm_sched_cancel(msm_sched *s, uint64_t conn_id, uint64_t request_id) {
    push_cancel(s, CANCEL_ONE, conn_id, request_id);
}

void msm_sched_cancel_conn(msm_sched *s, uint64_t conn_id) {
    push_cancel(s, CANCEL_CONN, conn_id, 0);
}

void msm_sched_cancel_all(msm_sched *s) {
    push_cancel(s, CANCEL_ALL, 0, 0);
}

/* ---- events ---- */

static msm_sched_event *event_for(const seq *q) {
    msm_sched_event *ev = calloc(1, sizeof *ev);
    if (ev) {
        ev->conn_id = q->req->conn_id;
        ev->request_id = q->req->request_id;
    }
    return ev;
}

static void emit(msm_sched *s, msm_sched_event *ev) {
    if (ev)
        s->emit(s->emit_ctx, ev);
}

/* Moves the text ready to go out (all of it when final) into the event, reallocated to hold it. */
static msm_sched_event *event_attach_text(msm_sched_event *ev, seq *q, bool final) {
    if (!ev)
        return NULL;
    size_t n;
    const char *delta = msm_textstream_ready(&q->text, final, &n);
    msm_sched_event *e = realloc(ev, sizeof *e + n + 1);
    if (!e) {
        ev->text = NULL; /* this event goes out without text; the next one carries it */
        return ev;
    }
    e->text = (char *)(e + 1);
    memcpy(e->text, delta, n);
    e->text[n] = 0;
    e->text_len = n;
    msm_textstream_sent(&q->text, n);
    return e;
}

/* Ends a sequence: blocks back to the pool, a final event (unless ev already carries the last
 * token, in which case the finish rides on it), the sequence freed. The caller has unlinked it.
 * With MSM_FINISH_ERROR, error (a negative errno) and msg say what went wrong. */
static void finish_seq(msm_sched *s, seq *q, msm_finish why, msm_sched_event *ev, int error, const msm_err *msg) {
    if (!ev)
        ev = event_for(q);
    if (s->e.tok) {
        /* The last event carries all the text still held, unless a stop string cut it. */
        msm_textstream_finish(&q->text);
        ev = event_attach_text(ev, q, true);
    }
    if (ev) {
        ev->finish = why;
        ev->prompt_tokens = q->req->n_prompt;
        ev->completion_tokens = q->n_generated;
        if (why == MSM_FINISH_ERROR) {
            ev->error = error;
            ev->error_msg = *msg;
        }
    }
    release_blocks(s, q);
    s->stats.finished[why]++;
    emit(s, ev);
    seq_free(q);
}

static void remove_running(msm_sched *s, int i) {
    memmove(&s->running[i], &s->running[i + 1], (size_t)(s->n_running - i - 1) * sizeof *s->running);
    s->n_running--;
}

static bool cancel_matches(const cancel_msg *c, const seq *q) {
    switch (c->kind) {
    case CANCEL_ONE: return q->req->conn_id == c->conn_id && q->req->request_id == c->request_id;
    case CANCEL_CONN: return q->req->conn_id == c->conn_id;
    case CANCEL_ALL: return true;
    }
    return false;
}

static void apply_cancel(msm_sched *s, const cancel_msg *c) {
    for (int i = 0; i < s->n_running;) {
        if (cancel_matches(c, s->running[i])) {
            seq *q = s->running[i];
            remove_running(s, i);
            finish_seq(s, q, MSM_FINISH_CANCELLED, NULL, 0, NULL);
        } else {
            i++;
        }
    }
    for (msm_fairq_node *prev = NULL, *w = s->waitq.head, *next; w; w = next) {
        next = w->next;
        seq *q = SEQ_OF(w);
        if (cancel_matches(c, q)) {
            msm_fairq_remove(&s->waitq, prev, w);
            atomic_fetch_sub(&s->n_waiting, 1);
            finish_seq(s, q, MSM_FINISH_CANCELLED, NULL, 0, NULL);
        } else {
            prev = w;
        }
    }
}

/* ---- scheduling ---- */

static void wait_push_front(msm_sched *s, seq *q) {
    msm_fairq_push_front(&s->waitq, &q->wait, q->req->conn_id);
    atomic_fetch_add(&s->n_waiting, 1);
}

static seq *wait_head(const msm_sched *s) {
    return s->waitq.head ? SEQ_OF(s->waitq.head) : NULL;
}

static seq *wait_pop(msm_sched *s) {
    msm_fairq_node *w = msm_fairq_pop(&s->waitq);
    if (!w)
        return NULL;
    atomic_fetch_sub(&s->n_waiting, 1);
    return SEQ_OF(w);
}

static int ensure_block_cap(seq *q, int n) {
    if (n <= q->cap_blocks)
        return 0;
    int cap = q->cap_blocks ? q->cap_blocks * 2 : 8;
    while (cap < n)
        cap *= 2;
    int32_t *b = realloc(q->blocks, (size_t)cap * sizeof *b);
    if (!b)
        return -ENOMEM;
    q->blocks = b;
    q->cap_blocks = cap;
    return 0;
}

/* Gives q blocks for its first n_tokens tokens. -ENOSPC when the pool is short (nothing taken). */
static int grow_blocks(msm_sched *s, seq *q, int n_tokens) {
    int need = msm_kv_blocks_for(n_tokens) - q->n_blocks;
    if (need <= 0)
        return 0;
    if (ensure_block_cap(q, q->n_blocks + need) < 0)
        return -ENOMEM;
    int rc = s->e.kv_alloc(s->e.ctx, need, q->blocks + q->n_blocks);
    if (rc < 0)
        return rc;
    q->n_blocks += need;
    return 0;
}

/* Preemption by recompute: the youngest running sequence loses its cache and goes back to the
 * head of the queue; its prompt is now prompt + generated (tokens[] already holds exactly that). */
static seq *preempt_youngest(msm_sched *s) {
    seq *v = s->running[s->n_running - 1];
    s->n_running--;
    release_blocks(s, v);
    v->n_cached = 0;
    wait_push_front(s, v);
    s->stats.preemptions++;
    return v;
}

static int build_step(msm_sched *s) {
    int n = 0, budget = s->o.max_step_tokens;

    /* 1. Decode rows, oldest first. */
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        seq *q = s->running[i];
        if (q->n_tokens - q->n_cached != 1)
            continue;
        bool preempted_self = false;
        while (grow_blocks(s, q, q->n_cached + 1) < 0) {
            if (preempt_youngest(s) == q) {
                preempted_self = true;
                break;
            }
        }
        if (preempted_self)
            break; /* q was the youngest: nothing after it remains */
        s->batch[n++] = (batch_entry){q, 1, MSM_STEP_OUTPUT_SAMPLE};
        budget--;
    }
    /* 2. Prefill chunks of admitted sequences (their blocks were taken at admission). */
    for (int i = 0; i < s->n_running && budget > 0; i++) {
        seq *q = s->running[i];
        int pending = q->n_tokens - q->n_cached;
        if (pending <= 1)
            continue;
        int chunk = pending < budget ? pending : budget;
        s->batch[n++] = (batch_entry){q, chunk,
                                      chunk == pending ? MSM_STEP_OUTPUT_SAMPLE : MSM_STEP_OUTPUT_NONE};
        budget -= chunk;
    }
    /* 3. Admission, in the waiting queue's order (round-robin over connections: msm_fairq.h),
     * while blocks for the whole prompt are free. */
    while (wait_head(s) && s->n_running < s->o.max_seqs && budget > 0) {
        seq *q = wait_head(s);
        int need = msm_kv_blocks_for(q->n_tokens);
        if (s->e.kv_n_free(s->e.ctx) < need)
            break;
        if (grow_blocks(s, q, q->n_tokens) < 0)
            break;
        wait_pop(s);
        s->running[s->n_running++] = q;
        int chunk = q->n_tokens < budget ? q->n_tokens : budget;
        s->batch[n++] = (batch_entry){q, chunk,
                                      chunk == q->n_tokens ? MSM_STEP_OUTPUT_SAMPLE : MSM_STEP_OUTPUT_NONE};
        budget -= chunk;
        s->stats.prompt_tokens += (uint64_t)q->n_tokens;
    }
    return n;
}

static int append_token(seq *q, int32_t t) {
    if (q->n_tokens == q->cap_tokens) {
        int cap = q->cap_tokens * 2;
        int32_t *p = realloc(q->tokens, (size_t)cap * sizeof *p);
        if (!p)
            return -ENOMEM;
        q->tokens = p;
        q->cap_tokens = cap;
    }
    q->tokens[q->n_tokens++] = t;
    return 0;
}

int msm_sched_pick_group(const int *load, const bool *healthy, int n, unsigned *cursor) {
    bool any_healthy = false;
    for (int i = 0; i < n && !any_healthy; i++)
        any_healthy = !healthy || healthy[i];
    int best = -1;
    unsigned start = *cursor % (unsigned)n;
    for (int k = 0; k < n; k++) {
        int i = (int)((start + (unsigned)k) % (unsigned)n);
        if (any_healthy && healthy && !healthy[i])
            continue;
        if (best < 0 || load[i] < load[best])
            best = i;
    }
    *cursor = (unsigned)best + 1;
    return best;
}

void msm_sched_logprobs(const float *logits, int vocab, int32_t chosen, int n, float *ret_chosen,
                        int32_t *ret_ids, float *ret_lp) {
    float mx = -INFINITY;
    for (int v = 0; v < vocab; v++)
        if (logits[v] > mx)
            mx = logits[v];
    double sum = 0;
    for (int v = 0; v < vocab; v++)
        sum += exp((double)logits[v] - mx);
    float lse = mx + (float)log(sum);
    *ret_chosen = logits[chosen] - lse;
    if (n > vocab)
        n = vocab;
    /* Partial insertion sort: n is small (<= MSM_MAX_TOP_LOGPROBS). Ties keep the lower id. */
    int have = 0;
    for (int v = 0; v < vocab; v++) {
        float x = logits[v];
        if (have == n && !(x > logits[ret_ids[n - 1]]))
            continue;
        int j = have < n ? have++ : n - 1;
        while (j > 0 && x > logits[ret_ids[j - 1]]) {
            ret_ids[j] = ret_ids[j - 1];
            j--;
        }
        ret_ids[j] = v;
    }
    for (int i = 0; i < n; i++)
        ret_lp[i] = logits[ret_ids[i]] - lse;
}

static void update_stats(msm_sched *s) {
    pthread_mutex_lock(&s->stats_mu);
    s->stats.running = s->n_running;
    s->stats.waiting = atomic_load(&s->n_waiting);
    s->stats.kv_free = s->e.kv_n_free(s->e.ctx);
    s->stats.kv_used = s->e.kv_total(s->e.ctx) - s->stats.kv_free;
    pthread_mutex_unlock(&s->stats_mu);
}

void msm_sched_get_stats(msm_sched *s, msm_sched_stats *ret) {
    pthread_mutex_lock(&s->stats_mu);
    *ret = s->stats;
    ret->waiting = atomic_load(&s->n_waiting);
    pthread_mutex_unlock(&s->stats_mu);
}

/* ---- one iteration: inbox, plan, engine step, outputs ---- */

static void unlink_running(msm_sched *s, const seq *q) {
    for (int j = 0; j < s->n_running; j++)
        if (s->running[j] == q) {
            remove_running(s, j);
            return;
        }
}

static bool wants_logprobs(const msm_gen_request *r) {
    return r->want_logprob || r->top_logprobs > 0;
}

/* Takes the inbox (new requests and cancels) out from under the loop thread. */
static void take_inbox(msm_sched *s, seq **ret_in, cancel_msg **ret_cancels) {
    pthread_mutex_lock(&s->mu);
    *ret_in = s->in_head;
    *ret_cancels = s->cancels_head;
    s->in_head = s->in_tail = NULL;
    s->cancels_head = s->cancels_tail = NULL;
    pthread_mutex_unlock(&s->mu);
}

/* New requests join the waiting queue and cancels apply, in the order the loop thread issued
 * them: a cancel reaches only requests submitted before it. (A Cancel of request X that crosses
 * X's last token, followed by a new Generate reusing id X, must not cancel the new one.) Once the
 * engine is dead, new requests fail at once. */
static void apply_inbox(msm_sched *s, seq *in, cancel_msg *cancels) {
    while (in || cancels) {
        if (in && (!cancels || in->inbox_order < cancels->inbox_order)) {
            seq *q = in;
            in = in->next;
            q->next = NULL;
            if (atomic_load(&s->dead)) {
                atomic_fetch_sub(&s->n_waiting, 1);
                finish_seq(s, q, MSM_FINISH_ERROR, NULL, s->dead_error, &s->dead_msg);
                continue;
            }
            msm_fairq_push(&s->waitq, &q->wait, q->req->conn_id);
            continue;
        }
        cancel_msg *c = cancels;
        cancels = c->next;
        apply_cancel(s, c);
        free(c);
    }
}

/* The rows of msm_step_out.logits that belong to the step entry st (the engine's layout). */
static int logit_rows(const msm_step_seq *st) {
    if (st->output == MSM_STEP_OUTPUT_ALL_LOGITS) return st->n_tokens;
    return st->output == MSM_STEP_OUTPUT_SAMPLE && st->want_logits ? 1 : 0;
}

/* The engine's view of the batch the scheduler built. Returns whether any entry wants logits. */
static bool plan_step(msm_sched *s, int n) {
    bool any_logits = false;
    for (int i = 0; i < n; i++) {
        const batch_entry *b = &s->batch[i];
        const seq *q = b->s;
        msm_step_seq *st = &s->step[i];
        memset(st, 0, sizeof *st);
        st->tokens = q->tokens + q->n_cached;
        st->n_tokens = b->n_feed;
        st->pos0 = q->n_cached;
        st->blocks = q->blocks;
        st->n_blocks = q->n_blocks;
        st->output = b->output ? MSM_STEP_OUTPUT_SAMPLE : MSM_STEP_OUTPUT_NONE;
        st->want_logits = b->output && wants_logprobs(q->req);
        if (q->req->want_prompt_logprobs && q->n_prompt_lp < q->req->n_prompt - 1 && q->n_generated == 0)
            st->output = MSM_STEP_OUTPUT_ALL_LOGITS; /* every prompt row, reduced in prompt_logprobs */
        if (q->req->logits_sink) {
            /* Every fed token's row: prompt chunks whole (ALL_LOGITS), a decode row as SAMPLE with
             * its logits, which keeps the step eligible for CUDA-graph replay. */
            if (q->n_generated == 0)
                st->output = MSM_STEP_OUTPUT_ALL_LOGITS;
            else if (b->output)
                st->want_logits = true;
        }
        any_logits |= logit_rows(st) > 0;
        st->sampling = q->req->sampling;
        st->sampling.counter = (uint64_t)q->n_generated;
    }
    return any_logits;
}

/* The engine refused or failed the step: its sequences end with an error; the rest (and later
 * requests) are still served. When the engine cannot run another step (-ENOTRECOVERABLE: a
 * device fault, a step past its deadline), every request of the group ends with that error, now
 * and from now on, and the scheduler runs no more steps (msm_sched_stats.engine_dead). */
static void fail_step(msm_sched *s, int n, int rc, const msm_err *engine_err) {
    msm_err msg = {{0}};
    bool fatal = rc == -ENOTRECOVERABLE;
    int error = msm_err_set(&msg, fatal ? rc : -EIO, "engine step failed: %s", rc < 0 ? engine_err->msg : "no output");
    s->stats.engine_errors++;
    s->stats.engine_failed = true;
    for (int i = 0; i < n; i++) {
        seq *q = s->batch[i].s;
        unlink_running(s, q);
        finish_seq(s, q, MSM_FINISH_ERROR, NULL, error, &msg);
    }
    if (!fatal)
        return;
    s->dead_error = error;
    s->dead_msg = msg;
    s->stats.engine_dead = true;
    atomic_store(&s->dead, true);
    while (s->n_running > 0) {
        seq *q = s->running[s->n_running - 1];
        s->n_running--;
        finish_seq(s, q, MSM_FINISH_ERROR, NULL, error, &msg);
    }
    for (seq *q; (q = wait_pop(s));)
        finish_seq(s, q, MSM_FINISH_ERROR, NULL, error, &msg);
}

/* Copies the n_rows logits rows of step entry st (the last fed tokens') into r's sink, each at
 * its token's position. */
static void sink_logits(const msm_sched *s, const msm_gen_request *r, const msm_step_seq *st,
                        const float *rows, int n_rows) {
    size_t V = (size_t)s->e.vocab;
    int first = st->pos0 + st->n_tokens - n_rows;
    for (int k = 0; k < n_rows && first + k < r->sink_rows; k++)
        memcpy(r->logits_sink + (size_t)(first + k) * V, rows + (size_t)k * V, V * sizeof *rows);
}

/* The logprobs of the prompt tokens that step entry st's rows predict (row k, at position
 * pos0 + k, predicts the token at pos0 + k + 1), for the prompt positions not handed out yet: one
 * event without a token. A preempted sequence recomputes its rows; positions already sent are
 * skipped, so each goes out once. */
static void prompt_logprobs(msm_sched *s, seq *q, const msm_step_seq *st, const float *rows) {
    const msm_gen_request *r = q->req;
    int first = st->pos0 + 1 > q->n_prompt_lp + 1 ? st->pos0 + 1 : q->n_prompt_lp + 1;
    int last = st->pos0 + st->n_tokens; /* the position the last row predicts */
    if (last > r->n_prompt - 1)
        last = r->n_prompt - 1;
    if (first > last)
        return;
    int n = last - first + 1;
    msm_sched_event *ev = calloc(1, sizeof *ev + (size_t)n * sizeof(msm_token_logprob));
    if (!ev)
        return; /* the consumer then sees fewer positions: it answers with an error */
    ev->conn_id = r->conn_id;
    ev->request_id = r->request_id;
    ev->prompt_lp = (msm_token_logprob *)(ev + 1);
    ev->prompt_lp_first = first;
    ev->n_prompt_lp = n;
    int top = r->prompt_top_logprobs < s->e.vocab ? r->prompt_top_logprobs : s->e.vocab;
    for (int i = 0; i < n; i++) {
        int p = first + i;
        msm_token_logprob *lp = &ev->prompt_lp[i];
        lp->token = r->prompt[p];
        lp->n_top = top;
        msm_sched_logprobs(rows + (size_t)(p - 1 - st->pos0) * (size_t)s->e.vocab, s->e.vocab, lp->token, top,
                           &lp->logprob, lp->top_ids, lp->top_logprobs);
    }
    q->n_prompt_lp = last;
    emit(s, ev);
}

/* Token t, sampled for q: appended, reported in ev (with its logprobs from the logits row, when
 * given), and checked against the stop rules. Returns why q finishes (NONE: it goes on); with
 * MSM_FINISH_ERROR, *ret_error (a negative errno) and msg say why. */
static msm_finish take_token(msm_sched *s, seq *q, int32_t t, const float *logits, msm_sched_event *ev,
                             int *ret_error, msm_err *msg) {
    const msm_gen_request *r = q->req;
    if (t == MSM_SAMPLE_NONFINITE) {
        s->stats.nonfinite_logits++;
        *ret_error = msm_err_set(msg, -EIO, "the model's logits for this sequence are not finite (NaN or "
                                 "infinity) at token %d: no token can be sampled", q->n_generated);
        return MSM_FINISH_ERROR;
    }
    if (t < 0 || t >= s->e.vocab) {
        *ret_error = msm_err_set(msg, -EIO, "engine sampled a token id outside the vocabulary");
        return MSM_FINISH_ERROR;
    }
    if (append_token(q, t) < 0) {
        *ret_error = msm_err_set(msg, -ENOMEM, "out of memory");
        return MSM_FINISH_ERROR;
    }
    q->n_generated++;
    s->stats.tokens_generated++;
    if (ev) {
        ev->has_token = true;
        ev->token = t;
        if (logits) {
            msm_sched_logprobs(logits, s->e.vocab, t, r->top_logprobs, &ev->logprob, ev->top_ids, ev->top_logprobs);
            ev->has_logprob = true;
            ev->n_top = r->top_logprobs < s->e.vocab ? r->top_logprobs : s->e.vocab;
        }
    }
    msm_finish why = MSM_FINISH_NONE;
    for (int k = 0; k < r->n_stop_ids && why == MSM_FINISH_NONE; k++)
        if (r->stop_ids[k] == t)
            why = MSM_FINISH_STOP;
    for (int k = 0; k < s->e.n_eos && why == MSM_FINISH_NONE && !r->ignore_eos; k++)
        if (s->e.eos_ids[k] == t)
            why = MSM_FINISH_EOS;
    if (s->e.tok) {
        int rc = msm_textstream_push(&q->text, t);
        if (rc < 0) {
            *ret_error = msm_err_set(msg, rc, "out of memory");
            return MSM_FINISH_ERROR;
        }
        if (rc == 1)
            why = MSM_FINISH_STOP; /* also after a stop id: its text must not show a stop string either */
    }
    if (why == MSM_FINISH_NONE && (q->n_generated >= r->max_tokens || q->n_tokens >= s->e.max_context))
        why = MSM_FINISH_LENGTH;
    return why;
}

/* The step's outputs: caches advance, sinks fill, sampled tokens go out as events, finished
 * sequences end. */
static void take_outputs(msm_sched *s, int n, const msm_step_out *out) {
    int row = 0;
    for (int i = 0; i < n; i++) {
        const batch_entry *b = &s->batch[i];
        const msm_step_seq *st = &s->step[i];
        seq *q = b->s;
        int n_rows = out->logits ? logit_rows(st) : 0;
        const float *rows = n_rows ? out->logits + (size_t)row * (size_t)s->e.vocab : NULL;
        row += n_rows;
        q->n_cached += b->n_feed;
        if (q->req->logits_sink && n_rows)
            sink_logits(s, q->req, st, rows, n_rows);
        if (q->req->want_prompt_logprobs && st->output == MSM_STEP_OUTPUT_ALL_LOGITS && n_rows == st->n_tokens)
            prompt_logprobs(s, q, st, rows);
        if (!b->output)
            continue;
        if (q->req->max_tokens == 0) { /* scoring only: the prompt is done, nothing is generated */
            unlink_running(s, q);
            finish_seq(s, q, MSM_FINISH_LENGTH, NULL, 0, NULL);
            continue;
        }
        /* The sampled token's row is the entry's last. */
        const float *logits = n_rows && wants_logprobs(q->req) ? rows + (size_t)(n_rows - 1) * (size_t)s->e.vocab : NULL;
        msm_sched_event *ev = event_for(q);
        msm_err msg = {{0}};
        int error = 0;
        msm_finish why = take_token(s, q, out->tokens[i], logits, ev, &error, &msg);
        if (why == MSM_FINISH_NONE) {
            if (s->e.tok)
                ev = event_attach_text(ev, q, false);
            emit(s, ev);
            continue;
        }
        unlink_running(s, q);
        finish_seq(s, q, why, ev, error, &msg);
    }
}

static uint64_t mono_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000 + 1; /* never 0 */
}

uint64_t msm_sched_step_running_ms(msm_sched *s) {
    uint64_t t0 = atomic_load(&s->step_since_ms);
    if (!t0)
        return 0;
    uint64_t now = mono_ms();
    return now > t0 ? now - t0 : 1;
}

/* Runs the batch build_step made on the engine and hands out its outputs. 1, or the negative
 * errno of a failed step. */
static int run_step(msm_sched *s, int n) {
    bool any_logits = plan_step(s, n);
    msm_step_out out = {0};
    msm_err err = {{0}};
    atomic_store(&s->step_since_ms, mono_ms());
    int rc = s->e.step(s->e.ctx, s->step, n, &out, &err);
    atomic_store(&s->step_since_ms, 0);
    pthread_mutex_lock(&s->stats_mu);
    s->stats.steps++;
    if (rc < 0 || !out.tokens || (any_logits && !out.logits)) {
        fail_step(s, n, rc, &err);
        rc = rc < 0 ? rc : -EIO;
    } else {
        s->stats.engine_failed = false;
        take_outputs(s, n, &out);
        rc = 1;
    }
    pthread_mutex_unlock(&s->stats_mu);
    return rc;
}

int msm_sched_iterate(msm_sched *s) {
    seq *in;
    cancel_msg *cancels;
    take_inbox(s, &in, &cancels);
    /* The stats counters are touched without the lock by this (the only writing) thread; readers
     * copy them under stats_mu, so hold it over the bookkeeping (not over the engine step). */
    pthread_mutex_lock(&s->stats_mu);
    apply_inbox(s, in, cancels);
    int n = build_step(s);
    pthread_mutex_unlock(&s->stats_mu);
    int rc = n > 0 ? run_step(s, n) : 0;
    s->busy = !atomic_load(&s->dead) && (s->n_running > 0 || s->waitq.head);
    update_stats(s);
    return rc;
}

/* ---- thread ---- */

static void *sched_main(void *arg) {
    msm_sched *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!s->stop && !s->busy && !s->in_head && !s->cancels_head)
            pthread_cond_wait(&s->cv, &s->mu);
        bool stop = s->stop;
        pthread_mutex_unlock(&s->mu);
        if (stop)
            break;
        msm_sched_iterate(s);
    }
    return NULL;
}

int msm_sched_start(msm_sched *s) {
    int rc = pthread_create(&s->thread, NULL, sched_main, s);
    if (rc)
        return -rc;
    s->thread_started = true;
    return 0;
}

void msm_sched_stop(msm_sched *s) {
    if (!s || !s->thread_started)
        return;
    pthread_mutex_lock(&s->mu);
    s->stop = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->thread, NULL);
    s->thread_started = false;
}

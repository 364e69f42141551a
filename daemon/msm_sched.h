/* msm_sched: the scheduler. It owns every generation request from admission to its last token.
 *
 * One scheduler thread is the engine's only caller. Each iteration it takes new requests and
 * cancels from its inbox (a mutex-protected queue the loop thread fills), builds one step —
 * continuous batching: decode rows of running sequences first, then prefill chunks under the
 * token budget (max_step_tokens), admitting waiting requests while KV blocks and max_seqs allow —
 * runs it, and turns the sampled tokens into events (stop rules, logprobs) handed to an emit
 * callback. When a running sequence needs a KV block and none is free, the most recently admitted
 * sequence is preempted by recompute: its blocks are freed and it is requeued at the head of the
 * waiting queue with prompt + generated tokens as its new prompt.
 *
 * The engine is reached through msm_sched_engine, a small vtable (step, KV pool, model limits), so
 * the unit tests drive the scheduler on a fake engine and the daemon on the real one.
 *
 * Text: when msm_sched_engine.tok is set, every sequence streams its text (msm_textstream.h) and
 * every event carries the UTF-8 text its token adds (never half a character). Stop strings match
 * on that text: the generation stops (FINISH_STOP) at the token that completes one, and the text
 * handed out ends just before the match; the last event carries whatever was held back.
 *
 * The daemon drives it from one scheduler thread per TP group; msm_generate (msmoe-run, the
 * engine tests) drives it in-process, calling msm_sched_iterate itself. */
#ifndef MSM_SCHED_H
#define MSM_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "msm_engine.h"
#include "msm_err.h"
#include "msm_tokenizer.h"

/* Values of msmoe.v1.FinishReason. */
typedef enum msm_finish {
    MSM_FINISH_NONE = 0,
    MSM_FINISH_LENGTH,
    MSM_FINISH_STOP,
    MSM_FINISH_EOS,
    MSM_FINISH_CANCELLED,
    MSM_FINISH_ERROR,
    MSM_FINISH_COUNT_,
} msm_finish;

const char *msm_finish_name(msm_finish f);

#define MSM_MAX_TOP_LOGPROBS 20

/* One token's logprob and the top-n alternatives at its position (log-softmax of the logits row
 * that predicted it), best first. */
typedef struct msm_token_logprob {
    int32_t token;
    float logprob;
    int n_top;
    int32_t top_ids[MSM_MAX_TOP_LOGPROBS];
    float top_logprobs[MSM_MAX_TOP_LOGPROBS];
} msm_token_logprob;

/* A validated generation request (native; protobuf structs never get this far). */
typedef struct msm_gen_request {
    uint64_t conn_id;         /* routing key of the reply: connection ... */
    uint64_t request_id;      /* ... and the client's request id */
    int32_t *prompt;          /* [n_prompt] token ids, each < vocab (owned) */
    int n_prompt;
    msm_sample_params sampling; /* counter is set per token by the scheduler */
    int max_tokens;           /* >= 1; 0 only with want_prompt_logprobs (score the prompt, generate
                                 nothing: the request ends after its prefill with FINISH_LENGTH) */
    int32_t *stop_ids;        /* [n_stop_ids] (owned) */
    int n_stop_ids;
    char **stop_strings;      /* [n_stop_strings] NUL-terminated UTF-8 (owned); need engine->tok */
    int n_stop_strings;
    int top_logprobs;         /* top-n logprobs per token, 0..MSM_MAX_TOP_LOGPROBS */
    bool want_logprob;        /* the chosen token's logprob (implied by top_logprobs > 0) */
    bool ignore_eos;
    /* Prompt logprobs (the HTTP API's echo + logprobs, lm-eval's loglikelihood): the logprob of
     * every prompt token after the first given the ones before it, with the prompt_top_logprobs
     * best alternatives, handed out in events before the first generated token. The prefill chunks
     * of such a request run with MSM_STEP_OUTPUT_ALL_LOGITS and the scheduler thread reduces the
     * rows to msm_token_logprob entries; no logits row leaves the scheduler. */
    bool want_prompt_logprobs;
    int prompt_top_logprobs;  /* 0..MSM_MAX_TOP_LOGPROBS */
    /* Offline scoring (msm_generate: msmoe-run --dump-logits, the golden tests; the API never sets
     * it): the logits row of every fed token, prompt and generated (the last generated token is
     * never fed), is copied to logits_sink + position * vocab, for positions < sink_rows. The
     * buffer is the caller's and must live until the request's last event. */
    float *logits_sink;       /* [sink_rows, vocab] or NULL */
    int sink_rows;
} msm_gen_request;

void msm_gen_request_free(msm_gen_request *r);

/* What the scheduler hands back: one event per generated token, the last one with a finish reason
 * (also events carrying only a finish, e.g. a cancel before the first token). */
typedef struct msm_sched_event {
    uint64_t conn_id;
    uint64_t request_id;
    bool has_token;
    int32_t token;
    bool has_logprob;
    float logprob;                 /* chosen token's log-softmax */
    int n_top;
    int32_t top_ids[MSM_MAX_TOP_LOGPROBS];
    float top_logprobs[MSM_MAX_TOP_LOGPROBS];
    msm_finish finish;             /* NONE: more follow */
    int prompt_tokens;             /* usage, with a finish */
    int completion_tokens;
    int error;                     /* with MSM_FINISH_ERROR: a negative errno (msm_code.h) ... */
    msm_err error_msg;             /* ... and what went wrong */
    /* With a tokenizer: the text delta, NUL-terminated, stored in the same allocation as the event
     * (so free(ev) frees it); NULL without a tokenizer. */
    char *text;
    size_t text_len;
    /* Prompt logprobs (want_prompt_logprobs), in events that carry no token: the entries of prompt
     * positions prompt_lp_first .. prompt_lp_first + n_prompt_lp - 1 (position 0 has none), in the
     * same allocation as the event. One event per prefill chunk; all of them come before the
     * request's first token event. */
    int prompt_lp_first;
    int n_prompt_lp;
    msm_token_logprob *prompt_lp;
    int group;                     /* the consumer's use: the daemon's emit marks the TP group */
    struct msm_sched_event *next;  /* queue link for the consumer's use */
} msm_sched_event;

/* Takes ownership of ev (free() it; that frees its text too). Called on the scheduler thread. */
typedef void (*msm_sched_emit_fn)(void *ctx, msm_sched_event *ev);

/* The engine as the scheduler sees it. */
typedef struct msm_sched_engine {
    void *ctx;
    int (*step)(void *ctx, const msm_step_seq *seqs, int n_seqs, msm_step_out *ret, msm_err *err);
    int (*kv_alloc)(void *ctx, int n, int32_t *ret_ids);     /* -ENOSPC, nothing taken */
    void (*kv_release)(void *ctx, const int32_t *ids, int n);
    int (*kv_n_free)(void *ctx);
    int (*kv_total)(void *ctx);
    /* The model's tokenizer (immutable, shared with the loop thread), for text deltas and stop
     * strings; NULL: events carry ids only and requests with stop strings are refused. */
    const msm_tokenizer *tok;
    int vocab;
    int max_context;          /* tokens per sequence: prompt + generated */
    int eos_ids[MSM_MAX_EOS];
    int n_eos;
} msm_sched_engine;

/* Fills the vtable with the real engine. */
void msm_sched_engine_from(msm_sched_engine *se, msm_engine *e);

typedef struct msm_sched_opts {
    int max_step_tokens;      /* tokens per step: decode rows + prefill chunks */
    int max_seqs;             /* sequences running at once (and per step) */
    int max_queue;            /* requests waiting for admission; more -> RESOURCE_EXHAUSTED */
} msm_sched_opts;

typedef struct msm_sched msm_sched;

int msm_sched_new(const msm_sched_opts *o, const msm_sched_engine *engine, msm_sched_emit_fn emit,
                  void *emit_ctx, msm_sched **ret, msm_err *err);
/* Stops the thread if running; frees every request without emitting. Accepts NULL. */
void msm_sched_free(msm_sched *s);

/* Milliseconds the engine step in progress has been running, 0 when none is (any thread). */
uint64_t msm_sched_step_running_ms(msm_sched *s);

/* Starts / stops the scheduler thread (which calls msm_sched_iterate while there is work). */
int msm_sched_start(msm_sched *s);
void msm_sched_stop(msm_sched *s);

/* Thread-safe. Takes ownership of *req on success (and sets *req NULL). Checks the limits that
 * depend on the engine and queue; the error names the limit: -EINVAL when the prompt is empty or
 * does not fit the context, -ENOTSUP for stop strings without a tokenizer, -ENOSPC when the
 * request can never fit the KV pool, -EAGAIN when the queue is full, -ESHUTDOWN once stopping,
 * -ENOMEM. */
int msm_sched_submit(msm_sched *s, msm_gen_request **req, msm_err *err);
/* Thread-safe. The request's stream ends with FINISH_CANCELLED and its blocks are freed at the
 * start of the next iteration. Unknown ids are ignored (the caller tracks what is in flight). */
void msm_sched_cancel(msm_sched *s, uint64_t conn_id, uint64_t request_id);
/* Thread-safe: cancels every request of a connection (disconnect). */
void msm_sched_cancel_conn(msm_sched *s, uint64_t conn_id);
/* Thread-safe: cancels everything (shutdown after the drain timeout). */
void msm_sched_cancel_all(msm_sched *s);

/* One iteration on the caller's thread: inbox, then one engine step if there is work. Returns 1
 * if a step ran, 0 if idle, negative errno when the engine failed (the step's requests then end
 * with FINISH_ERROR / INTERNAL; the scheduler keeps serving). When the engine's step returns
 * -ENOTRECOVERABLE (it cannot run another: a device fault, a step past its deadline) every
 * request of the scheduler ends with FINISH_ERROR and that error (INTERNAL), requests submitted
 * later are refused or end the same way, no step runs again, and the stats say engine_dead: the
 * daemon then exits non-zero. A sampled token MSM_SAMPLE_NONFINITE (the sequence's logits were
 * NaN or infinite) ends that request alone with FINISH_ERROR / INTERNAL and counts in
 * nonfinite_logits. Tests call this directly. */
int msm_sched_iterate(msm_sched *s);

typedef struct msm_sched_stats {
    int running;              /* admitted sequences */
    int waiting;              /* queued, not admitted (includes the inbox) */
    int kv_used;
    int kv_free;
    uint64_t steps;
    uint64_t preemptions;
    uint64_t tokens_generated;
    uint64_t prompt_tokens;   /* prompt tokens prefilled (recomputation included) */
    uint64_t finished[MSM_FINISH_COUNT_];
    uint64_t engine_errors;
    uint64_t nonfinite_logits; /* requests failed because their logits were NaN or infinite */
    bool engine_failed;       /* the last step failed */
    bool engine_dead;         /* a step failed with -ENOTRECOVERABLE: no more steps run */
} msm_sched_stats;

/* Thread-safe snapshot (updated once per iteration). */
void msm_sched_get_stats(msm_sched *s, msm_sched_stats *ret);

/* The spreading policy over several schedulers (one per TP group): the group a new request goes
 * to. The least loaded group (load: the requests it holds, running + waiting) among the healthy
 * ones wins — among all groups when none is healthy, so a node whose every engine failed its last
 * step still tries; ties go round-robin, to the first tied group at or after *cursor (cyclically),
 * and *cursor moves past the choice. healthy may be NULL (all healthy). Pure; n >= 1. */
int msm_sched_pick_group(const int *load, const bool *healthy, int n, unsigned *cursor);

/* Top-n log-softmax of one logits row: chosen token's logprob, and the n best (id, logprob) pairs,
 * best first. Exposed for the tests. */
void msm_sched_logprobs(const float *logits, int vocab, int32_t chosen, int n, float *ret_chosen,
                        int32_t *ret_ids, float *ret_lp);

#endif

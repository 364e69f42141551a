/* msm_generate: one sequence generated offline, through the daemon's scheduler (msm_sched.h) run
 * in-process on the caller's thread: no sockets, no scheduler thread. msmoe-run and the engine
 * tests use it, so the daemon and the offline tool share one generation loop: prefill in chunks
 * under the step budget, then decode, with the same stop rules and per-token sampling counters.
 *
 * The engine is used as the daemon uses it (msm_sched_engine_from); the scheduler gets one
 * sequence at a time (max_seqs 1) and the engine's step budget. */
#ifndef MSM_GENERATE_H
#define MSM_GENERATE_H

#include <stdbool.h>
#include <stdint.h>

#include "msm_engine.h"

typedef struct msm_generate_opts {
    int max_new;                /* tokens to generate (>= 1) */
    msm_sample_params sampling; /* counter is set per token */
    bool ignore_eos;            /* else stop after an eos id (it is included in the output) */
    bool dump_logits;           /* collect the logits of every fed token: [P + n - 1, vocab] */
} msm_generate_opts;

typedef struct msm_generation {
    int32_t *ids;               /* [n] generated ids */
    int n;
    float *logits;              /* [n_rows, vocab] when dump_logits, else NULL */
    int n_rows;
    double prefill_s, decode_s; /* wall time of the scheduler iterations before the first token
                                   (prefill) and after it (decode) */
} msm_generation;

/* Checks that P + max_new tokens fit the context and the free KV blocks, generates, and leaves
 * the pool as it was. Errors name the limit, or are the engine's. */
int msm_generate(msm_engine *e, const int32_t *prompt, int P, const msm_generate_opts *o,
                 msm_generation *ret, msm_err *err);
void msm_generation_done(msm_generation *g);

#endif

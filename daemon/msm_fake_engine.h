/* msm_fake_engine: a deterministic stand-in for the engine, behind the scheduler's vtable.
 *
 * Its "KV cache" stores the token fed at every (block, slot), and the token it samples is a hash of
 * the whole history read back through the block table, so a wrong block table, a lost prefill
 * chunk or a bad recompute after preemption changes the output: the unit tests compare against
 * msm_fake_engine_expected, which computes the same function from the plain token list. It checks
 * every block id, position and budget the way the real engine does, and can be told to fail or to
 * sleep per step, to fail for good (-ENOTRECOVERABLE, as the real engine does after a device
 * fault) or to sample MSM_SAMPLE_NONFINITE (as for NaN logits) from a given step on. Used by tests/unit/test_sched.c and by `msmoed` with engine.backend = fake (a
 * test-only backend for the daemon's integration tests). */
#ifndef MSM_FAKE_ENGINE_H
#define MSM_FAKE_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "msm_sched.h"

typedef struct msm_fake_engine_opts {
    int vocab;
    int max_context;
    int kv_blocks;            /* including the reserved block 0 */
    int eos_id;               /* -1 = none */
    int max_step_tokens;      /* the engine refuses larger steps */
    int max_seqs;
    int step_delay_us;
    int fault_step;           /* from this step on (1 = the first; 0 = never) ... */
    bool fault_nonfinite;     /* ... sample MSM_SAMPLE_NONFINITE, else fail with -ENOTRECOVERABLE */
    bool fault_stall;         /* ... never return from the step (a device or collective stuck) */
} msm_fake_engine_opts;

typedef struct msm_fake_engine {
    msm_fake_engine_opts o;
    int32_t *cache;           /* [kv_blocks * 16] the token at each cached position */
    uint8_t *used;            /* [kv_blocks] block allocated */
    int n_free;
    int32_t *out_tokens;      /* [max_seqs] */
    float *out_logits;        /* [max_seqs, vocab] */
    /* Observations for tests. */
    uint64_t steps;
    int last_n_seqs, last_n_tokens;
    int max_n_seqs_seen, max_n_tokens_seen;
    uint64_t double_frees;
    int fail_steps;           /* fail this many next steps */
} msm_fake_engine;

int msm_fake_engine_new(const msm_fake_engine_opts *o, msm_fake_engine **ret);
void msm_fake_engine_free(msm_fake_engine *f);
void msm_fake_engine_vtable(msm_fake_engine *f, msm_sched_engine *ret);

/* The token the fake engine samples after `history` (n tokens) for the given sampling params and
 * generated index (sp->counter). */
int32_t msm_fake_engine_expected(const int32_t *history, int n, const msm_sample_params *sp, int vocab);

#endif

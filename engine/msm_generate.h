/* msm_generate: single-sequence generation on an engine (prefill in chunks, then decode), the
 * loop msmoe-run and the tests share. The daemon's scheduler batches many sequences instead. */
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
    double prefill_s, decode_s; /* wall time of the prefill and decode steps */
} msm_generation;

/* Allocates KV blocks for P + max_new tokens, generates, releases the blocks. */
int msm_generate(msm_engine *e, const int32_t *prompt, int P, const msm_generate_opts *o,
                 msm_generation *ret, msm_err *err);
void msm_generation_done(msm_generation *g);

#endif

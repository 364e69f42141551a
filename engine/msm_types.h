/* msm_types: the few engine-level types and constants that the kernels, the engine and the daemon
 * all speak: the KV-cache block size, the per-row sampling parameters and the largest number of
 * decode batch buckets.
 *
 * A leaf header (it includes only the C library), so kernels/msm_kernels.h includes it without
 * reaching into the rest of the engine, and the daemon gets these without the kernel headers. */
#ifndef MSM_TYPES_H
#define MSM_TYPES_H

#include <stdint.h>

#define MSM_KV_BLOCK 16 /* tokens per KV-cache block */

/* What the samplers write for a row whose logits are not all finite (a NaN or an infinity): no
 * token can be drawn from such a row, and the engine hands this on as the sequence's token. */
#define MSM_SAMPLE_NONFINITE (-2)

#define MSM_MAX_BUCKETS 32 /* decode batch buckets an engine (and engine.buckets) may list */

/* Default of msm_engine_opts.multi_stream_max_tokens: overlapping the shared expert with the
 * routed experts on the aux stream paid at every decode batch (1-256) and prompt chunk up to
 * 1024 tokens on the H200 (Qwen1.5-MoE shapes: a 1024-token prefill 48.9 ms on against 49.7 ms
 * off), not at 2048 (126.2 against 125.3 ms): bench/results/2026-11-30-h200/run6-prefill.txt. */
#define MSM_MULTI_STREAM_MAX_TOKENS 1024


/* Per output row sampling parameters. temperature <= 0 means greedy (argmax, lowest id on ties). */
typedef struct msm_sample_params {
    float temperature;
    int32_t top_k;    /* 0 = all */
    float top_p;      /* 1 = all */
    uint32_t pad_;
    uint64_t seed;    /* with counter: a counter-based RNG, independent of batch composition */
    uint64_t counter; /* index of the token being generated in its sequence */
} msm_sample_params;

#endif

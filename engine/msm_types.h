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

#define MSM_MAX_BUCKETS 32 /* decode batch buckets an engine (and engine.buckets) may list */

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

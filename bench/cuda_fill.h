/* cuda_fill: device-side random fills for the kernel benchmark (bench/cuda_kernels.c). */
#ifndef MSM_BENCH_CUDA_FILL_H
#define MSM_BENCH_CUDA_FILL_H

#include <stddef.h>
#include <stdint.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* p[i] = bf16 uniform in [-scale, scale), from (seed, i). */
int msm_bench_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float scale, cudaStream_t s);
/* p[i] = uniform integer in [0, mod), from (seed, i). */
int msm_bench_fill_i32(int32_t *p, size_t n, uint64_t seed, int32_t mod, cudaStream_t s);

#ifdef __cplusplus
}
#endif

#endif

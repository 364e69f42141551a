/* Device-side helpers of the CUDA backend: deterministic dummy weights generated on the GPU
 * (--dummy-weights: no checkpoint, no host staging of 30 GB of random numbers) and the
 * float32 → bf16 conversion of uploaded weights. */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "msm_cuda.h"
#include "msm_cuda_backend.h"

/* Same mixing as msm_rng_uniform (kernels/cpu/kernels.c): the CPU and GPU dummies agree. */
static __device__ float rng_uniform(uint64_t seed, uint64_t counter) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + counter * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

static __device__ uint16_t to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static __global__ void fill_kernel(uint16_t *w, size_t n, uint64_t seed, float scale, int ones) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] = ones ? (uint16_t)0x3f80 : to_bf16((2.0f * rng_uniform(seed, i) - 1.0f) * scale);
}

extern "C" int msm_cuda_fill_dummy(uint16_t *w, size_t n, uint64_t seed, float scale, int ones,
                                   cudaStream_t stream) {
    if (n == 0) return 0;
    fill_kernel<<<1024, 256, 0, stream>>>(w, n, seed, scale, ones);
    CUDA_LAUNCH_CHECK();
    return 0;
}

static __global__ void gather_rows_kernel(float *out, const float *x, const int32_t *rows, int C) {
    const float *src = x + (size_t)rows[blockIdx.x] * C;
    float *dst = out + (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
}

/* out[r,:] = x[rows[r],:] with rows on the device (GATHER_ROWS: the logits rows of a step). */
extern "C" int msm_cuda_gather_rows(float *out, const float *x, const int32_t *rows, int R, int C,
                                    cudaStream_t stream) {
    if (R == 0) return 0;
    gather_rows_kernel<<<R, 256, 0, stream>>>(out, x, rows, C);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* Device-side helpers of the CUDA backend: deterministic dummy weights generated on the GPU
 * (--dummy-weights: no checkpoint, no host staging of 30 GB of random numbers) and the
 * float32 → bf16 conversion of uploaded weights. */
#include <cuda_runtime_api.h>
#include <stdint.h>

#include "msm_cuda.h"
#include "msm_cuda_backend.h"



static __global__ void fill_kernel(uint16_t *w, size_t n, uint64_t seed, float scale, int ones) {
    msm_pdl_trigger();
    msm_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] = ones ? (uint16_t)0x3f80 : msm_f2bf((2.0f * msm_rng_uniform_dev(seed, i) - 1.0f) * scale);
}

extern "C" int msm_cuda_fill_dummy(uint16_t *w, size_t n, uint64_t seed, float scale, int ones,
                                   cudaStream_t stream) {
    if (n == 0) return 0;
    CUDA_TRY(msm_launch(fill_kernel, dim3(1024), dim3(256), 0, stream, w, n, seed, scale, ones));
    return 0;
}

static __global__ void gather_rows_kernel(float *out, const float *x, const int32_t *rows, int C) {
    msm_pdl_trigger();
    msm_pdl_wait();
    const float *src = x + (size_t)rows[blockIdx.x] * C;
    float *dst = out + (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
}

/* out[r,:] = x[rows[r],:] with rows on the device (GATHER_ROWS: the logits rows of a step). */
extern "C" int msm_cuda_gather_rows(float *out, const float *x, const int32_t *rows, int R, int C,
                                    cudaStream_t stream) {
    if (R == 0) return 0;
    CUDA_TRY(msm_launch(gather_rows_kernel, dim3(R), dim3(256), 0, stream, out, x, rows, C));
    return 0;
}

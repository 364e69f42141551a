/* fill.cu: the CUDA backend's deterministic dummy weights, generated on the GPU (--dummy-weights:
 * no checkpoint, no host staging of 30 GB of random numbers), from the counter-based generator
 * the CPU backend's dummy weights use too (msm_rng_uniform). */
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
                                   msm_cuda_exec ex) {
    if (n == 0) return 0;
    CUDA_TRY(msm_launch(fill_kernel, dim3(1024), dim3(256), 0, ex, w, n, seed, scale, ones));
    return 0;
}

static __global__ void fill_f32_kernel(float *w, size_t n, uint64_t seed, float scale, int ones) {
    msm_pdl_trigger();
    msm_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        w[i] = ones ? 1.0f : (2.0f * msm_rng_uniform_dev(seed, i) - 1.0f) * scale;
}

extern "C" int msm_cuda_fill_dummy_f32(float *w, size_t n, uint64_t seed, float scale, int ones,
                                       msm_cuda_exec ex) {
    if (n == 0) return 0;
    CUDA_TRY(msm_launch(fill_f32_kernel, dim3(1024), dim3(256), 0, ex, w, n, seed, scale, ones));
    return 0;
}

static __global__ void fill_fp8_kernel(uint8_t *q, float *sc, size_t n, size_t n_scales, uint64_t seed, float scale) {
    msm_pdl_trigger();
    msm_pdl_wait();
    size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        q[i] = (uint8_t)__nv_cvt_float_to_fp8((2.0f * msm_rng_uniform_dev(seed, i) - 1.0f) * 448.0f, __NV_SATFINITE,
                                              __NV_E4M3);
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n_scales; i += stride) sc[i] = scale / 448.0f;
}

extern "C" int msm_cuda_fill_dummy_fp8(uint8_t *q, float *sc, size_t n, size_t n_scales, uint64_t seed, float scale,
                                       msm_cuda_exec ex) {
    if (n == 0) return 0;
    CUDA_TRY(msm_launch(fill_fp8_kernel, dim3(1024), dim3(256), 0, ex, q, sc, n, n_scales, seed, scale));
    return 0;
}

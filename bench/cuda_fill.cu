/* cuda_fill.cu: device-side fills for the kernel benchmark (not part of libmsmoe): large buffers
 * of deterministic pseudo-random values made on the device, so a timing run need not generate
 * and upload gigabytes from the host. */
#include "cuda_fill.h"
#include "msm_cuda.h"

#include <errno.h>

static __device__ uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* Uniform in [-scale, scale), never exactly zero-heavy. */
static __global__ void fill_bf16_kernel(uint16_t *p, size_t n, uint64_t seed, float scale) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        uint64_t z = mix(seed * 0x9E3779B97F4A7C15ull + i);
        float u = (float)(z >> 40) * (1.0f / 16777216.0f);
        p[i] = msm_f2bf((2.0f * u - 1.0f) * scale);
    }
}

static __global__ void fill_i32_kernel(int32_t *p, size_t n, uint64_t seed, int32_t mod) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        p[i] = (int32_t)(mix(seed * 0x9E3779B97F4A7C15ull + i) % (uint64_t)mod);
}

extern "C" int msm_bench_fill_bf16(uint16_t *p, size_t n, uint64_t seed, float scale, cudaStream_t s) {
    if (n == 0) return 0;
    fill_bf16_kernel<<<4096, 256, 0, s>>>(p, n, seed, scale);
    CUDA_LAUNCH_CHECK();
    return 0;
}

extern "C" int msm_bench_fill_i32(int32_t *p, size_t n, uint64_t seed, int32_t mod, cudaStream_t s) {
    if (n == 0 || mod <= 0) return n ? -EINVAL : 0;
    fill_i32_kernel<<<256, 256, 0, s>>>(p, n, seed, mod);
    CUDA_LAUNCH_CHECK();
    return 0;
}

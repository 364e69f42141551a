/* fp8.cu: FP8 block-scaled weights resident on the device (docs/adr/0006-fp8.md), the parts the
 * FP8 GEMVs (linear.cu, moe_pair.cu, moe_grouped.cu) do not cover: dequantisation to bf16 for the
 * bf16 paths of larger T (cuBLASLt, the tiled and WMMA MoE GEMMs), of a whole weight or of the
 * experts a step selected.
 *
 * The value is DeepSeek-V3's `weight_dequant`, f32(q) * scale in one float32 multiply, rounded to
 * bf16 (nearest even): bit for bit what load.cu stores for a weight that is not kept FP8, and the
 * host's msm_f32_to_bf16(msm_fp8_dequant_row(...)) (the oracle, engine/dtype.c); an FP8 NaN code
 * becomes the bf16 NaN of its sign (0x7fc0 / 0xffc0) as there. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>

/* used[e] = 1 for every expert ids[0..n) names, 0 for the others (one block). */
static __global__ void fp8_mark_kernel(int32_t *used, const int32_t *ids, int n, int E) {
    __shared__ int32_t u[256];
    msm_pdl_trigger();
    msm_pdl_wait();
    for (int e = threadIdx.x; e < E; e += blockDim.x) u[e] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int e = ids[i];
        if (e >= 0 && e < E) u[e] = 1;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) used[e] = u[e];
}

static __device__ __forceinline__ uint16_t fp8_deq_bf16(uint32_t q, float f, float s) {
    if ((q & 0x7fu) == 0x7fu) return (q & 0x80u) ? (uint16_t)0xffc0 : (uint16_t)0x7fc0;
    return msm_f2bf(__fmul_rn(f, s));
}

/* Block (chunk, expert e): rows x cols codes of expert e (skipped unless used[e], when used is
 * given) into dst, 8 columns a thread (cols and the phase ph % 8 == 0) or one. */
template <bool V8>
static __global__ void fp8_dequant_kernel(uint16_t *dst, const uint8_t *q, const float *sc, int ph,
                                          const int32_t *used, int rows, int cols) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int e = blockIdx.y;
    if (used && !used[e]) return;
    size_t per = (size_t)rows * cols, base = (size_t)e * per;
    const float *se = sc + (size_t)e * msm_cuda_fp8_scales(1, rows, cols, ph);
    size_t ncb = (size_t)((cols + ph + 127) >> 7);
    size_t step = (size_t)gridDim.x * blockDim.x * (V8 ? 8 : 1);
    for (size_t i = ((size_t)blockIdx.x * blockDim.x + threadIdx.x) * (V8 ? 8 : 1); i < per; i += step) {
        size_t r = i / (size_t)cols, c = i % (size_t)cols;
        float s = se[r * ncb + ((c + (size_t)ph) >> 7)];
        if constexpr (V8) { /* 8 columns inside one 128-column block (cols and ph % 8 == 0) */
            uint2 v = *(const uint2 *)(q + base + i);
            float f[8];
            msm_fp8x4_f32<true>(v.x, f), msm_fp8x4_f32<true>(v.y, f + 4);
            uint32_t o[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint32_t b0 = (j < 2 ? v.x : v.y) >> (16 * (j & 1)), b1 = b0 >> 8;
                o[j] = fp8_deq_bf16(b0 & 0xffu, f[2 * j], s) | (uint32_t)fp8_deq_bf16(b1 & 0xffu, f[2 * j + 1], s) << 16;
            }
            *(uint4 *)(dst + base + i) = make_uint4(o[0], o[1], o[2], o[3]);
        } else {
            uint32_t b = q[base + i];
            __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)b, __NV_E4M3);
            dst[base + i] = fp8_deq_bf16(b, __half2float(__half(h)), s);
        }
    }
}

extern "C" int msm_cuda_fp8_mark(int32_t *used, const int32_t *ids, int n, int E, msm_cuda_exec ex) {
    if (!used || E <= 0 || E > 256 || n < 0 || (n && !ids)) return -EINVAL;
    CUDA_TRY(msm_launch(fp8_mark_kernel, dim3(1), dim3(256), 0, ex, used, ids, n, E));
    return 0;
}

extern "C" int msm_cuda_fp8_dequant(uint16_t *dst, msm_cuda_fp8w w, int n_expert, int rows, int cols,
                                    const int32_t *used, msm_cuda_exec ex) {
    if (!dst || !w.q || !w.scale || w.phase < 0 || w.phase >= MSM_CUDA_FP8_BLOCK || n_expert <= 0 ||
        n_expert > 65535 || rows <= 0 || cols <= 0)
        return -EINVAL;
    bool v8 = cols % 8 == 0 && w.phase % 8 == 0 && (uintptr_t)w.q % 8 == 0 && (uintptr_t)dst % 16 == 0;
    size_t per = (size_t)rows * cols, units = v8 ? per / 8 : per;
    /* about 32 blocks of 256 threads an SM over the whole weight, split across the experts */
    size_t want = (size_t)ex.tune->sms * 32 / (size_t)n_expert;
    size_t bx = (units + 255) / 256;
    if (bx > want) bx = want ? want : 1;
    dim3 grid((unsigned)bx, (unsigned)n_expert);
    if (v8)
        CUDA_TRY(msm_launch(fp8_dequant_kernel<true>, grid, dim3(256), 0, ex, dst, w.q, w.scale, w.phase, used, rows,
                            cols));
    else
        CUDA_TRY(msm_launch(fp8_dequant_kernel<false>, grid, dim3(256), 0, ex, dst, w.q, w.scale, w.phase, used, rows,
                            cols));
    return 0;
}

/* moe_norm.h: the shared expert's combine + residual add + RMSNorm of one row (MOE_COMBINE_NORM),
 * the arithmetic that moe_combine_rmsnorm_kernel (elementwise.cu) and its form reading the routed
 * experts' per-pair rows itself (moe.cu, msm_cuda_moe_combine_rmsnorm_routed) share, so the two
 * give the same bits (not a public header). */
#ifndef MSM_MOE_NORM_H
#define MSM_MOE_NORM_H

#include "msm_cuda.h"

/* The threads of a block of msm_moe_combine_norm_row's kernels for rows of dim (0: too wide). */
static inline int msm_moe_combine_threads(int dim) {
    int threads = dim >= 2048 ? 512 : dim >= 1024 ? 256 : dim > 128 ? 128 : 64;
    if (dim > 16 * threads) threads = (((dim + 15) / 16 + 31) / 32) * 32;
    return threads > 1024 ? 0 : threads;
}

/* Block blockIdx.x's row (dim values) of: g = sigmoid(h . wg), sum = x + (routed + shared * g),
 * out = rmsnorm(sum) * w; routed(i) the routed experts' sum at element i of the rows (row-major
 * offset), pre() run once by every thread after the PDL wait, before the row's loads. NORM false:
 * only the combine (x, w, eps unused; sum gets routed + shared * g). One block per row; block sums
 * in a fixed order. Every thread of the block calls it; it does the PDL wait. */
template <int V, bool NORM, typename Pre, typename Rt>
static __device__ __forceinline__ void msm_moe_combine_norm_row(Pre pre, Rt routed, float *sum, float *out, const float *x,
                                                                const float *shared, const float *h,
                                                                const uint16_t *wg, const uint16_t *w, int dim,
                                                                float eps) {
    msm_pdl_trigger();
    float gv[V], wv[V]; /* weights: loaded before the PDL wait (msm_norm_w_load) */
    msm_norm_w_load<V>(wg, dim, gv);
    if (NORM) msm_norm_w_load<V>(w, dim, wv);
    msm_pdl_wait();
    pre();
    __shared__ float part[32];
    size_t off = (size_t)blockIdx.x * dim;
    float hv[V], xv[V], rv[V], sv[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        bool ok = i < dim;
        hv[j] = ok ? h[off + i] : 0.0f;
        xv[j] = ok && NORM ? x[off + i] : 0.0f;
        rv[j] = ok ? routed(off + i) : 0.0f;
        sv[j] = ok ? shared[off + i] : 0.0f;
    }
    float g = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++)
        if (threadIdx.x + j * blockDim.x < dim) g = fmaf(hv[j], gv[j], g);
    g = msm_block_sum(g, part);
    float s = 1.0f / (1.0f + expf(-g));
    if (!NORM) {
#pragma unroll
        for (int j = 0; j < V; j++) {
            int i = threadIdx.x + j * blockDim.x;
            if (i < dim) sum[off + i] = rv[j] + sv[j] * s;
        }
        return;
    }
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        xv[j] = xv[j] + (rv[j] + sv[j] * s);
        if (i < dim) {
            sum[off + i] = xv[j];
            ss += xv[j] * xv[j];
        }
    }
    ss = msm_block_sum(ss, part);
    float inv = 1.0f / sqrtf(ss / (float)dim + eps);
#pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < dim) out[off + i] = wv[j] * (xv[j] * inv);
    }
}

#endif

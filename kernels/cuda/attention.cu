/* attention.cu: causal paged attention over the bf16 KV cache, for decode and prefill alike.
 *
 * One block per (query head, token), 8 warps. The warps split the context positions 0..pos[t]
 * (warp w takes w, w+8, ...; two positions per iteration so two K/V rows are in flight), each
 * keeps its own online softmax (max, denominator, output accumulator over the head dims, lane l
 * owning dims l, l+32, ...), and the block merges the 8 partial softmaxes in a fixed order at the
 * end, so results are deterministic. Scores and the softmax are fp32, as on the CPU.
 *
 * Positions are read through the sequence's block table: slot = table[p / 16] * 16 + p % 16. GQA
 * query heads read kv head h / (nh / kvh); the group's heads share those K/V rows through L2.
 *
 * Known limit (a later optimisation): at batch 1 there are only nh blocks, which leaves most of
 * the SMs idle on long contexts; a split-context (flash-decoding) variant would fix that. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>
#include <math.h>

#define ATT_WARPS 8

template <int DPL>
__global__ void __launch_bounds__(ATT_WARPS * 32)
    attention_kernel(float *out, const float *q, const uint16_t *kc, const uint16_t *vc,
                     const int32_t *seq, const int32_t *pos, const int32_t *block_tables,
                     int max_blocks, int nh, int kvh, int hd, float scale) {
    __shared__ float sm_m[ATT_WARPS], sm_den[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][DPL * 32];
    int h = blockIdx.x, t = blockIdx.y;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int kh = h / (nh / kvh);
    size_t row = (size_t)kvh * hd;
    const float *qh = q + ((size_t)t * nh + h) * hd;
    float qv[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = i * 32 + lane;
        qv[i] = d < hd ? qh[d] : 0.0f;
    }
    const int32_t *bt = block_tables + (size_t)seq[t] * max_blocks;
    int n = pos[t] + 1;
    float m = -INFINITY, den = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;

    for (int p = warp; p < n; p += 2 * ATT_WARPS) {
        int p2 = p + ATT_WARPS;
        bool has2 = p2 < n; /* warp-uniform */
        size_t s1 = (size_t)bt[p / MSM_KV_BLOCK] * MSM_KV_BLOCK + p % MSM_KV_BLOCK;
        size_t s2 = has2 ? (size_t)bt[p2 / MSM_KV_BLOCK] * MSM_KV_BLOCK + p2 % MSM_KV_BLOCK : s1;
        const uint16_t *k1 = kc + s1 * row + (size_t)kh * hd, *v1 = vc + s1 * row + (size_t)kh * hd;
        const uint16_t *k2 = kc + s2 * row + (size_t)kh * hd, *v2 = vc + s2 * row + (size_t)kh * hd;
        float kf1[DPL], kf2[DPL], vf1[DPL], vf2[DPL];
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            int d = i * 32 + lane;
            bool ok = d < hd;
            kf1[i] = ok ? msm_bf(k1[d]) : 0.0f;
            kf2[i] = ok ? msm_bf(k2[d]) : 0.0f;
            vf1[i] = ok ? msm_bf(v1[d]) : 0.0f;
            vf2[i] = ok ? msm_bf(v2[d]) : 0.0f;
        }
        float d1 = 0.0f, d2 = 0.0f;
#pragma unroll
        for (int i = 0; i < DPL; i++) {
            d1 = fmaf(qv[i], kf1[i], d1);
            d2 = fmaf(qv[i], kf2[i], d2);
        }
        float sc1 = msm_warp_sum(d1) * scale, sc2 = msm_warp_sum(d2) * scale;
        {
            float nm = fmaxf(m, sc1);
            float corr = expf(m - nm), e = expf(sc1 - nm);
            den = den * corr + e;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] = acc[i] * corr + e * vf1[i];
            m = nm;
        }
        if (has2) {
            float nm = fmaxf(m, sc2);
            float corr = expf(m - nm), e = expf(sc2 - nm);
            den = den * corr + e;
#pragma unroll
            for (int i = 0; i < DPL; i++) acc[i] = acc[i] * corr + e * vf2[i];
            m = nm;
        }
    }
    if (lane == 0) sm_m[warp] = m, sm_den[warp] = den;
#pragma unroll
    for (int i = 0; i < DPL; i++) sm_acc[warp][i * 32 + lane] = acc[i];
    __syncthreads();
    float M = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) M = fmaxf(M, sm_m[w]);
    float D = 0.0f, cw[ATT_WARPS];
#pragma unroll
    for (int w = 0; w < ATT_WARPS; w++) {
        cw[w] = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - M); /* idle warps weigh 0 */
        D += sm_den[w] * cw[w];
    }
    float inv = 1.0f / D;
    float *oh = out + ((size_t)t * nh + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) o += sm_acc[w][d] * cw[w];
        oh[d] = o * inv;
    }
}

extern "C" int msm_cuda_attention(float *out, const float *q, const uint16_t *kc,
                                  const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                                  const int32_t *block_tables, int max_blocks, int T, int nh,
                                  int kvh, int hd, float scale, cudaStream_t stream) {
    if (T < 0 || nh <= 0 || kvh <= 0 || nh % kvh || hd <= 0 || hd > 256 || max_blocks <= 0)
        return -EINVAL;
    if (T == 0) return 0;
    if (T > 65535) return -EINVAL; /* grid.y limit; prefill chunks are far smaller */
    dim3 grid((unsigned)nh, (unsigned)T);
    int dpl = (hd + 31) / 32;
    if (dpl <= 1)
        attention_kernel<1><<<grid, ATT_WARPS * 32, 0, stream>>>(out, q, kc, vc, seq, pos,
                                                                  block_tables, max_blocks, nh,
                                                                  kvh, hd, scale);
    else if (dpl <= 2)
        attention_kernel<2><<<grid, ATT_WARPS * 32, 0, stream>>>(out, q, kc, vc, seq, pos,
                                                                  block_tables, max_blocks, nh,
                                                                  kvh, hd, scale);
    else if (dpl <= 4)
        attention_kernel<4><<<grid, ATT_WARPS * 32, 0, stream>>>(out, q, kc, vc, seq, pos,
                                                                  block_tables, max_blocks, nh,
                                                                  kvh, hd, scale);
    else
        attention_kernel<8><<<grid, ATT_WARPS * 32, 0, stream>>>(out, q, kc, vc, seq, pos,
                                                                  block_tables, max_blocks, nh,
                                                                  kvh, hd, scale);
    CUDA_LAUNCH_CHECK();
    return 0;
}

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
    attention_kernel(float *out, const float *q, size_t q_ld, const uint16_t *kc,
                     const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                     const int32_t *block_tables, int max_blocks, int nh, int kvh, int hd,
                     float scale, float *part) {
    __shared__ float sm_m[ATT_WARPS], sm_den[ATT_WARPS];
    __shared__ float sm_acc[ATT_WARPS][DPL * 32];
    int h = blockIdx.x, t = blockIdx.y;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int kh = h / (nh / kvh);
    size_t row = (size_t)kvh * hd;
    const float *qh = q + (size_t)t * q_ld + (size_t)h * hd;
    float qv[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        int d = i * 32 + lane;
        qv[i] = d < hd ? qh[d] : 0.0f;
    }
    const int32_t *bt = block_tables + (size_t)seq[t] * max_blocks;
    int n = pos[t] + 1, lo = 0;
    if (gridDim.z > 1) { /* split: this block takes one contiguous chunk of the positions */
        int chunk = (n + (int)gridDim.z - 1) / (int)gridDim.z;
        lo = min(n, (int)blockIdx.z * chunk);
        n = min(n, lo + chunk);
    }
    float m = -INFINITY, den = 0.0f, acc[DPL];
#pragma unroll
    for (int i = 0; i < DPL; i++) acc[i] = 0.0f;

    for (int p = lo + warp; p < n; p += 2 * ATT_WARPS) {
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
    if (gridDim.z > 1) { /* partial: [M, D, o[hd]] unnormalised, merged by attention_merge */
        float *ph = part + (((size_t)t * nh + h) * gridDim.z + blockIdx.z) * (size_t)(hd + 2);
        if (threadIdx.x == 0) ph[0] = M, ph[1] = D;
        for (int d = threadIdx.x; d < hd; d += blockDim.x) {
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++) o += sm_acc[w][d] * cw[w];
            ph[2 + d] = o;
        }
        return;
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

/* One block per (head, token): the splits' partials merged in split order. */
__global__ void attention_merge_kernel(float *out, const float *part, int nh, int hd, int ns) {
    int h = blockIdx.x, t = blockIdx.y;
    const float *ph = part + ((size_t)t * nh + h) * ns * (size_t)(hd + 2);
    float M = -INFINITY;
    for (int s = 0; s < ns; s++) M = fmaxf(M, ph[(size_t)s * (hd + 2)]);
    float D = 0.0f;
    for (int s = 0; s < ns; s++) {
        float m = ph[(size_t)s * (hd + 2)];
        D += m == -INFINITY ? 0.0f : ph[(size_t)s * (hd + 2) + 1] * expf(m - M);
    }
    float inv = 1.0f / D;
    float *oh = out + ((size_t)t * nh + h) * hd;
    for (int d = threadIdx.x; d < hd; d += blockDim.x) {
        float o = 0.0f;
        for (int s = 0; s < ns; s++) {
            float m = ph[(size_t)s * (hd + 2)];
            if (m != -INFINITY) o += ph[(size_t)s * (hd + 2) + 2 + d] * expf(m - M);
        }
        oh[d] = o * inv;
    }
}

#define ATT_MAX_SPLIT 32

/* Splits so that about two blocks per SM are busy (132 SMs on an H200; the count is queried). */
static int n_splits(int T, int nh) {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
            sms = 132;
    }
    long blocks = (long)T * nh, want = 2L * sms;
    if (blocks >= want) return 1;
    long s = (want + blocks - 1) / blocks;
    return (int)(s > ATT_MAX_SPLIT ? ATT_MAX_SPLIT : s);
}

extern "C" size_t msm_cuda_attention_ws_bytes(int T, int nh, int hd) {
    if (T <= 0 || nh <= 0 || hd <= 0) return 0;
    return sizeof(float) * (size_t)T * nh * ATT_MAX_SPLIT * (size_t)(hd + 2);
}

extern "C" int msm_cuda_attention(float *out, const float *q, const uint16_t *kc,
                                  const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                                  const int32_t *block_tables, int max_blocks, int T, int nh,
                                  int kvh, int hd, float scale, cudaStream_t stream) {
    return msm_cuda_attention_ex(out, q, (size_t)nh * hd, kc, vc, seq, pos, block_tables,
                                 max_blocks, T, nh, kvh, hd, scale, NULL, 0, stream);
}

extern "C" int msm_cuda_attention_ex(float *out, const float *q, size_t q_ld, const uint16_t *kc,
                                     const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                                     const int32_t *block_tables, int max_blocks, int T, int nh,
                                     int kvh, int hd, float scale, void *ws, size_t ws_bytes,
                                     cudaStream_t stream) {
    if (T < 0 || nh <= 0 || kvh <= 0 || nh % kvh || hd <= 0 || hd > 256 || max_blocks <= 0 ||
        q_ld < (size_t)nh * hd)
        return -EINVAL;
    if (T == 0) return 0;
    if (T > 65535) return -EINVAL; /* grid.y limit; prefill chunks are far smaller */
    int ns = ws ? n_splits(T, nh) : 1;
    float *part = (float *)ws;
    if (ns > 1 && sizeof(float) * (size_t)T * nh * ns * (size_t)(hd + 2) > ws_bytes) ns = 1;
    dim3 grid((unsigned)nh, (unsigned)T, (unsigned)ns);
    int dpl = (hd + 31) / 32;
    if (dpl <= 1)
        attention_kernel<1><<<grid, ATT_WARPS * 32, 0, stream>>>(out, q, q_ld, kc, vc, seq, pos,
                                                                  block_tables, max_blocks, nh,
                                                                  kvh, hd, scale, part);
    else if (dpl <= 2)
        attention_kernel<2><<<grid, ATT_WARPS * 32, 0, stream>>>(out, q, q_ld, kc, vc, seq, pos,
                                                                  block_tables, max_blocks, nh,
                                                                  kvh, hd, scale, part);
    else if (dpl <= 4)
        attention_kernel<4><<<grid, ATT_WARPS * 32, 0, stream>>>(out, q, q_ld, kc, vc, seq, pos,
                                                                  block_tables, max_blocks, nh,
                                                                  kvh, hd, scale, part);
    else
        attention_kernel<8><<<grid, ATT_WARPS * 32, 0, stream>>>(out, q, q_ld, kc, vc, seq, pos,
                                                                  block_tables, max_blocks, nh,
                                                                  kvh, hd, scale, part);
    CUDA_LAUNCH_CHECK();
    if (ns > 1) {
        attention_merge_kernel<<<dim3((unsigned)nh, (unsigned)T), 128, 0, stream>>>(out, part, nh, hd, ns);
        CUDA_LAUNCH_CHECK();
    }
    return 0;
}

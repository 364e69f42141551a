/* attention_dec.cu: one-token decode attention where the step waits on its latency, not its bytes
 * (MHA at 1-2 tokens a step: Qwen1.5-MoE's 16 heads read 4 MiB of cache a layer, 1 us at the
 * copy ceiling, yet the SIMT kernel took 8-9 us of the step a layer and the tensor-core split
 * ~8; both ran ~1200 dependent instructions a warp at 9-11 cycles each, Nsight Compute, H200 and
 * H100, bench/results/2026-12-05-h200-s20 and -s21).
 *
 * So: short chains, many warps, one barrier of each kind. Grid (ns, nh, T), ns <= 8 blocks of
 * AD_WARPS warps a (token, query head) as one thread-block cluster (ns 1: no cluster). The
 * cluster's ns * AD_WARPS warps take the context in turn, AD_U * (32 / L) positions a warp at a
 * time (8 at hd 128: context 512 is one pass of 64 warps): lane sl of a sub-group of L = hd / 8
 * lanes owns the 8 head dims 8*sl.. and reads them of a K and a V row with one 16-byte load each;
 * all of a pass's loads are issued together, before the previous pass is scored. A sub-group
 * scores its positions (fp32 dot, butterfly over its L lanes) and keeps an online softmax over
 * the passes; the warp's sub-groups merge by shuffles, the block's warps through shared memory in
 * warp order, and each block pushes its partial (max, denominator, unnormalised output) into rank
 * 0's shared memory, where after one cluster barrier rank 0 merges the ns partials in block order
 * and writes the output. Fixed orders throughout: the bits do not depend on timing (replay =
 * eager), though they are neither the SIMT nor the tensor-core kernel's (other groupings of the
 * same fp32 sums; all are held to the CPU). Scores and softmax are fp32, as on the CPU.
 *
 * Launched with programmatic dependent launch at decode only (one token a sequence,
 * msm_cuda_exec.decode): the step's inputs (seq, pos, block tables) and the cache rows below each
 * token's position were written before the step's first kernel, so a warp's first pass is loaded
 * before the PDL wait; the token's own row, which the kernel before writes, and q after it. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <cooperative_groups.h>
#include <errno.h>
#include <math.h>

namespace cg = cooperative_groups;

#define AD_WARPS 8
#define AD_THREADS (AD_WARPS * 32)
#define AD_U 4          /* positions a sub-group loads a pass, all in flight at once */
#define AD_MAX_SPLIT 8  /* blocks a cluster: the portable cluster size */

static __device__ __forceinline__ void ad_unpack8(uint4 r, float f[8]) {
    float2 a = msm_bf2(r.x), b = msm_bf2(r.y), c = msm_bf2(r.z), d = msm_bf2(r.w);
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
    f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

/* A sub-group's AD_U positions of a pass: the lane's 8 dims of their K and V rows (zero where the
 * position is past the range or not loaded yet). */
struct ad_pass {
    uint4 k[AD_U], v[AD_U];
    unsigned ok; /* bit u: position base + u * P + g is inside the context */
};

/* Issues the loads of the positions base + u * P + g, u < AD_U: those < n are in the pass, those
 * < lim are loaded now (lim = n - 1 before the PDL wait: the token's own row waits). */
template <int HD>
static __device__ __forceinline__ void ad_fetch(ad_pass &ps, int base, int n, int lim, int g, const int32_t *bt,
                                                size_t row, const uint16_t *kb, const uint16_t *vb) {
    constexpr int P = 32 / (HD / 8);
    size_t off[AD_U];
    unsigned now = 0;
    ps.ok = 0;
#pragma unroll
    for (int u = 0; u < AD_U; u++) {
        int p = base + u * P + g;
        ps.ok |= (unsigned)(p < n) << u;
        now |= (unsigned)(p < lim) << u;
        off[u] = p < lim ? ((size_t)__ldg(bt + p / MSM_KV_BLOCK) * MSM_KV_BLOCK + p % MSM_KV_BLOCK) * row : 0;
    }
#pragma unroll
    for (int u = 0; u < AD_U; u++) ps.k[u] = now >> u & 1 ? msm_ld_stream16(kb + off[u]) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < AD_U; u++) ps.v[u] = now >> u & 1 ? msm_ld_stream16(vb + off[u]) : make_uint4(0, 0, 0, 0);
}

/* Scores a pass (fp32 dot over the lane's 8 dims, butterfly over the sub-group's L lanes, which
 * leaves each of them the same value) and folds it into the sub-group's online softmax. */
template <int HD>
static __device__ __forceinline__ void ad_fold(const ad_pass &ps, const float qv[8], float scale, float &m, float &den,
                                               float acc[8]) {
    constexpr int L = HD / 8;
    float s[AD_U];
#pragma unroll
    for (int u = 0; u < AD_U; u++) {
        float kf[8], d = 0.0f;
        ad_unpack8(ps.k[u], kf);
#pragma unroll
        for (int j = 0; j < 8; j++) d = fmaf(qv[j], kf[j], d);
        s[u] = d;
    }
#pragma unroll
    for (int o = L / 2; o > 0; o >>= 1)
#pragma unroll
        for (int u = 0; u < AD_U; u++) s[u] += __shfl_xor_sync(MSM_FULL_MASK, s[u], o);
    float mx = m;
#pragma unroll
    for (int u = 0; u < AD_U; u++) {
        s[u] = ps.ok >> u & 1 ? s[u] * scale : -INFINITY;
        mx = fmaxf(mx, s[u]);
    }
    if (mx == -INFINITY) return; /* sub-group-uniform: nothing in the context yet */
    float corr = expf(m - mx);   /* m = -inf: 0 */
    den *= corr;
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j] *= corr;
#pragma unroll
    for (int u = 0; u < AD_U; u++) {
        float e = expf(s[u] - mx), vf[8]; /* past the context: e = 0 and v zero */
        ad_unpack8(ps.v[u], vf);
        den += e;
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = fmaf(e, vf[j], acc[j]);
    }
    m = mx;
}

static __device__ __forceinline__ void ad_cluster_arrive_relaxed(void) {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory");
}

static __device__ __forceinline__ void ad_cluster_wait(void) {
    asm volatile("barrier.cluster.wait.aligned;" ::: "memory");
}

template <int HD>
static __global__ void __launch_bounds__(AD_THREADS)
    attention_dec_kernel(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                         const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks, int nh,
                         int kvh, float scale) {
    constexpr int L = HD / 8, P = 32 / L, WP = AD_U * P; /* lanes a position; positions a load, a pass */
    __shared__ float sm_m[AD_WARPS], sm_d[AD_WARPS];
    __shared__ __align__(16) float sm_o[AD_WARPS][HD];
    __shared__ float sm_part[AD_MAX_SPLIT][HD + 2]; /* rank 0: each block's [M, D, o[HD]] */
    const int ns = gridDim.x, z = blockIdx.x, h = blockIdx.y, t = blockIdx.z;
    /* every block of the cluster has started before any writes into rank 0's shared memory: the
     * arrive here, its wait before the push (the barrier's latency hides behind the pass) */
    if (ns > 1) ad_cluster_arrive_relaxed();
    msm_pdl_trigger();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane / L, d0 = (lane % L) * 8;
    const int kh = h / (nh / kvh), n = max(pos[t] + 1, 0);
    const int32_t *bt = block_tables + (size_t)seq[t] * max_blocks;
    const size_t row = (size_t)kvh * HD;
    const uint16_t *kb = kc + (size_t)kh * HD + d0, *vb = vc + (size_t)kh * HD + d0;

    /* warp gw of the cluster takes the passes at positions (k * ns * AD_WARPS + gw) * WP, k = 0..;
     * the first before the PDL wait, all but the token's own row (position n - 1) */
    const int step = ns * AD_WARPS * WP;
    int base = (z * AD_WARPS + warp) * WP;
    ad_pass cur, nxt;
    ad_fetch<HD>(cur, base, n, n - 1, g, bt, row, kb, vb);
    msm_pdl_wait();
    {
        int dp = n - 1 - base; /* the own row, if it is one of this lane's */
        bool mine = dp >= 0 && dp < WP && dp % P == g;
        size_t off = mine ? ((size_t)__ldg(bt + (n - 1) / MSM_KV_BLOCK) * MSM_KV_BLOCK + (n - 1) % MSM_KV_BLOCK) * row : 0;
        uint4 k = mine ? msm_ld_stream16(kb + off) : make_uint4(0, 0, 0, 0);
        uint4 v = mine ? msm_ld_stream16(vb + off) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < AD_U; u++) {
            bool take = mine && dp / P == u;
            cur.k[u] = take ? k : cur.k[u];
            cur.v[u] = take ? v : cur.v[u];
        }
    }
    float qv[8];
    {
        const float4 *qh = (const float4 *)(q + (size_t)t * q_ld + (size_t)h * HD + d0);
        float4 a = qh[0], b = qh[1];
        qv[0] = a.x, qv[1] = a.y, qv[2] = a.z, qv[3] = a.w, qv[4] = b.x, qv[5] = b.y, qv[6] = b.z, qv[7] = b.w;
    }
    float m = -INFINITY, den = 0.0f, acc[8];
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j] = 0.0f;
    for (; base < n; base += step) { /* warp-uniform */
        ad_fetch<HD>(nxt, base + step, n, n, g, bt, row, kb, vb); /* past the context: no loads */
        ad_fold<HD>(cur, qv, scale, m, den, acc);
        cur = nxt;
    }

    /* the warp's sub-groups (same dims, other positions) into each, in a fixed pairing */
#pragma unroll
    for (int o = L; o < 32; o <<= 1) {
        float mo = __shfl_xor_sync(MSM_FULL_MASK, m, o), dno = __shfl_xor_sync(MSM_FULL_MASK, den, o);
        float mx = fmaxf(m, mo);
        float c1 = m == -INFINITY ? 0.0f : expf(m - mx), c2 = mo == -INFINITY ? 0.0f : expf(mo - mx);
        den = den * c1 + dno * c2;
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = acc[j] * c1 + __shfl_xor_sync(MSM_FULL_MASK, acc[j], o) * c2;
        m = mx;
    }
    if (lane == 0) sm_m[warp] = m, sm_d[warp] = den;
    if (g == 0) {
        *(float4 *)&sm_o[warp][d0] = make_float4(acc[0], acc[1], acc[2], acc[3]);
        *(float4 *)&sm_o[warp][d0 + 4] = make_float4(acc[4], acc[5], acc[6], acc[7]);
    }
    __syncthreads();

    /* the block's warps in warp order: column c = threadIdx.x (< HD) */
    const int c = threadIdx.x;
    float M = -INFINITY, D = 0.0f, O = 0.0f;
    if (c < HD) {
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++) M = fmaxf(M, sm_m[w]);
#pragma unroll
        for (int w = 0; w < AD_WARPS; w++) {
            float cw = sm_m[w] == -INFINITY ? 0.0f : expf(sm_m[w] - M); /* idle warps weigh 0 */
            D += sm_d[w] * cw;
            O += sm_o[w][c] * cw;
        }
    }
    float *o = out + ((size_t)t * nh + h) * HD;
    if (ns == 1) {
        if (c < HD) o[c] = n > 0 ? O * (1.0f / D) : 0.0f; /* empty context (pos < 0): zeros */
        return;
    }
    cg::cluster_group cl = cg::this_cluster();
    ad_cluster_wait(); /* every block of the cluster is running */
    if (c < HD) {
        float *dst = cl.map_shared_rank(&sm_part[z][0], 0);
        if (c == 0) dst[0] = M, dst[1] = D;
        dst[2 + c] = O;
    }
    cl.sync(); /* every partial is in rank 0's shared memory */
    if (z != 0 || c >= HD) return;
    float Mx = -INFINITY;
    for (int s = 0; s < ns; s++) Mx = fmaxf(Mx, sm_part[s][0]);
    float Dx = 0.0f, Ox = 0.0f;
    for (int s = 0; s < ns; s++) {
        float cw = sm_part[s][0] == -INFINITY ? 0.0f : expf(sm_part[s][0] - Mx); /* a block past the context: 0 */
        Dx += sm_part[s][1] * cw;
        Ox += sm_part[s][2 + c] * cw;
    }
    o[c] = n > 0 ? Ox * (1.0f / Dx) : 0.0f;
}

template <int HD>
static void ad_tuning_one(msm_cuda_tuning *t, int hi) {
    t->att_dec_per_sm[hi] = msm_blocks_per_sm(attention_dec_kernel<HD>, AD_THREADS, 0);
    for (int ns = 0; ns <= AD_MAX_SPLIT; ns++)
        t->att_dec_fit[hi][ns] = ns >= 2 ? msm_max_clusters(attention_dec_kernel<HD>, (unsigned)ns, AD_THREADS, 0) : 0;
}

/* The kernel's occupancy (GPU facts, msm_cuda_tuning_init). */
void msm__attention_dec_tuning(msm_cuda_tuning *t) {
    ad_tuning_one<64>(t, 0);
    ad_tuning_one<128>(t, 1);
}

extern "C" int msm_cuda_attention_dec_splits(int T, int nh, int kvh, int hd, const void *q, size_t q_ld,
                                             const void *kc, const void *vc, msm_cuda_exec ex) {
    const msm_cuda_tuning *tn = ex.tune;
    if (!ex.decode || T <= 0 || T > tn->att_dec_max_t || kvh <= 0 || nh % kvh || nh / kvh > tn->att_dec_max_g ||
        (hd != 64 && hd != 128) || ((uintptr_t)q | (uintptr_t)kc | (uintptr_t)vc) % 16 || q_ld % 4)
        return 0;
    int hi = hd == 128;
    long pairs = (long)T * nh, slots = (long)tn->sms * tn->att_dec_per_sm[hi];
    int cap = tn->att_max_split < AD_MAX_SPLIT ? tn->att_max_split : AD_MAX_SPLIT;
    for (int ns = AD_MAX_SPLIT; ns >= 2; ns /= 2)
        if (ns <= cap && pairs * ns <= slots && pairs + MSM_ATT_CLUSTER_SPARE <= tn->att_dec_fit[hi][ns]) return ns;
    return 1;
}

int msm__attention_dec_run(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                           const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks, int T,
                           int nh, int kvh, int hd, float scale, int ns, msm_cuda_exec ex) {
    dim3 grid((unsigned)ns, (unsigned)nh, (unsigned)T), blk(AD_THREADS);
#define AD_GO(HD)                                                                                                 \
    msm_launch_cluster(attention_dec_kernel<HD>, grid, blk, 0, (unsigned)ns, ex, out, q, q_ld, kc, vc, seq, pos, \
                       block_tables, max_blocks, nh, kvh, scale)
    if (hd == 64) CUDA_TRY(AD_GO(64));
    else if (hd == 128) CUDA_TRY(AD_GO(128));
    else return -EINVAL;
#undef AD_GO
    return 0;
}

/* attention_mma.cu: decode (and prefill) attention on tensor cores for grouped-query heads, the
 * path msm_cuda_attention_ex takes when a kv head serves several query heads and the (token, kv
 * head) blocks fill the GPU (tuning att_mma; attention.cu's SIMT kernel otherwise).
 *
 * Why: the SIMT kernel scores each position with a dot over L lanes and a butterfly of shuffles per
 * query head; at large batches it is bound by those instructions, not by memory (Qwen3-30B-A3B,
 * 8 query heads a kv head, batch 256, context 512: 298 us a layer at 0.9 TB/s, 40% of the step,
 * ncu on the H200, 2026-12-01). Here one block owns every query head of one kv head (up to 8;
 * more take several blocks) for one token, and the scores and the weighted sum of V are
 * mma.sync m16n8k16 products (bf16 in, fp32 accumulate), so each K/V row is read once for all
 * those heads and the arithmetic is off the critical path.
 *
 * Layout (FlashAttention-2 style, M = query rows): the 16 rows of A are the block's (up to) 8
 * heads' q split into bf16 hi (rows 0-7) and lo = bf16(q - hi) (rows 8-15), so one MMA yields
 * q_hi . k and q_lo . k for the same head in the two halves of the accumulator, and their sum
 * carries ~16 mantissa bits of q (near-fp32, like the MoE tensor-core GEMVs). S = Q K^T over a KV
 * block of 16 positions (two n8 tiles); the online softmax runs in fp32 per head (the four lanes
 * of a quad share a head row); P = exp(S - max) is split the same way, hi in rows 0-7 and lo in
 * rows 8-15 of the A operand of O += P V (n8 tiles over the head dims), whose two halves are added
 * at the end. K tiles feed the B operand through ldmatrix, V tiles through ldmatrix.trans.
 *
 * Each of the 4 warps takes the KV blocks w, w + 4, ... of the token's context with its own
 * double-buffered cp.async tiles (16 positions x hd bf16 of K and of V, rows swizzled so ldmatrix
 * reads are conflict-free), its own running max, denominator and output; positions past pos[t]
 * are zero-filled and masked. At the end the warps merge in warp order through shared memory, so
 * results are deterministic (bitwise the same run to run, replay or not). Scores, softmax and
 * merge are fp32 (as on the CPU); only q and p pass through the hi + lo bf16 pair.
 *
 * No context split over blocks: the launcher takes this kernel only once the (token, kv head)
 * blocks are enough to keep the GPU busy (attention.cu). A split version (partials merged by the
 * last block, as the SIMT kernel does) measured slower at context 512 (Qwen3-30B-A3B, ms a step,
 * split vs not: batch 8 10.85 vs 9.55, 16 13.17 vs 12.77, 32 18.16 vs 17.87; H200, 2026-12-01)
 * and was removed. Shared memory: 64 KiB a block at hd 128 and 3 blocks an SM, which with the
 * 1 KiB the driver reserves a block stays inside the 196 KiB carveout (keep the static shared
 * memory small: a build whose 3 blocks needed 196.2 KiB ran the FP8 presets' following GEMVs
 * slower, probably with the 228 KiB carveout's smaller L1; not yet confirmed).
 *
 * Launched with programmatic dependent launch: every block triggers its dependents and waits for
 * the previous kernel before it reads anything. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"
#include "qk_rope.h"

#include <cooperative_groups.h>
#include <errno.h>
#include <math.h>

#include <type_traits>

namespace cg = cooperative_groups;

#define AM_WARPS 4
#define AM_HEADS 8 /* query heads a block: the hi half of the MMA rows */
#define AM_MAX_SPLIT 16 /* the split kernel's largest cluster */

/* Bytes of one 16-position tile row in shared memory: hd bf16, at least 8 chunks of 16 bytes so
 * that the chunk swizzle (c ^ (row & 7)) stays inside the row. */
template <int HD>
struct am_geom {
    static constexpr int CH = HD / 8;                    /* 16-byte chunks of a K/V row */
    static constexpr int PITCH_CH = CH < 8 ? 8 : CH;      /* chunk slots a row in shared memory */
    static constexpr int TILE = MSM_KV_BLOCK * PITCH_CH * 16; /* bytes of one K or V tile */
    static constexpr int WARP_SMEM = 2 * 2 * TILE;        /* two stages of K and V */
    /* floats from one head's row to the next of q and of the staged warp outputs in shared memory:
     * a quad's 8 rows (g) HD + 8 apart fall on different banks, where HD apart they took 8 of its
     * 8-byte accesses into one bank each (8-way conflicts: 192 extra wavefronts a warp at 8 tokens
     * of Qwen3-30B-A3B, 39% of the split kernel's shared-memory traffic; H100 Nsight Compute,
     * bench/results/2026-12-07-h200-s34 run 8). Layout only: the same bits. */
    static constexpr int ROW = HD + 8;
    static constexpr int SMEM = AM_WARPS * WARP_SMEM;
};

static __device__ __forceinline__ void am_ldmatrix_x4_trans(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* Byte offset of chunk c of row r of a tile (swizzled). */
template <int HD>
static __device__ __forceinline__ uint32_t am_off(int r, int c) {
    return (uint32_t)(r * am_geom<HD>::PITCH_CH * 16 + ((c ^ (r & 7)) << 4));
}

/* Issues the copies of KV block b (positions b*16 .. b*16+15, those >= n zero-filled; cache block
 * `entry`, its block-table entry) of kv head kh into the warp's stage at sk (K) and sv (V). SKIP:
 * position `skip` is not copied at all (a later copy fills it: no two copies write one place). */
template <int HD, bool SKIP = false>
static __device__ __forceinline__ void am_fetch(uint32_t sk, uint32_t sv, const uint16_t *kc, const uint16_t *vc,
                                                int entry, int b, int n, size_t row, int kh, int lane, int skip = -1) {
    constexpr int CH = am_geom<HD>::CH;
    const size_t slot0 = (size_t)entry * MSM_KV_BLOCK;
#pragma unroll
    for (int i = lane; i < MSM_KV_BLOCK * CH; i += 32) {
        int r = i / CH, c = i % CH;
        if (SKIP && b * MSM_KV_BLOCK + r == skip) continue;
        bool ok = b * MSM_KV_BLOCK + r < n;
        size_t off = ((slot0 + (ok ? r : 0)) * row + (size_t)kh * HD) + (size_t)c * 8;
        msm_cp_async16(sk + am_off<HD>(r, c), kc + off, ok ? 16 : 0);
        msm_cp_async16(sv + am_off<HD>(r, c), vc + off, ok ? 16 : 0);
    }
}

/* q of heads h0.. (those below nhb) of token t as the A fragments of the scores: rows g (hi) and
 * g + 8 (lo) of head h0 + g, dims kk*16 + 2*tig (+8); a head's row hp floats after the one before
 * (HD in global memory, am_geom::ROW in shared memory). */
template <int HD>
static __device__ __forceinline__ void am_load_q(uint32_t (&qa)[HD / 16][4], const float *q, size_t q_ld, int t,
                                                 int h0, int nhb, int g, int tig, int hp = HD) {
    const float *qh = q + (size_t)t * q_ld + (size_t)(h0 + g) * hp;
    bool ok = g < nhb;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        float2 x0 = ok ? *(const float2 *)(qh + kk * 16 + 2 * tig) : make_float2(0.0f, 0.0f);
        float2 x1 = ok ? *(const float2 *)(qh + kk * 16 + 8 + 2 * tig) : make_float2(0.0f, 0.0f);
        msm_split_bf16x2(x0.x, x0.y, qa[kk][0], qa[kk][1]);
        msm_split_bf16x2(x1.x, x1.y, qa[kk][2], qa[kk][3]);
    }
}

/* ldmatrix lane rows / chunks: K (non-trans) matrices (pos 0-7, c), (0-7, c+1), (8-15, c),
 * (8-15, c+1); V (trans) matrices (pos 0-7, c), (8-15, c), (0-7, c+1), (8-15, c+1) */
struct am_lanes {
    int k_row, k_c, v_row, v_c;
    __device__ __forceinline__ explicit am_lanes(int lane)
        : k_row((lane & 7) + ((lane >> 4) << 3)), k_c((lane >> 3) & 1), v_row((lane & 7) + (((lane >> 3) & 1) << 3)),
          v_c(lane >> 4) {}
};

/* KV block b (positions b*16 .. b*16+15, those >= n masked), staged at cur (K, then V at
 * cur + TILE), folded into the warp's running max m, denominator share den and output o of head
 * g: S = Q K^T (s[j][0..1] head g (hi) at positions 8j + 2tig + {0,1}, s[j][2..3] the lo part),
 * the online softmax in fp32, then O += P V with P split into bf16 hi + lo. first: the warp's
 * first tile, where o and den are still 0 and m is -inf, so their rescale (by exp(-inf) = 0: zeros
 * again) is skipped (warp-uniform; the same bits, an exp and 65 multiplies less a lane where one
 * tile is all a warp has, as at 8 tokens of a 512-position context split 8 ways). */
template <int HD>
static __device__ __forceinline__ void am_tile(uint32_t cur, const uint32_t (&qa)[HD / 16][4], float (&o)[HD / 8][4],
                                               float &m, float &den, int b, int n, float scale, const am_lanes &ln,
                                               int tig, bool first) {
    constexpr int KS = HD / 16, NT = HD / 8, TILE = am_geom<HD>::TILE;
    float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
    for (int kk = 0; kk < KS; kk++) {
        uint32_t kb[4];
        msm_ldmatrix_x4(kb, cur + am_off<HD>(ln.k_row, 2 * kk + ln.k_c));
        msm_mma_bf16(s[0], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], kb[0], kb[1]);
        msm_mma_bf16(s[1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], kb[2], kb[3]);
    }
    /* the four scores of this lane (hi + lo), scaled; positions past the context: -inf */
    float sc[4];
    float mx = m;
#pragma unroll
    for (int j = 0; j < 2; j++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int p = b * MSM_KV_BLOCK + 8 * j + 2 * tig + e;
            float v = (s[j][e] + s[j][2 + e]) * scale;
            sc[2 * j + e] = p < n ? v : -INFINITY;
            mx = fmaxf(mx, sc[2 * j + e]);
        }
    mx = fmaxf(mx, __shfl_xor_sync(MSM_FULL_MASK, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(MSM_FULL_MASK, mx, 2));
    /* every block here has position b*16 < n, so mx is finite */
    if (!first) {
        float corr = expf(m - mx);
        den *= corr;
#pragma unroll
        for (int j = 0; j < NT; j++) o[j][0] *= corr, o[j][1] *= corr, o[j][2] *= corr, o[j][3] *= corr;
    }
    m = mx;
    float pr[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        pr[i] = expf(sc[i] - mx); /* masked: 0 */
        den += pr[i];
    }
    /* A fragments of P: rows g (hi) / g + 8 (lo), positions 2tig (+8) */
    uint32_t pa[4];
    msm_split_bf16x2(pr[0], pr[1], pa[0], pa[1]);
    msm_split_bf16x2(pr[2], pr[3], pa[2], pa[3]);
    /* O += P V over the head dims, 16 at a time (two n8 tiles per ldmatrix.x4.trans) */
#pragma unroll
    for (int j = 0; j < NT; j += 2) {
        uint32_t vb[4];
        am_ldmatrix_x4_trans(vb, cur + TILE + am_off<HD>(ln.v_row, j + ln.v_c));
        msm_mma_bf16(o[j], pa[0], pa[1], pa[2], pa[3], vb[0], vb[1]);
        msm_mma_bf16(o[j + 1], pa[0], pa[1], pa[2], pa[3], vb[2], vb[3]);
    }
}

/* After the warps' tiles: each warp's head-g output (hi + lo halves added), max and denominator
 * (summed over the quad, a fixed pairing) into shared memory, so = [AM_WARPS][AM_HEADS][ROW] over
 * the tile stages (am_geom::ROW, HD used), sm_m / sm_d [AM_WARPS][AM_HEADS]; ends with a barrier. */
template <int HD>
static __device__ __forceinline__ void am_stage_warps(float *so, float (*sm_m)[AM_HEADS], float (*sm_d)[AM_HEADS],
                                                      const float (&o)[HD / 8][4], float m, float den, int warp, int g,
                                                      int tig) {
    den += __shfl_xor_sync(MSM_FULL_MASK, den, 1);
    den += __shfl_xor_sync(MSM_FULL_MASK, den, 2);
    __syncthreads(); /* every warp is done with its tiles: the shared memory now holds outputs */
#pragma unroll
    for (int j = 0; j < HD / 8; j++) {
        int d = 8 * j + 2 * tig;
        float *p = so + ((size_t)warp * AM_HEADS + g) * am_geom<HD>::ROW + d;
        p[0] = o[j][0] + o[j][2];
        p[1] = o[j][1] + o[j][3];
    }
    if (tig == 0) sm_m[warp][g] = m, sm_d[warp][g] = den;
    __syncthreads();
}

/* The warp merge's weights, once a head instead of once a column: thread hh (< nhb) turns
 * am_stage_warps's maxima of head hh into the warps' weights (sm_m[w][hh] = exp(m_w - M), 0 for an
 * idle warp) and leaves the merged max in sm_d[1][hh] and denominator (summed in warp order) in
 * sm_d[0][hh]; ends with a barrier. Only thread hh touches column hh. Against the weights once a
 * column (the same bits): Qwen3-30B-A3B at 4-256 tokens -0.03..-0.11 ms a step, its FP8 preset
 * -0.05..-0.11 (H100, bench/results/2026-12-06-h200-s25 run 7). */
static __device__ __forceinline__ void am_head_weights(float (*sm_m)[AM_HEADS], float (*sm_d)[AM_HEADS], int nhb) {
    int hh = threadIdx.x;
    if (hh < nhb) {
        float mx = -INFINITY;
#pragma unroll
        for (int w = 0; w < AM_WARPS; w++) mx = fmaxf(mx, sm_m[w][hh]);
        float den = 0.0f, cw[AM_WARPS];
#pragma unroll
        for (int w = 0; w < AM_WARPS; w++) {
            cw[w] = sm_m[w][hh] == -INFINITY ? 0.0f : expf(sm_m[w][hh] - mx); /* idle warps weigh 0 */
            den += sm_d[w][hh] * cw[w];
        }
#pragma unroll
        for (int w = 0; w < AM_WARPS; w++) sm_m[w][hh] = cw[w];
        sm_d[0][hh] = den, sm_d[1][hh] = mx;
    }
    __syncthreads();
}

/* Columns d .. d + 3 (d % 4 == 0) of head hh of the block's output, each merged over the warps in
 * warp order with am_head_weights's weights: the unnormalised sums (the max and denominator are
 * sm_d[1][hh] and sm_d[0][hh]). Four columns a thread, 16-byte shared-memory loads; each column's
 * arithmetic is that of a column alone. */
template <int HD>
static __device__ __forceinline__ float4 am_merge_col4(const float *so, const float (*cw)[AM_HEADS], int hh, int d) {
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int w = 0; w < AM_WARPS; w++) {
        float4 v = *(const float4 *)(so + ((size_t)w * AM_HEADS + hh) * am_geom<HD>::ROW + d);
        float c = cw[w][hh];
        acc.x += v.x * c, acc.y += v.y * c, acc.z += v.z * c, acc.w += v.w * c;
    }
    return acc;
}

/* The split kernel's cluster merge (after the cluster barrier that publishes every block's partial:
 * sp [AM_HEADS][HD] unnormalised outputs, sp_m / sp_d [AM_HEADS] maxima and denominators, in each
 * block's shared memory). The cluster's threads take the output columns (head hh, dim d), block z
 * the columns z * 128 + threadIdx.x, + NS * 128, ...; each column is merged over the NS partials in
 * split order: M = max of the maxima, w_s = exp(m_s - M) (0 for a block past the context),
 * D = sum d_s w_s, out = (sum o_s w_s) / D. The weights are formed once per (head, split) in this
 * block's shared memory (sw, [2][AM_HEADS][NS]) instead of once per column, and a column's NS
 * remote loads are issued before that, so they are in flight while the weights are formed: each
 * column's arithmetic (its max, each weight, the sums in split order) is that of the per-column
 * merge, the same bits, with NS (a template constant) instead of 16 predicated splits. The caller
 * then holds a cluster barrier, which keeps every partial readable until all are read. */
template <int HD, int NS>
static __device__ __forceinline__ void am_cluster_merge(cg::cluster_group &cl, float *out, const float *sp,
                                                        const float *sp_m, const float *sp_d, float *sw, size_t th0,
                                                        int nhb, int n, int z) {
    constexpr int THR = AM_WARPS * 32, CPT = (AM_HEADS * HD + NS * THR - 1) / (NS * THR); /* columns a thread */
    float *pm = sw, *pw = sw + AM_HEADS * NS, *pd = sw + 2 * AM_HEADS * NS; /* [AM_HEADS][NS] each */
    const int c0 = z * THR + threadIdx.x;
    const bool any = z * THR < nhb * HD; /* this block has columns (block-uniform) */
    float os[CPT][NS];
#pragma unroll
    for (int r = 0; r < CPT; r++) {
        int c = c0 + r * NS * THR, hh = c / HD, d = c % HD;
        bool in = c < nhb * HD;
#pragma unroll
        for (int s2 = 0; s2 < NS; s2++)
            os[r][s2] = in ? cl.map_shared_rank(sp, s2)[(size_t)hh * HD + d] : 0.0f;
    }
    if (any) {
        for (int i = threadIdx.x; i < nhb * NS; i += THR) {
            int hh = i / NS, s2 = i % NS;
            pm[i] = cl.map_shared_rank(sp_m, s2)[hh];
            pd[i] = cl.map_shared_rank(sp_d, s2)[hh];
        }
        __syncthreads();
        for (int i = threadIdx.x; i < nhb * NS; i += THR) {
            const float *mh = pm + (i / NS) * NS;
            float M = -INFINITY;
#pragma unroll
            for (int s2 = 0; s2 < NS; s2++) M = fmaxf(M, mh[s2]);
            pw[i] = pm[i] == -INFINITY ? 0.0f : expf(pm[i] - M); /* a block past the context weighs 0 */
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < CPT; r++) {
            int c = c0 + r * NS * THR, hh = c / HD, d = c % HD;
            if (c >= nhb * HD) break;
            const float *wh = pw + hh * NS, *dh = pd + hh * NS;
            float D = 0.0f, acc = 0.0f;
#pragma unroll
            for (int s2 = 0; s2 < NS; s2++) {
                float cw = wh[s2];
                D += dh[s2] * cw;
                acc += os[r][s2] * cw;
            }
            out[(th0 + hh) * HD + d] = n > 0 ? acc * (1.0f / D) : 0.0f; /* empty context (pos < 0): zeros */
        }
    }
}

template <int HD>
static __global__ void __launch_bounds__(AM_WARPS * 32)
    attention_mma_kernel(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                         const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks,
                         int nh, int kvh, float scale, bool bt_ahead) {
    constexpr int TILE = am_geom<HD>::TILE;
    extern __shared__ __align__(128) unsigned char am_smem[];
    __shared__ float sm_m[AM_WARPS][AM_HEADS], sm_d[AM_WARPS][AM_HEADS];
    msm_pdl_trigger();
    msm_pdl_wait();

    const int G = nh / kvh, hgroups = (G + AM_HEADS - 1) / AM_HEADS;
    const int kh = blockIdx.x / hgroups, h0 = kh * G + (blockIdx.x % hgroups) * AM_HEADS;
    const int nhb = min(AM_HEADS, kh * G + G - h0); /* heads of this block */
    const int t = blockIdx.y, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3; /* fragment row (head) and column pair */
    const int n = max(pos[t] + 1, 0), nblk = (n + MSM_KV_BLOCK - 1) / MSM_KV_BLOCK;
    const int32_t *bt = block_tables + (size_t)seq[t] * max_blocks;
    const size_t row = (size_t)kvh * HD;

    uint32_t qa[HD / 16][4];
    am_load_q<HD>(qa, q, q_ld, t, h0, nhb, g, tig);

    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m = -INFINITY, den = 0.0f; /* head g's running max; this lane's share of its denominator */

    const uint32_t base = msm_smem_addr(am_smem) + (uint32_t)(warp * am_geom<HD>::WARP_SMEM);
    const am_lanes ln(lane);

    /* bt_ahead (tuning att_bt_cache): the block-table entry of the tile after next is loaded an
     * iteration before its copies are issued, so issuing them waits for no table load (which
     * otherwise stalled the warp before the current tile's arithmetic) */
    int b = warp;
    if (b < nblk) am_fetch<HD>(base, base + TILE, kc, vc, __ldg(bt + b), b, n, row, kh, lane);
    msm_cp_async_commit();
    int e_next = bt_ahead && b + AM_WARPS < nblk ? __ldg(bt + b + AM_WARPS) : 0;
    for (int it = 0; b < nblk; it++, b += AM_WARPS) { /* warp-uniform */
        const uint32_t cur = base + (uint32_t)((it & 1) * 2 * TILE), nxt = base + (uint32_t)((~it & 1) * 2 * TILE);
        int e_after = bt_ahead && b + 2 * AM_WARPS < nblk ? __ldg(bt + b + 2 * AM_WARPS) : 0;
        if (b + AM_WARPS < nblk)
            am_fetch<HD>(nxt, nxt + TILE, kc, vc, bt_ahead ? e_next : __ldg(bt + b + AM_WARPS), b + AM_WARPS, n, row, kh,
                         lane);
        e_next = e_after;
        msm_cp_async_commit();
        msm_cp_async_wait<1>();
        __syncwarp();
        am_tile<HD>(cur, qa, o, m, den, b, n, scale, ln, tig, it == 0);
        __syncwarp(); /* every lane has read this stage before the next iteration refills it */
    }
    msm_cp_async_wait<0>();

    float *so = (float *)am_smem; /* [AM_WARPS][AM_HEADS][ROW] */
    am_stage_warps<HD>(so, sm_m, sm_d, o, m, den, warp, g, tig);
    am_head_weights(sm_m, sm_d, nhb);

    /* merge the warps in warp order, four columns a thread; column c of the block's output is dim
     * c % HD of head c / HD (16-byte stores where out allows, block-uniform) */
    const size_t th0 = (size_t)t * nh + h0;
    const bool st4 = ((uintptr_t)out & 15) == 0;
    for (int c = 4 * threadIdx.x; c < nhb * HD; c += 4 * AM_WARPS * 32) {
        int hh = c / HD, d = c % HD;
        float4 acc = am_merge_col4<HD>(so, sm_m, hh, d);
        float inv = 1.0f / sm_d[0][hh];
        float4 r = n > 0 ? make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv)
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f); /* empty context (pos < 0): zeros */
        float *po = out + (th0 + hh) * HD + d;
        if (st4) *(float4 *)po = r;
        else po[0] = r.x, po[1] = r.y, po[2] = r.z, po[3] = r.w;
    }
}

/* ---- the q/k head norm, RoPE and the K/V cache write inside the split kernel (msm_cuda_attention_qk_rope) ----
 * At decode the split kernel may take the raw qkv rows (q heads, then kvh k heads, then kvh v heads;
 * row stride q_ld) instead of the rows qk_norm_rope_kv_kernel would have normed, rotated and cached:
 * rot > 0. Before the PDL wait the block puts the norm weights (as float) and the position's
 * cosines and sines (msm_rope_cs of dims 0 .. rot/2 - 1) in shared memory; after it, warp w norms
 * and rotates the block's query heads w, w + 4 with qkr_head's arithmetic (qk_rope.h: qkn_load,
 * qkn_norm_wv, msm_rope_lo / _hi; lane l holds dims l + 32 j) into shared memory, where the q
 * fragments are read from, and the block whose range holds the token's position does its kv
 * head's k (normed, rotated) and v: rounded to bf16 into the caches at slot[t] and into the K / V
 * tile row of that position where it is a warp's first tile (that row the early fetch skipped);
 * a later tile reads it back from the cache after the block's barrier. The same bits as
 * qk_norm_rope_kv_kernel then this kernel on its rows, one kernel boundary less a layer. The
 * scratch (AM_HEADS x HD q values, the weights, the cosines and sines) is warp 0's second tile
 * stage, which no copy touches before the tile loop. */
typedef struct am_qkr {
    const uint16_t *wq, *wk; /* q / k norm weights [hd] */
    const int32_t *slot;
    uint16_t *kw, *vw; /* the caches to write (kc, vc) */
    int rot;           /* rotated dims of a head (a multiple of 64); 0: off */
    float theta, eps;
} am_qkr;

/* The scratch in warp 0's second stage: sq [AM_HEADS][ROW] (am_geom::ROW, HD used), then wq, wk
 * [HD], cs, sn [HD / 2]. */
template <int HD>
struct am_qkr_smem {
    float *sq, *wq, *wk, *cs, *sn;
    __device__ __forceinline__ explicit am_qkr_smem(unsigned char *smem) {
        sq = (float *)(smem + 2 * am_geom<HD>::TILE);
        wq = sq + AM_HEADS * am_geom<HD>::ROW, wk = wq + HD, cs = wk + HD, sn = cs + HD / 2;
    }
};
static_assert(AM_HEADS * am_geom<128>::ROW * 4 + 3 * 128 * 4 <= 2 * am_geom<128>::TILE,
              "the q/k scratch fits a tile stage");
static_assert(AM_HEADS * am_geom<64>::ROW * 4 + 3 * 64 * 4 <= 2 * am_geom<64>::TILE,
              "the q/k scratch fits a tile stage");

/* A head loaded by qkn_load (v, its sum of squares ss) normed with weights w and rotated (rot
 * dims) as qkr_head does, in v (lane l: dims l + 32 j). */
template <int HD>
static __device__ __forceinline__ void am_qkr_head(float (&v)[8], float ss, const float *w, const float *cs,
                                                   const float *sn, int rot, float eps, int lane) {
    float wv[8];
#pragma unroll
    for (int j = 0; j < 8; j++) wv[j] = lane + 32 * j < HD ? w[lane + 32 * j] : 0.0f;
    qkn_norm_wv(v, ss, wv, HD, eps, lane);
    /* dims d = lane + 32 j < rot / 2, paired with v[j + hj] (hj = rot / 64, 1 .. HD / 64): each hj its
     * own unrolled loop, so v stays in registers (a runtime index put it in local memory) */
    auto rope = [&](auto hjc) {
        constexpr int HJ = decltype(hjc)::value;
#pragma unroll
        for (int j = 0; j < HJ; j++) {
            float a = v[j], b = v[j + HJ], c = cs[lane + 32 * j], s = sn[lane + 32 * j];
            v[j] = msm_rope_lo(a, b, c, s);
            v[j + HJ] = msm_rope_hi(a, b, c, s);
        }
    };
    static_assert(HD <= 256, "at most 4 rotated pairs a lane");
    switch (rot / 64) {
    case 1: rope(std::integral_constant<int, 1>()); break;
    case 2: if constexpr (HD >= 128) rope(std::integral_constant<int, 2>()); break;
    case 3: if constexpr (HD >= 192) rope(std::integral_constant<int, 3>()); break;
    case 4: if constexpr (HD >= 256) rope(std::integral_constant<int, 4>()); break;
    default: break;
    }
}

/* The bf16 of v (lane l: dims l + 32 j) into cache row kr (NULL: none) and into the tile row at
 * tile (NULL: none; a swizzled row r of 16-byte chunks, am_off). */
template <int HD>
static __device__ __forceinline__ void am_qkr_store(const float (&v)[8], uint16_t *kr, unsigned char *tile, int r,
                                                    int lane) {
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        if (d >= HD) break;
        uint16_t b = msm_f2bf(v[j]);
        if (kr) kr[d] = b;
        if (tile) *(uint16_t *)(tile + am_off<HD>(r, d / 8) + (d % 8) * 2) = b;
    }
}

/* ---- the context split over a thread-block cluster (msm__attention_mma_split_*) ----
 * Where few (token, kv head) blocks would leave the GPU idle (decode of 1-16 tokens on Qwen3's 4
 * kv heads: 4-64 blocks for 132 SMs), the context of each is split over ns blocks of one cluster
 * (grid (ns, kv heads x head groups, T)): block z takes positions [z chunk, (z + 1) chunk) of the
 * token's n, chunk a multiple of 16 (ceil(n / ns) rounded up; blocks past n take none), its warps
 * the 16-position tiles in it as above, and the block's warps merge as above into a partial of its
 * heads (max M, denominator D, unnormalised output), left in its shared memory. After a cluster
 * barrier, the cluster's threads together take the output columns (head, dim), each merging the ns
 * partials of its column from distributed shared memory in split order, with the arithmetic of the
 * warp merge: the bits do not depend on which block finishes first (replay = eager), though they
 * are not the unsplit kernel's (another grouping of the fp32 sums; both are held to the CPU).
 * The SIMT kernel instead reads each K/V row once per query head (8 times on Qwen3) and chains its
 * scores through shuffles: 21 us a layer at 8 tokens for 8 MiB of cache (H200,
 * bench/results/2026-12-04-h200-s13 run 2). At decode (one token a sequence) each warp's first
 * tile is requested before the PDL wait (the cache rows below the token's position and the block
 * tables were written before; the token's own row, which the kernel before writes, after it), as
 * the SIMT kernel's att_early. MHA at one token (att_mma_split_mha_max_t) runs here too, one head a
 * block (the other 7 MMA rows idle): at one token the kernels wait on latency, not arithmetic, and
 * this one was the fastest (Qwen1.5-MoE; tuning.cu). */
template <int HD, int NS>
static __global__ void __launch_bounds__(AM_WARPS * 32, 3)
    attention_mma_split_kernel(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                               const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks,
                               int nh, int kvh, float scale, bool early, am_qkr qk) {
    constexpr int TILE = am_geom<HD>::TILE, CH = am_geom<HD>::CH;
    extern __shared__ __align__(128) unsigned char am_smem[];
    __shared__ float sm_m[AM_WARPS][AM_HEADS], sm_d[AM_WARPS][AM_HEADS];
    cg::cluster_group cl = cg::this_cluster();
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();

    const int ns = NS, z = blockIdx.x; /* gridDim.x == NS */
    const int G = nh / kvh, hgroups = (G + AM_HEADS - 1) / AM_HEADS;
    const int kh = blockIdx.y / hgroups, h0 = kh * G + (blockIdx.y % hgroups) * AM_HEADS;
    const int nhb = min(AM_HEADS, kh * G + G - h0);
    const int t = blockIdx.z, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane >> 2, tig = lane & 3;
    const int n = max(pos[t] + 1, 0);
    const int chunk = ((n + ns - 1) / ns + MSM_KV_BLOCK - 1) / MSM_KV_BLOCK * MSM_KV_BLOCK;
    const int lo = min(n, z * chunk), hi = min(n, lo + chunk);
    /* the block's tiles [b0, b1): none past the context (lo = hi = n would otherwise take n's tile) */
    const int b0 = lo / MSM_KV_BLOCK, b1 = hi > lo ? (hi + MSM_KV_BLOCK - 1) / MSM_KV_BLOCK : b0;
    const int32_t *bt = block_tables + (size_t)seq[t] * max_blocks;
    const size_t row = (size_t)kvh * HD;
    const uint32_t base = msm_smem_addr(am_smem) + (uint32_t)(warp * am_geom<HD>::WARP_SMEM);
    const am_lanes ln(lane);

    /* the warp's first tile; early: all but the token's own row (position n - 1) before the wait,
     * that row after it (it is in the context's last tile) */
    int b = b0 + warp;
    if (b < b1) am_fetch<HD, true>(base, base + TILE, kc, vc, __ldg(bt + b), b, n, row, kh, lane, early ? n - 1 : -1);
    msm_cp_async_commit();
    const bool qkr = qk.rot > 0; /* only with early (msm_cuda_attention_qk_rope): row n - 1 skipped above */
    const am_qkr_smem<HD> qs(am_smem);
    int sl = -1;
    if (qkr) { /* the weights, the cosines and sines: no kernel of the step writes them */
        sl = qk.slot[t];
        for (int i = threadIdx.x; i < HD; i += AM_WARPS * 32) qs.wq[i] = msm_bf(qk.wq[i]), qs.wk[i] = msm_bf(qk.wk[i]);
        for (int i = threadIdx.x; i < qk.rot / 2; i += AM_WARPS * 32)
            msm_rope_cs(pos[t], i, qk.rot, qk.theta, &qs.cs[i], &qs.sn[i]);
        __syncthreads();
    }
    if (early) {
        msm_pdl_wait();
        if (b < b1 && (n - 1) / MSM_KV_BLOCK == b && lane < CH && !(qkr && sl >= 0)) {
            int r = (n - 1) % MSM_KV_BLOCK;
            size_t off = (((size_t)__ldg(bt + b) * MSM_KV_BLOCK + r) * row + (size_t)kh * HD) + (size_t)lane * 8;
            msm_cp_async16(base + am_off<HD>(r, lane), kc + off, 16);
            msm_cp_async16(base + TILE + am_off<HD>(r, lane), vc + off, 16);
        }
        msm_cp_async_commit();
    }
    uint32_t qa[HD / 16][4];
    if (qkr) {
        /* the block's q heads normed and rotated (warp w: heads w and w + 4); the token's k (warp 0)
         * and v (warp 1) by the block holding its position. Every row a warp takes is requested
         * before any is used: one round trip to L2 where the rows one after another took up to
         * three on the kernel's critical path (the same arithmetic a head). */
        static_assert(AM_HEADS <= 2 * AM_WARPS, "at most two q heads a warp");
        const float *xr = q + (size_t)t * q_ld;
        const int ja = warp, jb = warp + AM_WARPS; /* warp-uniform */
        const bool kv = lo <= n - 1 && n - 1 < hi && warp < 2;
        float va[8], vb[8], vk[8];
        float sa = ja < nhb ? qkn_load(xr + (size_t)(h0 + ja) * HD, HD, lane, va) : 0.0f;
        float sb = jb < nhb ? qkn_load(xr + (size_t)(h0 + jb) * HD, HD, lane, vb) : 0.0f;
        float sk = kv ? qkn_load(xr + (size_t)(nh + (warp ? kvh : 0) + kh) * HD, HD, lane, vk) : 0.0f;
        if (ja < nhb) {
            am_qkr_head<HD>(va, sa, qs.wq, qs.cs, qs.sn, qk.rot, qk.eps, lane);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (lane + 32 * j < HD) qs.sq[ja * am_geom<HD>::ROW + lane + 32 * j] = va[j];
        }
        if (jb < nhb) {
            am_qkr_head<HD>(vb, sb, qs.wq, qs.cs, qs.sn, qk.rot, qk.eps, lane);
#pragma unroll
            for (int j = 0; j < 8; j++)
                if (lane + 32 * j < HD) qs.sq[jb * am_geom<HD>::ROW + lane + 32 * j] = vb[j];
        }
        if (kv) { /* warp 0: k, normed and rotated; warp 1: v as it is */
            const int own = (n - 1) / MSM_KV_BLOCK - b0, r = (n - 1) % MSM_KV_BLOCK;
            unsigned char *tile = sl >= 0 && own < AM_WARPS
                                      ? am_smem + (size_t)own * am_geom<HD>::WARP_SMEM + (warp ? TILE : 0)
                                      : NULL;
            uint16_t *cr = sl >= 0 ? (warp ? qk.vw : qk.kw) + (size_t)sl * row + (size_t)kh * HD : NULL;
            if (warp == 0) am_qkr_head<HD>(vk, sk, qs.wk, qs.cs, qs.sn, qk.rot, qk.eps, lane);
            am_qkr_store<HD>(vk, cr, tile, r, lane);
        }
        __syncthreads(); /* the q values, the injected row and the cached one (a later tile reads it) */
        am_load_q<HD>(qa, qs.sq, 0, 0, 0, nhb, g, tig, am_geom<HD>::ROW);
        __syncthreads(); /* warp 0's second stage is the tile loop's again */
    } else {
        am_load_q<HD>(qa, q, q_ld, t, h0, nhb, g, tig);
    }
    float o[HD / 8][4];
#pragma unroll
    for (int j = 0; j < HD / 8; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m = -INFINITY, den = 0.0f;
    for (int it = 0; b < b1; it++, b += AM_WARPS) { /* warp-uniform */
        const uint32_t cur = base + (uint32_t)((it & 1) * 2 * TILE), nxt = base + (uint32_t)((~it & 1) * 2 * TILE);
        if (b + AM_WARPS < b1)
            am_fetch<HD>(nxt, nxt + TILE, kc, vc, __ldg(bt + b + AM_WARPS), b + AM_WARPS, n, row, kh, lane);
        msm_cp_async_commit();
        msm_cp_async_wait<1>();
        __syncwarp();
        am_tile<HD>(cur, qa, o, m, den, b, n, scale, ln, tig, it == 0);
        __syncwarp();
    }
    msm_cp_async_wait<0>();

    float *so = (float *)am_smem;                                  /* [AM_WARPS][AM_HEADS][ROW] */
    float *sp = so + (size_t)AM_WARPS * AM_HEADS * am_geom<HD>::ROW; /* [AM_HEADS][HD]: the block's partial */
    /* ... its max and denominator a head: here, not in static shared memory, so that 3 blocks an SM
     * stay inside the 196 KiB carveout as the unsplit kernel's do */
    float *sp_m = sp + (size_t)AM_HEADS * HD, *sp_d = sp_m + AM_HEADS;
    am_stage_warps<HD>(so, sm_m, sm_d, o, m, den, warp, g, tig);
    am_head_weights(sm_m, sm_d, nhb);
    /* the block's partial: the warp merge's max, denominator and (unnormalised) sum, in warp order */
    for (int c = 4 * threadIdx.x; c < nhb * HD; c += 4 * AM_WARPS * 32) { /* four columns a thread */
        int hh = c / HD, d = c % HD;
        *(float4 *)(sp + (size_t)hh * HD + d) = am_merge_col4<HD>(so, sm_m, hh, d);
        if (d == 0) sp_m[hh] = sm_d[1][hh], sp_d[hh] = sm_d[0][hh];
    }
    msm_cluster_sync_smem(); /* every block's partial is in its shared memory */
    am_cluster_merge<HD, NS>(cl, out, sp, sp_m, sp_d, sp_d + AM_HEADS, (size_t)t * nh + h0, nhb, n, z);
    cl.sync(); /* every block's partial has been read */
}

template <int HD>
static int am_prepare_one(void) {
    CUDA_TRY(cudaFuncSetAttribute(attention_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  am_geom<HD>::SMEM));
    return 0;
}

/* The split kernel's shared memory, and clusters past 8 where the device allows them (else its
 * fit for 16 is 0), for each cluster size NS it is built for (2, 4, 8, 16). */
template <int HD, int NS>
static int am_split_prepare_ns(void) {
    CUDA_TRY(cudaFuncSetAttribute(attention_mma_split_kernel<HD, NS>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  am_geom<HD>::SMEM));
    if (cudaFuncSetAttribute(attention_mma_split_kernel<HD, NS>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
        cudaSuccess)
        (void)cudaGetLastError();
    return 0;
}

template <int HD>
static int am_split_prepare_one(void) {
    int r = am_split_prepare_ns<HD, 2>();
    if (!r) r = am_split_prepare_ns<HD, 4>();
    if (!r) r = am_split_prepare_ns<HD, 8>();
    if (!r) r = am_split_prepare_ns<HD, 16>();
    return r;
}

/* The shared-memory limits of the kernels on the current device (msm_cuda_tuning_init). */
int msm__attention_mma_prepare(void) {
    int r = am_prepare_one<16>();
    if (!r) r = am_prepare_one<32>();
    if (!r) r = am_prepare_one<64>();
    if (!r) r = am_prepare_one<128>();
    if (!r) r = am_split_prepare_one<64>();
    if (!r) r = am_split_prepare_one<128>();
    return r;
}

/* Clusters of NS blocks of the split kernel the GPU holds at once (sizes it is not built for: 0). */
template <int HD, int NS>
static int am_split_fit(void) {
    return msm_max_clusters(attention_mma_split_kernel<HD, NS>, (unsigned)NS, AM_WARPS * 32, am_geom<HD>::SMEM);
}

template <int HD>
static void am_split_tuning_one(msm_cuda_tuning *t, int hi) {
    t->att_mma_split_per_sm[hi] =
        msm_blocks_per_sm(attention_mma_split_kernel<HD, 8>, AM_WARPS * 32, am_geom<HD>::SMEM);
    for (int ns = 0; ns <= 16; ns++) t->att_mma_split_fit[hi][ns] = 0;
    t->att_mma_split_fit[hi][2] = am_split_fit<HD, 2>();
    t->att_mma_split_fit[hi][4] = am_split_fit<HD, 4>();
    t->att_mma_split_fit[hi][8] = am_split_fit<HD, 8>();
    t->att_mma_split_fit[hi][16] = am_split_fit<HD, 16>();
}

/* The split kernel's occupancy (GPU facts, msm_cuda_tuning_init, after msm__attention_mma_prepare). */
void msm__attention_mma_tuning(msm_cuda_tuning *t) {
    am_split_tuning_one<64>(t, 0);
    am_split_tuning_one<128>(t, 1);
}

bool msm__attention_mma_fits(int hd, const void *q, size_t q_ld, const void *kc, const void *vc) {
    return (hd == 16 || hd == 32 || hd == 64 || hd == 128) && q_ld % 2 == 0 && (uintptr_t)q % 8 == 0 &&
           (uintptr_t)kc % 16 == 0 && (uintptr_t)vc % 16 == 0;
}

int msm__attention_mma_run(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                           const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks,
                           int T, int nh, int kvh, int hd, float scale, msm_cuda_exec ex) {
    int G = nh / kvh, hgroups = (G + AM_HEADS - 1) / AM_HEADS;
    dim3 grid((unsigned)(kvh * hgroups), (unsigned)T), blk(AM_WARPS * 32);
#define AM_GO(HD)                                                                                                  \
    msm_launch(attention_mma_kernel<HD>, grid, blk, (size_t)am_geom<HD>::SMEM, ex, out, q, q_ld, kc, vc, seq, pos, \
               block_tables, max_blocks, nh, kvh, scale, ex.tune->att_bt_cache)
    switch (hd) {
    case 16: CUDA_TRY(AM_GO(16)); break;
    case 32: CUDA_TRY(AM_GO(32)); break;
    case 64: CUDA_TRY(AM_GO(64)); break;
    case 128: CUDA_TRY(AM_GO(128)); break;
    default: return -EINVAL;
    }
#undef AM_GO
    return 0;
}

/* Clusters of the split kernel leave att_cluster_spare free, as the SIMT kernel's do. */
extern "C" int msm_cuda_attention_mma_splits(int T, int nh, int kvh, int hd, const void *q, size_t q_ld,
                                             const void *kc, const void *vc, msm_cuda_exec ex) {
    const msm_cuda_tuning *tn = ex.tune;
    if (!tn->att_mma_split || T <= 0 || kvh <= 0 || nh % kvh || (hd != 64 && hd != 128) ||
        !msm__attention_mma_fits(hd, q, q_ld, kc, vc))
        return 0;
    int G = nh / kvh;
    bool gqa = G >= 4 && G <= AM_HEADS && T >= tn->att_mma_split_min_t &&
               (!tn->att_mma_split_max_t || T <= tn->att_mma_split_max_t);
    bool mha = G == 1 && T <= tn->att_mma_split_mha_max_t;
    if (!gqa && !mha) return 0;
    int hi = hd == 128, cap = tn->att_max_split;
    if (gqa && tn->att_mma_split_gqa_max > 0 && tn->att_mma_split_gqa_max < cap) cap = tn->att_mma_split_gqa_max;
    long pairs = (long)T * kvh, slots = (long)tn->sms * tn->att_mma_split_per_sm[hi];
    for (int ns = 16; ns >= 2; ns /= 2)
        if (ns <= cap && pairs * ns <= slots && pairs + tn->att_cluster_spare <= tn->att_mma_split_fit[hi][ns])
            return ns;
    return 0;
}

static int am_split_launch(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                           const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks, int T,
                           int nh, int kvh, int hd, float scale, int ns, bool early, const am_qkr &qk,
                           msm_cuda_exec ex) {
    int G = nh / kvh, hgroups = (G + AM_HEADS - 1) / AM_HEADS;
    dim3 grid((unsigned)ns, (unsigned)(kvh * hgroups), (unsigned)T), blk(AM_WARPS * 32);
#define AMS_GO(HD, NS)                                                                                            \
    msm_launch_cluster(attention_mma_split_kernel<HD, NS>, grid, blk, (size_t)am_geom<HD>::SMEM, (unsigned)ns, ex, \
                       out, q, q_ld, kc, vc, seq, pos, block_tables, max_blocks, nh, kvh, scale, early, qk)
#define AMS_NS(HD)                                                                                                \
    (ns == 2 ? AMS_GO(HD, 2) : ns == 4 ? AMS_GO(HD, 4) : ns == 8 ? AMS_GO(HD, 8) : AMS_GO(HD, 16))
    if ((hd != 64 && hd != 128) || (ns != 2 && ns != 4 && ns != 8 && ns != 16)) return -EINVAL;
    if (hd == 64) CUDA_TRY(AMS_NS(64));
    else CUDA_TRY(AMS_NS(128));
#undef AMS_NS
#undef AMS_GO
    return 0;
}

int msm__attention_mma_split_run(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                                 const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks,
                                 int T, int nh, int kvh, int hd, float scale, int ns, msm_cuda_exec ex) {
    am_qkr none = {};
    return am_split_launch(out, q, q_ld, kc, vc, seq, pos, block_tables, max_blocks, T, nh, kvh, hd, scale, ns,
                           ex.decode && ex.tune->att_early, none, ex);
}

/* The split kernel's cluster size for a fused q/k norm + RoPE + attention call, 0 where it does not
 * take it (msm_cuda_attention_qk_rope_fits). */
static int qk_rope_splits(int T, int nh, int kvh, int hd, int rot, const void *qkv, const void *kc, const void *vc,
                          msm_cuda_exec ex) {
    if (!(ex.decode && ex.tune->att_early && ex.tune->att_qk_rope) || T <= 0 || T > 65535 || nh <= 0 || kvh <= 0 ||
        nh % kvh || rot <= 0 || rot > hd || rot % 64)
        return 0;
    return msm_cuda_attention_mma_splits(T, nh, kvh, hd, qkv, (size_t)(nh + 2 * kvh) * hd, kc, vc, ex);
}

extern "C" bool msm_cuda_attention_qk_rope_fits(int T, int nh, int kvh, int hd, int rot, const void *qkv,
                                                const void *kc, const void *vc, msm_cuda_exec ex) {
    return qk_rope_splits(T, nh, kvh, hd, rot, qkv, kc, vc, ex) > 0;
}

extern "C" int msm_cuda_attention_qk_rope(float *out, const float *qkv, const uint16_t *wq, const uint16_t *wk,
                                          float eps, uint16_t *kc, uint16_t *vc, const int32_t *seq, const int32_t *pos,
                                          const int32_t *slot, const int32_t *block_tables, int max_blocks, int T,
                                          int nh, int kvh, int hd, int rot, float theta, float scale,
                                          msm_cuda_exec ex) {
    if (!qkv || !wq || !wk || !kc || !vc || !slot || max_blocks <= 0) return -EINVAL;
    int ns = qk_rope_splits(T, nh, kvh, hd, rot, qkv, kc, vc, ex);
    if (!ns) return -ENOTSUP;
    size_t C = (size_t)(nh + 2 * kvh) * hd;
    am_qkr qk = {wq, wk, slot, kc, vc, rot, theta, eps};
    return am_split_launch(out, qkv, C, kc, vc, seq, pos, block_tables, max_blocks, T, nh, kvh, hd, scale, ns, true, qk,
                           ex);
}

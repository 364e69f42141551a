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

#include <errno.h>
#include <math.h>

#define AM_WARPS 4
#define AM_HEADS 8 /* query heads a block: the hi half of the MMA rows */

/* Bytes of one 16-position tile row in shared memory: hd bf16, at least 8 chunks of 16 bytes so
 * that the chunk swizzle (c ^ (row & 7)) stays inside the row. */
template <int HD>
struct am_geom {
    static constexpr int CH = HD / 8;                    /* 16-byte chunks of a K/V row */
    static constexpr int PITCH_CH = CH < 8 ? 8 : CH;      /* chunk slots a row in shared memory */
    static constexpr int TILE = MSM_KV_BLOCK * PITCH_CH * 16; /* bytes of one K or V tile */
    static constexpr int WARP_SMEM = 2 * 2 * TILE;        /* two stages of K and V */
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
 * `entry`, its block-table entry) of kv head kh into the warp's stage at sk (K) and sv (V). */
template <int HD>
static __device__ __forceinline__ void am_fetch(uint32_t sk, uint32_t sv, const uint16_t *kc, const uint16_t *vc,
                                                int entry, int b, int n, size_t row, int kh, int lane) {
    constexpr int CH = am_geom<HD>::CH;
    const size_t slot0 = (size_t)entry * MSM_KV_BLOCK;
#pragma unroll
    for (int i = lane; i < MSM_KV_BLOCK * CH; i += 32) {
        int r = i / CH, c = i % CH;
        bool ok = b * MSM_KV_BLOCK + r < n;
        size_t off = ((slot0 + (ok ? r : 0)) * row + (size_t)kh * HD) + (size_t)c * 8;
        msm_cp_async16(sk + am_off<HD>(r, c), kc + off, ok ? 16 : 0);
        msm_cp_async16(sv + am_off<HD>(r, c), vc + off, ok ? 16 : 0);
    }
}

template <int HD>
static __global__ void __launch_bounds__(AM_WARPS * 32)
    attention_mma_kernel(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                         const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks,
                         int nh, int kvh, float scale, bool bt_ahead) {
    constexpr int KS = HD / 16; /* k steps of the scores */
    constexpr int NT = HD / 8;  /* n8 tiles of the output */
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

    /* A fragments of q: rows g (hi) and g + 8 (lo) of head h0 + g, dims kk*16 + 2*tig (+8) */
    uint32_t qa[KS][4];
    {
        const float *qh = q + (size_t)t * q_ld + (size_t)(h0 + g) * HD;
        bool ok = g < nhb;
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            float2 x0 = ok ? *(const float2 *)(qh + kk * 16 + 2 * tig) : make_float2(0.0f, 0.0f);
            float2 x1 = ok ? *(const float2 *)(qh + kk * 16 + 8 + 2 * tig) : make_float2(0.0f, 0.0f);
            msm_split_bf16x2(x0.x, x0.y, qa[kk][0], qa[kk][1]);
            msm_split_bf16x2(x1.x, x1.y, qa[kk][2], qa[kk][3]);
        }
    }

    float o[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m = -INFINITY, den = 0.0f; /* head g's running max; this lane's share of its denominator */

    const uint32_t base = msm_smem_addr(am_smem) + (uint32_t)(warp * am_geom<HD>::WARP_SMEM);
    /* ldmatrix lane rows / chunks: K (non-trans) matrices (pos 0-7, c), (0-7, c+1), (8-15, c),
     * (8-15, c+1); V (trans) matrices (pos 0-7, c), (8-15, c), (0-7, c+1), (8-15, c+1) */
    const int k_row = (lane & 7) + ((lane >> 4) << 3), k_c = (lane >> 3) & 1;
    const int v_row = (lane & 7) + (((lane >> 3) & 1) << 3), v_c = lane >> 4;

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

        /* S = Q K^T: s[j][0..1] = head g (hi) at positions 8j + 2tig + {0,1}, s[j][2..3] the lo part */
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
#pragma unroll
        for (int kk = 0; kk < KS; kk++) {
            uint32_t kb[4];
            msm_ldmatrix_x4(kb, cur + am_off<HD>(k_row, 2 * kk + k_c));
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
        float corr = expf(m - mx); /* m = -inf: 0 */
        m = mx;
        den *= corr;
#pragma unroll
        for (int j = 0; j < NT; j++) o[j][0] *= corr, o[j][1] *= corr, o[j][2] *= corr, o[j][3] *= corr;
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
            am_ldmatrix_x4_trans(vb, cur + TILE + am_off<HD>(v_row, j + v_c));
            msm_mma_bf16(o[j], pa[0], pa[1], pa[2], pa[3], vb[0], vb[1]);
            msm_mma_bf16(o[j + 1], pa[0], pa[1], pa[2], pa[3], vb[2], vb[3]);
        }
        __syncwarp(); /* every lane has read this stage before the next iteration refills it */
    }
    msm_cp_async_wait<0>();

    /* the head's denominator over the quad (fixed pairing: the same sum in all four lanes) */
    den += __shfl_xor_sync(MSM_FULL_MASK, den, 1);
    den += __shfl_xor_sync(MSM_FULL_MASK, den, 2);
    __syncthreads(); /* every warp is done with its tiles: the shared memory now holds outputs */
    float *so = (float *)am_smem; /* [AM_WARPS][AM_HEADS][HD] */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        int d = 8 * j + 2 * tig;
        float *p = so + ((size_t)warp * AM_HEADS + g) * HD + d;
        p[0] = o[j][0] + o[j][2];
        p[1] = o[j][1] + o[j][3];
    }
    if (tig == 0) sm_m[warp][g] = m, sm_d[warp][g] = den;
    __syncthreads();

    /* merge the warps in warp order; column c of the block's output is dim c % HD of head c / HD */
    const size_t th0 = (size_t)t * nh + h0;
    for (int c = threadIdx.x; c < nhb * HD; c += AM_WARPS * 32) {
        int hh = c / HD, d = c % HD;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < AM_WARPS; w++) M = fmaxf(M, sm_m[w][hh]);
        float D = 0.0f, acc = 0.0f;
#pragma unroll
        for (int w = 0; w < AM_WARPS; w++) {
            float cw = sm_m[w][hh] == -INFINITY ? 0.0f : expf(sm_m[w][hh] - M); /* idle warps weigh 0 */
            D += sm_d[w][hh] * cw;
            acc += so[((size_t)w * AM_HEADS + hh) * HD + d] * cw;
        }
        out[(th0 + hh) * HD + d] = n > 0 ? acc * (1.0f / D) : 0.0f; /* empty context (pos < 0): zeros */
    }
}

template <int HD>
static int am_prepare_one(void) {
    CUDA_TRY(cudaFuncSetAttribute(attention_mma_kernel<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  am_geom<HD>::SMEM));
    return 0;
}

/* The shared-memory limits of the kernels on the current device (msm_cuda_tuning_init). */
int msm__attention_mma_prepare(void) {
    int r = am_prepare_one<16>();
    if (!r) r = am_prepare_one<32>();
    if (!r) r = am_prepare_one<64>();
    if (!r) r = am_prepare_one<128>();
    return r;
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

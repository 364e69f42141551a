/* attention.cu: causal paged attention over the bf16 KV cache, for decode and prefill alike.
 *
 * One block of 4 warps per (GB query heads, token, context split). Each warp is cut into sub-groups
 * of L lanes, L*8 >= hd: lane sl of a sub-group owns the 8 head dims 8*sl..8*sl+7 and reads them
 * of a K or V row with one 16-byte load, so a warp reads 32/L positions per load instruction
 * (2 at hd 128). Every iteration a sub-group handles ATT_U positions: the K and V loads of the
 * next iteration are issued before the current one is scored (4 KiB per warp per iteration, up
 * to 8 KiB in flight; with 5 blocks of 4 warps resident an SM keeps ~80-160 KiB in flight, well
 * over the ~32 KiB HBM needs per SM at full rate). Scoring is an fp32 dot over the lane's dims
 * and a butterfly sum over the sub-group's L lanes; each sub-group keeps its own online softmax
 * (max, denominator, output accumulator), updated once per ATT_U positions. At the end the sub-groups merge through shuffles and the warps through shared
 * memory, both in a fixed order, so results are bitwise deterministic. Scores and the softmax
 * are fp32, as on the CPU (only the order of the sums differs).
 *
 * Positions are read through the sequence's block table: slot = table[p / 16] * 16 + p % 16. GQA
 * query heads read kv head h / (nh / kvh). A block takes GB query heads of one kv head (GB <= 4
 * dividing nh / kvh, tuning att_group): every K/V row it loads serves its GB heads, each with its
 * own scores and online softmax, the arithmetic of a one-head block repeated (Qwen3-30B-A3B's 8
 * query heads a kv head read the cache 2x instead of 8x; its attention at batch 8 was ~20 us a
 * layer, H200, 2026-12-01). The splits' counters and partials stay per (token, query head).
 *
 * Split context (flash-decoding): when T * nh blocks leave the GPU's resident block slots empty
 * and the caller gives a workspace, grid.z = ns (<= ATT_MAX_SPLIT, as many as fill the slots in
 * one wave) splits each token's context 0..pos[t] into equal chunks, a multiple of the positions
 * a block handles per iteration; a short context uses fewer splits (the blocks beyond exit at
 * once). Each split block writes its partial (max, denominator,
 * unnormalised output) to the workspace, fences, and counts itself in with an atomic counter
 * per (token, head); the block that arrives last merges all partials IN SPLIT ORDER (so the
 * result does not depend on which block was last) and resets the counter to zero, which leaves
 * the workspace ready for the next call or graph replay. Workspace layout:
 *   [ATT_MAX_CTR] u32 counters, zero between calls  |  [T, nh, ns, hd + 2] f32 partials
 * The counters sit at fixed offsets whatever T and ns are, so partials never overwrite them.
 *
 * With att_cluster (the default) the splits of a (token, head group) are one thread-block
 * cluster instead: each block leaves its partial in its own shared memory and block rank 0 merges
 * them through distributed shared memory with the same arithmetic in the same order (the same
 * bits), without the workspace round trip, the fences and the counter.
 *
 * Launched with programmatic dependent launch: every block triggers its dependents and waits
 * for the previous kernel before it reads anything it wrote. At decode (one token a sequence,
 * msm_cuda_exec.decode) the first K/V tile is loaded before that wait: the step's inputs and the
 * cache rows below each token's position were written before the step's first kernel; only the
 * token's own row waits (att_early).
 *
 * msm_cuda_attention_rope: at decode a ROPE_KV_WRITE and the ATTENTION reading its output are one
 * launch of the same kernel (att_rope): it rotates q and the token's k from the unrotated qkv rows
 * (the RoPE kernels' arithmetic, a cos/sin table per block), uses that k and v, rounded to bf16 as
 * the cache holds them, for the token's position and writes them to the cache once per kv head:
 * the same bits as the two kernels, one kernel boundary less a layer. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <cooperative_groups.h>
#include <errno.h>
#include <math.h>

namespace cg = cooperative_groups;

#define ATT_WARPS 4
#define ATT_THREADS (ATT_WARPS * 32)
#define ATT_U 4          /* positions per sub-group per iteration, all loads in flight at once */
#define ATT_MAX_SPLIT 16
#define ATT_MAX_CTR 4096 /* (token, head) pairs that may split, e.g. T = 32 at nh = 128 */
#define ATT_PART_OFF ((size_t)ATT_MAX_CTR * sizeof(unsigned))

/* The 8 bf16 at p, p + 8 <= the row's end: one 16-byte load when VEC (rows 16-byte aligned),
 * else element by element with the dims from nvalid on read as zero (hd % 8 != 0). */
template <bool VEC>
static __device__ __forceinline__ uint4 att_load8(const uint16_t *p, int nvalid) {
    if constexpr (VEC) {
        return msm_ld_stream16(p);
    } else {
        uint32_t w[4];
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t lo = 2 * i < nvalid ? __ldg(p + 2 * i) : 0u;
            uint32_t hi = 2 * i + 1 < nvalid ? __ldg(p + 2 * i + 1) : 0u;
            w[i] = lo | hi << 16;
        }
        return make_uint4(w[0], w[1], w[2], w[3]);
    }
}

static __device__ __forceinline__ void att_unpack8(uint4 r, float f[8]) {
    float2 a = msm_bf2(r.x), b = msm_bf2(r.y), c = msm_bf2(r.z), d = msm_bf2(r.w);
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y;
    f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

/* One sub-group's ATT_U positions of an iteration: their K and V pieces (zero where invalid). */
struct att_tile {
    uint4 k[ATT_U], v[ATT_U];
    unsigned ok; /* bit u: position base + u * P + g is in the block's range */
};

/* The block table of a block's sequence, with its entries b0 .. b0 + nb - 1 (the block's
 * positions, at most ATT_BT_CACHE of them) copied into shared memory once (att_bt_cache): a K/V
 * load then needs no table load first. A tile's loads depended on their table entries' loads, two
 * round trips an iteration (Qwen1.5-MoE batch 8: 128 positions a block in 4 iterations, 21 us at
 * 1.65 TB/s in Nsight Compute; H200, 2026-12-03 ninth session, run 1). */
#define ATT_BT_CACHE 64
struct att_bt {
    const int32_t *bt, *sm;
    int b0, nb;
};

/* The cache row offset (elements) of position p through the sequence's block table. */
static __device__ __forceinline__ size_t att_row_off(const att_bt &t, int p, size_t row) {
    int b = p / MSM_KV_BLOCK, e = b - t.b0;
    int blk = e >= 0 && e < t.nb ? t.sm[e] : __ldg(t.bt + b);
    return ((size_t)blk * MSM_KV_BLOCK + p % MSM_KV_BLOCK) * row;
}

/* Issues the loads of the positions base + u * (32 / L) + g, u < ATT_U, those < hi (none when
 * base >= hi: then it only clears the tile); of them only those < lim are loaded now (the others
 * read as zero until att_fetch_late: the early decode fetch before the PDL wait, lim = pos[t]). */
template <int L, bool VEC>
static __device__ __forceinline__ void att_fetch(att_tile &tl, int base, int hi, int lim, int g,
                                                 const att_bt &bt, size_t row, const uint16_t *kb,
                                                 const uint16_t *vb, int nval) {
    size_t off[ATT_U];
    tl.ok = 0;
    unsigned now = 0;
#pragma unroll
    for (int u = 0; u < ATT_U; u++) {
        int p = base + u * (32 / L) + g;
        bool ok = p < hi;
        tl.ok |= (unsigned)ok << u;
        now |= (unsigned)(ok && p < lim) << u;
        off[u] = ok && p < lim ? att_row_off(bt, p, row) : 0;
    }
    bool lane_ok = nval > 0;
#pragma unroll
    for (int u = 0; u < ATT_U; u++)
        tl.k[u] = (now >> u & 1) && lane_ok ? att_load8<VEC>(kb + off[u], nval) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < ATT_U; u++)
        tl.v[u] = (now >> u & 1) && lane_ok ? att_load8<VEC>(vb + off[u], nval) : make_uint4(0, 0, 0, 0);
}

/* After the PDL wait: the tile's position p (the token's own, which the kernel before this one
 * wrote), if it is one of this lane's, loaded now. */
template <int L, bool VEC>
static __device__ __forceinline__ void att_fetch_late(att_tile &tl, int base, int p, int g, const att_bt &bt,
                                                      size_t row, const uint16_t *kb, const uint16_t *vb,
                                                      int nval) {
    constexpr int P = 32 / L;
    int d = p - base;
    bool mine = d >= 0 && d < ATT_U * P && d % P == g && nval > 0;
    size_t off = mine ? att_row_off(bt, p, row) : 0;
#pragma unroll
    for (int u = 0; u < ATT_U; u++) {
        bool take = mine && d / P == u && (tl.ok >> u & 1);
        uint4 k = take ? att_load8<VEC>(kb + off, nval) : tl.k[u], v = take ? att_load8<VEC>(vb + off, nval) : tl.v[u];
        tl.k[u] = k, tl.v[u] = v;
    }
}

/* The tile's position p, if it is one of this lane's, takes the rows (k, v) computed in the
 * kernel (decode with RoPE: the token's own, never read from the cache). */
template <int L>
static __device__ __forceinline__ void att_inject(att_tile &tl, int base, int p, int g, uint4 k, uint4 v) {
    constexpr int P = 32 / L;
    int d = p - base;
    bool mine = d >= 0 && d < ATT_U * P && d % P == g;
#pragma unroll
    for (int u = 0; u < ATT_U; u++) {
        bool take = mine && d / P == u && (tl.ok >> u & 1);
        tl.k[u] = take ? k : tl.k[u];
        tl.v[u] = take ? v : tl.v[u];
    }
}

/* RoPE of the lane's 8 dims d0.. of a head (x in place), the first rot of the head's dims
 * rotated (rot % 16 == 0: a chunk of 8 never straddles the halves) with msm_rope_lo / _hi and
 * the cosines and sines cs, sn [rot / 2] of the position (msm_rope_cs, in shared memory): the
 * arithmetic of the RoPE kernels. The partner dims (i + rot/2 for the low half, i - rot/2 for
 * the high one) come from the lane of the same sub-group that holds them. Every lane of the warp
 * calls it. */
template <int L>
static __device__ __forceinline__ void att_rope8(float x[8], int d0, int rot, const float *cs, const float *sn,
                                                 int lane) {
    int half = rot / 2, c = d0 / 8, hc = half / 8;
    int pc = c < hc ? c + hc : c < 2 * hc ? c - hc : c;
    int src = (lane & ~(L - 1)) + pc;
    float y[8];
#pragma unroll
    for (int e = 0; e < 8; e++) y[e] = __shfl_sync(MSM_FULL_MASK, x[e], src);
    if (c < hc) {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = msm_rope_lo(x[e], y[e], cs[d0 + e], sn[d0 + e]);
    } else if (c < 2 * hc) {
#pragma unroll
        for (int e = 0; e < 8; e++) x[e] = msm_rope_hi(y[e], x[e], cs[d0 - half + e], sn[d0 - half + e]);
    }
}

static __device__ __forceinline__ uint4 att_pack8(const float f[8]) {
    uint32_t w[4];
#pragma unroll
    for (int i = 0; i < 4; i++) w[i] = (uint32_t)msm_f2bf(f[2 * i]) | (uint32_t)msm_f2bf(f[2 * i + 1]) << 16;
    return make_uint4(w[0], w[1], w[2], w[3]);
}

/* Scores a tile (fp32 dot over the lane's 8 dims, butterfly sum over the sub-group's L lanes,
 * which leaves all of them the same value) and folds it into the sub-group's online softmax. */
template <int L>
static __device__ __forceinline__ void att_fold(const att_tile &tl, const float qv[8], float scale,
                                                float &m, float &den, float acc[8]) {
    float s[ATT_U];
#pragma unroll
    for (int u = 0; u < ATT_U; u++) {
        float kf[8], d = 0.0f;
        att_unpack8(tl.k[u], kf);
#pragma unroll
        for (int j = 0; j < 8; j++) d = fmaf(qv[j], kf[j], d);
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) d += __shfl_xor_sync(MSM_FULL_MASK, d, o);
        s[u] = tl.ok >> u & 1 ? d * scale : -INFINITY;
    }
    float mx = m;
#pragma unroll
    for (int u = 0; u < ATT_U; u++) mx = fmaxf(mx, s[u]);
    if (mx == -INFINITY) return; /* sub-group-uniform: nothing valid yet */
    float corr = expf(m - mx);   /* m = -inf: 0 */
    den *= corr;
#pragma unroll
    for (int j = 0; j < 8; j++) acc[j] *= corr;
#pragma unroll
    for (int u = 0; u < ATT_U; u++) {
        float e = expf(s[u] - mx), vf[8]; /* invalid position: e = 0 and v zero */
        att_unpack8(tl.v[u], vf);
        den += e;
#pragma unroll
        for (int j = 0; j < 8; j++) acc[j] = fmaf(e, vf[j], acc[j]);
    }
    m = mx;
}

/* ov[s] = p[s * stride] for the splits s < nsplit (all loads in flight at once; L2, since other
 * blocks wrote them), zero elsewhere or when !any. */
static __device__ __forceinline__ void att_load_col(float ov[ATT_MAX_SPLIT], const float *p,
                                                    size_t stride, int nsplit, bool any) {
#pragma unroll
    for (int s = 0; s < ATT_MAX_SPLIT; s++) ov[s] = any && s < nsplit ? __ldcg(p + (size_t)s * stride) : 0.0f;
}

/* CL (GB 1): the splits of a (token, head) are one thread-block cluster (grid (ns, nh, T),
 * cluster (ns, 1, 1)); each block leaves its partial in its shared memory and block rank 0 merges
 * them through distributed shared memory, in split order, with the arithmetic of the last-block
 * merge below (the same bits), with no workspace round trip, fence or counter. Else grid
 * (nh / GB, T, ns) and the last-block merge through the workspace.
 * early: every sequence of the step has one token (decode, msm_cuda_exec.decode): the step's
 * inputs (seq, pos, block tables: written before its first kernel) and the cache rows below the
 * token's position (written by earlier steps) are read before the PDL wait, so the first K/V
 * tile is in flight while the kernel before finishes; the token's own row, which that kernel
 * wrote, is loaded after the wait.
 * rp.rot > 0 (decode with early, VEC, rot % 16 == 0): q is the unrotated qkv row (q heads, then
 * kvh k heads, then kvh v heads; row stride q_ld) that ROPE_KV_WRITE would have rotated and
 * cached: the kernel rotates the q heads and the token's own k head itself, with the RoPE
 * kernels' arithmetic, rounds that k and the v head to bf16 as the cache holds them, uses them
 * for the token's position (never reading its cache row) and the first block of each kv head's
 * query heads whose range holds the position writes them to the cache at slot[t] (< 0: not
 * written): the same bits as the RoPE + cache write kernel followed by this one. */
typedef struct att_rope_args {
    int rot;       /* rotated dims of a head; 0: no RoPE here */
    float theta;
    const int32_t *slot;
    uint16_t *kw, *vw; /* the caches to write (kc, vc) */
} att_rope_args;

template <int L, bool VEC, int GB, bool CL>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_kernel(float *out, const float *q, size_t q_ld, const uint16_t *kc,
                     const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                     const int32_t *block_tables, int max_blocks, int nh, int kvh, int hd,
                     float scale, unsigned *ctr, float *part, bool early, bool bt_cache, att_rope_args rp) {
    constexpr int P = 32 / L;                    /* positions per warp per load instruction */
    constexpr int WPOS = ATT_U * P;              /* positions per warp per iteration */
    constexpr int BPOS = ATT_WARPS * WPOS;       /* positions per block per iteration */
    constexpr int NCOL = GB * L * 8;             /* output columns of the block's heads */
    constexpr int RND = (NCOL + ATT_THREADS - 1) / ATT_THREADS; /* of them per thread */
    __shared__ float sm_m[GB][ATT_WARPS], sm_den[GB][ATT_WARPS];
    __shared__ float sm_acc[GB][ATT_WARPS][L * 8];
    __shared__ float sm_sm[GB][ATT_MAX_SPLIT], sm_sc[GB][ATT_MAX_SPLIT];
    __shared__ int sm_last;
    /* CL: this block's partial per head, [M, D, o[L * 8]] (read by rank 0 of the cluster) */
    __shared__ float sm_part[CL ? GB : 1][CL ? L * 8 + 2 : 1];
    __shared__ float sm_cs[L * 4], sm_sn[L * 4]; /* RoPE here: cos, sin of the token's position */
    __shared__ int32_t sm_bt[ATT_BT_CACHE];      /* bt_cache: the block's block-table entries */
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();

    const int h0 = (CL ? blockIdx.y : blockIdx.x) * GB, t = CL ? blockIdx.z : blockIdx.y;
    const int z = CL ? blockIdx.x : blockIdx.z, ns = CL ? gridDim.x : gridDim.z;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int g = lane / L, d0 = (lane % L) * 8; /* sub-group; first of the lane's 8 dims */
    const int nval = min(8, hd - d0);            /* the lane's dims inside the head, <= 0: none */

    /* this block's positions [lo, hi) */
    const int32_t *bt = block_tables + (size_t)seq[t] * max_blocks;
    int n = max(pos[t] + 1, 0), lo = 0, hi = n, nsplit = 1;
    if (ns > 1) {
        int chunk = (n + ns - 1) / ns;
        chunk = max(BPOS, (chunk + BPOS - 1) / BPOS * BPOS);
        nsplit = max(1, (n + chunk - 1) / chunk); /* <= ns */
        lo = z * chunk;
        hi = min(n, lo + chunk);
        /* short context: fewer splits; the blocks beyond exit at once (block-uniform), or with
         * CL take part in the cluster's barriers with an empty range */
        if (z >= nsplit) {
            if constexpr (!CL) return;
            lo = hi = n;
        }
    }

    /* the GB query heads h0.. share kv head kh (the launcher picks GB dividing nh / kvh) */
    const int kh = h0 / (nh / kvh);
    const size_t row = (size_t)kvh * hd;
    const uint16_t *kb = kc + (size_t)kh * hd + d0, *vb = vc + (size_t)kh * hd + d0;

    /* warp w takes positions [base, base + WPOS) for base = lo + w * WPOS, + BPOS, ...; the
     * next iteration's rows are loaded while the current ones are scored (software pipeline).
     * Each K/V row read serves the block's GB heads, each with its own online softmax, exactly
     * the arithmetic of a block of one head. */
    int base = lo + warp * WPOS;
    att_bt tb = {bt, sm_bt, 0, 0};
    if (bt_cache) { /* block-uniform; the tables are step inputs, read before the wait like pos */
        int b0 = lo / MSM_KV_BLOCK, nb = hi > lo ? min(ATT_BT_CACHE, (hi - 1) / MSM_KV_BLOCK - b0 + 1) : 0;
        for (int i = threadIdx.x; i < nb; i += ATT_THREADS) sm_bt[i] = __ldg(bt + b0 + i);
        __syncthreads();
        tb.b0 = b0, tb.nb = nb;
    }
    const bool rope = rp.rot > 0;
    if (rope) { /* block-uniform; pos is a step input, read before the wait like the cache rows */
        for (int i = threadIdx.x; i < rp.rot / 2; i += ATT_THREADS) msm_rope_cs(n - 1, i, rp.rot, rp.theta, &sm_cs[i], &sm_sn[i]);
        __syncthreads();
    }
    const int lim = rope ? n - 1 : hi; /* with RoPE the token's own row is computed, not read */
    att_tile cur, nxt;
    att_fetch<L, VEC>(cur, base, hi, early ? n - 1 : hi, g, tb, row, kb, vb, nval);
    if (early) {
        msm_pdl_wait();
        if (!rope) att_fetch_late<L, VEC>(cur, base, n - 1, g, tb, row, kb, vb, nval);
    }
    float qv[GB][8];
#pragma unroll
    for (int j = 0; j < GB; j++) {
        const float *qh = q + (size_t)t * q_ld + (size_t)(h0 + j) * hd + d0;
#pragma unroll
        for (int i = 0; i < 8; i++) qv[j][i] = i < nval ? qh[i] : 0.0f;
    }
    uint4 nk = make_uint4(0, 0, 0, 0), nv = nk;
    if (rope) { /* warp-uniform */
        const float *qr = q + (size_t)t * q_ld + d0;
        float kf[8], vf[8];
#pragma unroll
        for (int i = 0; i < 8; i++) {
            kf[i] = i < nval ? qr[(size_t)(nh + kh) * hd + i] : 0.0f;
            vf[i] = i < nval ? qr[(size_t)(nh + kvh + kh) * hd + i] : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < GB; j++) att_rope8<L>(qv[j], d0, rp.rot, sm_cs, sm_sn, lane);
        att_rope8<L>(kf, d0, rp.rot, sm_cs, sm_sn, lane);
        nk = att_pack8(kf), nv = att_pack8(vf);
        att_inject<L>(cur, base, n - 1, g, nk, nv);
        /* the cache row of the token: written once per kv head, by the block of its first query
         * heads that holds the position */
        int sl = rp.slot[t];
        if (warp == 0 && g == 0 && nval > 0 && sl >= 0 && h0 % (nh / kvh) == 0 && lo <= n - 1 && n - 1 < hi) {
            *(uint4 *)(rp.kw + (size_t)sl * row + (size_t)kh * hd + d0) = nk;
            *(uint4 *)(rp.vw + (size_t)sl * row + (size_t)kh * hd + d0) = nv;
        }
    }

    float m[GB], den[GB], acc[GB][8];
#pragma unroll
    for (int j = 0; j < GB; j++) {
        m[j] = -INFINITY, den[j] = 0.0f;
#pragma unroll
        for (int i = 0; i < 8; i++) acc[j][i] = 0.0f;
    }
    for (; base < hi; base += BPOS) { /* warp-uniform */
        att_fetch<L, VEC>(nxt, base + BPOS, hi, lim, g, tb, row, kb, vb, nval);
        if (rope) att_inject<L>(nxt, base + BPOS, n - 1, g, nk, nv);
#pragma unroll
        for (int j = 0; j < GB; j++) att_fold<L>(cur, qv[j], scale, m[j], den[j], acc[j]);
        cur = nxt;
    }

    /* merge the warp's sub-groups (same dims, other positions) into sub-group 0, fixed order */
#pragma unroll
    for (int j = 0; j < GB; j++) {
#pragma unroll
        for (int o = L; o < 32; o <<= 1) {
            float mo = __shfl_xor_sync(MSM_FULL_MASK, m[j], o), dno = __shfl_xor_sync(MSM_FULL_MASK, den[j], o);
            float mx = fmaxf(m[j], mo);
            float c1 = m[j] == -INFINITY ? 0.0f : expf(m[j] - mx), c2 = mo == -INFINITY ? 0.0f : expf(mo - mx);
            den[j] = den[j] * c1 + dno * c2;
#pragma unroll
            for (int i = 0; i < 8; i++) {
                float ao = __shfl_xor_sync(MSM_FULL_MASK, acc[j][i], o);
                acc[j][i] = acc[j][i] * c1 + ao * c2;
            }
            m[j] = mx;
        }
        if (lane == 0) sm_m[j][warp] = m[j], sm_den[j][warp] = den[j];
        if (g == 0) {
#pragma unroll
            for (int i = 0; i < 8; i++) sm_acc[j][warp][d0 + i] = acc[j][i];
        }
    }
    __syncthreads();

    /* merge the warps in warp order (every thread computes the same M, D of each head); column
     * c = threadIdx.x + r * ATT_THREADS of the block's output is dim c % (L * 8) of head
     * c / (L * 8) */
    float M[GB], D[GB], cw[GB][ATT_WARPS];
#pragma unroll
    for (int j = 0; j < GB; j++) {
        M[j] = -INFINITY;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) M[j] = fmaxf(M[j], sm_m[j][w]);
        D[j] = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) {
            cw[j][w] = sm_m[j][w] == -INFINITY ? 0.0f : expf(sm_m[j][w] - M[j]); /* idle warps weigh 0 */
            D[j] += sm_den[j][w] * cw[j][w];
        }
    }
    const size_t th0 = (size_t)t * nh + h0;
    if (nsplit == 1) { /* (cluster-uniform: every split of a token computes the same nsplit) */
        if (z > 0) return; /* CL: an idle block of a short context */
#pragma unroll
        for (int r = 0; r < RND; r++) {
            int c = threadIdx.x + r * ATT_THREADS, j = c / (L * 8), d = c % (L * 8);
            if (c >= NCOL || d >= hd) continue;
            float o = 0.0f;
#pragma unroll
            for (int w = 0; w < ATT_WARPS; w++) o += sm_acc[j][w][d] * cw[j][w];
            float inv = n > 0 ? 1.0f / D[j] : 0.0f; /* empty context (pos < 0): zeros */
            out[(th0 + j) * hd + d] = o * inv;
        }
        return;
    }

    /* split: publish each head's partial [M, D, o[hd]] (unnormalised): CL in this block's
     * shared memory, else in the workspace, then count in once for the block (the counter of its
     * first head) */
    const size_t stride = (size_t)hd + 2;
#pragma unroll
    for (int r = 0; r < RND; r++) {
        int c = threadIdx.x + r * ATT_THREADS, j = c / (L * 8), d = c % (L * 8);
        if (c >= NCOL || d >= hd) continue;
        float *ph = CL ? sm_part[j] : part + ((th0 + j) * ns + z) * stride;
        if (d == 0) ph[0] = M[j], ph[1] = D[j];
        float o = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) o += sm_acc[j][w][d] * cw[j][w];
        ph[2 + d] = o;
    }
    float ov[RND][ATT_MAX_SPLIT];
    if constexpr (CL) {
        cg::cluster_group cl = cg::this_cluster();
        msm_cluster_sync_smem(); /* every split's partial is in its block's shared memory */
        if (z == 0) {
#pragma unroll
            for (int r = 0; r < RND; r++) {
                int c = threadIdx.x + r * ATT_THREADS, j = c / (L * 8), d = c % (L * 8);
                bool any = c < NCOL && d < hd;
#pragma unroll
                for (int s2 = 0; s2 < ATT_MAX_SPLIT; s2++)
                    ov[r][s2] = any && s2 < nsplit ? cl.map_shared_rank(&sm_part[any ? j : 0][2 + d], s2)[0] : 0.0f;
            }
            for (int i = threadIdx.x; i < GB * nsplit; i += ATT_THREADS) {
                const float *pp = cl.map_shared_rank(&sm_part[i / nsplit][0], i % nsplit);
                sm_sm[i / nsplit][i % nsplit] = pp[0];
                sm_sc[i / nsplit][i % nsplit] = pp[1];
            }
        }
        cl.sync(); /* rank 0 has read every partial: the other blocks may exit */
        if (z != 0) return;
        __syncthreads();
    } else {
        __syncthreads();
        if (threadIdx.x == 0) {
            __threadfence(); /* release: the block's partials (ordered by the barrier) before the count */
            unsigned prev = atomicAdd(ctr + th0, 1u);
            __threadfence(); /* acquire: the other splits' partials after their counts */
            sm_last = prev == (unsigned)nsplit - 1;
        }
        __syncthreads();
        if (!sm_last) return;

        /* the last block: every split's partial is visible (read from L2); merge in split order.
         * All of a thread's partial outputs are loaded together with the maxima and denominators,
         * so the merge costs one L2 round trip. */
#pragma unroll
        for (int r = 0; r < RND; r++) {
            int c = threadIdx.x + r * ATT_THREADS, j = c / (L * 8), d = c % (L * 8);
            bool any = c < NCOL && d < hd;
            att_load_col(ov[r], part + (th0 + (any ? j : 0)) * ns * stride + 2 + d, stride, nsplit, any);
        }
        for (int i = threadIdx.x; i < GB * nsplit; i += ATT_THREADS) {
            const float *pp = part + ((th0 + i / nsplit) * ns + i % nsplit) * stride;
            sm_sm[i / nsplit][i % nsplit] = __ldcg(pp);
            sm_sc[i / nsplit][i % nsplit] = __ldcg(pp + 1);
        }
        __syncthreads();
        if (threadIdx.x == 0) ctr[th0] = 0; /* every split has counted in: ready for the next call */
    }
#pragma unroll
    for (int j = 0; j < GB; j++) {
        M[j] = -INFINITY;
        for (int s2 = 0; s2 < nsplit; s2++) M[j] = fmaxf(M[j], sm_sm[j][s2]);
    }
    __syncthreads(); /* every thread has read the maxima before they become the weights */
    for (int i = threadIdx.x; i < GB * nsplit; i += ATT_THREADS) {
        float ms = sm_sm[i / nsplit][i % nsplit];
        sm_sm[i / nsplit][i % nsplit] = ms == -INFINITY ? 0.0f : expf(ms - M[i / nsplit]); /* weight */
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < RND; r++) {
        int c = threadIdx.x + r * ATT_THREADS, j = c / (L * 8), d = c % (L * 8);
        if (c >= NCOL || d >= hd) continue;
        float Dj = 0.0f;
        for (int s2 = 0; s2 < nsplit; s2++) Dj += sm_sc[j][s2] * sm_sm[j][s2];
        float o = 0.0f;
#pragma unroll
        for (int s2 = 0; s2 < ATT_MAX_SPLIT; s2++)
            if (s2 < nsplit) o += ov[r][s2] * sm_sm[j][s2];
        out[(th0 + j) * hd + d] = o * (1.0f / Dj);
    }
}

/* The index of sub-group width L (4, 8, 16, 32) in the tuning's per-width tables. */
static constexpr int att_li(int L) { return L <= 4 ? 0 : L <= 8 ? 1 : L <= 16 ? 2 : 3; }

/* Resident blocks of attention_kernel<L, VEC, GB> on one SM (1 if the query fails); the cluster
 * form's clusters of up to 16 allowed (non-portable sizes past 8: the H100/H200 take 16). */
template <int L, bool VEC, int GB>
static int att_per_sm(void) {
    int per = msm_blocks_per_sm(attention_kernel<L, VEC, GB, false>, ATT_THREADS, 0);
    if constexpr (GB == 1)
        if (cudaFuncSetAttribute(attention_kernel<L, VEC, 1, true>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
            cudaSuccess)
            (void)cudaGetLastError(); /* then att_cluster_fit finds no room for clusters past 8 */
    return per;
}

/* Query heads a block may take at sub-group width L: GB * L <= 64 keeps the last block's merge
 * (RND x ATT_MAX_SPLIT partial columns a thread) in registers. */
#define ATT_GB_OK(L, GB) ((GB) * (L) <= 64)

/* att_per_sm, 0 for a GB the kernel is not built for */
template <int L, bool VEC, int GB>
static int att_per_sm_gb(void) {
    if constexpr (ATT_GB_OK(L, GB)) return att_per_sm<L, VEC, GB>();
    else return 0;
}

template <int L, bool VEC>
static void att_tuning_l(msm_cuda_tuning *t, int li) {
    t->att_per_sm[li][VEC][0] = att_per_sm_gb<L, VEC, 1>();
    t->att_per_sm[li][VEC][1] = att_per_sm_gb<L, VEC, 2>();
    t->att_per_sm[li][VEC][2] = att_per_sm_gb<L, VEC, 3>();
    t->att_per_sm[li][VEC][3] = att_per_sm_gb<L, VEC, 4>();
}

/* How many clusters of ns split blocks of attention_kernel<L, VEC, 1, true> an idle GPU holds at
 * once (msm_max_clusters). Clusters that do not all fit run in a second wave, which doubles the
 * kernel (a Qwen1.5-MoE batch-8 step's 128 clusters of 4 took 30.8 us a layer against 15.8
 * unclustered; H200, 2026-12-01, bench/results/2026-12-01-h200-mega run 2), and under programmatic
 * dependent launch the kernel before still holds slots when they are placed: att_launch takes the
 * cluster form only while att_cluster_spare clusters of this would stay free. */
template <int L, bool VEC>
static void att_cluster_fit(msm_cuda_tuning *t, int li) {
    for (int ns = 2; ns <= ATT_MAX_SPLIT; ns++)
        t->att_cluster_fit[li][VEC][ns] = msm_max_clusters(attention_kernel<L, VEC, 1, true>, (unsigned)ns, ATT_THREADS, 0);
}

/* The occupancy fields of the attention kernels, for msm_cuda_tuning_init. */
void msm__attention_tuning(msm_cuda_tuning *t) {
    att_tuning_l<4, false>(t, 0), att_tuning_l<4, true>(t, 0);
    att_tuning_l<8, false>(t, 1), att_tuning_l<8, true>(t, 1);
    att_tuning_l<16, false>(t, 2), att_tuning_l<16, true>(t, 2);
    att_tuning_l<32, false>(t, 3), att_tuning_l<32, true>(t, 3);
    att_cluster_fit<4, false>(t, 0), att_cluster_fit<4, true>(t, 0);
    att_cluster_fit<8, false>(t, 1), att_cluster_fit<8, true>(t, 1);
    att_cluster_fit<16, false>(t, 2), att_cluster_fit<16, true>(t, 2);
    att_cluster_fit<32, false>(t, 3), att_cluster_fit<32, true>(t, 3);
}

template <int L, bool VEC, int GB>
static int att_launch(float *out, const float *q, size_t q_ld, const uint16_t *kc,
                      const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                      const int32_t *block_tables, int max_blocks, int T, int nh, int kvh, int hd,
                      float scale, void *ws, size_t ws_bytes, const att_rope_args &rp, msm_cuda_exec ex) {
    long pairs = (long)T * (nh / GB); /* (token, head group) blocks of one split */
    int ns = 1;
    if (ws && (long)T * nh <= ATT_MAX_CTR && ws_bytes > ATT_PART_OFF) {
        /* as many splits as fill the resident block slots in one wave (a second, partial wave
         * would leave a tail); the device uses fewer for short contexts, so only long contexts
         * pay for merges */
        constexpr int li = att_li(L);
        long want = (long)ex.tune->sms * ex.tune->att_per_sm[li][VEC][GB - 1] / pairs;
        long fit = (long)((ws_bytes - ATT_PART_OFF) / (sizeof(float) * (size_t)T * nh * ((size_t)hd + 2)));
        int cap = ex.tune->att_max_split < ATT_MAX_SPLIT ? ex.tune->att_max_split : ATT_MAX_SPLIT;
        if (want > cap) want = cap;
        ns = (int)(want < fit ? want : fit);
        if (ns < 1) ns = 1;
    }
    unsigned *ctr = (unsigned *)ws;
    float *part = ws ? (float *)((char *)ws + ATT_PART_OFF) : NULL;
    bool early = (ex.decode && ex.tune->att_early) || rp.rot > 0; /* RoPE here: decode only (the caller) */
    if constexpr (GB == 1) {
        /* the splits of a (token, head) as one cluster, where att_cluster_spare of the clusters
         * the GPU holds (att_cluster_fit) stay free: the same splits, the same bits */
        constexpr int li = att_li(L);
        if (ns > 1 && ex.tune->att_cluster && pairs + ex.tune->att_cluster_spare <= ex.tune->att_cluster_fit[li][VEC][ns]) {
            dim3 grid((unsigned)ns, (unsigned)nh, (unsigned)T);
            CUDA_TRY(msm_launch_cluster(attention_kernel<L, VEC, 1, true>, grid, dim3(ATT_THREADS), 0, (unsigned)ns, ex,
                                        out, q, q_ld, kc, vc, seq, pos, block_tables, max_blocks, nh, kvh, hd, scale,
                                        ctr, part, early, ex.tune->att_bt_cache, rp));
            return 0;
        }
    }
    dim3 grid((unsigned)(nh / GB), (unsigned)T, (unsigned)ns);
    CUDA_TRY(msm_launch(attention_kernel<L, VEC, GB, false>, grid, dim3(ATT_THREADS), 0, ex, out, q, q_ld,
                        kc, vc, seq, pos, block_tables, max_blocks, nh, kvh, hd, scale, ctr, part, early,
                        ex.tune->att_bt_cache, rp));
    return 0;
}

/* GB: the most query heads of one kv head a block takes (<= tune->att_group, dividing the group
 * nh / kvh, ATT_GB_OK); each K/V row it reads then serves GB heads instead of one. Only when one
 * head a block already fills the GPU's block slots unsplit: with fewer (token, head) pairs the
 * step is bound by each block's serial latency, which GB heads a block multiply (H200,
 * 2026-12-01, Qwen3-30B-A3B, 32 query heads over 4 kv heads, GB 4 against 1: batch 1 4.23 vs
 * 3.79 ms, 8 9.88 vs 9.61; batch 32 18.88 vs 19.50, 128 26.07 vs 28.50). */
template <int L, bool VEC>
static int att_launch_gb(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                         const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks,
                         int T, int nh, int kvh, int hd, float scale, void *ws, size_t ws_bytes,
                         const att_rope_args &rp, msm_cuda_exec ex) {
    int G = nh / kvh, gb = 1;
    constexpr int li = att_li(L);
    long min_pairs = ex.tune->att_group_min > 0 ? ex.tune->att_group_min
                                                : (long)ex.tune->sms * ex.tune->att_per_sm[li][VEC][0];
    bool full = (long)T * nh >= min_pairs;
    for (int c = 4; c > 1 && gb == 1 && full; c--)
        if (c <= ex.tune->att_group && G % c == 0 && ATT_GB_OK(L, c)) gb = c;
#define ATT_GB(GB)                                                                                                  \
    att_launch<L, VEC, ATT_GB_OK(L, GB) ? GB : 1>(out, q, q_ld, kc, vc, seq, pos, block_tables, max_blocks, T, nh, \
                                                 kvh, hd, scale, ws, ws_bytes, rp, ex)
    switch (gb) {
    case 4: return ATT_GB(4);
    case 3: return ATT_GB(3);
    case 2: return ATT_GB(2);
    default: return ATT_GB(1);
    }
#undef ATT_GB
}

extern "C" size_t msm_cuda_attention_ws_bytes(int T, int nh, int hd) {
    if (T <= 0 || nh <= 0 || hd <= 0 || (long)T * nh > ATT_MAX_CTR) return 0;
    return ATT_PART_OFF + sizeof(float) * (size_t)T * nh * ATT_MAX_SPLIT * ((size_t)hd + 2);
}

extern "C" int msm_cuda_attention(float *out, const float *q, const uint16_t *kc,
                                  const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                                  const int32_t *block_tables, int max_blocks, int T, int nh,
                                  int kvh, int hd, float scale, msm_cuda_exec ex) {
    return msm_cuda_attention_ex(out, q, (size_t)nh * hd, kc, vc, seq, pos, block_tables,
                                 max_blocks, T, nh, kvh, hd, scale, NULL, 0, ex);
}

/* Whether the tensor-core kernel (attention_mma.cu) takes the call: once its (token, kv head)
 * blocks are enough: with 4 or more query heads a kv head from sms / 4 blocks, with fewer (the
 * SIMT kernel is lean there) from 4 waves' worth. It has no context split, so below that the
 * split SIMT blocks here win (H200, 2026-12-01, context 512, ms a step, tensor-core vs SIMT:
 * Qwen3-30B-A3B, 8 heads a kv head: batch 1 3.79 vs 3.45, 4 6.99 vs 6.92, 8 9.55 vs 9.62, 16
 * 12.77 vs 13.27, 32 17.87 vs 18.90, 256 25.60 vs 36.05; GLM-4.5-Air, 12: batch 4 16.42 vs 16.68;
 * Qwen1.5-MoE, MHA: batch 8 5.04 vs 4.94, 32 9.26 vs 9.31, 48 9.40 vs 9.76, 256 16.72 vs 17.41) */
static bool att_takes_mma(const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc, int T, int nh, int kvh,
                          int hd, msm_cuda_exec ex) {
    int att_mma = ex.tune->att_mma, G = nh / kvh;
    if (att_mma == MSM_CUDA_ATT_MMA_OFF || !msm__attention_mma_fits(hd, q, q_ld, kc, vc)) return false;
    long blocks = (long)T * kvh * ((G + 7) / 8), sms = ex.tune->sms;
    long min_blocks = ex.tune->att_mma_min_blocks > 0 ? ex.tune->att_mma_min_blocks
                      : G >= 4                      ? (sms + 3) / 4
                                                    : 4 * sms;
    return att_mma == MSM_CUDA_ATT_MMA_ON || blocks >= min_blocks;
}

/* 16-byte K/V loads need every row start 16-byte aligned */
static bool att_vec(int hd, const uint16_t *kc, const uint16_t *vc) {
    return hd % 8 == 0 && !(((uintptr_t)kc | (uintptr_t)vc) & 15);
}

/* The SIMT kernel at the sub-group width the head dim needs (8 dims a lane). */
static int att_simt(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                    const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks, int T, int nh,
                    int kvh, int hd, float scale, void *ws, size_t ws_bytes, const att_rope_args &rp,
                    msm_cuda_exec ex) {
    bool vec = att_vec(hd, kc, vc);
    int chunks = (hd + 7) / 8; /* 8-dim pieces of a head: one per lane of a sub-group */
#define ATT_GO(L)                                                                                       \
    (vec ? att_launch_gb<L, true>(out, q, q_ld, kc, vc, seq, pos, block_tables, max_blocks, T, nh, kvh, hd, \
                                  scale, ws, ws_bytes, rp, ex)                                          \
         : att_launch_gb<L, false>(out, q, q_ld, kc, vc, seq, pos, block_tables, max_blocks, T, nh, kvh, hd, \
                                   scale, ws, ws_bytes, rp, ex))
    if (chunks <= 4) return ATT_GO(4);
    if (chunks <= 8) return ATT_GO(8);
    if (chunks <= 16) return ATT_GO(16);
    return ATT_GO(32);
#undef ATT_GO
}

static bool att_args_ok(int T, int nh, int kvh, int hd, int max_blocks, size_t q_ld, const void *ws) {
    return T >= 0 && T <= 65535 && nh > 0 && kvh > 0 && nh % kvh == 0 && hd > 0 && hd <= 256 && max_blocks > 0 &&
           q_ld >= (size_t)nh * hd && !(ws && ((uintptr_t)ws & 3)); /* T: grid limits; prefill chunks are far smaller */
}

extern "C" int msm_cuda_attention_ex(float *out, const float *q, size_t q_ld, const uint16_t *kc,
                                     const uint16_t *vc, const int32_t *seq, const int32_t *pos,
                                     const int32_t *block_tables, int max_blocks, int T, int nh,
                                     int kvh, int hd, float scale, void *ws, size_t ws_bytes,
                                     msm_cuda_exec ex) {
    if (!att_args_ok(T, nh, kvh, hd, max_blocks, q_ld, ws)) return -EINVAL;
    if (T == 0) return 0;
    int ns = msm_cuda_attention_mma_splits(T, nh, kvh, hd, q, q_ld, kc, vc, ex);
    if (ns)
        return msm__attention_mma_split_run(out, q, q_ld, kc, vc, seq, pos, block_tables, max_blocks, T, nh, kvh, hd,
                                            scale, ns, ex);
    if (att_takes_mma(q, q_ld, kc, vc, T, nh, kvh, hd, ex))
        return msm__attention_mma_run(out, q, q_ld, kc, vc, seq, pos, block_tables, max_blocks, T, nh, kvh, hd, scale,
                                      ex);
    att_rope_args none = {};
    return att_simt(out, q, q_ld, kc, vc, seq, pos, block_tables, max_blocks, T, nh, kvh, hd, scale, ws, ws_bytes,
                    none, ex);
}

extern "C" int msm_cuda_attention_rope(float *out, float *qkv_rot, const float *qkv, uint16_t *kc, uint16_t *vc,
                                       const int32_t *seq, const int32_t *pos, const int32_t *slot,
                                       const int32_t *block_tables, int max_blocks, int T, int nh, int kvh, int hd,
                                       int rot, float theta, float scale, void *ws, size_t ws_bytes,
                                       msm_cuda_exec ex) {
    size_t C = (size_t)(nh + 2 * kvh) * hd;
    if (!att_args_ok(T, nh, kvh, hd, max_blocks, C, ws) || !slot || !kc || !vc || rot <= 0 || rot > hd || rot % 2)
        return -EINVAL;
    if (T == 0) return 0;
    bool fused = ex.decode && ex.tune->att_rope && rot % 16 == 0 && att_vec(hd, kc, vc) &&
                 !att_takes_mma(qkv_rot, C, kc, vc, T, nh, kvh, hd, ex) &&
                 !msm_cuda_attention_mma_splits(T, nh, kvh, hd, qkv_rot, C, kc, vc, ex);
    if (fused) {
        att_rope_args rp = {rot, theta, slot, kc, vc};
        return att_simt(out, qkv, C, kc, vc, seq, pos, block_tables, max_blocks, T, nh, kvh, hd, scale, ws, ws_bytes,
                        rp, ex);
    }
    int r = msm_cuda_rope_kv(qkv_rot, qkv, pos, slot, kc, vc, T, nh, kvh, hd, rot, theta, ex);
    return r ? r : msm_cuda_attention_ex(out, qkv_rot, C, kc, vc, seq, pos, block_tables, max_blocks, T, nh, kvh, hd,
                                         scale, ws, ws_bytes, ex);
}

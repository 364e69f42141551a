/* moe_grouped.cu: the routed experts at medium T (up to MSM_CUDA_MOE_GROUPED_GEMV_MAX_T), after
 * moe.cu has grouped the (token, slot) pairs by expert: gate/up and down GEMVs that stream each
 * selected expert's rows once for all of its tokens, the down GEMV writing one f32 row per pair
 * (combined by moe.cu). Two kinds:
 *   - SIMT (T < MOE_MMA_MIN_T): block (row chunk, expert) (or, tuning moe_gg_persist, persistent
 *     blocks looping over those items), fp32 FMAs on the exact bf16 weights, up to 4 tokens a pass.
 *   - tensor-core ("MMA", T >= MOE_MMA_MIN_T): a warp owns 16 weight rows (rows g and g+8 of
 *     m16n8k16's A) and 8 tokens (n8); lane (g = lane/4, q = lane%4) streams
 *     W[row][32c + 8q .. +8] of rows g and g+8 with 16-byte loads, which feed two k16 MMAs under
 *     a fixed permutation of k inside each 32-wide chunk (logical k 2q+j -> 8q+j, 2q+8+j ->
 *     8q+2+j, +4 for the second MMA); the B fragment reads x of token g at the same physical k.
 *     x is split as bf16 hi + bf16 lo (x - hi), so the products carry ~16 mantissa bits of x (as
 *     the MMV linear): near-fp32, within the GEMV tolerance of the CPU oracle. The 4 warps of a
 *     block split K and sum their partials in warp order (deterministic). Its cost per weight
 *     byte does not grow with the tokens an expert has (up to 16 a pass), so it pulls ahead once
 *     experts have ~4 tokens or more. The grids are persistent (the blocks the GPU holds, each
 *     looping over (expert, row chunk) items), so there is no partial last wave. */
#include "moe_internal.h"

#include <errno.h>

#define MOE_WARPS 4

/* The tensor-core GEMVs from this many tokens on (measured on the H200 at the Qwen1.5-MoE
 * shapes, whole call: SIMT ahead up to T = 32, e.g. 261 us against 292; MMA at T = 48, 322
 * against 331, and T = 64, 337 against 404). */
#define MOE_MMA_MIN_T 48
#define MMA_NW 4     /* warps of a tensor-core GEMV block, splitting K */
#define MMA_U 4      /* 32-wide K chunks in flight per warp: 2 * MMA_U 16-byte loads a lane */
#define MMA_NT 2     /* 8-token tiles a pass */
#define MMA_MINB 5   /* blocks an SM should hold: caps the registers at 96 a thread */
#define MMA_MINB_FP8 3 /* the FP8 ones (decoded A fragments of a whole chunk live at once): 168 */
#define DOWN_ROWS 16 /* rows of a down MMA item */

/* ---- medium T, SIMT: grouped GEMVs (fp32 FMAs) ----
 * Block (row chunk, e) streams its rows of expert e once and dots every one with all the rows
 * (token copies) routed to e, NT tokens per pass (a later pass re-reads the rows, mostly from L2).
 * fp32 math on the exact bf16 weights and f32 activations, like the CPU oracle; act and the
 * per-pair down rows stay f32. The gate/up kernel triggers its dependants only after its wait (see
 * moe_down_mma_kernel), so the down may read the routing before its own wait (early).
 * Expert e's rows: after moe_group_kernel, grouped rows expert_off[e] .. expert_off[e + 1] - 1
 * (pair perm[g]); or, scanning (ids given: tuning moe_group_scan_max_t), the block finds e's
 * pairs in ids itself, in ascending order (gg_scan), and act / outp rows are the pairs' indices:
 * no grouping kernel, whose one block of 1024 threads waited for room beside the shared expert's
 * GEMVs at 8 tokens (Qwen1.5-MoE timeline: router end to gate/up start 10.7 us). The same sums
 * either way (each row's dot does not depend on the others). Off by default: every block's scan
 * cost more than the grouping kernel (tuning.cu).
 * NT = 4 tokens a pass: the fp32 partials per token are what limits the blocks an SM holds
 * (gate/up: 166 registers a thread at 8 tokens, 96 at 4), and an expert mostly has 1-4 tokens up
 * to T = 32; measured on the H200 at the Qwen1.5-MoE shapes, 4 against 8 (2): T = 8 112 us against
 * 127 (113), T = 16 173 against 198 (184), T = 32 261 against 300 (303). Tuning moe_gg_*_nt picks
 * 2 or 4 per kernel (the down takes 2 by default: fewer registers, more blocks an SM; measured in
 * tuning.cu), moe_gg_gateup_u / moe_gg_down_u the K chunks in flight (same sums: a lane's chunks
 * are summed in K order whatever the step). */
#define GG_U 2

/* Expert e's pairs among ids[0, P) in ascending order into sp (the whole block calls it); returns
 * their count. Every thread loads its ids at once (one round trip, P <= MSM_CUDA_MOE_SCAN_MAX_P =
 * 4 * 128), each warp counts its hits of each round by a ballot, and a pair's slot is the hits
 * before it: rounds first, then warps, then lanes (p = round * 128 + thread). (A warp scanning 32
 * ids a round in turn cost Qwen3-30B-A3B, 64 pairs at 8 tokens in each of 12288 gate/up blocks,
 * 0.29 ms a step; this form still 0.3: H200, 2026-12-03 ninth session, runs 2-3.) */
static __device__ __forceinline__ int gg_scan(int *sp, const int32_t *ids, int P, int e) {
    constexpr int NR = MSM_CUDA_MOE_SCAN_MAX_P / (MOE_WARPS * 32);
    __shared__ int cnt[NR][MOE_WARPS];
    int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    bool hit[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        int p = r * MOE_WARPS * 32 + tid;
        hit[r] = p < P && ids[p] == e;
    }
    unsigned m[NR];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        m[r] = __ballot_sync(MSM_FULL_MASK, hit[r]);
        if (lane == 0) cnt[r][warp] = __popc(m[r]);
    }
    __syncthreads();
    int n = 0;
#pragma unroll
    for (int q = 0; q < NR; q++)
#pragma unroll
        for (int w = 0; w < MOE_WARPS; w++) n += cnt[q][w];
#pragma unroll
    for (int r = 0; r < NR; r++) {
        int before = 0; /* hits in earlier rounds, or in this round's earlier warps */
#pragma unroll
        for (int q = 0; q < NR; q++)
#pragma unroll
            for (int w = 0; w < MOE_WARPS; w++) before += (q < r || (q == r && w < warp)) ? cnt[q][w] : 0;
        if (hit[r]) sp[before + __popc(m[r] & ((1u << lane) - 1))] = r * MOE_WARPS * 32 + tid;
    }
    __syncthreads();
    return n;
}

/* This block's expert *e and its rows [*g0, *g1) (empty: nothing to do). Scanning (ids given):
 * blockIdx.y is the expert, its pairs scanned into sp, the kernel's dynamic shared memory (P ints,
 * launched only when scanning: gg_smem; the kernels without the scan, the default, hold none).
 * After the grouping: blockIdx.y is the s-th selected expert (ws.items, min(E, P) of them at
 * most) where the grid is compact (grouped_simt_launch), else the expert itself (expert_off). */
static __device__ __forceinline__ void gg_rows(const moe_ws &ws, const int32_t *ids, int P, bool compact, int *sp,
                                               int *e, int *g0, int *g1) {
    *e = blockIdx.y;
    if (ids) {
        *g0 = 0, *g1 = gg_scan(sp, ids, P, *e);
    } else if (compact) {
        int4 it = (int)blockIdx.y < *ws.n_sel ? ws.items[blockIdx.y] : make_int4(0, 0, 0, 0);
        *e = it.x, *g0 = it.y, *g1 = it.z;
    } else {
        *g0 = ws.expert_off[*e], *g1 = ws.expert_off[*e + 1];
    }
}

/* A persistent block's items (s-th selected expert, row chunk) of the nchunk chunks an expert, in
 * turn from blockIdx.x by gridDim.x: f(its ws.items entry, its chunk), the next entry read before
 * f runs. Reads through L2 (the down reads them before its PDL wait). Returns whether the block had
 * any item. */
template <typename F>
static __device__ __forceinline__ bool gg_each_item(const moe_ws &ws, int nchunk, F f) {
    const int n = __ldcg(ws.n_sel) * nchunk;
    int it = blockIdx.x;
    int4 cur = it < n ? __ldcg(ws.items + it / nchunk) : make_int4(0, 0, 0, 0);
    for (; it < n; it += gridDim.x) {
        int nx = it + gridDim.x;
        int4 nxt = nx < n ? __ldcg(ws.items + nx / nchunk) : make_int4(0, 0, 0, 0);
        f(cur, it % nchunk);
        cur = nxt;
    }
    return (int)blockIdx.x < n;
}

/* The gate/up of one block item: the columns of row chunk c (MOE_WARPS * R of them) of expert e for
 * its grouped rows [g0, g1) (pairs sp[g] where scanned). */
template <int R, int NT, bool VEC, bool FP8, int U>
static __device__ __forceinline__ void gg_gateup_item(const moe_ws &ws, const int32_t *ids, const int *sp,
                                                      const float *x, const void *gate_up, const float *gu_sc,
                                                      int gu_ph, int H, int I, int k, int e, int g0, int g1, int c) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int i0 = (c * MOE_WARPS + warp) * R;
    if (i0 >= I) return;
    float *act = (float *)ws.act;
    size_t eb = (size_t)e * 2 * I * H;
    const float *se = FP8 ? gu_sc + (size_t)e * msm_cuda_fp8_scales(1, 2 * I, H, gu_ph) : NULL;
    const void *wr[2 * R];
    const float *sr[2 * R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int i = min(i0 + r, I - 1); /* rows past I duplicate the last one; never stored */
        wr[r] = msm_wrow<FP8>(gate_up, eb, i, H);
        wr[R + r] = msm_wrow<FP8>(gate_up, eb, I + i, H);
        sr[r] = msm_srow(se, i, H, gu_ph);
        sr[R + r] = msm_srow(se, I + i, H, gu_ph);
    }
    for (int gb = g0; gb < g1; gb += NT) {
        int nt = min(NT, g1 - gb);
        const float *xs[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int g = gb + min(t, nt - 1);
            xs[t] = x + (size_t)((ids ? sp[g] : ws.perm[g]) / k) * H;
        }
        float acc[2 * R][NT];
#pragma unroll
        for (int r = 0; r < 2 * R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        msm_rows_dot_w<2 * R, NT, U, VEC, FP8>(acc, wr, sr, xs, nt, H, gu_ph, lane);
        /* only the nt live token columns are reduced (nt is warp-uniform; an expert mostly has
         * 1-3 tokens at T=32, so reducing all NT cost as much as the loads) */
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            size_t row = ids ? (size_t)sp[gb + t] : (size_t)(gb + t);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float g = msm_warp_sum(acc[r][t]), u = msm_warp_sum(acc[R + r][t]);
                if (lane == 0 && i0 + r < I) act[row * I + i0 + r] = g / (1.0f + expf(-g)) * u;
            }
        }
    }
}

/* Block (row chunk, expert); PER (persistent, tuning moe_gg_persist, compact grids after the
 * grouping only): the blocks the GPU holds, each looping over the items (s-th selected expert,
 * row chunk), chunk-major within an expert so the blocks at work at once read neighbouring rows,
 * the next item's routing read before this one's rows. The same sums either way. */
template <int R, int NT, bool VEC, bool FP8, int U = GG_U, bool PER = false>
static __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gateup_grouped_gemv_kernel(moe_ws ws, const int32_t *ids, int P, bool compact, const float *x,
                                   const void *gate_up, const float *gu_sc, int gu_ph, int H, int I, int k) {
    extern __shared__ int sp[];
    msm_pdl_wait();
    msm_pdl_trigger();
    if constexpr (PER) {
        gg_each_item(ws, (I + MOE_WARPS * R - 1) / (MOE_WARPS * R), [&](int4 it, int c) {
            gg_gateup_item<R, NT, VEC, FP8, U>(ws, NULL, sp, x, gate_up, gu_sc, gu_ph, H, I, k, it.x, it.y, it.z, c);
        });
    } else {
        int e, g0, g1;
        gg_rows(ws, ids, P, compact, sp, &e, &g0, &g1);
        if (g0 >= g1) return;
        gg_gateup_item<R, NT, VEC, FP8, U>(ws, ids, sp, x, gate_up, gu_sc, gu_ph, H, I, k, e, g0, g1, blockIdx.x);
    }
}

/* outp[g, h] = dot(down_e[h, :], act[g, :]) for the rows g of expert e (grouped rows, or the
 * scanned pairs), rows of chunk c. hook: the PDL wait (early: the routing and the first weight
 * loads come before it; the gate/up before this triggers only after its own wait); act, written
 * by the gate/up, and every store after it. */
template <int R, int NT, int U, bool VEC, bool FP8>
static __device__ __forceinline__ void gg_down_item(const moe_ws &ws, const int32_t *ids, const int *sp,
                                                    const void *down, const float *dn_sc, int dn_ph, int H, int I,
                                                    int e, int g0, int g1, int c, bool early) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int h0 = (c * MOE_WARPS + warp) * R;
    if (h0 >= H) return;
    const float *act = (const float *)ws.act;
    const float *se = FP8 ? dn_sc + (size_t)e * msm_cuda_fp8_scales(1, H, I, dn_ph) : NULL;
    const void *wr[R];
    const float *sr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        wr[r] = msm_wrow<FP8>(down, (size_t)e * H * I, min(h0 + r, H - 1), I);
        sr[r] = msm_srow(se, min(h0 + r, H - 1), I, dn_ph);
    }
    for (int gb = g0; gb < g1; gb += NT) {
        int nt = min(NT, g1 - gb);
        const float *xs[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int g = gb + min(t, nt - 1);
            xs[t] = act + (size_t)(ids ? sp[g] : g) * I;
        }
        float acc[R][NT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        /* the wait (early) once this pass's first weight loads are out; a no-op after the first */
        msm_rows_dot_w<R, NT, U, VEC, FP8>(acc, wr, sr, xs, nt, I, dn_ph, lane, msm_pdl_hook{early});
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= nt) break;
            size_t row = ids ? (size_t)sp[gb + t] : (size_t)(gb + t);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float d = msm_warp_sum(acc[r][t]);
                if (lane == 0 && h0 + r < H) ws.outp[row * H + h0 + r] = d;
            }
        }
    }
}

/* Block (row chunk, expert), or persistent (PER) as the gate/up kernel; early: the routing before
 * the PDL wait (read through L2: no line of it is in L1 before the wait). */
template <int R, int NT, int U, bool VEC, bool FP8, bool PER = false>
static __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_grouped_gemv_kernel(moe_ws ws, const int32_t *ids, int P, bool compact, const void *down,
                                 const float *dn_sc, int dn_ph, int H, int I, bool early) {
    extern __shared__ int sp[];
    if (!early) msm_pdl_wait();
    msm_pdl_trigger();
    if constexpr (PER) {
        /* early: each item's hook waits (a no-op after the first); a block with no item still waits:
         * this grid's completion must imply its predecessors' */
        bool any = gg_each_item(ws, (H + MOE_WARPS * R - 1) / (MOE_WARPS * R), [&](int4 it, int c) {
            gg_down_item<R, NT, U, VEC, FP8>(ws, NULL, sp, down, dn_sc, dn_ph, H, I, it.x, it.y, it.z, c, early);
        });
        if (!any) msm_pdl_wait();
    } else {
        int e, g0, g1;
        gg_rows(ws, ids, P, compact, sp, &e, &g0, &g1);
        if (g0 >= g1) return;
        gg_down_item<R, NT, U, VEC, FP8>(ws, ids, sp, down, dn_sc, dn_ph, H, I, e, g0, g1, blockIdx.x, early);
    }
}

/* ---- medium T, tensor cores: grouped MMA GEMVs ---- */

/* ch += W[16 rows, 32-chunk] . Xhi[32-chunk, 8 tokens], cl += the same with Xlo, for this lane's
 * share: wa, wb = 8 weights of rows g and g+8 at physical k 8q..8q+7 of the chunk, xa, xb = x of
 * token g at the same k. Two accumulators halve the chain of dependent MMAs. */
static __device__ __forceinline__ void mma_chunk(float ch[4], float cl[4], uint4 wa, uint4 wb,
                                                 float4 xa, float4 xb) {
    uint32_t h0, l0, h1, l1, h2, l2, h3, l3;
    msm_split_bf16x2(xa.x, xa.y, h0, l0);
    msm_split_bf16x2(xa.z, xa.w, h1, l1);
    msm_split_bf16x2(xb.x, xb.y, h2, l2);
    msm_split_bf16x2(xb.z, xb.w, h3, l3);
    msm_mma_bf16(ch, wa.x, wb.x, wa.y, wb.y, h0, h1);
    msm_mma_bf16(cl, wa.x, wb.x, wa.y, wb.y, l0, l1);
    msm_mma_bf16(ch, wa.z, wb.z, wa.w, wb.w, h2, h3);
    msm_mma_bf16(cl, wa.z, wb.z, wa.w, wb.w, l2, l3);
}

/* acc = this warp's K share (a contiguous run of 32-wide chunks, K split over NW warps) of rows
 * wa_row (g) and wb_row (g+8) against up to NT tiles of 8 tokens (xr[t]: token t*8+g's row,
 * NULL past the last token; only the first ntile tiles, a warp-uniform count, are live).
 * K % 8 == 0; rows and xr 16-byte aligned. All 2*U weight loads of a step are issued before
 * any is used. (Interleaving the warps' chunks, so a block step reads 1 KB of each row, measured
 * 10% slower on the H200.) */
template <int NW, int U, int NT>
static __device__ __forceinline__ void mma_rows(float acc[NT][4], const uint16_t *wa_row,
                                                const uint16_t *wb_row, const float *const xr[NT],
                                                int ntile, int K, int warp, int q) {
    float lo[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = lo[t][i] = 0.0f;
    int nch = (K + 31) / 32, per = (nch + NW - 1) / NW;
    int c0 = warp * per, c1 = min(nch, c0 + per);
    for (int c = c0; c < c1; c += U) {
        uint4 wa[U], wb[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = (c + u) * 32 + q * 8;
            bool ok = c + u < c1 && kk < K;
            wa[u] = ok ? msm_ld_stream16(wa_row + kk) : make_uint4(0, 0, 0, 0);
            wb[u] = ok ? msm_ld_stream16(wb_row + kk) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c + u >= c1) break;
            int kk = (c + u) * 32 + q * 8;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= ntile) break;
                float4 xa = make_float4(0, 0, 0, 0), xb = xa;
                if (xr[t] && kk < K) {
                    const float4 *p = (const float4 *)(xr[t] + kk);
                    xa = p[0], xb = p[1];
                }
                mma_chunk(acc[t], lo[t], wa[u], wb[u], xa, xb);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] += lo[t][i];
}

/* mma_rows for FP8-resident rows (docs/adr/0006-fp8.md; the decode and the k permutation of
 * linear_fp8.cu): 64-column chunks, K % 64 == 0 and the column phase ph % 64 == 0 so a chunk has
 * one scale per row (sa, sb: the rows' scales); lane (g, q) streams codes 16q..16q+15 of rows g
 * and g+8 per chunk, x of token g at the same columns is split into bf16 hi + lo of x * 2^100, and
 * each chunk's MMAs go into a fresh accumulator then scaled into acc (scale * 2^20). */
template <int NW, int U, int NT>
static __device__ __forceinline__ void mma_rows_fp8(float acc[NT][4], const uint8_t *wa_row, const uint8_t *wb_row,
                                                    const float *sa, const float *sb, int ph,
                                                    const float *const xr[NT], int ntile, int K, int warp, int q) {
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
    int nch = K / 64, per = (nch + NW - 1) / NW;
    int c0 = warp * per, c1 = min(nch, c0 + per);
    for (int c = c0; c < c1; c += U) {
        uint4 wa[U], wb[U];
        float s_a[U], s_b[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = (c + u) * 64 + q * 16, blk = ((c + u) * 64 + ph) >> 7;
            bool ok = c + u < c1;
            wa[u] = ok ? msm_ld_stream16(wa_row + kk) : make_uint4(0, 0, 0, 0);
            wb[u] = ok ? msm_ld_stream16(wb_row + kk) : make_uint4(0, 0, 0, 0);
            s_a[u] = ok ? __ldg(sa + blk) * MSM_FP8_S_SCALE : 0.0f;
            s_b[u] = ok ? __ldg(sb + blk) * MSM_FP8_S_SCALE : 0.0f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c + u >= c1) break;
            int kk = (c + u) * 64 + q * 16;
            const uint32_t a4[4] = {wa[u].x, wa[u].y, wa[u].z, wa[u].w}, b4[4] = {wb[u].x, wb[u].y, wb[u].z, wb[u].w};
            uint32_t A[4][4];
            msm_fp8_a_frags(a4, b4, A);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= ntile) break;
                /* every lane runs every MMA (mma.sync needs the whole warp): a lane without a
                 * token feeds zeros */
                float ct[4] = {0.0f, 0.0f, 0.0f, 0.0f};
                const float4 *p = xr[t] ? (const float4 *)(xr[t] + kk) : NULL;
#pragma unroll
                for (int j = 0; j < 4; j++) {
                    float4 v = xr[t] ? p[j] : make_float4(0, 0, 0, 0);
                    uint32_t h0, l0, h1, l1;
                    msm_split_bf16x2(v.x * MSM_FP8_X_SCALE, v.y * MSM_FP8_X_SCALE, h0, l0);
                    msm_split_bf16x2(v.z * MSM_FP8_X_SCALE, v.w * MSM_FP8_X_SCALE, h1, l1);
                    msm_mma_bf16(ct, A[j][0], A[j][1], A[j][2], A[j][3], h0, h1);
                    msm_mma_bf16(ct, A[j][0], A[j][1], A[j][2], A[j][3], l0, l1);
                }
                acc[t][0] = fmaf(ct[0], s_a[u], acc[t][0]);
                acc[t][1] = fmaf(ct[1], s_a[u], acc[t][1]);
                acc[t][2] = fmaf(ct[2], s_b[u], acc[t][2]);
                acc[t][3] = fmaf(ct[3], s_b[u], acc[t][3]);
            }
        }
    }
}

/* Warp 0's acc += the other warps' partials, in warp order (deterministic). Block-wide. */
template <int NW, int NT>
static __device__ __forceinline__ void mma_reduce(float acc[NT][4], float4 (*red)[NT][32],
                                                  int ntile, int warp, int lane) {
    if (warp > 0)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < ntile) red[warp - 1][t][lane] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    __syncthreads();
    if (warp == 0)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= ntile) break;
#pragma unroll
            for (int w = 1; w < NW; w++) {
                float4 v = red[w - 1][t][lane];
                acc[t][0] += v.x, acc[t][1] += v.y, acc[t][2] += v.z, acc[t][3] += v.w;
            }
        }
}

/* Gate/up + SwiGLU, persistent: block b runs items b, b + gridDim.x, ... of n_sel * nchunk,
 * item = (s-th selected expert, 8 columns from i0). Rows g / g+8 of the MMA are the gate row
 * and the up row of column i0+g, so warp 0 ends holding matching gate and up sums: c0/c2 for
 * token 2q, c1/c3 for token 2q+1. The next item's descriptor is loaded while the current one
 * streams. Waits, then triggers (see moe_down_mma_kernel). */
template <int NW, int U, int NT, bool FP8 = false>
static __global__ void __launch_bounds__(NW * 32, FP8 ? MMA_MINB_FP8 : MMA_MINB)
    moe_gateup_mma_kernel(moe_ws ws, const float *x, const void *gate_up, const float *gu_sc, int gu_ph, int H,
                          int I, int k) {
    __shared__ float4 red[NW - 1][NT][32];
    msm_pdl_wait();
    msm_pdl_trigger();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int nchunk = (I + 7) / 8, n_items = *ws.n_sel * nchunk;
    float *act = (float *)ws.act;
    int it = blockIdx.x;
    int4 cur = it < n_items ? ws.items[it / nchunk] : make_int4(0, 0, 0, 0);
    for (; it < n_items; it += gridDim.x) {
        int nx = it + gridDim.x;
        int4 nxt = nx < n_items ? ws.items[nx / nchunk] : make_int4(0, 0, 0, 0);
        int e = cur.x, r0 = cur.y, r1 = cur.z;
        cur = nxt;
        int i0 = (it % nchunk) * 8, i = min(i0 + g, I - 1); /* columns past I: never stored */
        const uint16_t *ge = (const uint16_t *)gate_up + (size_t)e * 2 * I * H;
        const uint8_t *ge8 = (const uint8_t *)gate_up + (size_t)e * 2 * I * H;
        const float *se = FP8 ? gu_sc + (size_t)e * msm_cuda_fp8_scales(1, 2 * I, H, gu_ph) : NULL;
        for (int rb = r0; rb < r1; rb += NT * 8) {
            int ntile = min(NT, (r1 - rb + 7) >> 3);
            const float *xr[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int r = rb + t * 8 + g;
                xr[t] = r < r1 ? x + (size_t)(ws.perm[r] / k) * H : NULL;
            }
            float acc[NT][4];
            if constexpr (FP8)
                mma_rows_fp8<NW, U, NT>(acc, ge8 + (size_t)i * H, ge8 + (size_t)(I + i) * H, msm_srow(se, i, H, gu_ph),
                                        msm_srow(se, I + i, H, gu_ph), gu_ph, xr, ntile, H, warp, q);
            else
                mma_rows<NW, U, NT>(acc, ge + (size_t)i * H, ge + (size_t)(I + i) * H, xr, ntile, H, warp, q);
            mma_reduce<NW, NT>(acc, red, ntile, warp, lane);
            if (warp == 0 && i0 + g < I)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= ntile) break;
                    int ra = rb + t * 8 + 2 * q;
                    if (ra < r1) act[(size_t)ra * I + i0 + g] = msm__silu_mul(acc[t][0], acc[t][2]);
                    if (ra + 1 < r1) act[(size_t)(ra + 1) * I + i0 + g] = msm__silu_mul(acc[t][1], acc[t][3]);
                }
            __syncthreads(); /* red is reused by the next pass or item */
        }
    }
}

/* Down, persistent like the gate/up kernel: item = (s-th selected expert, 16 rows from h0)
 * writes outp[r, h] for the expert's grouped rows r. The one read ahead of a PDL wait in this
 * file: the item table was complete before the gate/up kernel passed its wait, and that kernel
 * triggers only after its wait, so before this grid can start. A block therefore reads its first
 * item (through L2, never a stale L1 line) and pulls that item's weight rows into L2 while
 * gate/up still runs; it writes nothing before the wait. */
template <int NW, int U, int NT, bool FP8 = false>
static __global__ void __launch_bounds__(NW * 32, FP8 ? MMA_MINB_FP8 : MMA_MINB)
    moe_down_mma_kernel(moe_ws ws, const void *down, const float *dn_sc, int dn_ph, int H, int I, bool prefetch) {
    __shared__ float4 red[NW - 1][NT][32];
    msm_pdl_trigger();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int nchunk = (H + DOWN_ROWS - 1) / DOWN_ROWS, n_items = __ldcg(ws.n_sel) * nchunk;
    int it = blockIdx.x;
    if (it >= n_items) { /* still wait: this grid's completion must imply its predecessors' */
        msm_pdl_wait();
        return;
    }
    int4 cur = __ldcg(ws.items + it / nchunk);
    if (prefetch) { /* the item's rows are contiguous */
        int h0 = (it % nchunk) * DOWN_ROWS;
        constexpr size_t es = FP8 ? 1 : 2;
        uintptr_t a = (uintptr_t)((const char *)down + ((size_t)cur.x * H + h0) * I * es) & ~(uintptr_t)127;
        uintptr_t end = (uintptr_t)((const char *)down + ((size_t)cur.x * H + min(h0 + DOWN_ROWS, H)) * I * es);
        for (a += (uintptr_t)threadIdx.x * 128; a < end; a += NW * 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
    msm_pdl_wait();
    const float *act = (const float *)ws.act;
    for (; it < n_items; it += gridDim.x) {
        int nx = it + gridDim.x;
        int4 nxt = nx < n_items ? ws.items[nx / nchunk] : make_int4(0, 0, 0, 0);
        int e = cur.x, r0 = cur.y, r1 = cur.z;
        cur = nxt;
        int h0 = (it % nchunk) * DOWN_ROWS, ha = h0 + g, hb = h0 + 8 + g;
        const uint16_t *de = (const uint16_t *)down + (size_t)e * H * I;
        const uint8_t *de8 = (const uint8_t *)down + (size_t)e * H * I;
        const float *se = FP8 ? dn_sc + (size_t)e * msm_cuda_fp8_scales(1, H, I, dn_ph) : NULL;
        for (int rb = r0; rb < r1; rb += NT * 8) {
            int ntile = min(NT, (r1 - rb + 7) >> 3);
            const float *xr[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int r = rb + t * 8 + g;
                xr[t] = r < r1 ? act + (size_t)r * I : NULL;
            }
            float acc[NT][4];
            if constexpr (FP8)
                mma_rows_fp8<NW, U, NT>(acc, de8 + (size_t)min(ha, H - 1) * I, de8 + (size_t)min(hb, H - 1) * I,
                                        msm_srow(se, min(ha, H - 1), I, dn_ph), msm_srow(se, min(hb, H - 1), I, dn_ph),
                                        dn_ph, xr, ntile, I, warp, q);
            else
                mma_rows<NW, U, NT>(acc, de + (size_t)min(ha, H - 1) * I, de + (size_t)min(hb, H - 1) * I,
                                    xr, ntile, I, warp, q);
            mma_reduce<NW, NT>(acc, red, ntile, warp, lane);
            if (warp == 0)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= ntile) break;
                    int ra = rb + t * 8 + 2 * q;
                    if (ra < r1) {
                        if (ha < H) ws.outp[(size_t)ra * H + ha] = acc[t][0];
                        if (hb < H) ws.outp[(size_t)ra * H + hb] = acc[t][2];
                    }
                    if (ra + 1 < r1) {
                        if (ha < H) ws.outp[(size_t)(ra + 1) * H + ha] = acc[t][1];
                        if (hb < H) ws.outp[(size_t)(ra + 1) * H + hb] = acc[t][3];
                    }
                }
            __syncthreads();
        }
    }
}

/* The bf16 grouped SIMT gate/up of R rows a warp and NT tokens a pass at u K chunks in flight (tuning
 * moe_gg_gateup_u: 3 or 4, else GG_U). */
template <int R, int NT, bool PER>
static auto gg_gateup_bf16(int u) {
    return u == 4   ? moe_gateup_grouped_gemv_kernel<R, NT, true, false, 4, PER>
           : u == 3 ? moe_gateup_grouped_gemv_kernel<R, NT, true, false, 3, PER>
                    : moe_gateup_grouped_gemv_kernel<R, NT, true, false, GG_U, PER>;
}

/* The bf16 grouped SIMT down of R rows a warp, NT (2 or 4) tokens a pass, 3 or GG_U K chunks. */
template <int R, bool PER>
static auto gg_down_bf16(int nt, int u) {
    return nt == 2 ? (u == 3 ? moe_down_grouped_gemv_kernel<R, 2, 3, true, false, PER>
                             : moe_down_grouped_gemv_kernel<R, 2, GG_U, true, false, PER>)
                   : (u == 3 ? moe_down_grouped_gemv_kernel<R, 4, 3, true, false, PER>
                             : moe_down_grouped_gemv_kernel<R, 4, GG_U, true, false, PER>);
}

/* Blocks of a persistent kernel: what the GPU holds resident, at most `items`. */
static unsigned persistent_grid(int sms, int per_sm, size_t items) {
    size_t cap = (size_t)(sms > 0 ? sms : 1) * (per_sm > 0 ? per_sm : 1);
    return (unsigned)(items < cap ? (items ? items : 1) : cap);
}

/* A persistent grid of kern: the blocks the GPU holds at once, at most one a block of the compact
 * grid g. */
template <typename Kernel>
static dim3 gg_grid(Kernel kern, dim3 g, int sms) {
    return dim3(persistent_grid(sms, msm_blocks_per_sm(kern, MOE_WARPS * 32, 0), (size_t)g.x * g.y));
}

/* The grouped SIMT gate/up (gateup) or down GEMV. ids: the pairs' expert ids when the kernels
 * scan them themselves (no grouping kernel ran; P = T * k <= MSM_CUDA_MOE_SCAN_MAX_P), else NULL.
 * bf16 rows with 16-byte loads take the tuning's tokens a pass, chunks in flight and persistent
 * grids (moe_gg_persist, compact grids only); FP8 and scalar rows the defaults (4 tokens, 2 chunks,
 * a block an item). */
static cudaError_t grouped_simt_launch(const moe_ws &ws, const int32_t *ids, int P, const float *x,
                                       const void *gate_up, const float *gu_sc, int gu_ph, const void *down,
                                       const float *dn_sc, int dn_ph, bool vec_h, bool vec_i, bool gateup, int H,
                                       int I, int k, int E, msm_cuda_exec ex) {
    constexpr int RG = 2, RD = 4;
    const msm_cuda_tuning *tn = ex.tune;
    dim3 blk(MOE_WARPS * 32);
    size_t sm = ids ? sizeof(int) * (size_t)P : 0; /* the scanned pairs (gg_rows) */
    /* compact: a grid row per selected expert (at most min(E, P)) instead of one per expert, so no
     * block starts only to find its expert unselected (Qwen3-30B-A3B at 8 tokens: ~52 of 128
     * experts selected, 7300 of the gate/up's 12288 blocks had nothing to do) */
    bool compact = !ids && tn->moe_gg_compact && P > 0;
    unsigned ny = (unsigned)(compact && P < E ? P : E);
    if (gateup) {
        dim3 ga((unsigned)((I + MOE_WARPS * RG - 1) / (MOE_WARPS * RG)), ny);
        if (gu_sc)
            return msm_launch(moe_gateup_grouped_gemv_kernel<RG, 4, true, true>, ga, blk, sm, ex, ws, ids, P, compact,
                              x, gate_up, gu_sc, gu_ph, H, I, k);
        if (vec_h) {
            int u = tn->moe_gg_gateup_u;
            bool nt2 = tn->moe_gg_gateup_nt == 2;
            if (compact && (tn->moe_gg_persist & MSM_CUDA_MOE_PERSIST_GATEUP)) {
                auto kern = nt2 ? gg_gateup_bf16<RG, 2, true>(u) : gg_gateup_bf16<RG, 4, true>(u);
                return msm_launch(kern, gg_grid(kern, ga, tn->sms), blk, 0, ex, ws, ids, P, compact, x, gate_up,
                                  gu_sc, gu_ph, H, I, k);
            }
            auto kern = nt2 ? gg_gateup_bf16<RG, 2, false>(u) : gg_gateup_bf16<RG, 4, false>(u);
            return msm_launch(kern, ga, blk, sm, ex, ws, ids, P, compact, x, gate_up, gu_sc, gu_ph, H, I, k);
        }
        return msm_launch(moe_gateup_grouped_gemv_kernel<RG, 4, false, false>, ga, blk, sm, ex, ws, ids, P, compact, x,
                          gate_up, gu_sc, gu_ph, H, I, k);
    }
    dim3 gd((unsigned)((H + MOE_WARPS * RD - 1) / (MOE_WARPS * RD)), ny);
    bool early = tn->moe_gg_early && !ex.w_written;
    if (dn_sc)
        return msm_launch(moe_down_grouped_gemv_kernel<RD, 4, GG_U, true, true>, gd, blk, sm, ex, ws, ids, P, compact,
                          down, dn_sc, dn_ph, H, I, early);
    if (vec_i) {
        int nt = tn->moe_gg_down_nt, u = tn->moe_gg_down_u;
        if (compact && (tn->moe_gg_persist & MSM_CUDA_MOE_PERSIST_DOWN)) {
            auto kern = gg_down_bf16<RD, true>(nt, u);
            return msm_launch(kern, gg_grid(kern, gd, tn->sms), blk, 0, ex, ws, ids, P, compact, down, dn_sc,
                              dn_ph, H, I, early);
        }
        auto kern = gg_down_bf16<RD, false>(nt, u);
        return msm_launch(kern, gd, blk, sm, ex, ws, ids, P, compact, down, dn_sc, dn_ph, H, I, early);
    }
    return msm_launch(moe_down_grouped_gemv_kernel<RD, 4, GG_U, false, false>, gd, blk, sm, ex, ws, ids, P, compact,
                      down, dn_sc, dn_ph, H, I, early);
}

/* Resident blocks an SM holds of a kernel with MMA_NW warps (1 if the query fails). */
template <typename Kernel>
static int blocks_per_sm(Kernel kernel) {
    return msm_blocks_per_sm(kernel, MMA_NW * 32, 0);
}

/* The occupancy fields of the MoE kernels, for msm_cuda_tuning_init. */
void msm__moe_tuning(msm_cuda_tuning *t) {
    t->moe_gateup_mma_per_sm = blocks_per_sm(moe_gateup_mma_kernel<MMA_NW, MMA_U, MMA_NT>);
    t->moe_down_mma_per_sm = blocks_per_sm(moe_down_mma_kernel<MMA_NW, MMA_U, MMA_NT>);
    t->moe_gateup_mma4_per_sm = blocks_per_sm(moe_gateup_mma_kernel<MMA_NW, MMA_U, 4>);
    t->moe_down_mma4_per_sm = blocks_per_sm(moe_down_mma_kernel<MMA_NW, MMA_U, 4>);
    t->moe_gateup_mma8_per_sm = blocks_per_sm(moe_gateup_mma_kernel<MMA_NW, MMA_U, MMA_NT, true>);
    t->moe_down_mma8_per_sm = blocks_per_sm(moe_down_mma_kernel<MMA_NW, MMA_U, MMA_NT, true>);
}

/* Whether the tensor-core grouped GEMVs take T tokens (else the SIMT ones). */
static bool grouped_mma(const msm_cuda_tuning *tn, int T) {
    int kf = tn->moe_kernels;
    return !(kf & MSM_CUDA_MOE_K_SIMT) && (T >= MOE_MMA_MIN_T || (kf & MSM_CUDA_MOE_K_MMA));
}

bool msm__moe_grouped_scans(const msm_cuda_tuning *tn, int T, int k) {
    return !grouped_mma(tn, T) && T <= tn->moe_group_scan_max_t && (long)T * k <= MSM_CUDA_MOE_SCAN_MAX_P;
}

int msm__moe_grouped_run(const moe_ws &ws, const int32_t *ids, const float *x, const uint16_t *gate_up,
                         const uint16_t *down, int T, int H, int I, int k, int E, bool vec_h,
                         bool vec_i, msm_cuda_exec ex) {
    const msm_cuda_tuning *tn = ex.tune;
    int kf = tn->moe_kernels;
    size_t P = (size_t)T * k;
    bool mma = grouped_mma(tn, T);
    if (mma) ids = NULL; /* the caller grouped (msm__moe_grouped_scans false) */
    size_t max_sel = P < (size_t)E ? P : (size_t)E;
    bool nt4 = kf & MSM_CUDA_MOE_K_NT4;
    if (mma && vec_h) {
        auto kern = nt4 ? moe_gateup_mma_kernel<MMA_NW, MMA_U, 4> : moe_gateup_mma_kernel<MMA_NW, MMA_U, MMA_NT>;
        unsigned grid = persistent_grid(tn->sms, nt4 ? tn->moe_gateup_mma4_per_sm : tn->moe_gateup_mma_per_sm,
                                        max_sel * ((I + 7) / 8));
        CUDA_TRY(msm_launch(kern, dim3(grid), dim3(MMA_NW * 32), 0, ex, ws, x, (const void *)gate_up,
                            (const float *)NULL, 0, H, I, k));
    } else {
        CUDA_TRY(grouped_simt_launch(ws, ids, (int)P, x, gate_up, NULL, 0, down, NULL, 0, vec_h, vec_i, true, H, I, k,
                                     E, ex));
        ex.no_pdl = false; /* only the first kernel (msm_cuda_exec.no_pdl) */
    }
    if (mma && vec_i) {
        auto kern = nt4 ? moe_down_mma_kernel<MMA_NW, MMA_U, 4> : moe_down_mma_kernel<MMA_NW, MMA_U, MMA_NT>;
        unsigned grid = persistent_grid(tn->sms, nt4 ? tn->moe_down_mma4_per_sm : tn->moe_down_mma_per_sm,
                                        max_sel * ((H + DOWN_ROWS - 1) / DOWN_ROWS));
        CUDA_TRY(msm_launch(kern, dim3(grid), dim3(MMA_NW * 32), 0, ex, ws, (const void *)down, (const float *)NULL,
                            0, H, I, !(kf & MSM_CUDA_MOE_K_NO_PREFETCH)));
    } else {
        CUDA_TRY(grouped_simt_launch(ws, ids, (int)P, x, gate_up, NULL, 0, down, NULL, 0, vec_h, vec_i, false, H, I, k,
                                     E, ex));
    }
    return 0;
}

/* The FP8 grouped GEMVs, after the grouping: the tensor-core ones (mma_rows_fp8) where H, I and
 * the column phases are multiples of 64 (unless the SIMT kernels are forced), else SIMT. */
int msm__moe_grouped_fp8_run(const moe_ws &ws, const float *x, msm_cuda_fp8w gu, msm_cuda_fp8w dn, int T, int H,
                             int I, int k, int E, msm_cuda_exec ex) {
    const msm_cuda_tuning *tn = ex.tune;
    bool mma = !(tn->moe_kernels & MSM_CUDA_MOE_K_SIMT) && H % 64 == 0 && I % 64 == 0 && gu.phase % 64 == 0 &&
               dn.phase % 64 == 0;
    if (mma) {
        size_t P = (size_t)T * k, max_sel = P < (size_t)E ? P : (size_t)E;
        unsigned ga = persistent_grid(tn->sms, tn->moe_gateup_mma8_per_sm, max_sel * ((I + 7) / 8));
        CUDA_TRY(msm_launch(moe_gateup_mma_kernel<MMA_NW, MMA_U, MMA_NT, true>, dim3(ga), dim3(MMA_NW * 32), 0, ex, ws,
                            x, (const void *)gu.q, gu.scale, gu.phase, H, I, k));
        unsigned gd = persistent_grid(tn->sms, tn->moe_down_mma8_per_sm, max_sel * ((H + DOWN_ROWS - 1) / DOWN_ROWS));
        CUDA_TRY(msm_launch(moe_down_mma_kernel<MMA_NW, MMA_U, MMA_NT, true>, dim3(gd), dim3(MMA_NW * 32), 0, ex, ws,
                            (const void *)dn.q, dn.scale, dn.phase, H, I, !(tn->moe_kernels & MSM_CUDA_MOE_K_NO_PREFETCH)));
        return 0;
    }
    int P = T * k; /* (no scan: P only sizes the compact grid) */
    CUDA_TRY(grouped_simt_launch(ws, NULL, P, x, gu.q, gu.scale, gu.phase, dn.q, dn.scale, dn.phase, true, true, true,
                                 H, I, k, E, ex));
    CUDA_TRY(grouped_simt_launch(ws, NULL, P, x, gu.q, gu.scale, gu.phase, dn.q, dn.scale, dn.phase, true, true, false,
                                 H, I, k, E, ex));
    return 0;
}

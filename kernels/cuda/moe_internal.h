/* moe_internal: what the MoE files of kernels/cuda share (not a public header). The routed
 * experts are one launcher, msm_cuda_moe_experts (moe.cu), which groups the (token, slot) pairs
 * by expert when the path needs it and calls one path's runner:
 *   moe_pair.cu     small T: per-(token, slot) fp32 GEMVs
 *   moe_grouped.cu  medium T: grouped GEMVs, fp32 SIMT or tensor-core (bf16 hi + lo x)
 *   moe_tiled.cu    large decode batches: tiled tensor-core GEMMs through shared memory (bf16
 *                   weights, or FP8 codes decoded in shared memory)
 *   moe_gemm.cu     prefill-sized T: grouped WMMA GEMMs (bf16 x and activations)
 * See moe.cu for the whole design. */
#ifndef MSM_MOE_INTERNAL_H
#define MSM_MOE_INTERNAL_H

#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#define G_BM 64 /* rows of a WMMA tile (also counted by the group kernel) */

/* The workspace of one call, carved by msm__moe_ws_layout. */
typedef struct moe_ws {
    int32_t *expert_off; /* [E+1] first grouped row of each expert */
    int32_t *tile_off;   /* [E+1] first 64-row tile of each expert; tile_off[E] = tiles */
    int4 *items;         /* [E] {e, first, end grouped row} of the s-th selected expert (e
                          * ascending), for s < n_sel */
    int32_t *n_sel;      /* [1] how many experts have pairs */
    int32_t *perm;       /* [P] grouped row -> pair */
    int32_t *inv;        /* [P] pair -> grouped row (-1: invalid expert id) */
    uint16_t *act;       /* [P, I] bf16 silu(g)*u, grouped order (GEMV paths: f32 [P, I]; pair
                          * order where the grouped GEMVs scan, msm__moe_grouped_scans) */
    float *outp;         /* [P, H] per-pair down output, grouped order (... pair order) */
} moe_ws;

/* ws carved out of base for T tokens' k pairs (msm_cuda_moe_experts_ws_bytes = the bytes). */
size_t msm__moe_ws_layout(int T, int H, int I, int k, int E, char *base, moe_ws *ws);

/* The grouping of P = T * k pairs by expert into ws, by one whole block of any size (a multiple of
 * 32, at least 32): per-expert counts, offsets (rows and 64-row tiles), the selected-expert table, a
 * permutation grouping the pairs by expert and its inverse. ids are read from L2 (__ldcg), so a
 * block of the grid that wrote them may run it after a fence (the router's last block:
 * msm_cuda_router_linear_topk's grp). cnt, cur: the block's shared memory, E ints each (E <= 256).
 * Which row of its group a pair takes depends on the atomics' order; nothing downstream depends on
 * it (moe.cu). */
static __device__ __forceinline__ void msm__moe_group_block(const moe_ws &ws, const int32_t *ids, int P, int E,
                                                            int *cnt, int *cur) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        int e = __ldcg(ids + p);
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* warp 0: lane-owned runs of experts, exclusive scans over lanes */
        int lane = threadIdx.x, per = (E + 31) / 32, lo = min(E, lane * per), hi = min(E, lo + per);
        int rows = 0, tiles = 0, ns = 0;
        for (int e = lo; e < hi; e++) {
            rows += cnt[e];
            tiles += (cnt[e] + G_BM - 1) / G_BM;
            ns += cnt[e] > 0;
        }
        int xr = rows, xt = tiles, xn = ns;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int a = __shfl_up_sync(MSM_FULL_MASK, xr, o), b = __shfl_up_sync(MSM_FULL_MASK, xt, o),
                c = __shfl_up_sync(MSM_FULL_MASK, xn, o);
            if (lane >= o) xr += a, xt += b, xn += c;
        }
        xr -= rows, xt -= tiles, xn -= ns; /* exclusive */
        for (int e = lo; e < hi; e++) {
            ws.expert_off[e] = xr;
            ws.tile_off[e] = xt;
            cur[e] = xr;
            if (cnt[e] > 0) ws.items[xn++] = make_int4(e, xr, xr + cnt[e], 0);
            xr += cnt[e];
            xt += (cnt[e] + G_BM - 1) / G_BM;
        }
        if (lane == 31) {
            ws.expert_off[E] = xr;
            ws.tile_off[E] = xt;
            *ws.n_sel = xn;
        }
    }
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        int e = __ldcg(ids + p), pos = -1;
        if (e >= 0 && e < E) {
            pos = atomicAdd(&cur[e], 1);
            ws.perm[pos] = p;
        }
        ws.inv[p] = pos;
    }
}

/* silu(g) * u with the CPU oracle's formula. */
static __device__ __forceinline__ float msm__silu_mul(float g, float u) {
    return g / (1.0f + expf(-g)) * u;
}

/* Small T (moe_pair.cu): act (f32 [T*k, I]) then y directly. vec_h / vec_i: 16-byte loads of
 * the gate/up and down rows are possible. gate_up and down are bf16, or FP8 codes when their
 * scales gu_sc / dn_sc are given (both or neither; H, I and the column phases gu_ph / dn_ph
 * multiples of 16, 16-byte aligned: msm_cuda_fp8w). */
int msm__moe_pair_run(float *y, const float *x, const int32_t *ids, const float *w, const void *gate_up,
                      const float *gu_sc, int gu_ph, const void *down, const float *dn_sc, int dn_ph, float *act,
                      int T, int H, int I, int k, int E, bool vec_h, bool vec_i, msm_cuda_exec ex);

/* Whether the medium-T GEMVs at T tokens (bf16) find each expert's pairs themselves
 * (msm_cuda_tuning.moe_group_scan_max_t): then no grouping kernel runs, the runner gets the ids and
 * act / outp rows are the pairs' indices. */
bool msm__moe_grouped_scans(const msm_cuda_tuning *tn, int T, int k);

/* Medium T (moe_grouped.cu): after the grouping (ids NULL; act and outp in grouped order), or
 * scanning ids (msm__moe_grouped_scans; rows in pair order). */
int msm__moe_grouped_run(const moe_ws &ws, const int32_t *ids, const float *x, const uint16_t *gate_up,
                         const uint16_t *down, int T, int H, int I, int k, int E, bool vec_h,
                         bool vec_i, msm_cuda_exec ex);

/* Medium T with FP8-resident weights (moe_grouped.cu): the grouped tensor-core GEMVs on the codes
 * (SIMT where the shapes do not allow them, or when forced). */
int msm__moe_grouped_fp8_run(const moe_ws &ws, const float *x, msm_cuda_fp8w gu, msm_cuda_fp8w dn, int T, int H,
                             int I, int k, int E, msm_cuda_exec ex);

/* Large T (moe_gemm.cu), after the grouping: act (bf16) and outp in ws. H, I multiples of
 * G_BK (msm__moe_gemm_fits). */
bool msm__moe_gemm_fits(int H, int I);
int msm__moe_gemm_run(const moe_ws &ws, const float *x, const uint16_t *gate_up,
                      const uint16_t *down, int T, int H, int I, int k, int E, msm_cuda_exec ex);

/* Large decode batches (moe_tiled.cu), after the grouping: x and act as bf16 hi + lo in ws. H, I
 * multiples of 64 (msm__moe_tiled_fits). */
bool msm__moe_tiled_fits(int H, int I);
int msm__moe_tiled_run(const moe_ws &ws, const float *x, const uint16_t *gate_up,
                       const uint16_t *down, int T, int H, int I, int k, int E, msm_cuda_exec ex);

/* Large decode batches with FP8-resident weights (moe_tiled.cu): the tiled GEMMs on the codes, never
 * dequantised. Fits where the bf16 ones do and both column phases are multiples of 64 (a 64-wide K
 * step then has one scale per row), with 16-byte aligned codes. */
bool msm__moe_tiled_fp8_fits(int H, int I, msm_cuda_fp8w gu, msm_cuda_fp8w dn);
int msm__moe_tiled_fp8_run(const moe_ws &ws, const float *x, msm_cuda_fp8w gu, msm_cuda_fp8w dn, int T, int H,
                           int I, int k, int E, msm_cuda_exec ex);

#endif

/* moe_tiled.cu: the routed experts at large decode batches (MSM_CUDA_MOE_TILED_MIN_T <= T <=
 * MSM_CUDA_MOE_TILED_MAX_T), after moe.cu has grouped the (token, slot) pairs by expert: tiled
 * tensor-core GEMMs that stream each selected expert's weights from HBM once, through a
 * multi-stage shared-memory pipeline, for all of that expert's tokens.
 *
 * Why: at 128-256 tokens an expert has ~9-35 of them. The grouped GEMVs (moe_grouped.cu) load x
 * straight from global memory in every warp and split it into bf16 hi + lo in the inner loop, so
 * their x traffic grows with the tokens an expert has and passes the weights' (measured on the
 * H200: 61% of the copy ceiling at T = 128, 38% at T = 256); the WMMA GEMMs (moe_gemm.cu) stage
 * both operands synchronously (43%). Here:
 *   1. moe_split_x_kernel writes x in grouped order as bf16 hi + lo rows once (xh, xl [P, H]),
 *      so the GEMMs copy x tiles like the weights, with no conversion in the inner loop;
 *   2. a block owns 128 weight rows of one expert (8 warps x 16 rows) and up to 64 of its tokens
 *      (8 n8 tiles) a pass; each K step of 64 copies the 128 x 64 weight tile and the x tiles (hi,
 *      lo) into shared memory with cp.async, TL_STAGES steps in flight, 16-byte chunks swizzled so
 *      that ldmatrix reads them without bank conflicts; with few tokens an expert (batch 32-256
 *      decode) a pass takes 16 or 32 tokens and the same shared memory holds 5 or 4 stages
 *      (TL_ST: more weight bytes in flight a block; tiled_bm picks by the mean tokens an expert);
 *   3. mma.sync m16n8k16 (bf16 in, fp32 accumulate): A = 16 weight rows (ldmatrix.x4), B = 8
 *      tokens of x hi and of x lo, both into the same accumulator, so the products carry ~16
 *      mantissa bits of x (as the MMV linear and the grouped tensor-core GEMVs): near-fp32;
 *   4. gate/up: the warp's 16 rows are the gate rows and the up rows of the same 8 columns, so a
 *      thread ends holding matching gate and up sums and writes silu(g) * u, split into bf16
 *      hi + lo (act [P, I] each) for the down GEMM, whose B operand it is; down writes one f32
 *      row per pair (outp), which moe.cu's combine kernel sums in slot order.
 * An expert with more than 64 tokens takes several passes (the weights streamed again). Results
 * are deterministic: each output is one thread's fixed sequence of MMAs.
 *
 * FP8-resident experts (docs/adr/0006-fp8.md) from fp8_moe_tiled_min_t tokens run the same kernels
 * on their e4m3 codes (moe_*_tiled_fp8_kernel), instead of dequantising every selected expert to
 * a bf16 buffer each step, which cost more than the GEMMs at 128-256 tokens (3 bytes a code of
 * extra traffic; GLM-4.5-Air-FP8 decode at batch 128 ran at 23% of HBM bandwidth, H200):
 *   5. the 128 x 64 code tile of a K step (8 KB, one byte a weight) comes through the same
 *      cp.async pipeline, TF_STAGES = 4 steps deep (96 KB with the x tiles: two blocks an SM; 8 and
 *      6 at 16 and 32 tokens a pass: TF_ST), or with tuning fp8_tiled_ks = 2 at 16 / 32 tokens a
 *      pass two K steps a stage (4 / 3 stages of 16 KB of codes: 128 contiguous bytes of a row a
 *      stage, as the bf16 tile's, and half the barriers; the same sums; not yet measured);
 *      each warp turns its 16 rows into bf16 A fragments by bit placement (f32(q) * 2^-120,
 *      exactly, as the FP8 tensor-core GEMVs), x and the activations are split as x * 2^100;
 *   6. a step's MMAs go into fresh step accumulators, added times the rows' scales (one per row
 *      for a 64-wide step when the column phase is a multiple of 64; other phases keep the
 *      dequantising path), so the weights met are f32(q) * scale as in the FP8 GEMVs: their
 *      oracle is the CPU on the float32 weights, not bf16-rounded ones.
 * Registers (ptxas, sm_90a, -O3): at 64 tokens a pass 128 a thread, no spills, for both FP8 kernels
 * at two blocks an SM (166-168 uncapped); 94 at 32 and 80 at 16 (two K steps a stage: 126-128 and
 * 87-88); the bf16 kernels 80. Against dequantising (H200, sixth session): Qwen3-30B-A3B FP8 batch
 * 128 / 256 45.7 / 51.0 -> 20.5 / 26.4 ms (tuning.cu). Yet the FP8 preset's steps of 8-256 tokens
 * run at 43-51% of the H200's copy rate against the bf16 preset's 75-85% (README), and session 5's
 * 32-token timeline had the FP8 gate/up at ~55% of it: the forty-first session's plan
 * (bench/results/2026-12-08-h200-s41) measures why. */
#include "moe_internal.h"
#include "tiled.h"

#include <errno.h>

/* ---- x in grouped order as bf16 hi + lo ---- */

/* xh[r,:] = bf16(x[t,:] * xs), xl[r,:] = bf16(x[t,:] * xs - xh[r,:]) with t = perm[r] / k, for the
 * grouped rows r < expert_off[E]; xs = 1 (bf16 weights) or 2^100 (FP8 codes, decoded as
 * f32(q) * 2^-120; exact scaling). One block per row (grid-stride). */
static __global__ void moe_split_x_kernel(moe_ws ws, uint16_t *xh, uint16_t *xl, const float *x,
                                          float xs, int P, int H, int k, int E) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int rows = ws.expert_off[E];
    for (int r = blockIdx.x; r < rows && r < P; r += gridDim.x) {
        const float *src = x + (size_t)(ws.perm[r] / k) * H;
        for (int h = threadIdx.x * 2; h < H; h += blockDim.x * 2) {
            uint32_t hi, lo;
            msm_split_bf16x2(src[h] * xs, src[h + 1] * xs, hi, lo);
            *(uint32_t *)(xh + (size_t)r * H + h) = hi;
            *(uint32_t *)(xl + (size_t)r * H + h) = lo;
        }
    }
}

/* Gate/up + SwiGLU: block b = (s-th selected expert, 64 columns from i0). Warp w's rows are the
 * gate rows (0..7) and the up rows (8..15) of columns i0 + 8w .. + 7, so C fragment elements
 * c0/c2 (token 2q) and c1/c3 (token 2q+1) of column i0 + 8w + g pair up. Writes act hi + lo
 * (bf16 [P, I] each, grouped order). */
template <int BM>
static __global__ void __launch_bounds__(TL_WARPS * 32, 2)
    moe_gateup_tiled_kernel(moe_ws ws, const uint16_t *xh, const uint16_t *xl,
                            const uint16_t *gate_up, uint16_t *ah, uint16_t *al, int H, int I) {
    extern __shared__ __align__(128) unsigned char smem[];
    msm_pdl_wait();
    msm_pdl_trigger();
    int ncol = (I + 63) / 64, s = blockIdx.x / ncol, i0 = (blockIdx.x % ncol) * 64;
    if (s >= *ws.n_sel) return;
    int4 it = ws.items[s];
    int e = it.x, r0 = it.y, r1 = it.z;
    const uint16_t *ge = gate_up + (size_t)e * 2 * I * H;
    auto w_row = [&](int r) {
        int col = min(i0 + 8 * (r >> 4) + (r & 7), I - 1); /* columns past I: never stored */
        return ge + (size_t)((r & 8) ? I + col : col) * H;
    };
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int col = i0 + 8 * warp + g;
    for (int rb = r0; rb < r1; rb += BM) {
        int ntile = min(BM / 8, (r1 - rb + 7) >> 3);
        float acc[8][4];
        tl_gemm<BM>(acc, smem, w_row, xh, xl, rb, r1, ntile, H);
#pragma unroll
        for (int t = 0; t < 8; t++) {
            if (t >= ntile) break;
            int ra = rb + 8 * t + 2 * q;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if (ra + j >= r1 || col >= I) continue;
                float v = msm__silu_mul(acc[t][j], acc[t][2 + j]);
                uint16_t hi = msm_f2bf(v), lo = msm_f2bf(v - msm_bf(hi));
                ah[(size_t)(ra + j) * I + col] = hi;
                al[(size_t)(ra + j) * I + col] = lo;
            }
        }
        __syncthreads(); /* the next pass refills the shared memory */
    }
}

/* Down: block b = (s-th selected expert, 128 rows from h0): outp[r, h] = act[r, :] . down_e[h, :]
 * for the expert's grouped rows r (act as bf16 hi + lo). */
template <int BM>
static __global__ void __launch_bounds__(TL_WARPS * 32, 2)
    moe_down_tiled_kernel(moe_ws ws, const uint16_t *ah, const uint16_t *al, const uint16_t *down,
                          int H, int I) {
    extern __shared__ __align__(128) unsigned char smem[];
    msm_pdl_wait();
    msm_pdl_trigger();
    int nrow = (H + TL_ROWS - 1) / TL_ROWS, s = blockIdx.x / nrow, h0 = (blockIdx.x % nrow) * TL_ROWS;
    if (s >= *ws.n_sel) return;
    int4 it = ws.items[s];
    int e = it.x, r0 = it.y, r1 = it.z;
    const uint16_t *de = down + (size_t)e * H * I;
    auto w_row = [&](int r) { return de + (size_t)min(h0 + r, H - 1) * I; };
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    for (int rb = r0; rb < r1; rb += BM) {
        int ntile = min(BM / 8, (r1 - rb + 7) >> 3);
        float acc[8][4];
        tl_gemm<BM>(acc, smem, w_row, ah, al, rb, r1, ntile, I);
#pragma unroll
        for (int t = 0; t < 8; t++) {
            if (t >= ntile) break;
            int ra = rb + 8 * t + 2 * q;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int r = ra + (j & 1), h = h0 + warp * 16 + g + 8 * (j >> 1);
                if (r < r1 && h < H) ws.outp[(size_t)r * H + h] = acc[t][j];
            }
        }
        __syncthreads();
    }
}

/* ---- FP8-resident experts (docs/adr/0006-fp8.md) ----
 * The same blocks, passes and epilogues on the e4m3 codes: a K step's weight tile is 128 rows x 64
 * codes (8 KB, half the bf16 tile), copied with cp.async like the x tiles, TF_STAGES steps in
 * flight; msm_tile_mma_fp8_k64 decodes the codes to bf16 from shared memory, runs the step's MMAs
 * into step accumulators and adds them times the rows' scales. x and the activations are
 * bf16 hi + lo of x * 2^100 (the decode's 2^-120 and the scales' 2^20 cancel it). A 64-wide step
 * has one scale per row when the column phase is a multiple of 64 (msm__moe_tiled_fp8_fits). */
/* moe_gateup_tiled_kernel on FP8 codes gate_up [E, 2I, H] with scales gu_sc [E, 2I, ceil((H + ph) /
 * 128)]; xh / xl are x * 2^100, and act is written as bf16 hi + lo of silu(g) * u * 2^100 (the
 * down kernel's B operand). */
template <int BM, int KS = 1>
static __global__ void __launch_bounds__(TL_WARPS * 32, 2)
    moe_gateup_tiled_fp8_kernel(moe_ws ws, const uint16_t *xh, const uint16_t *xl, const uint8_t *gate_up,
                                const float *gu_sc, int ph, uint16_t *ah, uint16_t *al, int H, int I) {
    extern __shared__ __align__(128) unsigned char smem[];
    msm_pdl_wait();
    msm_pdl_trigger();
    int ncol = (I + 63) / 64, s = blockIdx.x / ncol, i0 = (blockIdx.x % ncol) * 64;
    if (s >= *ws.n_sel) return;
    int4 it = ws.items[s];
    int e = it.x, r0 = it.y, r1 = it.z;
    const uint8_t *ge = gate_up + (size_t)e * 2 * I * H;
    const float *se = gu_sc + (size_t)e * msm_cuda_fp8_scales(1, 2 * I, H, ph);
    auto w_row = [&](int r) {
        int col = min(i0 + 8 * (r >> 4) + (r & 7), I - 1); /* columns past I: never stored */
        return ge + (size_t)((r & 8) ? I + col : col) * H;
    };
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int col = i0 + 8 * warp + g, cc = min(col, I - 1);
    /* C rows g (the gate row of column col) and g + 8 (its up row) */
    const float *sg = msm_srow(se, cc, H, ph), *su = msm_srow(se, I + cc, H, ph);
    for (int rb = r0; rb < r1; rb += BM) {
        int ntile = min(BM / 8, (r1 - rb + 7) >> 3);
        float acc[8][4];
        tf_gemm<BM, KS>(acc, smem, w_row, sg, su, ph, xh, xl, rb, r1, ntile, H, H);
#pragma unroll
        for (int t = 0; t < 8; t++) {
            if (t >= ntile) break;
            int ra = rb + 8 * t + 2 * q;
#pragma unroll
            for (int j = 0; j < 2; j++) {
                if (ra + j >= r1 || col >= I) continue;
                float v = msm__silu_mul(acc[t][j], acc[t][2 + j]) * MSM_FP8_X_SCALE;
                uint16_t hi = msm_f2bf(v), lo = msm_f2bf(v - msm_bf(hi));
                ah[(size_t)(ra + j) * I + col] = hi;
                al[(size_t)(ra + j) * I + col] = lo;
            }
        }
        __syncthreads(); /* the next pass refills the shared memory */
    }
}

/* moe_down_tiled_kernel on FP8 codes down [E, H, I] with scales dn_sc [E, H, ceil((I + ph) / 128)];
 * ah / al are the activations * 2^100 (moe_gateup_tiled_fp8_kernel). */
template <int BM, int KS = 1>
static __global__ void __launch_bounds__(TL_WARPS * 32, 2)
    moe_down_tiled_fp8_kernel(moe_ws ws, const uint16_t *ah, const uint16_t *al, const uint8_t *down,
                              const float *dn_sc, int ph, int H, int I) {
    extern __shared__ __align__(128) unsigned char smem[];
    msm_pdl_wait();
    msm_pdl_trigger();
    int nrow = (H + TL_ROWS - 1) / TL_ROWS, s = blockIdx.x / nrow, h0 = (blockIdx.x % nrow) * TL_ROWS;
    if (s >= *ws.n_sel) return;
    int4 it = ws.items[s];
    int e = it.x, r0 = it.y, r1 = it.z;
    const uint8_t *de = down + (size_t)e * H * I;
    const float *se = dn_sc + (size_t)e * msm_cuda_fp8_scales(1, H, I, ph);
    auto w_row = [&](int r) { return de + (size_t)min(h0 + r, H - 1) * I; };
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const float *sa = msm_srow(se, min(h0 + warp * 16 + g, H - 1), I, ph);
    const float *sb = msm_srow(se, min(h0 + warp * 16 + g + 8, H - 1), I, ph);
    for (int rb = r0; rb < r1; rb += BM) {
        int ntile = min(BM / 8, (r1 - rb + 7) >> 3);
        float acc[8][4];
        tf_gemm<BM, KS>(acc, smem, w_row, sa, sb, ph, ah, al, rb, r1, ntile, I, I);
#pragma unroll
        for (int t = 0; t < 8; t++) {
            if (t >= ntile) break;
            int ra = rb + 8 * t + 2 * q;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                int r = ra + (j & 1), h = h0 + warp * 16 + g + 8 * (j >> 1);
                if (r < r1 && h < H) ws.outp[(size_t)r * H + h] = acc[t][j];
            }
        }
        __syncthreads();
    }
}

/* ---- host side ---- */

bool msm__moe_tiled_fits(int H, int I) { return H % TL_BK == 0 && I % TL_BK == 0 && H % 2 == 0; }

bool msm__moe_tiled_fp8_fits(int H, int I, msm_cuda_fp8w gu, msm_cuda_fp8w dn) {
    return msm__moe_tiled_fits(H, I) && gu.phase % TL_BK == 0 && dn.phase % TL_BK == 0 &&
           ((uintptr_t)gu.q | (uintptr_t)dn.q) % 16 == 0; /* cp.async: 16-byte aligned rows */
}

template <int BM> static int tiled_prepare(void) {
    CUDA_TRY(cudaFuncSetAttribute(moe_gateup_tiled_kernel<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, TL_SMEM_BM(BM)));
    CUDA_TRY(cudaFuncSetAttribute(moe_down_tiled_kernel<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize, TL_SMEM_BM(BM)));
    CUDA_TRY(cudaFuncSetAttribute(moe_gateup_tiled_fp8_kernel<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  TF_SMEM_BM(BM)));
    CUDA_TRY(cudaFuncSetAttribute(moe_down_tiled_fp8_kernel<BM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  TF_SMEM_BM(BM)));
    if constexpr (BM <= 32) { /* two K steps a stage (tuning fp8_tiled_ks) */
        CUDA_TRY(cudaFuncSetAttribute(moe_gateup_tiled_fp8_kernel<BM, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      TF_SMEM_BM2(BM)));
        CUDA_TRY(cudaFuncSetAttribute(moe_down_tiled_fp8_kernel<BM, 2>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      TF_SMEM_BM2(BM)));
    }
    return 0;
}

int msm__moe_tiled_prepare(void) {
    int r = tiled_prepare<16>();
    if (r == 0) r = tiled_prepare<32>();
    if (r == 0) r = tiled_prepare<64>();
    return r;
}

/* What both runners carve and launch: x hi + lo [P, H] in the outp region ([P, H] f32; the down
 * kernel overwrites it only after its PDL wait, when the gate/up kernel, its only reader, has
 * completed), act hi + lo [P, I] in the act region, and the grids (a block per selected expert and
 * 64 columns / 128 rows). */
typedef struct tiled_plan {
    uint16_t *xh, *xl, *ah, *al;
    unsigned split_rows, g1, g2;
} tiled_plan;

static int tiled_plan_make(const moe_ws &ws, int T, int H, int I, int k, int E, tiled_plan *ret) {
    size_t P = (size_t)T * k, max_sel = P < (size_t)E ? P : (size_t)E;
    size_t g1 = max_sel * ((I + 63) / 64), g2 = max_sel * ((H + TL_ROWS - 1) / TL_ROWS);
    if (g1 > 0x7fffffff || g2 > 0x7fffffff) return -EINVAL;
    ret->xh = (uint16_t *)ws.outp, ret->xl = ret->xh + P * H;
    ret->ah = ws.act, ret->al = ws.act + P * I;
    ret->split_rows = (unsigned)(P < 4096 ? P : 4096);
    ret->g1 = (unsigned)g1, ret->g2 = (unsigned)g2;
    return 0;
}

/* Tokens a pass of the tiled kernels (bf16 and FP8): the tuning's moe_tiled_bm (16, 32 or 64), or by the
 * mean tokens an expert (T k / E) when 0: 16 up to 3 on average, 32 up to 24, else 64 (an expert
 * with more tokens than a pass takes more passes; run 2 of bench/results/2026-12-02-h200-s4: at a
 * mean of 2 16 was 0.1 ms faster than 32 on Qwen3-30B-A3B, from 4 to 17 32 was as fast or faster,
 * and 16 lost 2.6-4.6 ms a step at 17 (two passes of the weights for most experts)). */
static int tiled_bm(const msm_cuda_tuning *tn, int T, int k, int E) {
    if (tn->moe_tiled_bm == 16 || tn->moe_tiled_bm == 32 || tn->moe_tiled_bm == 64) return tn->moe_tiled_bm;
    long long pairs = (long long)T * k;
    return pairs <= 3LL * E ? 16 : pairs <= 24LL * E ? 32 : 64;
}

/* The bf16 gate/up and down GEMMs of plan p with BM tokens a pass. */
template <int BM>
static int tiled_gemms(const tiled_plan &p, const moe_ws &ws, const uint16_t *gate_up, const uint16_t *down, int H,
                       int I, msm_cuda_exec ex) {
    CUDA_TRY(msm_launch(moe_gateup_tiled_kernel<BM>, dim3(p.g1), dim3(TL_WARPS * 32), TL_SMEM_BM(BM), ex, ws, p.xh,
                        p.xl, gate_up, p.ah, p.al, H, I));
    CUDA_TRY(msm_launch(moe_down_tiled_kernel<BM>, dim3(p.g2), dim3(TL_WARPS * 32), TL_SMEM_BM(BM), ex, ws, p.ah,
                        p.al, down, H, I));
    return 0;
}

int msm__moe_tiled_run(const moe_ws &ws, const float *x, const uint16_t *gate_up,
                       const uint16_t *down, int T, int H, int I, int k, int E, msm_cuda_exec ex) {
    tiled_plan p;
    int r = tiled_plan_make(ws, T, H, I, k, E, &p);
    if (r) return r;
    CUDA_TRY(msm_launch(moe_split_x_kernel, dim3(p.split_rows), dim3(256), 0, ex, ws, p.xh, p.xl, x, 1.0f,
                        T * k, H, k, E));
    int bm = tiled_bm(ex.tune, T, k, E);
    return bm == 16   ? tiled_gemms<16>(p, ws, gate_up, down, H, I, ex)
           : bm == 32 ? tiled_gemms<32>(p, ws, gate_up, down, H, I, ex)
                      : tiled_gemms<64>(p, ws, gate_up, down, H, I, ex);
}

/* The FP8 gate/up and down GEMMs of plan p with BM tokens a pass, KS K steps a pipeline stage. */
template <int BM, int KS = 1>
static int tiled_fp8_gemms(const tiled_plan &p, const moe_ws &ws, msm_cuda_fp8w gu, msm_cuda_fp8w dn, int H, int I,
                           msm_cuda_exec ex) {
    constexpr int smem = KS == 1 ? TF_SMEM_BM(BM) : TF_SMEM_BM2(BM);
    CUDA_TRY(msm_launch(moe_gateup_tiled_fp8_kernel<BM, KS>, dim3(p.g1), dim3(TL_WARPS * 32), smem, ex, ws, p.xh,
                        p.xl, gu.q, gu.scale, gu.phase, p.ah, p.al, H, I));
    CUDA_TRY(msm_launch(moe_down_tiled_fp8_kernel<BM, KS>, dim3(p.g2), dim3(TL_WARPS * 32), smem, ex, ws, p.ah,
                        p.al, dn.q, dn.scale, dn.phase, H, I));
    return 0;
}

int msm__moe_tiled_fp8_run(const moe_ws &ws, const float *x, msm_cuda_fp8w gu, msm_cuda_fp8w dn, int T, int H,
                           int I, int k, int E, msm_cuda_exec ex) {
    if (!msm__moe_tiled_fp8_fits(H, I, gu, dn)) return -EINVAL;
    tiled_plan p;
    int r = tiled_plan_make(ws, T, H, I, k, E, &p);
    if (r) return r;
    CUDA_TRY(msm_launch(moe_split_x_kernel, dim3(p.split_rows), dim3(256), 0, ex, ws, p.xh, p.xl, x,
                        MSM_FP8_X_SCALE, T * k, H, k, E));
    int bm = tiled_bm(ex.tune, T, k, E);
    if (ex.tune->fp8_tiled_ks == 2 && bm <= 32) /* two K steps a stage */
        return bm == 16 ? tiled_fp8_gemms<16, 2>(p, ws, gu, dn, H, I, ex) : tiled_fp8_gemms<32, 2>(p, ws, gu, dn, H, I, ex);
    return bm == 16   ? tiled_fp8_gemms<16>(p, ws, gu, dn, H, I, ex)
           : bm == 32 ? tiled_fp8_gemms<32>(p, ws, gu, dn, H, I, ex)
                      : tiled_fp8_gemms<64>(p, ws, gu, dn, H, I, ex);
}

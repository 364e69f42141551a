/* moe_pair.cu: the routed experts at small T (decode, T <= MSM_CUDA_MOE_GEMV_MAX_T), "pair" path:
 * two fp32 SIMT GEMV kernels, no grouping.
 *   A: one warp per (pair p = t*k+j, i): the gate row i and the up row I+i of expert ids[p] are
 *      streamed with 16-byte loads and dotted with x[t]; the warp writes silu(g)*u to act[p,i].
 *   B: one warp per (t, h): y[t,h] = sum_j w[t,j] * dot(down[ids[t,j]][h,:], act[t*k+j,:]),
 *      accumulated in slot order as the CPU does.
 * With FP8 the weights are e4m3 codes with block scales (msm_rows_dot_fp8; the scale pointers
 * gu_sc, dn_sc are NULL for bf16 weights), decoded with integer operations, or with the hardware's
 * e4m3 -> half conversion where msm_cuda_tuning.fp8_moe_hw says so (HW: fewer instructions a code
 * for these issue-bound kernels; the same products, see msm_cuda_tuning.fp8_moe_hw). With
 * msm_cuda_tuning.fp8_moe_lean the FP8 gate/up and split down take msm_rows_dot_fp8_lean, the same
 * sums in registers that make one token's grids one wave. */
#include "moe_internal.h"

#include <errno.h>

#define MOE_WARPS 4
#define MOE_U 4

/* One warp per (pair p, column i). (Two columns a warp, a single wave at T = 1, measured 15%
 * slower there on the H200.) U 16-byte loads a lane a row in flight; MINB blocks an SM (U 2 at 12:
 * the same sums in the same order as U 4, msm_rows_dot, in a register budget that holds one wave
 * of Qwen3-30B-A3B's 1536 blocks at one token; msm_cuda_tuning.moe_gu_u2). */
/* LEAN (FP8 only): msm_rows_dot_fp8_lean (PIPE: its next step's codes early), the same sums in the
 * registers of MINB 12 (one wave of Qwen3-30B-A3B's 1536 blocks at one token;
 * msm_cuda_tuning.fp8_moe_lean). LT: the programmatic trigger after the wait, not before it, so the
 * down kernel after it launches only once the routing this one waited for is complete and may read
 * the expert ids before its own wait (moe_down_split_kernel's EARLY; msm_cuda_tuning.moe_pair_early). */
template <bool VEC, bool FP8, bool HW = false, bool PIPE = false, int U = MOE_U, int MINB = 0, bool LEAN = false,
          bool LT = false>
static __global__ void __launch_bounds__(MOE_WARPS * 32, MINB)
    moe_gateup_gemv_kernel(float *act, const float *x, const int32_t *ids, const void *gate_up,
                           const float *gu_sc, int gu_ph, int H, int I, int k, int E) {
    static_assert(!LEAN || FP8, "the lean dot is FP8's");
    if constexpr (!LT) msm_pdl_trigger();
    msm_pdl_wait();
    if constexpr (LT) msm_pdl_trigger();
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int i = blockIdx.x * MOE_WARPS + warp, p = blockIdx.y;
    if (i >= I) return;
    int e = ids[p];
    if (e < 0 || e >= E) return; /* not a valid expert: the down kernel skips the pair */
    size_t eb = (size_t)e * 2 * I * H;
    const float *se = FP8 ? gu_sc + (size_t)e * msm_cuda_fp8_scales(1, 2 * I, H, gu_ph) : NULL;
    const void *const wr[2] = {msm_wrow<FP8>(gate_up, eb, i, H), msm_wrow<FP8>(gate_up, eb, I + i, H)};
    const float *const sr[2] = {msm_srow(se, i, H, gu_ph), msm_srow(se, I + i, H, gu_ph)};
    const float *const xs[1] = {x + (size_t)(p / k) * H};
    float acc[2][1] = {{0.0f}, {0.0f}};
    if constexpr (LEAN) {
        const uint8_t *const w8[2] = {(const uint8_t *)wr[0], (const uint8_t *)wr[1]};
        float a[2] = {0.0f, 0.0f};
        msm_rows_dot_fp8_lean<2, HW, PIPE>(a, w8, sr, xs[0], H, gu_ph, lane);
        acc[0][0] = a[0], acc[1][0] = a[1];
    } else {
        msm_rows_dot_w<2, 1, U, VEC, FP8, false, HW, PIPE>(acc, wr, sr, xs, 1, H, gu_ph, lane);
    }
    float g = msm_warp_sum(acc[0][0]), u = msm_warp_sum(acc[1][0]);
    if (lane == 0) act[(size_t)p * I + i] = msm__silu_mul(g, u);
}

/* One warp per (t, h): the k down rows of the token's experts are streamed together (KMAX >= k
 * slots, unused ones skipped), then combined in slot order as the CPU does. bf16 rows (FP8 ones:
 * moe_down_gemv_fp8_kernel). */
/* moe_down_gemv_kernel's 16-byte loads a lane a row */
static __host__ __device__ constexpr int down_gemv_u(int kmax) { return kmax >= 8 ? 1 : kmax >= 4 ? 2 : 4; }

template <int KMAX, bool VEC, bool PIPE = false>
static __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_gemv_kernel(float *y, const float *act, const int32_t *ids, const float *w,
                         const uint16_t *down, int H, int I, int k, int E) {
    constexpr int U = down_gemv_u(KMAX);
    msm_pdl_trigger();
    msm_pdl_wait();
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int h = blockIdx.x * MOE_WARPS + warp, t = blockIdx.y;
    if (h >= H) return;
    const uint16_t *wr[KMAX];
    const float *xs[KMAX];
    float acc[KMAX][KMAX];
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        int p = t * k + j, e = j < k ? ids[p] : -1;
        bool ok = j < k && e >= 0 && e < E;
        wr[j] = ok ? down + ((size_t)e * H + h) * I : NULL;
        xs[j] = act + (size_t)p * I;
        acc[j][j] = 0.0f;
    }
    msm_rows_dot<KMAX, KMAX, U, VEC, true, PIPE>(acc, wr, xs, KMAX, I, lane);
    float y_th = 0.0f;
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        float d = msm_warp_sum(acc[j][j]);
        if (wr[j]) y_th += w[t * k + j] * d;
    }
    if (lane == 0) y[(size_t)t * H + h] = y_th;
}

/* The same products with a token's k expert rows spread over warps (MSM_CUDA_MOE_K_DOWN_SPLIT):
 * block (h0 .. h0 + HB - 1, t) has KMAX warps; warp j streams the HB rows from h0 of slot j's expert
 * against act[t*k+j] (msm_rows_dot_w with R = HB rows and one vector: per row the same lane partials in the
 * same order as the one-warp kernels' dots, bf16 or FP8, with U loads a row in flight, so a
 * 768-wide row is one round of loads instead of three), warp-sums them into shared memory, and
 * thread r then combines row h0 + r in slot order as those kernels do: bitwise the same y at any HB
 * (msm_cuda_tuning.moe_down_hb: 4 for bf16, 2 for FP8, whose HB 4 spills). FP8: dn_sc the experts' scales, dn_ph the column
 * phase. */
/* HB 4: 2 loads a lane a row in flight (the same sums, msm_rows_dot) in a budget of 32 warps an SM
 * (64 registers), so Qwen3-30B-A3B's 512 blocks at one token are one wave */
template <int KMAX, int HB>
static constexpr int down_split_minb() { return HB >= 4 ? 1024 / (KMAX * 32) : 0; }
/* LEAN (FP8 only): msm_rows_dot_fp8_lean, the same bits, in registers that hold HB 4 without
 * spills (msm_cuda_tuning.fp8_moe_lean). EARLY: the expert ids read and each warp's first weight
 * loads issued before the PDL wait, which then comes before act is read (the hook of the rows-dot):
 * only after a gate/up kernel that triggers after its own wait (LT), so the ids are complete when
 * this kernel launches (msm_cuda_tuning.moe_pair_early). */
template <int KMAX, int HB, bool VEC, bool FP8, bool HW = false, bool LEAN = false, bool EARLY = false>
static __global__ void __launch_bounds__(KMAX * 32, down_split_minb<KMAX, HB>())
    moe_down_split_kernel(float *y, const float *act, const int32_t *ids, const float *w, const void *down,
                          const float *dn_sc, int dn_ph, int H, int I, int k, int E) {
    /* 16-byte loads a row in flight: 1024 columns either way (HB 4: 512 bf16) */
    constexpr int U = FP8 || HB >= 4 ? 2 : 4;
    __shared__ float d[KMAX][HB];
    __shared__ bool ok[KMAX];
    msm_pdl_trigger();
    if constexpr (!EARLY) msm_pdl_wait();
    int j = threadIdx.x / 32, lane = threadIdx.x & 31;
    int h0 = blockIdx.x * HB, t = blockIdx.y;
    int p = t * k + j, e = j < k ? ids[p] : -1;
    bool okj = j < k && e >= 0 && e < E;
    const float *se = FP8 && okj ? dn_sc + (size_t)e * msm_cuda_fp8_scales(1, H, I, dn_ph) : NULL;
    const void *wr[HB];
    const float *sr[HB];
#pragma unroll
    for (int r = 0; r < HB; r++) {
        bool okr = okj && h0 + r < H;
        wr[r] = okr ? msm_wrow<FP8>(down, (size_t)e * H * I, h0 + r, I) : NULL;
        sr[r] = FP8 && okr ? msm_srow(se, h0 + r, I, dn_ph) : NULL;
    }
    const float *xs[1] = {act + (size_t)(okj ? p : 0) * I};
    float acc[HB][1];
#pragma unroll
    for (int r = 0; r < HB; r++) acc[r][0] = 0.0f;
    if constexpr (LEAN) {
        static_assert(FP8, "the lean dot is FP8's");
        const uint8_t *w8[HB];
        float a[HB];
#pragma unroll
        for (int r = 0; r < HB; r++) w8[r] = (const uint8_t *)wr[r], a[r] = 0.0f;
        if constexpr (EARLY)
            msm_rows_dot_fp8_lean<HB, HW, false, msm_pdl_hook>(a, w8, sr, xs[0], I, dn_ph, lane, msm_pdl_hook{true});
        else
            msm_rows_dot_fp8_lean<HB, HW>(a, w8, sr, xs[0], I, dn_ph, lane);
#pragma unroll
        for (int r = 0; r < HB; r++) acc[r][0] = a[r];
    } else if constexpr (EARLY) {
        msm_rows_dot_w<HB, 1, U, VEC, FP8, false, HW, false, msm_pdl_hook>(acc, wr, sr, xs, 1, I, dn_ph, lane,
                                                                           msm_pdl_hook{true});
    } else {
        msm_rows_dot_w<HB, 1, U, VEC, FP8, false, HW>(acc, wr, sr, xs, 1, I, dn_ph, lane);
    }
#pragma unroll
    for (int r = 0; r < HB; r++) {
        float s = msm_warp_sum(acc[r][0]);
        if (lane == 0) d[j][r] = s;
    }
    if (lane == 0) ok[j] = okj;
    __syncthreads();
    if (threadIdx.x < HB && h0 + (int)threadIdx.x < H) {
        float y_th = 0.0f;
#pragma unroll
        for (int jj = 0; jj < KMAX; jj++)
            if (ok[jj]) y_th += w[t * k + jj] * d[jj][threadIdx.x];
        y[(size_t)t * H + h0 + threadIdx.x] = y_th;
    }
}

/* The FP8 down GEMV: one warp per (t, HR rows h0..h0+HR-1), the HR rows of each slot's expert
 * sharing that slot's act row (read once for them), combined per row in slot order as the CPU
 * does. (Measured no faster than one row a warp on the H200: the kernel is latency-bound, see
 * docs/adr/0006-fp8.md.) */
#define DOWN_FP8_HR 2
template <int KMAX, int HR, bool HW = false>
static __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_gemv_fp8_kernel(float *y, const float *act, const int32_t *ids, const float *w, const uint8_t *down,
                             const float *dn_sc, int dn_ph, int H, int I, int k, int E) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int h0 = (blockIdx.x * MOE_WARPS + warp) * HR, t = blockIdx.y;
    if (h0 >= H) return;
    const uint8_t *wr[KMAX * HR];
    const float *sr[KMAX * HR];
    const float *xs[KMAX];
    float acc[KMAX * HR][KMAX];
    size_t per = msm_cuda_fp8_scales(1, H, I, dn_ph);
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        int p = t * k + j, e = j < k ? ids[p] : -1;
        bool ok = j < k && e >= 0 && e < E;
        xs[j] = act + (size_t)(ok ? p : 0) * I;
#pragma unroll
        for (int hr = 0; hr < HR; hr++) {
            int r = j * HR + hr, h = h0 + hr;
            bool okr = ok && h < H;
            wr[r] = okr ? down + ((size_t)e * H + h) * I : NULL;
            sr[r] = okr ? msm_srow(dn_sc + (size_t)e * per, h, I, dn_ph) : NULL;
            acc[r][j] = 0.0f;
        }
    }
    msm_rows_dot_fp8<KMAX * HR, KMAX, 1, HR, HW>(acc, wr, sr, xs, KMAX, I, dn_ph, lane);
#pragma unroll
    for (int hr = 0; hr < HR; hr++) {
        float y_th = 0.0f;
#pragma unroll
        for (int j = 0; j < KMAX; j++) {
            float d = msm_warp_sum(acc[j * HR + hr][j]);
            if (wr[j * HR + hr]) y_th += w[t * k + j] * d;
        }
        if (lane == 0 && h0 + hr < H) y[(size_t)t * H + h0 + hr] = y_th;
    }
}

/* moe_down_split_kernel at HB rows a warp: grid (ceil(H / HB), T), KMAX warps a block; EARLY as
 * its (the gate/up before it launched with LT) */
template <int KMAX, int HB, bool EARLY>
static cudaError_t down_split_go(unsigned T, msm_cuda_exec ex, bool vec, float *y, const float *act,
                                 const int32_t *ids, const float *w, const void *down, const float *dn_sc, int dn_ph,
                                 int H, int I, int k, int E) {
    dim3 gs((unsigned)((H + HB - 1) / HB), T), bs(KMAX * 32);
#define DS(VEC_, FP8_, HW_, LEAN_)                                                                            \
    msm_launch(moe_down_split_kernel<KMAX, HB, VEC_, FP8_, HW_, LEAN_, EARLY>, gs, bs, 0, ex, y, act, ids, w, down, \
               dn_sc, dn_ph, H, I, k, E)
    if constexpr (HB == 4) /* FP8 at 4 rows a warp in 64 registers, no spills (msm_cuda_tuning.fp8_moe_lean) */
        if (dn_sc && ex.tune->fp8_moe_lean) return ex.tune->fp8_moe_hw ? DS(true, true, true, true) : DS(true, true, false, true);
    if (dn_sc && ex.tune->fp8_moe_hw) /* FP8: the caller checked I % 16 and the alignment */
        return DS(true, true, true, false);
    if (dn_sc) return DS(true, true, false, false);
    return vec ? DS(true, false, false, false) : DS(false, false, false, false);
#undef DS
}

template <int KMAX, int HB>
static cudaError_t down_split_launch(unsigned T, msm_cuda_exec ex, bool vec, bool early, float *y, const float *act,
                                     const int32_t *ids, const float *w, const void *down, const float *dn_sc,
                                     int dn_ph, int H, int I, int k, int E) {
    return early ? down_split_go<KMAX, HB, true>(T, ex, vec, y, act, ids, w, down, dn_sc, dn_ph, H, I, k, E)
                 : down_split_go<KMAX, HB, false>(T, ex, vec, y, act, ids, w, down, dn_sc, dn_ph, H, I, k, E);
}

/* Whether down_gemv_launch<KMAX> takes the split down kernel (a token's experts over warps): by
 * default for 8 slots (Qwen3-30B-A3B batch 1 3.69 -> 3.44 ms, batch 4 7.53 -> 6.85, FP8 3.81 ->
 * 3.56; GLM-4.5-Air FP8 8.22 -> 7.55); at 4 slots, 2 rows a warp measured slower than one warp a row
 * (Qwen1.5-MoE batch 1 +0.03 ms in 2026-12-01, +0.11 in 2026-12-04) and 4 rows faster: bf16 from 4
 * slots at 4 rows a warp, Qwen1.5-MoE 1.724-1.736 -> 1.701-1.707 ms at batch 1, 3.316-3.334 ->
 * 3.207-3.234 at 4 (H200, 2026-12-04) */
static bool down_split_taken(const msm_cuda_tuning *t, int kmax, bool fp8) {
    int kf = t->moe_kernels;
    return (kf & MSM_CUDA_MOE_K_DOWN_SPLIT) || (kmax >= (fp8 ? 8 : 4) && !(kf & MSM_CUDA_MOE_K_DOWN_WARP));
}

/* The down kernel after the gate/up one: early as down_split_go's (only where the split kernel is
 * taken: down_split_taken). */
template <int KMAX>
static cudaError_t down_gemv_launch(dim3 grid, msm_cuda_exec ex, bool vec, bool early, float *y,
                                    const float *act, const int32_t *ids, const float *w,
                                    const void *down, const float *dn_sc, int dn_ph, int H, int I, int k,
                                    int E) {
    dim3 blk(MOE_WARPS * 32);
    bool fp8 = dn_sc != NULL;
    int hb = ex.tune->moe_down_hb ? ex.tune->moe_down_hb : fp8 && !ex.tune->fp8_moe_lean ? 2 : 4;
    if (down_split_taken(ex.tune, KMAX, fp8)) {
        if (hb == 4)
            return down_split_launch<KMAX, 4>(grid.y, ex, vec, early, y, act, ids, w, down, dn_sc, dn_ph, H, I, k, E);
        return down_split_launch<KMAX, 2>(grid.y, ex, vec, early, y, act, ids, w, down, dn_sc, dn_ph, H, I, k, E);
    }
    if (dn_sc) {
        grid.x = (unsigned)((H + MOE_WARPS * DOWN_FP8_HR - 1) / (MOE_WARPS * DOWN_FP8_HR));
        if (ex.tune->fp8_moe_hw)
            return msm_launch(moe_down_gemv_fp8_kernel<KMAX, DOWN_FP8_HR, true>, grid, blk, 0, ex, y, act, ids, w,
                              (const uint8_t *)down, dn_sc, dn_ph, H, I, k, E);
        return msm_launch(moe_down_gemv_fp8_kernel<KMAX, DOWN_FP8_HR>, grid, blk, 0, ex, y, act, ids, w,
                          (const uint8_t *)down, dn_sc, dn_ph, H, I, k, E);
    }
    if constexpr (KMAX <= 4) /* rows of several steps: pipelined (tuning rows_pipe) */
        if (vec && (ex.tune->rows_pipe & MSM_CUDA_PIPE_MOE_DOWN) && I > 256 * down_gemv_u(KMAX))
            return msm_launch(moe_down_gemv_kernel<KMAX, true, true>, grid, blk, 0, ex, y, act, ids, w,
                              (const uint16_t *)down, H, I, k, E);
    if (vec)
        return msm_launch(moe_down_gemv_kernel<KMAX, true>, grid, blk, 0, ex, y, act, ids, w,
                          (const uint16_t *)down, H, I, k, E);
    return msm_launch(moe_down_gemv_kernel<KMAX, false>, grid, blk, 0, ex, y, act, ids, w, (const uint16_t *)down,
                      H, I, k, E);
}

/* Whether the bf16 gate/up GEMV of `blocks` blocks takes 2 loads a row at GU_U2_MINB an SM
 * (msm_cuda_tuning.moe_gu_u2): AUTO where that makes one wave and 4 loads do not, and no kernel
 * runs beside it on the aux stream (Qwen1.5-MoE, whose shared expert does, measured slower). */
#define GU_U2_MINB 12
static bool gateup_u2(msm_cuda_exec ex, long blocks) {
    const msm_cuda_tuning *t = ex.tune;
    if (t->moe_gu_u2 != MSM_CUDA_MOE_GU_U2_AUTO) return t->moe_gu_u2 == MSM_CUDA_MOE_GU_U2_ON;
    return !ex.aux_beside && blocks <= (long)GU_U2_MINB * t->sms && blocks > (long)t->moe_gu_per_sm * t->sms;
}

/* The FP8 gate/up on msm_rows_dot_fp8_lean (msm_cuda_tuning.fp8_moe_lean) at 12 blocks an SM, 40
 * registers: 1 one load a lane a row in flight, 2 its next step's codes loaded early (no spills;
 * with 1 and the hardware decode ptxas keeps 8 bytes, the output's index, on the stack outside the
 * loop; CUDA 13.0, sm_90a) */
template <bool LT>
static cudaError_t gateup_fp8_lean_launch(dim3 ga, msm_cuda_exec ex, float *act, const float *x, const int32_t *ids,
                                          const void *gate_up, const float *gu_sc, int gu_ph, int H, int I, int k,
                                          int E) {
    bool hw = ex.tune->fp8_moe_hw, pipe = ex.tune->fp8_moe_lean == 2;
    auto kern = hw ? (pipe ? moe_gateup_gemv_kernel<true, true, true, true, 1, GU_U2_MINB, true, LT>
                           : moe_gateup_gemv_kernel<true, true, true, false, 1, GU_U2_MINB, true, LT>)
                   : (pipe ? moe_gateup_gemv_kernel<true, true, false, true, 1, GU_U2_MINB, true, LT>
                           : moe_gateup_gemv_kernel<true, true, false, false, 1, GU_U2_MINB, true, LT>);
    return msm_launch(kern, ga, dim3(MOE_WARPS * 32), 0, ex, act, x, ids, gate_up, gu_sc, gu_ph, H, I, k, E);
}

/* The gate/up GEMV of the pair path, LT as moe_gateup_gemv_kernel's. */
template <bool LT>
static cudaError_t gateup_launch(dim3 ga, msm_cuda_exec ex, bool vec_h, float *act, const float *x,
                                 const int32_t *ids, const void *gate_up, const float *gu_sc, int gu_ph, int H, int I,
                                 int k, int E) {
    dim3 blk(MOE_WARPS * 32);
#define GU(...) \
    msm_launch(moe_gateup_gemv_kernel<__VA_ARGS__>, ga, blk, 0, ex, act, x, ids, gate_up, gu_sc, gu_ph, H, I, k, E)
    if (gu_sc && ex.tune->fp8_moe_lean) /* FP8 in 40 registers: 12 blocks an SM (tuning fp8_moe_lean) */
        return gateup_fp8_lean_launch<LT>(ga, ex, act, x, ids, gate_up, gu_sc, gu_ph, H, I, k, E);
    if (gu_sc && ex.tune->fp8_moe_hw) /* FP8 (the caller checked H % 16 and the alignment) */
        return GU(true, true, true, false, MOE_U, 0, false, LT);
    if (gu_sc) return GU(true, true, false, false, MOE_U, 0, false, LT);
    if (vec_h && gateup_u2(ex, (long)ga.x * ga.y)) /* 2 loads a lane a row, 12 blocks an SM */
        return GU(true, false, false, false, 2, GU_U2_MINB, false, LT);
    if (vec_h && (ex.tune->rows_pipe & MSM_CUDA_PIPE_MOE_GU) && H > 256 * MOE_U) /* rows of several steps: pipelined */
        return GU(true, false, false, true, MOE_U, 0, false, LT);
    if (vec_h) return GU(true, false, false, false, MOE_U, 0, false, LT);
    return GU(false, false, false, false, MOE_U, 0, false, LT);
#undef GU
}

/* The occupancy field of the pair path's gate/up GEMV, for msm_cuda_tuning_init. */
void msm__moe_pair_tuning(msm_cuda_tuning *t) {
    t->moe_gu_per_sm = msm_blocks_per_sm(moe_gateup_gemv_kernel<true, false>, MOE_WARPS * 32, 0);
}

/* The kernels' slot bound for k experts a token. */
static int pair_kmax(int k) { return k <= 1 ? 1 : k <= 2 ? 2 : k <= 4 ? 4 : 8; }

/* Whether the pair path's split down loads early (tuning moe_pair_early; its AUTO rule). */
extern "C" bool msm_cuda_moe_pair_early(const msm_cuda_tuning *t, int T, int k, bool fp8, bool aux_beside) {
    int kmax = pair_kmax(k), pe = t->moe_pair_early;
    bool auto_early = pe == MSM_CUDA_MOE_PAIR_EARLY_AUTO && !(T == 1 && aux_beside);
    return (pe == MSM_CUDA_MOE_PAIR_EARLY_ON || auto_early) && down_split_taken(t, kmax, fp8);
}

int msm__moe_pair_run(float *y, const float *x, const int32_t *ids, const float *w, const void *gate_up,
                      const float *gu_sc, int gu_ph, const void *down, const float *dn_sc, int dn_ph, float *act,
                      int T, int H, int I, int k, int E, bool vec_h, bool vec_i, msm_cuda_exec ex) {
    size_t P = (size_t)T * k;
    if (P > 65535) return -EINVAL; /* grid.y of the gate/up kernel */
    dim3 ga((unsigned)((I + MOE_WARPS - 1) / MOE_WARPS), (unsigned)P);
    int kmax = pair_kmax(k);
    /* the split down's weights before its PDL wait (tuning moe_pair_early): the gate/up triggers after its wait */
    bool early = msm_cuda_moe_pair_early(ex.tune, T, k, dn_sc != NULL, ex.aux_beside);
    if (early)
        CUDA_TRY(gateup_launch<true>(ga, ex, vec_h, act, x, ids, gate_up, gu_sc, gu_ph, H, I, k, E));
    else
        CUDA_TRY(gateup_launch<false>(ga, ex, vec_h, act, x, ids, gate_up, gu_sc, gu_ph, H, I, k, E));
    ex.no_pdl = false; /* the down kernel follows the gate/up one programmatically (msm_cuda_exec.no_pdl) */
    dim3 gb((unsigned)((H + MOE_WARPS - 1) / MOE_WARPS), (unsigned)T);
    if (kmax == 1)
        CUDA_TRY(down_gemv_launch<1>(gb, ex, vec_i, early, y, act, ids, w, down, dn_sc, dn_ph, H, I, k, E));
    else if (kmax == 2)
        CUDA_TRY(down_gemv_launch<2>(gb, ex, vec_i, early, y, act, ids, w, down, dn_sc, dn_ph, H, I, k, E));
    else if (kmax == 4)
        CUDA_TRY(down_gemv_launch<4>(gb, ex, vec_i, early, y, act, ids, w, down, dn_sc, dn_ph, H, I, k, E));
    else
        CUDA_TRY(down_gemv_launch<8>(gb, ex, vec_i, early, y, act, ids, w, down, dn_sc, dn_ph, H, I, k, E));
    return 0;
}

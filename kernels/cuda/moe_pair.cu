/* moe_pair.cu: the routed experts at small T (decode, T <= MSM_CUDA_MOE_GEMV_MAX_T), "pair" path:
 * two fp32 SIMT GEMV kernels, no grouping.
 *   A: one warp per (pair p = t*k+j, i): the gate row i and the up row I+i of expert ids[p] are
 *      streamed with 16-byte loads and dotted with x[t]; the warp writes silu(g)*u to act[p,i].
 *   B: one warp per (t, h): y[t,h] = sum_j w[t,j] * dot(down[ids[t,j]][h,:], act[t*k+j,:]),
 *      accumulated in slot order as the CPU does. */
#include "moe_internal.h"

#include <errno.h>

#define MOE_WARPS 4
#define MOE_U 4

/* One warp per (pair p, column i). (Two columns a warp, a single wave at T = 1, measured 15%
 * slower there on the H200.) */
template <bool VEC>
static __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gateup_gemv_kernel(float *act, const float *x, const int32_t *ids,
                           const uint16_t *gate_up, int H, int I, int k, int E) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int i = blockIdx.x * MOE_WARPS + warp, p = blockIdx.y;
    if (i >= I) return;
    int e = ids[p];
    if (e < 0 || e >= E) return; /* not a valid expert: the down kernel skips the pair */
    const uint16_t *ge = gate_up + (size_t)e * 2 * I * H;
    const uint16_t *const wr[2] = {ge + (size_t)i * H, ge + (size_t)(I + i) * H};
    const float *const xs[1] = {x + (size_t)(p / k) * H};
    float acc[2][1] = {{0.0f}, {0.0f}};
    msm_rows_dot<2, 1, MOE_U, VEC>(acc, wr, xs, 1, H, lane);
    float g = msm_warp_sum(acc[0][0]), u = msm_warp_sum(acc[1][0]);
    if (lane == 0) act[(size_t)p * I + i] = msm__silu_mul(g, u);
}

/* One warp per (t, h): the k down rows of the token's experts are streamed together (KMAX >= k
 * slots, unused ones skipped), then combined in slot order as the CPU does. */
template <int KMAX, bool VEC>
static __global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_gemv_kernel(float *y, const float *act, const int32_t *ids, const float *w,
                         const uint16_t *down, int H, int I, int k, int E) {
    constexpr int U = KMAX >= 8 ? 1 : KMAX >= 4 ? 2 : 4;
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
    msm_rows_dot<KMAX, KMAX, U, VEC, true>(acc, wr, xs, KMAX, I, lane);
    float y_th = 0.0f;
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        float d = msm_warp_sum(acc[j][j]);
        if (wr[j]) y_th += w[t * k + j] * d;
    }
    if (lane == 0) y[(size_t)t * H + h] = y_th;
}

template <int KMAX>
static cudaError_t down_gemv_launch(dim3 grid, msm_cuda_exec ex, bool vec, float *y,
                                    const float *act, const int32_t *ids, const float *w,
                                    const uint16_t *down, int H, int I, int k, int E) {
    dim3 blk(MOE_WARPS * 32);
    if (vec)
        return msm_launch(moe_down_gemv_kernel<KMAX, true>, grid, blk, 0, ex, y, act, ids, w,
                          down, H, I, k, E);
    return msm_launch(moe_down_gemv_kernel<KMAX, false>, grid, blk, 0, ex, y, act, ids, w, down,
                      H, I, k, E);
}

int msm__moe_pair_run(float *y, const float *x, const int32_t *ids, const float *w,
                      const uint16_t *gate_up, const uint16_t *down, float *act, int T, int H,
                      int I, int k, int E, bool vec_h, bool vec_i, msm_cuda_exec ex) {
    size_t P = (size_t)T * k;
    if (P > 65535) return -EINVAL; /* grid.y of the gate/up kernel */
    dim3 ga((unsigned)((I + MOE_WARPS - 1) / MOE_WARPS), (unsigned)P), blk(MOE_WARPS * 32);
    if (vec_h)
        CUDA_TRY(msm_launch(moe_gateup_gemv_kernel<true>, ga, blk, 0, ex, act, x, ids, gate_up, H,
                            I, k, E));
    else
        CUDA_TRY(msm_launch(moe_gateup_gemv_kernel<false>, ga, blk, 0, ex, act, x, ids, gate_up, H,
                            I, k, E));
    dim3 gb((unsigned)((H + MOE_WARPS - 1) / MOE_WARPS), (unsigned)T);
    if (k <= 1)
        CUDA_TRY(down_gemv_launch<1>(gb, ex, vec_i, y, act, ids, w, down, H, I, k, E));
    else if (k <= 2)
        CUDA_TRY(down_gemv_launch<2>(gb, ex, vec_i, y, act, ids, w, down, H, I, k, E));
    else if (k <= 4)
        CUDA_TRY(down_gemv_launch<4>(gb, ex, vec_i, y, act, ids, w, down, H, I, k, E));
    else
        CUDA_TRY(down_gemv_launch<8>(gb, ex, vec_i, y, act, ids, w, down, H, I, k, E));
    return 0;
}

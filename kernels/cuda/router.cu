/* router.cu: MoE router softmax + top-k on the device, one warp per token.
 *
 * Lane l holds logits l, l+32, ... (E <= 256: at most 8 a lane, in registers). The softmax max
 * and denominator are warp reductions; selection runs k rounds of a warp arg-max over the logits
 * (softmax is monotonic) ordered by (value descending, id ascending), which is the CPU's "highest
 * first, lowest id on ties". Weights are exp(l - max) / sum, renormalised in slot order when norm,
 * exactly as the CPU does. ids and weights never leave the device. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>
#include <math.h>

#define ROUTER_WARPS 4
#define ROUTER_PER_LANE 8 /* E <= 256 */

static __global__ void __launch_bounds__(ROUTER_WARPS * 32)
    router_topk_kernel(int32_t *ids, float *w, const float *logits, int T, int E, int k,
                       bool norm) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int t = blockIdx.x * ROUTER_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (t >= T) return;
    const float *l = logits + (size_t)t * E;
    float v[ROUTER_PER_LANE];
    float mx = -INFINITY;
#pragma unroll
    for (int i = 0; i < ROUTER_PER_LANE; i++) {
        int e = i * 32 + lane;
        v[i] = e < E ? l[e] : -INFINITY;
        mx = fmaxf(mx, v[i]);
    }
    mx = msm_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTER_PER_LANE; i++)
        if (i * 32 + lane < E) sum += expf(v[i] - mx);
    sum = msm_warp_sum(sum);

    unsigned taken = 0; /* bit i: this lane's element i already selected */
    float wt[8];
    int id[8];
#pragma unroll
    for (int j = 0; j < 8; j++) { /* unrolled so wt/id stay in registers */
        if (j >= k) break;
        float bv = -INFINITY;
        int bi = 0x7fffffff;
#pragma unroll
        for (int i = 0; i < ROUTER_PER_LANE; i++) {
            int e = i * 32 + lane;
            if (e < E && !(taken >> i & 1u) && (bi == 0x7fffffff || v[i] > bv)) bv = v[i], bi = e;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            float ov = __shfl_xor_sync(MSM_FULL_MASK, bv, o);
            int oi = __shfl_xor_sync(MSM_FULL_MASK, bi, o);
            bool better = oi != 0x7fffffff &&
                          (bi == 0x7fffffff || ov > bv || (ov == bv && oi < bi));
            if (better) bv = ov, bi = oi;
        }
        if ((bi & 31) == lane) taken |= 1u << (bi / 32);
        id[j] = bi;
        wt[j] = expf(bv - mx) / sum;
    }
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (j < k) s += wt[j];
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (j >= k) break;
            ids[(size_t)t * k + j] = id[j];
            w[(size_t)t * k + j] = norm ? wt[j] / s : wt[j];
        }
    }
}

extern "C" int msm_cuda_router_topk(int32_t *ids, float *w, const float *logits, int T, int E,
                                    int k, bool norm, msm_cuda_exec ex) {
    if (T < 0 || E <= 0 || E > 32 * ROUTER_PER_LANE || k <= 0 || k > 8 || k > E) return -EINVAL;
    if (T == 0) return 0;
    unsigned blocks = (unsigned)((T + ROUTER_WARPS - 1) / ROUTER_WARPS);
    CUDA_TRY(msm_launch(router_topk_kernel, dim3(blocks), dim3(ROUTER_WARPS * 32), 0, ex, ids, w, logits, T, E, k, norm));
    return 0;
}

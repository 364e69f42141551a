/* router_internal: the MoE router's top-k on the device, shared by router.cu (the router kernels)
 * and moe_pair.cu (the routed experts' first kernel taking the top-k from the router's logits at
 * decode: msm_cuda_router_experts). Not a public header.
 *
 * Lane l holds logits l, l+32, ... (E <= 256: at most 8 a lane, in registers). The softmax max
 * and denominator are warp reductions; selection runs k rounds of a warp arg-max over the logits
 * (softmax is monotonic) ordered by (value descending, id ascending), which is the CPU's "highest
 * first, lowest id on ties", or takes the ranks a block computed at once (router_rank_shared).
 * Weights are exp(l - max) / sum, renormalised in slot order when norm, exactly as the CPU does. */
#ifndef MSM_ROUTER_INTERNAL_H
#define MSM_ROUTER_INTERNAL_H

#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#define ROUTER_WARPS 4
#define ROUTER_PER_LANE 8 /* E <= 256 */

#define NO_ID 0x7fffffff /* an arg-max candidate slot holding nothing */

/* Warp arg-max over (v, i) pairs, value descending then id ascending (i == NO_ID: no candidate);
 * with CARRY, x travels with the winner. Every lane ends with the winner. */
template <bool CARRY>
static __device__ __forceinline__ void warp_argmax(float &v, int &i, float &x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float ov = __shfl_xor_sync(MSM_FULL_MASK, v, o), ox = CARRY ? __shfl_xor_sync(MSM_FULL_MASK, x, o) : x;
        int oi = __shfl_xor_sync(MSM_FULL_MASK, i, o);
        bool better = oi != NO_ID && (i == NO_ID || ov > v || (ov == v && oi < i));
        if (better) v = ov, i = oi, x = ox;
    }
}

/* One round of a top-k selection over the warp's elements (lane l holds v[i] of element
 * i * 32 + l, i < ROUTER_PER_LANE, up to E): this lane's best element not yet taken, then the
 * warp's; the lane holding the winner marks it taken. Returns its id, with its value in *bv and,
 * with CARRY, its x[i] in *bx. */
template <bool CARRY>
static __device__ __forceinline__ int select_next(const float (&v)[ROUTER_PER_LANE],
                                                  const float (&x)[ROUTER_PER_LANE], unsigned &taken,
                                                  int E, int lane, float &bv, float &bx) {
    int bi = NO_ID;
    bv = -INFINITY, bx = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTER_PER_LANE; i++) {
        int e = i * 32 + lane;
        if (e < E && !(taken >> i & 1u) && (bi == NO_ID || v[i] > bv)) {
            bv = v[i], bi = e;
            if (CARRY) bx = x[i];
        }
    }
    warp_argmax<CARRY>(bv, bi, bx);
    if ((bi & 31) == lane) taken |= 1u << (bi / 32);
    return bi;
}

/* Softmax + top-k of token t's E logits at l, by one warp. The logits are read through L2
 * (__ldcg), or with SMEM from the shared-memory copy the fused router's last block made of what
 * other blocks of its grid wrote (the same values: no second round trip to L2). With rank
 * (shared memory, rank[j] the id of the j-th best, or -1), the selection is taken from there
 * unless a slot is empty or a logit is NaN; else (and without rank) k rounds of select_next. The
 * weights are the same bits either way. */
template <bool SMEM = false>
static __device__ __forceinline__ float topk_ld(const float *p) {
    if constexpr (SMEM) return *p;
    else return __ldcg(p);
}

template <bool SMEM = false>
static __device__ __forceinline__ void topk_token(int32_t *ids, float *w, const float *l, int t, int E, int k,
                                                  bool norm, int lane, const int *rank = NULL) {
    float v[ROUTER_PER_LANE];
    float mx = -INFINITY;
    bool nan = false;
#pragma unroll
    for (int i = 0; i < ROUTER_PER_LANE; i++) {
        int e = i * 32 + lane;
        v[i] = e < E ? topk_ld<SMEM>(l + e) : -INFINITY;
        mx = fmaxf(mx, v[i]);
        nan |= isnan(v[i]);
    }
    mx = msm_warp_max(mx);
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < ROUTER_PER_LANE; i++)
        if (i * 32 + lane < E) sum += expf(v[i] - mx);
    sum = msm_warp_sum(sum);

    float wt[8];
    int id[8];
    bool ranked = rank && !__any_sync(MSM_FULL_MASK, nan || (lane < k && rank[lane] < 0));
    if (ranked) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (j >= k) break;
            id[j] = rank[j];
            wt[j] = expf(topk_ld<SMEM>(l + id[j]) - mx) / sum;
        }
    } else {
        unsigned taken = 0; /* bit i: this lane's element i already selected */
#pragma unroll
        for (int j = 0; j < 8; j++) { /* unrolled so wt/id stay in registers */
            if (j >= k) break;
            float bv, unused;
            id[j] = select_next<false>(v, v, taken, E, lane, bv, unused);
            wt[j] = expf(bv - mx) / sum;
        }
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

/* A block ranks token t's E logits at l (global, written by another kernel or block: read through
 * L2) at once: lg (shared, 32 * ROUTER_PER_LANE floats, 16-byte aligned) gets them, padded with
 * -inf to a multiple of 4, and rank[j] (shared, 8) the id of the j-th best by topk_token's order
 * (above, or equal at a lower id), or -1 (no NaN: every rank below k is filled once). Every thread
 * of the block calls it; it ends with a barrier. */
static __device__ __forceinline__ void router_rank_shared(const float *l, int E, int k, float *lg, int *rank) {
    for (int e = threadIdx.x; e < E; e += blockDim.x) lg[e] = __ldcg(l + e);
    for (int e = E + threadIdx.x; e < (E + 3) / 4 * 4; e += blockDim.x) lg[e] = -INFINITY; /* never counted */
    if (threadIdx.x < 8) rank[threadIdx.x] = -1;
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float v = lg[e];
        int r = 0;
        for (int f = 0; f < E; f += 4) { /* four logits a shared-memory load; the pad is -inf, below v or NaN */
            float4 u = *(const float4 *)(lg + f);
            r += (u.x > v || (u.x == v && f < e)) + (u.y > v || (u.y == v && f + 1 < e)) +
                 (u.z > v || (u.z == v && f + 2 < e)) + (u.w > v || (u.w == v && f + 3 < e));
        }
        if (r < k) rank[r] = e; /* unique without NaN; topk_token checks */
    }
    __syncthreads();
}

/* The fused router's logits alone (msm_cuda_router_linear_topk without its top-k): x [T, K],
 * wr [E, K] bf16; *logits [T, E] f32 in ws (msm_cuda_router_ws_bytes). 0 or a negative errno. */
int msm__router_logits(float **logits, const float *x, const uint16_t *wr, int T, int E, int K, int k, void *ws,
                       size_t ws_bytes, msm_cuda_exec ex);

#endif

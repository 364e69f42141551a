/* router.cu: the MoE routers on the device, one warp per token: softmax + top-k (Qwen2/3-MoE,
 * Mixtral) and the group-limited sigmoid router with a selection bias (GLM-4.5).
 *
 * Lane l holds logits l, l+32, ... (E <= 256: at most 8 a lane, in registers). The softmax max
 * and denominator are warp reductions; selection runs k rounds of a warp arg-max over the logits
 * (softmax is monotonic) ordered by (value descending, id ascending), which is the CPU's "highest
 * first, lowest id on ties". Weights are exp(l - max) / sum, renormalised in slot order when norm,
 * exactly as the CPU does. ids and weights never leave the device. */
#include "moe_internal.h" /* msm__moe_group_block: the fused router's grouping for the experts */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <cooperative_groups.h>
#include <errno.h>
#include <math.h>

namespace cg = cooperative_groups;

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

static __global__ void __launch_bounds__(ROUTER_WARPS * 32)
    router_topk_kernel(int32_t *ids, float *w, const float *logits, int T, int E, int k,
                       bool norm) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int t = blockIdx.x * ROUTER_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (t >= T) return;
    topk_token(ids, w, logits + (size_t)t * E, t, E, k, norm, lane);
}

/* ---- router GEMV + top-k in one launch (msm_cuda_router_linear_topk) ----
 * Logit n of token t is computed with msm_cuda_linear's arithmetic for a small N, so the logits
 * are bitwise its: BLOCK (msm_small_block): block (n, t) runs msm_small_dot (linear.cu's
 * small_gemv_kernel); else warp i of block (bx, t) computes logit bx * ROUTER_WARPS + i with
 * msm_rows_dot<1, 1, 4> and a warp sum (gemv_kernel<1, 1, 4>). Either then adds 0.0f for the
 * absent bias. Each block counts itself in on token t's counter (after a fence); the block
 * arriving last runs the top-k of topk_token over the logits and resets the counter to zero for
 * the next call or replay (router_rank_tail). */

/* The logits' padding to a multiple of 4 (-inf: never counted) and no rank yet, in the shared
 * memory rank_topk reads: by a block about to rank lg[0, E). */
static __device__ __forceinline__ void rank_pad(float *lg, int *rank, int E) {
    for (int e = E + threadIdx.x; e < (E + 3) / 4 * 4; e += blockDim.x) lg[e] = -INFINITY;
    if (threadIdx.x < 8) rank[threadIdx.x] = -1;
}

/* Token t's top-k from its E logits in shared memory (lg, padded by rank_pad) by a whole block: its
 * threads rank the logits at once (e's rank: the logits above it, or equal at a lower id:
 * topk_token's order), instead of k dependent rounds of warp arg-max; then warp 0 runs topk_token
 * with that ranking. */
static __device__ __forceinline__ void rank_topk(int32_t *ids, float *w, const float *lg, int *rank, int t, int E,
                                                 int k, bool norm) {
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
    if (threadIdx.x < 32) topk_token<true>(ids, w, lg, t, E, k, norm, threadIdx.x & 31, rank);
}

/* The routed experts' grouping a fused router leaves in their workspace (msm_cuda_router_linear_topk's
 * grp): P = T * k pairs of E experts into ws; P = 0: none. */
struct router_grp {
    moe_ws ws;
    int P, E;
};

/* The fused router's counters and logits in its workspace: a counter a token, then the grouping's
 * one (ctr[MSM_CUDA_ROUTER_FUSED_MAX_T]), padded to 16 bytes; then the logits [T, E]. */
#define ROUTER_CTRS (MSM_CUDA_ROUTER_FUSED_MAX_T + 4)

/* The fused routers' tail, by every thread of a block that has written its logits of token t
 * (grid y: the T tokens). The block ranking a token's logits last (every token's ids written)
 * then groups the pairs for the experts when g.P (msm__moe_group_block, in the shared memory the
 * ranking used), and resets the grouping's counter. */
static __device__ __forceinline__ void router_rank_tail(int32_t *ids, float *w, const float *logits, unsigned *ctr,
                                                        int t, int E, int k, bool norm, const router_grp &g) {
    __shared__ bool last;
    __shared__ __align__(16) float lg[2 * 32 * ROUTER_PER_LANE]; /* the logits, then the grouping's 2 x E ints */
    __shared__ int rank[8];
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ctr + t, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    const float *l = logits + (size_t)t * E;
    for (int e = threadIdx.x; e < E; e += blockDim.x) lg[e] = __ldcg(l + e);
    rank_pad(lg, rank, E);
    __syncthreads();
    rank_topk(ids, w, lg, rank, t, E, k, norm);
    if (threadIdx.x == 0) ctr[t] = 0;
    if (!g.P) return;
    if (threadIdx.x == 0) { /* the lane that wrote token t's ids (topk_token), after warp 0's reads of lg */
        __threadfence();
        last = atomicAdd(ctr + MSM_CUDA_ROUTER_FUSED_MAX_T, 1u) == gridDim.y - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    int *cnt = (int *)lg;
    msm__moe_group_block(g.ws, ids, g.P, g.E, cnt, cnt + 32 * ROUTER_PER_LANE);
    if (threadIdx.x == 0) ctr[MSM_CUDA_ROUTER_FUSED_MAX_T] = 0;
}

/* early (tuning gemv_early, a weight not written during the step): the PDL wait is passed after
 * the first weight loads are issued (the dots' hook), as the GEMVs do, so the router's weight
 * loads overlap the kernel before; else at once. */
template <bool VEC, bool BLOCK>
static __global__ void __launch_bounds__(MSM_SMALL_THREADS)
    router_linear_topk_kernel(int32_t *ids, float *w, float *logits, unsigned *ctr, const float *x,
                              const uint16_t *wr, int T, int E, int K, int k, bool norm, bool early, router_grp g) {
    static_assert(MSM_SMALL_THREADS == ROUTER_WARPS * 32, "one block size for both ways");
    __shared__ float part[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, t = blockIdx.y;
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    if constexpr (BLOCK) {
        int n = blockIdx.x;
        float s = msm_small_dot<VEC>(wr + (size_t)n * K, x + (size_t)t * K, K, part, msm_pdl_hook{early});
        if (threadIdx.x == 0) logits[(size_t)t * E + n] = s + 0.0f;
    } else {
        int n = blockIdx.x * ROUTER_WARPS + warp;
        if (n < E) {
            const uint16_t *rows[1] = {wr + (size_t)n * K};
            const float *xs[1] = {x + (size_t)t * K};
            float acc[1][1] = {{0.0f}};
            msm_rows_dot<1, 1, 4, VEC>(acc, rows, xs, 1, K, lane, msm_pdl_hook{early});
            float s = msm_warp_sum(acc[0][0]);
            if (lane == 0) logits[(size_t)t * E + n] = s + 0.0f;
        } else if (early) {
            msm_pdl_wait(); /* a warp past E: the tail below reads what kernels before wrote */
        }
        __syncthreads();
    }
    router_rank_tail(ids, w, logits, ctr, t, E, k, norm, g);
}

/* ---- the fused router as one thread-block cluster a token (tuning router_cluster_max_t) ----
 * router_linear_topk_kernel's BLOCK form without the logits' round trip through global memory:
 * the C = ceil(E / R) blocks of token t's cluster compute R logits each (block b: logits
 * bR .. bR + R - 1), thread i of a block holding R partials with the elements msm_small_dot's
 * thread i has, summed in its order, then warp sums and the warps in order per logit (that
 * function's arithmetic: bitwise the same logits). Each block stores its logits into block
 * rank 0's shared memory (distributed shared memory: by st.async onto rank 0's mbarrier, or stores
 * and a cluster barrier, rc_put / rc_gather); once they are all there rank 0 ranks them
 * (rank_topk) and writes ids and weights, so the fence, the counter's atomic and the last block's
 * reload from L2 leave the kernel's critical path. early: the first round's weight loads go out
 * before the PDL wait (constant weights; x and every store wait). */
#define RC_THREADS MSM_SMALL_THREADS
#define RC_MAX_CLUSTER 16 /* non-portable past 8: the H100/H200 take 16 */
#define RC_LOADS 16       /* 16-byte weight loads a thread has in flight a round */

/* Allows a cluster router kernel's clusters past 8 blocks (non-portable sizes); the largest cluster of
 * it (blocks of `threads`, smem dynamic bytes) the device can launch, up to `most` (8, the portable
 * size, if the query fails). */
template <typename Kern>
static int cluster_allow(Kern kernel, int most, int threads, size_t smem) {
    int n = 0;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)most, 1);
    cfg.blockDim = dim3((unsigned)threads);
    cfg.dynamicSmemBytes = smem;
    if (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess ||
        cudaOccupancyMaxPotentialClusterSize(&n, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 8;
    }
    return n;
}

/* A cluster router thread's round of weight loads at k0: U 16-byte loads of each of its R rows,
 * 8 x RC_THREADS columns apart (a NULL row or a column past K: zeros), all in flight at once. */
template <int R, int U>
static __device__ __forceinline__ void rc_load_round(uint4 (&wv)[R][U], const uint16_t *const *rows, int k0,
                                                     int K) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = k0 + u * 8 * RC_THREADS;
            wv[r][u] = rows[r] && kk < K ? msm_ld_stream16(rows[r] + kk) : make_uint4(0, 0, 0, 0);
        }
}

/* The cluster routers' logits into their ranking blocks (tuning router_st_async: sa). Without sa,
 * distributed stores and a cluster barrier (its release after remote stores a GPU-scope fence in
 * every block); with it, each ranking block arms its own mbarrier for its E logits' bytes before the
 * cluster's first barrier (rc_arm), the logits go by st.async completing on it (rc_put), and only
 * the ranking blocks wait, on it (rc_gather). The same values in the same places: the same bits. */
static __device__ __forceinline__ void rc_arm(uint64_t *bar, int E) {
    msm_mbar_init(bar, 1);
    msm_mbar_arm_cluster(bar, (unsigned)E * 4u);
    msm_mbar_init_fence(); /* before the cluster barrier the senders wait for */
}
static __device__ __forceinline__ void rc_put(cg::cluster_group &cl, float *lg, uint64_t *bar, unsigned to, float v,
                                              bool sa) {
    if (sa)
        msm_st_async_f32(lg, bar, to, v);
    else
        cl.map_shared_rank(lg, to)[0] = v;
}
static __device__ __forceinline__ void rc_gather(cg::cluster_group &cl, uint64_t *bar, bool ranks, bool sa) {
    if (!sa)
        cl.sync();
    else if (ranks)
        msm_mbar_wait_cluster(bar, 0);
}

/* The cluster router's body for token t = blockIdx.y, reading its row from xt (global memory, or
 * the block's shared memory after hook()). hook() runs once in every thread, after the thread's
 * first round of weight loads is issued and the PDL wait (if early), before xt is read: the fused
 * norm's (norm_router_cluster_kernel), which needs every thread to have a first round
 * (K >= 8 * RC_THREADS: norm_router_layout). */
template <int R, typename Hook>
static __device__ __forceinline__ void router_cluster_body(int32_t *ids, float *w, const float *xt,
                                                           const uint16_t *wr, int E, int K, int k, bool norm,
                                                           bool early, bool sa, Hook hook) {
    constexpr int U = RC_LOADS / R; /* loads a row a round */
    __shared__ __align__(16) float lg[32 * ROUTER_PER_LANE]; /* rank 0's: every logit of the token */
    __shared__ float part[R][RC_THREADS / 32];
    __shared__ int rank[8];
    __shared__ __align__(8) uint64_t lgbar; /* sa: rank 0's, complete once its E logits landed */
    cg::cluster_group cl = cg::this_cluster();
    int b = (int)cl.block_rank(), t = blockIdx.y, tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    if (sa && b == 0 && tid == 0) rc_arm(&lgbar, E);
    /* distributed shared memory may be written only once every block of the cluster runs: arrive
     * now, wait before the stores into rank 0 (long since passed by then) */
    auto started = cl.barrier_arrive();
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    const uint16_t *rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) rows[r] = b * R + r < E ? wr + (size_t)(b * R + r) * K : NULL;
    float acc[R];
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    for (int k0 = tid * 8; k0 < K; k0 += 8 * RC_THREADS * U) {
        uint4 wv[R][U];
        rc_load_round<R, U>(wv, rows, k0, K);
        if (k0 == tid * 8) {
            if (early) msm_pdl_wait();
            hook();
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = k0 + u * 8 * RC_THREADS;
            if (kk >= K) break;
            const float4 *xp = (const float4 *)(xt + kk);
            float4 xa = xp[0], xb = xp[1];
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = msm_fma8_bf16(wv[r][u], xa, xb, acc[r]);
        }
    }
    if (early) msm_pdl_wait(); /* a thread with no round (K < 8 * tid + 8) waits here */
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = msm_warp_sum(acc[r]);
        if (lane == 0) part[r][warp] = v;
    }
    if (b == 0) rank_pad(lg, rank, E);
    __syncthreads();
    cl.barrier_wait(std::move(started));
    if (tid < R && b * R + tid < E) {
        float tot = 0.0f;
#pragma unroll
        for (int i = 0; i < RC_THREADS / 32; i++) tot += part[tid][i];
        rc_put(cl, lg + b * R + tid, &lgbar, 0, tot + 0.0f, sa);
    }
    rc_gather(cl, &lgbar, b == 0, sa); /* every block's logits in rank 0's lg */
    if (b == 0) rank_topk(ids, w, lg, rank, t, E, k, norm);
}

template <int R>
static __global__ void __launch_bounds__(RC_THREADS)
    router_cluster_kernel(int32_t *ids, float *w, const float *x, const uint16_t *wr, int E, int K, int k,
                          bool norm, bool early, bool sa) {
    int t = blockIdx.y;
    router_cluster_body<R>(ids, w, x + (size_t)t * K, wr, E, K, k, norm, early, sa, msm_no_hook{});
}

/* Logits a block of the cluster router takes for E experts: the fewest of 1, 2, 4, 8, 16 that
 * keep the cluster within RC_MAX_CLUSTER blocks. */
static int rc_rows(int E) {
    int R = 1;
    while (R < 16 && (E + R - 1) / R > RC_MAX_CLUSTER) R *= 2;
    return R;
}

/* Whether the cluster router takes a call: T * E within one block a logit's range (msm_small_block:
 * the counter form's BLOCK logits, whose bits it has), up to router_cluster_max_t tokens, 16-byte
 * rows and x, its cluster within what the device launches. */
static bool rc_fits(int T, int E, int K, const void *wr, const void *x, const msm_cuda_tuning *tn) {
    int R = rc_rows(E);
    return T <= tn->router_cluster_max_t && msm_small_block(T, E) && K % 8 == 0 &&
           ((uintptr_t)wr | (uintptr_t)x) % 16 == 0 && (E + R - 1) / R <= tn->router_cluster_max;
}

template <int R>
static cudaError_t rc_launch(int32_t *ids, float *w, const float *x, const uint16_t *wr, int T, int E, int K, int k,
                             bool norm, bool early, msm_cuda_exec ex) {
    unsigned C = (unsigned)((E + R - 1) / R);
    return msm_launch_cluster(router_cluster_kernel<R>, dim3(C, (unsigned)T), dim3(RC_THREADS), 0, C, ex, ids, w, x,
                              wr, E, K, k, norm, early, ex.tune->router_st_async);
}

/* The launch for E's rows a block (rc_rows), the weights before the PDL wait at one token (as the
 * norm router's). */
static int rc_go(int32_t *ids, float *w, const float *x, const uint16_t *wr, int T, int E, int K, int k, bool norm,
                 msm_cuda_exec ex) {
    bool early = T == 1 && ex.tune->gemv_early && !ex.w_written;
    int R = rc_rows(E);
    cudaError_t e = R == 1   ? rc_launch<1>(ids, w, x, wr, T, E, K, k, norm, early, ex)
                    : R == 2 ? rc_launch<2>(ids, w, x, wr, T, E, K, k, norm, early, ex)
                    : R == 4 ? rc_launch<4>(ids, w, x, wr, T, E, K, k, norm, early, ex)
                    : R == 8 ? rc_launch<8>(ids, w, x, wr, T, E, K, k, norm, early, ex)
                             : rc_launch<16>(ids, w, x, wr, T, E, K, k, norm, early, ex);
    CUDA_TRY(e);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- the fused router as one cluster for TB tokens (tuning router_tcluster_max_t, _tb) ----
 * router_cluster_kernel with the cluster's R weight rows a block read once for TB tokens (a whole
 * step's at decode sizes) instead of once a token's cluster: block b of cluster y computes logits
 * bR .. bR + R - 1 of tokens yTB .. yTB + TB - 1 (fewer in the last cluster), each (logit, token)
 * in msm_small_dot's order with its warp sums and the warps in order (router_cluster_body's
 * arithmetic: the counter form's BLOCK logits, bitwise), its weight loads before the PDL wait
 * where early. Token j's logits go into the shared memory of the cluster's block j (TB <= C),
 * which ranks them after the cluster barrier: the TB tokens rank at once on TB blocks, as the
 * counter form's last blocks do, without their fence, counter atomic and reload from L2. */
template <int R, int TB>
static __global__ void __launch_bounds__(RC_THREADS)
    router_tcluster_kernel(int32_t *ids, float *w, const float *x, const uint16_t *wr, int T, int E, int K, int k,
                           bool norm, bool early, bool sa, router_grp g) {
    constexpr int U = RC_LOADS / R; /* loads a row a round */
    __shared__ __align__(16) float lg[32 * ROUTER_PER_LANE]; /* block j's: every logit of token j */
    __shared__ float part[R][TB][RC_THREADS / 32];
    __shared__ int rank[8];
    __shared__ __align__(8) uint64_t lgbar; /* sa: block j's, complete once token j's E logits landed */
    cg::cluster_group cl = cg::this_cluster();
    int b = (int)cl.block_rank(), t0 = blockIdx.y * TB, nt = min(TB, T - t0), tid = threadIdx.x, warp = tid / 32,
        lane = tid & 31;
    if (sa && b < nt && tid == 0) rc_arm(&lgbar, E);
    auto started = cl.barrier_arrive(); /* as router_cluster_body: before any distributed store */
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    const uint16_t *rows[R];
#pragma unroll
    for (int r = 0; r < R; r++) rows[r] = b * R + r < E ? wr + (size_t)(b * R + r) * K : NULL;
    float acc[R][TB];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < TB; j++) acc[r][j] = 0.0f;
    for (int k0 = tid * 8; k0 < K; k0 += 8 * RC_THREADS * U) {
        uint4 wv[R][U];
        rc_load_round<R, U>(wv, rows, k0, K);
        if (early && k0 == tid * 8) msm_pdl_wait();
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = k0 + u * 8 * RC_THREADS;
            if (kk >= K) break;
            /* every token's x loads of this step in flight at once, with no branch between them (a
             * token past the last cluster's reads the last row; its sums are never stored) */
            float4 xa[TB], xb[TB];
#pragma unroll
            for (int j = 0; j < TB; j++) {
                const float4 *xp = (const float4 *)(x + (size_t)min(t0 + j, T - 1) * K + kk);
                xa[j] = xp[0], xb[j] = xp[1];
            }
#pragma unroll
            for (int j = 0; j < TB; j++)
#pragma unroll
                for (int r = 0; r < R; r++) acc[r][j] = msm_fma8_bf16(wv[r][u], xa[j], xb[j], acc[r][j]);
        }
    }
    if (early) msm_pdl_wait(); /* a thread with no round (K < 8 * tid + 8) waits here */
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int j = 0; j < TB; j++) {
            float v = msm_warp_sum(acc[r][j]);
            if (lane == 0) part[r][j][warp] = v;
        }
    if (b < nt) rank_pad(lg, rank, E);
    __syncthreads();
    cl.barrier_wait(std::move(started));
    for (int i = tid; i < R * TB; i += RC_THREADS) {
        int r = i / TB, j = i % TB;
        if (j < nt && b * R + r < E) {
            float tot = 0.0f;
#pragma unroll
            for (int q = 0; q < RC_THREADS / 32; q++) tot += part[r][j][q];
            rc_put(cl, lg + b * R + r, &lgbar, (unsigned)j, tot + 0.0f, sa);
        }
    }
    rc_gather(cl, &lgbar, b < nt, sa); /* every token's logits in its block's lg */
    if (b < nt) rank_topk(ids, w, lg, rank, t0 + b, E, k, norm);
    if (!g.P) return;
    /* one cluster holds every token (tc_go): after the barrier (release / acquire at cluster scope,
     * so the ranking blocks' ids are visible in L2) block 0 groups the pairs for the experts */
    cl.sync();
    if (b == 0) {
        __shared__ int gc[2 * 32 * ROUTER_PER_LANE];
        msm__moe_group_block(g.ws, ids, g.P, g.E, gc, gc + 32 * ROUTER_PER_LANE);
    }
}

/* The tokens a cluster of the batched router takes for T tokens and E experts: the tuning's
 * (router_tcluster_tb), at most T (rounded up to 2, 4, 8) and the cluster's blocks (each ranks one
 * token); R x TB logits a thread at most 64 (16 rows: 4 tokens). 1: the token's own cluster
 * (router_cluster_kernel) is that form. */
static int tc_tokens(int T, int E, const msm_cuda_tuning *tn) {
    int R = rc_rows(E), C = (E + R - 1) / R, tb = 1;
    while (tb < 8 && tb < T && tb < tn->router_tcluster_tb) tb *= 2;
    while (tb > 1 && (tb > C || R * tb > 64)) tb /= 2;
    return tb;
}

/* Whether the batched cluster router takes a call: rc_fits' conditions with router_tcluster_max_t
 * for router_cluster_max_t (and its own largest cluster), 2 tokens a cluster or more, and no kernel
 * of its layer beside it on the aux stream (aux_beside: the shared expert's blocks fill SMs that a
 * cluster of 15-16 blocks waits for; Qwen1.5-MoE measured +0.01..+0.03 ms at 4-8 tokens, H100,
 * bench/results/2026-12-06-h200-s28 runs 2-3). */
static bool tc_fits(int T, int E, int K, const void *wr, const void *x, bool aux_beside, const msm_cuda_tuning *tn) {
    int R = rc_rows(E);
    return !aux_beside && T >= 2 && T <= tn->router_tcluster_max_t && msm_small_block(T, E) && K % 8 == 0 &&
           ((uintptr_t)wr | (uintptr_t)x) % 16 == 0 && (E + R - 1) / R <= tn->router_tcluster_max &&
           tc_tokens(T, E, tn) >= 2;
}

template <int R, int TB>
static cudaError_t tc_launch(int32_t *ids, float *w, const float *x, const uint16_t *wr, int T, int E, int K, int k,
                             bool norm, bool early, const router_grp &g, msm_cuda_exec ex) {
    unsigned C = (unsigned)((E + R - 1) / R);
    return msm_launch_cluster(router_tcluster_kernel<R, TB>, dim3(C, (unsigned)((T + TB - 1) / TB)), dim3(RC_THREADS),
                              0, C, ex, ids, w, x, wr, T, E, K, k, norm, early, ex.tune->router_st_async, g);
}

template <int R>
static cudaError_t tc_launch_tb(int tb, int32_t *ids, float *w, const float *x, const uint16_t *wr, int T, int E,
                                int K, int k, bool norm, bool early, const router_grp &g, msm_cuda_exec ex) {
    if constexpr (R * 8 <= 64)
        if (tb == 8) return tc_launch<R, 8>(ids, w, x, wr, T, E, K, k, norm, early, g, ex);
    return tb == 4 ? tc_launch<R, 4>(ids, w, x, wr, T, E, K, k, norm, early, g, ex)
                   : tc_launch<R, 2>(ids, w, x, wr, T, E, K, k, norm, early, g, ex);
}

/* The batched router's launch (tc_fits), its weights before the PDL wait where gemv_early and no
 * kernel of the step writes them; with g.P (grouping for the experts, taken only where one cluster
 * holds every token: msm_cuda_router_linear_topk) its block 0 groups the pairs after the ranking. */
static int tc_go(int32_t *ids, float *w, const float *x, const uint16_t *wr, int T, int E, int K, int k, bool norm,
                 const router_grp &g, msm_cuda_exec ex) {
    bool early = ex.tune->gemv_early && !ex.w_written;
    int R = rc_rows(E), tb = tc_tokens(T, E, ex.tune);
    cudaError_t e = R == 1   ? tc_launch_tb<1>(tb, ids, w, x, wr, T, E, K, k, norm, early, g, ex)
                    : R == 2 ? tc_launch_tb<2>(tb, ids, w, x, wr, T, E, K, k, norm, early, g, ex)
                    : R == 4 ? tc_launch_tb<4>(tb, ids, w, x, wr, T, E, K, k, norm, early, g, ex)
                    : R == 8 ? tc_launch_tb<8>(tb, ids, w, x, wr, T, E, K, k, norm, early, g, ex)
                             : tc_launch_tb<16>(tb, ids, w, x, wr, T, E, K, k, norm, early, g, ex);
    CUDA_TRY(e);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* tc_allow: rc_allow for router_tcluster_kernel<R, TB> */
template <int R, int TB>
static int tc_allow(void) {
    return cluster_allow(router_tcluster_kernel<R, TB>, RC_MAX_CLUSTER, RC_THREADS, 0);
}

/* Allows router_cluster_kernel<R>'s clusters past 8 blocks (non-portable sizes); the largest cluster
 * of it the device can launch (8, the portable size, if the query fails). */
template <int R>
static int rc_allow(void) {
    return cluster_allow(router_cluster_kernel<R>, RC_MAX_CLUSTER, RC_THREADS, 0);
}

template <int R, int V>
static int nrc_allow(void);

void msm__router_tuning(msm_cuda_tuning *t) {
    const int n[] = {RC_MAX_CLUSTER, rc_allow<1>(), rc_allow<2>(), rc_allow<4>(), rc_allow<8>(), rc_allow<16>()};
    /* the fused norm's cluster router (its row in shared memory, up to K 4096's): its own limit */
    const int f[] = {nrc_allow<1, 4>(),  nrc_allow<2, 4>(),  nrc_allow<4, 4>(),  nrc_allow<8, 4>(),  nrc_allow<16, 4>(),
                     nrc_allow<1, 8>(),  nrc_allow<2, 8>(),  nrc_allow<4, 8>(),  nrc_allow<8, 8>(),  nrc_allow<16, 8>(),
                     nrc_allow<1, 16>(), nrc_allow<2, 16>(), nrc_allow<4, 16>(), nrc_allow<8, 16>(), nrc_allow<16, 16>()};
    int m2 = RC_MAX_CLUSTER;
    for (size_t i = 0; i < sizeof f / sizeof *f; i++) m2 = f[i] < m2 ? f[i] : m2;
    t->norm_router_cluster_max = m2;
    /* the batched form (router_tcluster_kernel): its own */
    const int c[] = {tc_allow<1, 2>(),  tc_allow<1, 4>(), tc_allow<1, 8>(), tc_allow<2, 2>(), tc_allow<2, 4>(),
                     tc_allow<2, 8>(),  tc_allow<4, 2>(), tc_allow<4, 4>(), tc_allow<4, 8>(), tc_allow<8, 2>(),
                     tc_allow<8, 4>(),  tc_allow<8, 8>(), tc_allow<16, 2>(), tc_allow<16, 4>()};
    int m3 = RC_MAX_CLUSTER;
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) m3 = c[i] < m3 ? c[i] : m3;
    t->router_tcluster_max = m3;
    int m = n[0];
    for (size_t i = 1; i < sizeof n / sizeof *n; i++) m = n[i] < m ? n[i] : m;
    t->router_cluster_max = m;
}

/* ---- ADD_RMSNORM + the fused router in one launch (msm_cuda_norm_router_linear_topk) ----
 * router_linear_topk_kernel with the residual add + RMSNorm of its token's row done by every block
 * itself (msm_block_norm_row: msm_cuda_add_rmsnorm's bits, the block's 128 threads playing the norm
 * kernel's 256 virtual threads, F = 2 each) into shared memory, as the rows-dot hook: after the block's
 * first weight loads are issued (before the PDL wait when early), so the norm's one-block kernel
 * and one kernel boundary leave the step and the norm overlaps the weight loads. The logits are
 * the same products of the same values in the same order (x read from shared memory), so ids and
 * weights are bitwise the two kernels'; block (0, t) also writes row t's residual sum and norm for
 * their other readers (the experts, the next residual add). Decode-sized T (every block norms its
 * token's row). */
/* The fused router's norm: token row `off` of a + b, normed (msm_block_norm_row: the norm kernel's
 * bits, MSM_SMALL_THREADS threads playing its vt virtual ones, F each) into the block's shared xn;
 * the block of grid x 0 also writes the residual sum and the norm. Run once by every thread of the
 * block (a rows-dot hook), after the PDL wait when wait. */
template <int V, int F>
struct router_norm_hook {
    const float *a, *b;
    const uint16_t *nw;
    float *sum, *out, *xn;
    size_t off;
    int K, vt;
    float eps;
    float *part;
    bool wait;
    __device__ __forceinline__ void operator()() const {
        if (wait) msm_pdl_wait();
        float wv[F][V]; /* the norm weights, L2 hits of every block */
        msm_block_norm_w<V, F, MSM_SMALL_THREADS>(nw, K, vt, wv);
        bool wr0 = blockIdx.x == 0;
        msm_block_norm_row<V, F, MSM_SMALL_THREADS>([&](int i) { return a[off + i] + b[off + i]; },
                                                    [&](int i, float v, float o) {
                                                        xn[i] = o;
                                                        if (wr0) sum[off + i] = v, out[off + i] = o;
                                                    },
                                                    wv, K, eps, vt, part);
        __syncthreads(); /* the whole row in shared memory before any thread reads it */
    }
};

template <bool BLOCK, int V, int F>
static __global__ void __launch_bounds__(MSM_SMALL_THREADS)
    norm_router_kernel(int32_t *ids, float *w, float *logits, unsigned *ctr, const float *a, const float *b,
                       const uint16_t *nw, float *sum, float *out, float eps, int vt, const uint16_t *wr, int T,
                       int E, int K, int k, bool norm, bool early, router_grp g) {
    extern __shared__ __align__(16) float xn[]; /* [K]: token t's normed row */
    __shared__ float part[32];
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, t = blockIdx.y;
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    router_norm_hook<V, F> hook{a, b, nw, sum, out, xn, (size_t)t * K, K, vt, eps, part, early};
    if constexpr (BLOCK) {
        int n = blockIdx.x;
        float s = msm_small_dot<true>(wr + (size_t)n * K, xn, K, part, hook);
        if (threadIdx.x == 0) logits[(size_t)t * E + n] = s + 0.0f;
    } else { /* a warp past E runs the loop with a NULL row (no loads) so every thread reaches the norm */
        int n = blockIdx.x * ROUTER_WARPS + warp;
        const uint16_t *rows[1] = {n < E ? wr + (size_t)n * K : NULL};
        const float *xs[1] = {xn};
        float acc[1][1] = {{0.0f}};
        msm_rows_dot<1, 1, 4, true>(acc, rows, xs, 1, K, lane, hook);
        float s = msm_warp_sum(acc[0][0]);
        if (lane == 0 && n < E) logits[(size_t)t * E + n] = s + 0.0f;
        __syncthreads();
    }
    router_rank_tail(ids, w, logits, ctr, t, E, k, norm, g);
}

extern "C" size_t msm_cuda_router_ws_bytes(int T, int E) {
    return ROUTER_CTRS * sizeof(unsigned) + (size_t)T * E * sizeof(float);
}

extern "C" bool msm_cuda_router_groups(const msm_cuda_moe_args *m, const msm_cuda_tuning *tn) {
    return tn->router_group && m->T >= 1 && m->T <= MSM_CUDA_ROUTER_FUSED_MAX_T && msm_cuda_moe_groups(m, tn);
}

extern "C" bool msm_cuda_router_batched(int T, int E, int K, bool aux_beside, const msm_cuda_tuning *tn) {
    return T >= 1 && E >= 1 && E <= 32 * ROUTER_PER_LANE && T <= MSM_CUDA_ROUTER_FUSED_MAX_T && T <= 65535 &&
           !rc_fits(T, E, K, NULL, NULL, tn) && tc_fits(T, E, K, NULL, NULL, aux_beside, tn);
}

/* grp's grouping as the kernels take it (g->P = 0 without grp); -EINVAL where grp is not the
 * experts reading these ids or the router does not group for them (msm_cuda_router_groups). */
static int router_grp_of(const msm_cuda_moe_args *grp, const int32_t *ids, int T, int E, int k,
                         const msm_cuda_tuning *tn, router_grp *g) {
    *g = router_grp{};
    if (!grp) return 0;
    if (grp->ids != ids || grp->T != T || grp->k != k || grp->E != E || !msm_cuda_router_groups(grp, tn) ||
        !grp->ws || (uintptr_t)grp->ws % 256 || grp->ws_bytes < msm_cuda_moe_experts_ws_bytes(T, grp->H, grp->I, k, E))
        return -EINVAL;
    msm__moe_ws_layout(T, grp->H, grp->I, k, E, (char *)grp->ws, &g->ws);
    g->P = T * k;
    g->E = E;
    return 0;
}

extern "C" int msm_cuda_router_linear_topk(int32_t *ids, float *w, const float *x, const uint16_t *wr, int T, int E,
                                           int K, int k, bool norm, const msm_cuda_moe_args *grp, void *ws,
                                           size_t ws_bytes, msm_cuda_exec ex) {
    if (T < 0 || E <= 0 || E > 32 * ROUTER_PER_LANE || K <= 0 || k <= 0 || k > 8 || k > E) return -EINVAL;
    router_grp g;
    if (router_grp_of(grp, ids, T, E, k, ex.tune, &g)) return -EINVAL;
    if (T == 0) return 0;
    if (!ws || ws_bytes < msm_cuda_router_ws_bytes(T, E) || (uintptr_t)ws % 16) return -EINVAL;
    unsigned *ctr = (unsigned *)ws;
    float *logits = (float *)((char *)ws + ROUTER_CTRS * sizeof(unsigned));
    if (T > MSM_CUDA_ROUTER_FUSED_MAX_T || T > 65535) { /* the pair, through the same logits buffer */
        int r = msm_cuda_linear(logits, x, wr, NULL, T, E, K, NULL, NULL, 0, ex);
        return r ? r : msm_cuda_router_topk(ids, w, logits, T, E, k, norm, ex);
    }
    bool vec = K % 8 == 0 && ((uintptr_t)wr | (uintptr_t)x) % 16 == 0, blk = msm_small_block(T, E);
    if (!g.P && rc_fits(T, E, K, wr, x, ex.tune)) return rc_go(ids, w, x, wr, T, E, K, k, norm, ex);
    if (tc_fits(T, E, K, wr, x, ex.aux_beside, ex.tune) && (!g.P || tc_tokens(T, E, ex.tune) >= T))
        return tc_go(ids, w, x, wr, T, E, K, k, norm, g, ex);
    dim3 grid(blk ? (unsigned)E : (unsigned)((E + ROUTER_WARPS - 1) / ROUTER_WARPS), (unsigned)T), block(MSM_SMALL_THREADS);
    bool early = ex.tune->gemv_early && !ex.w_written;
#define ROUTER_GO(V, B) \
    CUDA_TRY(msm_launch(router_linear_topk_kernel<V, B>, grid, block, 0, ex, ids, w, logits, ctr, x, wr, T, E, K, k, norm, \
                        early, g))
    if (vec && blk) ROUTER_GO(true, true);
    else if (vec) ROUTER_GO(true, false);
    else if (blk) ROUTER_GO(false, true);
    else ROUTER_GO(false, false);
#undef ROUTER_GO
    return 0;
}

/* The norm layouts the fused kernel has: vt = 256 threads of V values (msm_norm_threads /
 * msm_norm_vals of K, 1024 <= K <= 4096), played by its 128 threads two each. K >= 8 * 128 also
 * gives every thread of a block (and every lane of a warp) a first round of weight loads, so all of
 * them reach the norm's barriers (the hook) at the same instruction: __syncthreads is bar.sync,
 * which a warp must not reach diverged. */
static bool norm_router_layout(int K, int *vt, int *V) {
    *vt = msm_norm_threads(K), *V = msm_norm_vals(K, *vt);
    return K >= 8 * MSM_SMALL_THREADS && *vt == 256 && (*V == 4 || *V == 8 || *V == 16);
}

/* ---- ADD_RMSNORM + the cluster router in one launch (msm_cuda_norm_router_linear_topk where the
 * cluster router takes the call: one token by default, tuning router_cluster_max_t) ----
 * router_cluster_kernel with norm_router_kernel's norm: every block of token t's cluster norms the
 * row into shared memory (msm_block_norm_row, the norm kernel's bits, F = 2 virtual threads a
 * thread) after its first round of weight loads, and reads x from there; block rank 0 also writes
 * the residual sum and the norm. The same logits from the same values, so ids and weights are
 * bitwise the two kernels' (the norm, then router_cluster_kernel). The norm kernel's launch and its
 * kernel boundary leave the router's chain (Qwen1.5-MoE batch 1: the norm 3 us, then the router 7.3
 * us after it, bench/results/2026-12-05-h200-s17 run 1); a layer whose shared expert forks before
 * the norm (pass fork_before_norm) has the norm right before its router. */
template <int R, int V, int F>
static __global__ void __launch_bounds__(RC_THREADS)
    norm_router_cluster_kernel(int32_t *ids, float *w, const float *a, const float *b, const uint16_t *nw,
                               float *sum, float *out, float eps, int vt, const uint16_t *wr, int E, int K, int k,
                               bool norm, bool early, bool sa) {
    extern __shared__ __align__(16) float xn[]; /* [K]: token t's normed row */
    __shared__ float npart[32];
    /* grid x 0 is cluster rank 0 (the cluster spans the grid's x); the body waits before the hook */
    router_cluster_body<R>(ids, w, xn, wr, E, K, k, norm, early, sa,
                           router_norm_hook<V, F>{a, b, nw, sum, out, xn, (size_t)blockIdx.y * K, K, vt, eps, npart,
                                                  false});
}

/* rc_allow for norm_router_cluster_kernel<R, V, 2> (its row of up to 4096 floats in dynamic shared memory) */
template <int R, int V>
static int nrc_allow(void) {
    return cluster_allow(norm_router_cluster_kernel<R, V, 2>, RC_MAX_CLUSTER, RC_THREADS, 4096 * sizeof(float));
}

template <int R, int V>
static cudaError_t nrc_launch(int32_t *ids, float *w, const float *a, const float *b, const uint16_t *nw, float *sum,
                              float *out, float eps, int vt, const uint16_t *wr, int T, int E, int K, int k,
                              bool norm, bool early, msm_cuda_exec ex) {
    unsigned C = (unsigned)((E + R - 1) / R);
    return msm_launch_cluster(norm_router_cluster_kernel<R, V, 2>, dim3(C, (unsigned)T), dim3(RC_THREADS),
                              (size_t)K * sizeof(float), C, ex, ids, w, a, b, nw, sum, out, eps, vt, wr, E, K, k, norm,
                              early, ex.tune->router_st_async);
}

template <int V>
static cudaError_t nrc_go(int32_t *ids, float *w, const float *a, const float *b, const uint16_t *nw, float *sum,
                          float *out, float eps, int vt, const uint16_t *wr, int T, int E, int K, int k, bool norm,
                          msm_cuda_exec ex) {
    bool early = T == 1 && ex.tune->gemv_early && !ex.w_written; /* as rc_go */
    int R = rc_rows(E);
#define NRC(R_) nrc_launch<R_, V>(ids, w, a, b, nw, sum, out, eps, vt, wr, T, E, K, k, norm, early, ex)
    return R == 1 ? NRC(1) : R == 2 ? NRC(2) : R == 4 ? NRC(4) : R == 8 ? NRC(8) : NRC(16);
#undef NRC
}

extern "C" bool msm_cuda_norm_router_fits(int T, int E, int K, const msm_cuda_tuning *tn) {
    int vt, V;
    return tn->norm_router && T >= 1 && T <= tn->norm_router_max_t && T <= MSM_CUDA_ROUTER_FUSED_MAX_T && E >= 1 &&
           E <= 32 * ROUTER_PER_LANE && K % 8 == 0 && (size_t)K * sizeof(float) <= (48u << 10) &&
           norm_router_layout(K, &vt, &V);
}

template <int V, int F>
static cudaError_t norm_router_go(dim3 grid, bool blk, int32_t *ids, float *w, float *logits, unsigned *ctr,
                                  const float *a, const float *b, const uint16_t *nw, float *sum, float *out,
                                  float eps, int vt, const uint16_t *wr, int T, int E, int K, int k, bool norm,
                                  const router_grp &g, msm_cuda_exec ex) {
    /* the router weights before the PDL wait at one token (their loads overlap the kernel before;
     * at 8 tokens early router loads measured slower, bench/results/2026-12-02-h200-s2 run 3) */
    bool early = T == 1 && ex.tune->gemv_early;
    size_t shm = (size_t)K * sizeof(float);
    if (blk)
        return msm_launch(norm_router_kernel<true, V, F>, grid, dim3(MSM_SMALL_THREADS), shm, ex, ids, w, logits,
                          ctr, a, b, nw, sum, out, eps, vt, wr, T, E, K, k, norm, early, g);
    return msm_launch(norm_router_kernel<false, V, F>, grid, dim3(MSM_SMALL_THREADS), shm, ex, ids, w, logits, ctr,
                      a, b, nw, sum, out, eps, vt, wr, T, E, K, k, norm, early, g);
}

extern "C" int msm_cuda_norm_router_linear_topk(int32_t *ids, float *w, float *sum, float *out, const float *a,
                                                const float *b, const uint16_t *nw, float eps, const uint16_t *wr,
                                                int T, int E, int K, int k, bool norm, const msm_cuda_moe_args *grp,
                                                void *ws, size_t ws_bytes, msm_cuda_exec ex) {
    router_grp g;
    if (!sum || !out || !a || !b || !nw || !wr || E <= 0 || E > 32 * ROUTER_PER_LANE || k <= 0 || k > 8 || k > E ||
        !msm_cuda_norm_router_fits(T, E, K, ex.tune) || router_grp_of(grp, ids, T, E, k, ex.tune, &g))
        return -EINVAL;
    if (!ws || ws_bytes < msm_cuda_router_ws_bytes(T, E) || (uintptr_t)ws % 16) return -EINVAL;
    if ((uintptr_t)wr % 16) { /* no vector loads: the two kernels */
        int r = msm_cuda_add_rmsnorm(sum, out, a, b, nw, T, K, eps, ex);
        return r ? r : msm_cuda_router_linear_topk(ids, w, out, wr, T, E, K, k, norm, grp, ws, ws_bytes, ex);
    }
    int vt, V;
    norm_router_layout(K, &vt, &V);
    if (!g.P && rc_fits(T, E, K, wr, wr, ex.tune) &&
        (E + rc_rows(E) - 1) / rc_rows(E) <= ex.tune->norm_router_cluster_max) {
        /* one cluster a token, every block norming the row */
        cudaError_t e = V == 4   ? nrc_go<4>(ids, w, a, b, nw, sum, out, eps, vt, wr, T, E, K, k, norm, ex)
                        : V == 8 ? nrc_go<8>(ids, w, a, b, nw, sum, out, eps, vt, wr, T, E, K, k, norm, ex)
                                 : nrc_go<16>(ids, w, a, b, nw, sum, out, eps, vt, wr, T, E, K, k, norm, ex);
        CUDA_TRY(e);
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    unsigned *ctr = (unsigned *)ws;
    float *logits = (float *)((char *)ws + ROUTER_CTRS * sizeof(unsigned));
    bool blk = msm_small_block(T, E);
    dim3 grid(blk ? (unsigned)E : (unsigned)((E + ROUTER_WARPS - 1) / ROUTER_WARPS), (unsigned)T);
#define NR(V_, F_) \
    norm_router_go<V_, F_>(grid, blk, ids, w, logits, ctr, a, b, nw, sum, out, eps, vt, wr, T, E, K, k, norm, g, ex)
    cudaError_t e = V == 4 ? NR(4, 2) : V == 8 ? NR(8, 2) : NR(16, 2);
#undef NR
    CUDA_TRY(e);
    CUDA_LAUNCH_CHECK();
    return 0;
}

extern "C" int msm_cuda_router_topk(int32_t *ids, float *w, const float *logits, int T, int E,
                                    int k, bool norm, msm_cuda_exec ex) {
    if (T < 0 || E <= 0 || E > 32 * ROUTER_PER_LANE || k <= 0 || k > 8 || k > E) return -EINVAL;
    if (T == 0) return 0;
    unsigned blocks = (unsigned)((T + ROUTER_WARPS - 1) / ROUTER_WARPS);
    CUDA_TRY(msm_launch(router_topk_kernel, dim3(blocks), dim3(ROUTER_WARPS * 32), 0, ex, ids, w, logits, T, E, k, norm));
    return 0;
}

/* ---- group-limited sigmoid router (msm_cpu_router_group_topk's twin) ----
 * Lane l holds experts l, l+32, ...: their sigmoid scores s and choice scores c = s + bias, in
 * registers. A group's score is the sum of its two highest c: each lane keeps the top 2 of its own
 * experts of the group, and a butterfly merges the pairs (exact: the same two values the CPU finds,
 * added once, on every lane). Lane g keeps group g's score; topk_group rounds of a warp arg-max
 * over those lanes (value descending, group ascending) pick the kept groups, which is the CPU's
 * rank rule. The other groups' experts get -inf, then k rounds of the arg-max above pick the
 * experts, each winner's s travelling with it. Weights: s, / (their sum in slot order + 1e-20)
 * when norm, * scale: the CPU's sequence of float operations, so only expf may differ (CUDA's is
 * within 2 ulp, the C library's within 1), and with it a selection at a near-tie. The warp
 * algorithm was checked bitwise against the CPU rule in a lane-by-lane simulation (exact ties,
 * 1 to 32 groups). */
#define ROUTER_MAX_GROUPS 32 /* group scores live one per lane */

/* Merges this lane's top-2 pair (a1 >= a2) with every other lane's: the warp's top 2. */
static __device__ __forceinline__ void warp_top2(float &a1, float &a2) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        float b1 = __shfl_xor_sync(MSM_FULL_MASK, a1, o), b2 = __shfl_xor_sync(MSM_FULL_MASK, a2, o);
        float n2 = a1 >= b1 ? fmaxf(a2, b1) : fmaxf(a1, b2);
        a1 = fmaxf(a1, b1);
        a2 = n2;
    }
}

static __global__ void __launch_bounds__(ROUTER_WARPS * 32)
    router_group_topk_kernel(int32_t *ids, float *w, const float *logits, const float *bias, int T,
                             int E, int k, int n_group, int topk_group, bool norm, float scale) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int t = blockIdx.x * ROUTER_WARPS + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (t >= T) return;
    const float *l = logits + (size_t)t * E;
    int per = E / n_group;
    float s[ROUTER_PER_LANE], c[ROUTER_PER_LANE];
    int grp[ROUTER_PER_LANE]; /* the group of this lane's element i; -1 past E */
#pragma unroll
    for (int i = 0; i < ROUTER_PER_LANE; i++) {
        int e = i * 32 + lane;
        s[i] = e < E ? 1.0f / (1.0f + expf(-l[e])) : 0.0f;
        c[i] = e < E ? s[i] + bias[e] : -INFINITY;
        grp[i] = e < E ? e / per : -1;
    }

    unsigned kept = 0xffffffffu; /* bit g: group g kept */
    if (topk_group < n_group) {
        float gs = -INFINITY; /* lane g: group g's score */
        for (int g = 0; g < n_group; g++) {
            float a1 = -INFINITY, a2 = -INFINITY;
#pragma unroll
            for (int i = 0; i < ROUTER_PER_LANE; i++) {
                if (grp[i] == g) {
                    if (c[i] > a1) a2 = a1, a1 = c[i];
                    else if (c[i] > a2) a2 = c[i];
                }
            }
            warp_top2(a1, a2);
            if (lane == g) gs = a1 + a2;
        }
        kept = 0;
        for (int j = 0; j < topk_group; j++) {
            bool cand = lane < n_group && !(kept >> lane & 1u);
            float bv = cand ? gs : -INFINITY, unused = 0.0f;
            int bi = cand ? lane : NO_ID;
            warp_argmax<false>(bv, bi, unused);
            kept |= 1u << bi;
        }
#pragma unroll
        for (int i = 0; i < ROUTER_PER_LANE; i++)
            if (grp[i] >= 0 && !(kept >> grp[i] & 1u)) c[i] = -INFINITY;
    }

    unsigned taken = 0; /* bit i: this lane's element i already selected */
    float wt[8];
    int id[8];
#pragma unroll
    for (int j = 0; j < 8; j++) { /* unrolled so wt/id stay in registers */
        if (j >= k) break;
        float bv;
        id[j] = select_next<true>(c, s, taken, E, lane, bv, wt[j]); /* the choice by c, the weight s */
    }
    float den = 1.0f;
    if (norm) {
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (j < k) sum += wt[j];
        den = sum + 1e-20f;
    }
    if (lane == 0) {
#pragma unroll
        for (int j = 0; j < 8; j++) {
            if (j >= k) break;
            ids[(size_t)t * k + j] = id[j];
            w[(size_t)t * k + j] = (norm ? wt[j] / den : wt[j]) * scale;
        }
    }
}

extern "C" int msm_cuda_router_group_topk(int32_t *ids, float *w, const float *logits,
                                          const float *bias, int T, int E, int k, int n_group,
                                          int topk_group, bool norm, float scale, msm_cuda_exec ex) {
    if (T < 0 || E <= 0 || E > 32 * ROUTER_PER_LANE || k <= 0 || k > 8 || n_group <= 0 ||
        n_group > ROUTER_MAX_GROUPS || E % n_group || E / n_group < 2 || topk_group <= 0 ||
        topk_group > n_group || k > topk_group * (E / n_group) || !bias)
        return -EINVAL;
    if (T == 0) return 0;
    unsigned blocks = (unsigned)((T + ROUTER_WARPS - 1) / ROUTER_WARPS);
    CUDA_TRY(msm_launch(router_group_topk_kernel, dim3(blocks), dim3(ROUTER_WARPS * 32), 0, ex, ids, w,
                        logits, bias, T, E, k, n_group, topk_group, norm, scale));
    return 0;
}

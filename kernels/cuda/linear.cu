/* linear.cu: y = x . W^T (+ b) with bf16 weights, and the per-rank CUDA context.
 *
 * Decode (T <= MSM_CUDA_GEMV_MAX_T) is memory-bound on the weights: the GEMV kernel gives each
 * warp R rows of W, streams them with 16-byte loads that bypass L1 (several in flight per lane),
 * and multiplies every weight it reads with all T token rows, so W crosses the memory bus once per
 * step. Math is fp32 on the exact bf16 values, like the CPU oracle.
 *
 * Prefill and large batches go to cuBLASLt: for prefill chunks (T >= 65) x is split into bf16 hi +
 * lo in the caller's workspace, then two bf16 x bf16 -> fp32 "TN" matmuls (fp32 compute) write y
 * (the second adds into it), so the result is close to the fp32 product; for decode batches x is
 * rounded to bf16 and one matmul reads the weights once (see lt_split_min_t).
 * Small outputs (N <= MSM_CUDA_GEMV_SMALL_N: the MoE routers, whose top-k must not flip on
 * rounding) always take the fp32 GEMV. The matmuls write y directly (column-major y^T [N,T] is
 * row-major y [T,N]). Layouts, the matmul descriptor and the heuristic's algorithm are built once
 * per (shape, pointer alignment) and cached in the context, so a launch only enqueues. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"
#include "qk_rope.h"

#include <cooperative_groups.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

namespace cg = cooperative_groups;

/* cuBLASLt workspace carved from the caller's ws after the bf16 copy of x. */
#define LT_WS_BYTES ((size_t)32 << 20)
#define MAX_PLANS 128

typedef struct lt_plan {
    int T, N, K;
    unsigned align_a, align_d; /* pointer alignment the algorithm was chosen for */
    cublasLtMatmulDesc_t op;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
} lt_plan;

struct msm_cuda_ctx {
    int device;
    cublasLtHandle_t lt;
    int n_plans, next_evict;
    lt_plan plans[MAX_PLANS];
};

static void plan_done(lt_plan *p) {
    if (p->la) cublasLtMatrixLayoutDestroy(p->la);
    if (p->lb) cublasLtMatrixLayoutDestroy(p->lb);
    if (p->ld) cublasLtMatrixLayoutDestroy(p->ld);
    if (p->op) cublasLtMatmulDescDestroy(p->op);
    memset(p, 0, sizeof(*p));
}

extern "C" void msm_cuda_ctx_free(msm_cuda_ctx *ctx) {
    if (!ctx) return;
    for (int i = 0; i < ctx->n_plans; i++) plan_done(&ctx->plans[i]);
    if (ctx->lt) cublasLtDestroy(ctx->lt);
    free(ctx);
}

static int ctx_init(msm_cuda_ctx *ctx) {
    CUDA_TRY(cudaGetDevice(&ctx->device));
    CUBLAS_TRY(cublasLtCreate(&ctx->lt));
    return 0;
}

extern "C" int msm_cuda_ctx_new(msm_cuda_ctx **ret_ctx) {
    msm_cuda_ctx *ctx = (msm_cuda_ctx *)calloc(1, sizeof(*ctx));
    if (!ctx) return -ENOMEM;
    int r = ctx_init(ctx);
    if (r < 0) {
        msm_cuda_ctx_free(ctx);
        return r;
    }
    *ret_ctx = ctx;
    return 0;
}

static unsigned ptr_align(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 256;
    while (al > 1 && a % al) al >>= 1;
    return al;
}

static int plan_build(msm_cuda_ctx *ctx, lt_plan *p, int T, int N, int K, unsigned align_a,
                      unsigned align_d) {
    p->T = T, p->N = N, p->K = K, p->align_a = align_a, p->align_d = align_d;
    cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
    CUBLAS_TRY(cublasLtMatmulDescCreate(&p->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
    CUBLAS_TRY(cublasLtMatmulDescSetAttribute(p->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
    /* A = W as column-major [K,N] (op T -> [N,K]); B = x as column-major [K,T]; D = [N,T]. */
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, K, N, K));
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, K, T, K));
    CUBLAS_TRY(cublasLtMatrixLayoutCreate(&p->ld, CUDA_R_32F, N, T, N));
    cublasLtMatmulPreference_t pref;
    CUBLAS_TRY(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = LT_WS_BYTES;
    uint32_t ab = 256;
    int r = 0;
    cublasStatus_t st;
    if ((st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                   &ws, sizeof(ws))) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                                                   &align_a, sizeof(align_a))) !=
            CUBLAS_STATUS_SUCCESS ||
        (st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                                                   &ab, sizeof(ab))) != CUBLAS_STATUS_SUCCESS ||
        (st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                                                   &align_d, sizeof(align_d))) !=
            CUBLAS_STATUS_SUCCESS ||
        (st = cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                                                   &align_d, sizeof(align_d))) !=
            CUBLAS_STATUS_SUCCESS) {
        r = msm__cublas_fail("cublasLtMatmulPreferenceSetAttribute", __FILE__, __LINE__, st);
    } else {
        cublasLtMatmulHeuristicResult_t res;
        int n = 0;
        st = cublasLtMatmulAlgoGetHeuristic(ctx->lt, p->op, p->la, p->lb, p->ld, p->ld, pref, 1,
                                            &res, &n);
        if (st != CUBLAS_STATUS_SUCCESS)
            r = msm__cublas_fail("cublasLtMatmulAlgoGetHeuristic", __FILE__, __LINE__, st);
        else if (n < 1)
            r = msm__cublas_fail("cublasLtMatmulAlgoGetHeuristic (no algorithm)", __FILE__,
                                 __LINE__, CUBLAS_STATUS_NOT_SUPPORTED);
        else
            p->algo = res.algo;
    }
    cublasLtMatmulPreferenceDestroy(pref);
    return r;
}

static int plan_get(msm_cuda_ctx *ctx, int T, int N, int K, unsigned align_a, unsigned align_d,
                    lt_plan **ret) {
    for (int i = 0; i < ctx->n_plans; i++) {
        lt_plan *p = &ctx->plans[i];
        if (p->T == T && p->N == N && p->K == K && p->align_a == align_a &&
            p->align_d == align_d) {
            *ret = p;
            return 0;
        }
    }
    lt_plan *p;
    if (ctx->n_plans < MAX_PLANS) {
        p = &ctx->plans[ctx->n_plans++];
    } else { /* full: recycle round-robin (a workload has far fewer shapes than this) */
        p = &ctx->plans[ctx->next_evict];
        ctx->next_evict = (ctx->next_evict + 1) % MAX_PLANS;
        plan_done(p);
    }
    int r = plan_build(ctx, p, T, N, K, align_a, align_d);
    if (r < 0) {
        plan_done(p); /* leaves a zero key that never matches a real shape */
        return r;
    }
    *ret = p;
    return 0;
}

extern "C" int msm_cuda_linear_prepare(msm_cuda_ctx *ctx, int T, int N, int K) {
    if (!ctx || T <= 0 || N <= 0 || K <= 0) return -EINVAL;
    if (T <= MSM_CUDA_GEMV_MAX_T || N <= MSM_CUDA_GEMV_SMALL_N) return 0;
    lt_plan *p;
    return plan_get(ctx, T, N, K, 256, 256, &p);
}

/* ---- GEMV ---- */

#define GEMV_WARPS 4
/* blocks an SM the gemv_minb kernels are compiled for (msm_cuda_tuning.gemv_minb): 40 registers.
 * The other kernels' MINB is 0, no floor: __launch_bounds__(n, 1) is not the same as (n) to ptxas,
 * which then took more registers (the MMV at 4 token tiles 176 -> 209, the FP8 GEMV at 4 tokens 76
 * -> 83; CUDA 13, 2026-12-04), fewer blocks an SM for nothing. */
#define GEMV_MINB 12

/* Warp (blockIdx.x, warp) owns rows n0..n0+R-1; blockIdx.y the token chunk t0..t0+NT-1. */
/* U: 16-byte weight loads in flight per lane per row (R * U per lane in all). FP8: w holds e4m3
 * codes and wsc their block scales (msm_rows_dot_fp8); else w is bf16 and wsc unused. early: the
 * first step's weight loads go out before the PDL wait (msm_cuda_tuning.gemv_early; never for a
 * weight written during the step, msm_cuda_exec.w_written). */
/* gemv_rows_at: the same for rows n0..n0+R-1 chosen by the caller, each result handed to
 * put(t, n, v) on every lane of the warp (v = the row's sum + bias, the same on every lane). */
template <int NT, int R, int U, bool VEC, bool FP8, bool HW, bool PIPE, typename Put, typename Hook = msm_pdl_hook>
static __device__ __forceinline__ void gemv_rows_at(int n0, Put put, const float *x, const void *w, const float *wsc,
                                                    int ph, const uint16_t *bias, int T, int N, int K, bool prefetch,
                                                    bool early, Hook hook = Hook()) {
    int lane = threadIdx.x & 31;
    int t0 = blockIdx.y * NT;
    msm_pdl_trigger();
    /* With prefetch (MSM_CUDA_GEMV_PREFETCH=1; off by default, slower at batch 1), pull this
     * warp's weight rows towards L2 until the previous kernel is done (PDL): weights are never
     * written during a step. The rows of one warp are contiguous. */
    if (prefetch && n0 < N) {
        const char *wb = (const char *)msm_wrow<FP8>(w, 0, n0, K);
        size_t bytes = (size_t)min(R, N - n0) * K * (FP8 ? 1 : 2);
        for (size_t o = (size_t)lane * 128; o < bytes; o += 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(wb + o));
    }
    if (!early) msm_pdl_wait();
    if (n0 >= N) return;
    int nt = min(NT, T - t0);
    const void *wr[R];
    const float *sr[R];
    const float *xs[NT];
#pragma unroll
    for (int r = 0; r < R; r++) {
        wr[r] = n0 + r < N ? msm_wrow<FP8>(w, 0, n0 + r, K) : NULL;
        sr[r] = FP8 ? msm_srow(wsc, n0 + r, K, ph) : NULL;
    }
#pragma unroll
    for (int t = 0; t < NT; t++) xs[t] = x + (size_t)(t0 + min(t, nt - 1)) * K;
    float acc[R][NT];
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    msm_rows_dot_w<R, NT, U, VEC, FP8, false, HW, PIPE>(acc, wr, sr, xs, nt, K, ph, lane, hook);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float b = (bias && n0 + r < N) ? msm_bf(bias[n0 + r]) : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = msm_warp_sum(acc[r][t]);
            if (t < nt && n0 + r < N) put(t0 + t, n0 + r, s + b);
        }
    }
}

template <int NT, int R, int U, bool VEC, bool FP8, bool HW, bool PIPE = false>
static __device__ __forceinline__ void gemv_rows(float *y, const float *x, const void *w, const float *wsc, int ph,
                                                 const uint16_t *bias, int T, int N, int K, bool prefetch,
                                                 bool early) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    gemv_rows_at<NT, R, U, VEC, FP8, HW, PIPE>(
        (blockIdx.x * GEMV_WARPS + warp) * R,
        [&](int t, int n, float v) {
            if (lane == 0) y[(size_t)t * N + n] = v;
        },
        x, w, wsc, ph, bias, T, N, K, prefetch, early, msm_pdl_hook{early});
}

template <int NT, int R, int U, bool VEC, bool FP8, bool HW, bool PIPE = false, int MINB = 0>
static __global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)
    gemv_kernel(float *y, const float *x, const void *w, const float *wsc, int ph, const uint16_t *bias,
                int T, int N, int K, bool prefetch, bool early) {
    gemv_rows<NT, R, U, VEC, FP8, HW, PIPE>(y, x, w, wsc, ph, bias, T, N, K, prefetch, early);
}

/* ---- the qkv GEMV with RoPE and the K/V cache write in its epilogue (msm_cuda_linear_rope_kv) ----
 * gemv_kernel<NT, 1, 4> (one row a warp, one or two tokens) over the qkv weight [(nh + 2 kvh) hd, K],
 * its rows handed out so that a block holds what rope_copy_kernel needs together: in a rotated
 * (q or k) head, a "pair" block takes rows i, i + rot/2, i + 1, i + 1 + rot/2 (i even < rot/2) and
 * a "pass" block four dims past rot; a v block four v rows. Each warp's sum + bias (the GEMV's bits)
 * goes to shared memory; then a few threads rotate the pairs with msm_rope_lo / _hi (their
 * msm_rope_cs computed while the weights stream) and write the rows and the k / v cache entries
 * exactly as rope_copy_kernel does. So out and both
 * caches are bitwise msm_cuda_linear then msm_cuda_rope_kv, one launch and one kernel boundary less
 * a layer; the unrotated qkv rows are never written. */
struct lrk_args {
    float *out;                  /* [T, N] rotated q, k and the v rows */
    const int32_t *pos, *slot;   /* [T] */
    uint16_t *kc, *vc;           /* the layer's caches, rows of kvh * hd */
    int nh, kvh, hd, rot;
    float theta;
};

template <int NT, int U, bool PIPE, int MINB = 0>
static __global__ void __launch_bounds__(GEMV_WARPS * 32, MINB)
    linear_rope_kernel(lrk_args a, const float *x, const uint16_t *w, const uint16_t *bias, int T, int N, int K,
                       bool prefetch, bool early, bool cs_early) {
    static_assert(GEMV_WARPS == 4, "a pair block is four rows");
    __shared__ float ys[GEMV_WARPS][NT];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, tid = threadIdx.x;
    const int hd = a.hd, half = a.rot / 2, nrot = a.nh + a.kvh, pairs = half / 2;
    const int per_h = pairs + (hd - a.rot) / 4; /* blocks a rotated head */
    const int b = blockIdx.x, bh = b / per_h, j = b % per_h;
    /* kind 0: pair block (i0 = 2 j), 1: pass-through dims of a rotated head, 2: v rows */
    const int kind = bh < nrot ? (j < pairs ? 0 : 1) : 2;
    int row;
    if (kind == 0) row = bh * hd + 2 * j + (warp >> 1) + (warp & 1) * half;
    else if (kind == 1) row = bh * hd + a.rot + (j - pairs) * 4 + warp;
    else row = nrot * hd + (b - nrot * per_h) * 4 + warp;
    /* a pair thread's cosine and sine, in the rows-dot hook (after its first weight loads are
     * issued): before the PDL wait at decode (cs_early: the positions are step inputs, written
     * before the step's first kernel, as rope_copy_kernel's early prologue), else after it */
    const bool rot_thread = kind == 0 && tid < 2 * T;
    float c = 0.0f, sn = 0.0f;
    auto hook = [&]() {
        if (rot_thread && cs_early) msm_rope_cs(a.pos[tid >> 1], 2 * j + (tid & 1), a.rot, a.theta, &c, &sn);
        if (early) msm_pdl_wait();
        if (rot_thread && !cs_early) msm_rope_cs(a.pos[tid >> 1], 2 * j + (tid & 1), a.rot, a.theta, &c, &sn);
    };
    gemv_rows_at<NT, 1, U, true, false, false, PIPE>(
        row,
        [&](int t, int, float v) {
            if (lane == 0) ys[warp][t] = v;
        },
        x, w, NULL, 0, bias, T, N, K, prefetch, early, hook);
    __syncthreads();
    const size_t krow = (size_t)a.kvh * hd;
    if (kind == 0) {
        if (rot_thread) {
            int p = tid & 1, t = tid >> 1, i = 2 * j + p;
            float lo = ys[2 * p][t], hi = ys[2 * p + 1][t];
            float ra = msm_rope_lo(lo, hi, c, sn), rb = msm_rope_hi(lo, hi, c, sn);
            size_t o = (size_t)t * N + (size_t)bh * hd;
            a.out[o + i] = ra;
            a.out[o + i + half] = rb;
            int sl = bh >= a.nh ? a.slot[t] : -1;
            if (sl >= 0) {
                uint16_t *kr = a.kc + (size_t)sl * krow + (size_t)(bh - a.nh) * hd;
                kr[i] = msm_f2bf(ra);
                kr[i + half] = msm_f2bf(rb);
            }
        }
    } else if (tid < 4 * T) {
        int q = tid & 3, t = tid >> 2;
        float v = ys[q][t];
        if (kind == 1) {
            int d = a.rot + (j - pairs) * 4 + q;
            a.out[(size_t)t * N + (size_t)bh * hd + d] = v;
            int sl = bh >= a.nh ? a.slot[t] : -1;
            if (sl >= 0) a.kc[(size_t)sl * krow + (size_t)(bh - a.nh) * hd + d] = msm_f2bf(v);
        } else {
            int col = (b - nrot * per_h) * 4 + q;
            a.out[(size_t)t * N + (size_t)nrot * hd + col] = v;
            int sl = a.slot[t];
            if (sl >= 0) a.vc[(size_t)sl * krow + col] = msm_f2bf(v);
        }
    }
}

/* ---- GEMV + residual add + RMSNorm (LINEAR_ADD_RMSNORM, msm_cuda_linear_add_rmsnorm) ----
 * The GEMV blocks write y = x . W^T + b into sum; each block then counts itself in on ctr (after a
 * fence), and the block arriving last computes, for every token row, sum = r + y and out =
 * rmsnorm(sum) * nw with add_rmsnorm_kernel's arithmetic: the row laid out over VT =
 * msm_norm_threads(N) virtual threads (thread i owns elements i, i + VT, ...), squares summed in
 * that order, warp sums, then the VT / 32 warps in order; the block's GEMV_WARPS * 32 threads
 * each play F = VT / (GEMV_WARPS * 32) virtual threads (VT = 64: half of them idle). So the node is
 * bitwise the GEMV followed by msm_cuda_add_rmsnorm, one launch and no one-block kernel between
 * the GEMV and its readers. It resets ctr to zero for the next call or replay. */
template <int NT, bool VEC, int V, int F>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_norm_kernel(float *sum, float *out, const float *x, const uint16_t *w, const uint16_t *bias, const float *r,
                     const uint16_t *nw, int T, int N, int K, float eps, int vt, unsigned *ctr, bool prefetch) {
    constexpr int R = NT >= 3 ? 2 : 1, U = 4; /* gemv_launch's choice for NT <= 4 */
    static_assert(NT <= 4, "the fused GEMV takes up to 4 tokens");
    __shared__ float part[32];
    __shared__ bool last;
    gemv_rows<NT, R, U, VEC, false, false>(sum, x, w, NULL, 0, bias, T, N, K, prefetch, false);
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(ctr, 1u) == gridDim.x * gridDim.y - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    /* the norm weights, loaded with the first row (only the last block needs them: loading them
     * before the GEMV would hold F * V registers through it in every block) */
    float wv[F][V];
    msm_block_norm_w<V, F, GEMV_WARPS * 32>(nw, N, vt, wv);
    for (int t = 0; t < T; t++) {
        size_t off = (size_t)t * N;
        msm_block_norm_row<V, F, GEMV_WARPS * 32>([&](int i) { return r[off + i] + __ldcg(sum + off + i); },
                                  [&](int i, float v, float o) { sum[off + i] = v, out[off + i] = o; }, wv, N, eps, vt,
                                  part);
    }
    if (threadIdx.x == 0) *ctr = 0;
}

/* ---- RMSNorm in, GEMV out (ADD_RMSNORM + the LINEAR reading its norm: msm_cuda_norm_linear) ----
 * Every block computes the residual add + RMSNorm of the T token rows itself, with
 * msm_block_norm_row (msm_cuda_add_rmsnorm's bits: its NI_WARPS * 32 threads are the norm
 * kernel's virtual threads one to one), into shared memory, and multiplies its weight rows with
 * them exactly as gemv_kernel's warps do (msm_rows_dot_w: the same lane partials in the same
 * order, the same warp sum, + bias), so y is bitwise the GEMV's of the norm kernel's output; block 0
 * also writes the residual sum and the normed rows for their other readers. The norm runs as the
 * rows-dot hook, after each warp's first weight loads are issued (before the PDL wait when early):
 * the norm's one-block kernel and its launch leave the step, and its latency overlaps the weight
 * stream. A warp past N runs the loop with NULL rows (no loads) so every thread reaches the norm's
 * barriers; K >= 32 * 16 codes (FP8) or 32 * 8 bf16 gives every lane a first step, where the hook
 * runs. 8 warps a block (16 rows at R = 2) keep the per-block norm (x and the residual from L2)
 * a small share of the weight stream. */
#define NI_WARPS 8
template <int V>
struct norm_in_hook {
    const float *a, *b;
    const uint16_t *nw;
    float *sum, *out, *xn; /* xn: shared [T][K] */
    int T, K, vt;
    float eps;
    float *part;
    bool early;
    __device__ __forceinline__ void operator()() const {
        if (early) msm_pdl_wait();
        float w[1][V]; /* loaded with the first row's x: L2 hits of every block, in flight together */
        msm_block_norm_w<V, 1, NI_WARPS * 32>(nw, K, vt, w);
        for (int t = 0; t < T; t++) {
            size_t off = (size_t)t * K;
            float *xr = xn + off;
            bool wr = blockIdx.x == 0;
            msm_block_norm_row<V, 1, NI_WARPS * 32>([&](int i) { return a[off + i] + b[off + i]; },
                                                     [&](int i, float v, float o) {
                                                         xr[i] = o;
                                                         if (wr) sum[off + i] = v, out[off + i] = o;
                                                     },
                                                     w, K, eps, vt, part);
        }
        __syncthreads(); /* every row in shared memory before any warp reads it */
    }
};

/* A norm-in kernel's warp: acc = its lane partials of weight rows n0 .. n0 + R - 1 (those below nend;
 * a row past it NULL: no loads, the hook still reached) against the T normed rows in xn, which the hook
 * (norm_in_hook over xn, or a hook that calls one) writes after the warp's first weight loads. */
template <int NT, int R, int U, bool FP8, bool PIPE, bool HW, typename Hook>
static __device__ __forceinline__ void norm_in_dot_h(float (&acc)[R][NT], const void *w, const float *wsc, int ph,
                                                     int n0, int nend, int T, int K, const float *xn, int lane,
                                                     Hook hook) {
    const void *wr[R];
    const float *sr[R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        wr[r] = n0 + r < nend ? msm_wrow<FP8>(w, 0, n0 + r, K) : NULL;
        sr[r] = FP8 ? msm_srow(wsc, n0 + r, K, ph) : NULL;
    }
    const float *xs[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) xs[t] = xn + (size_t)min(t, T - 1) * K;
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    msm_rows_dot_w<R, NT, U, true, FP8, false, HW, PIPE, Hook>(acc, wr, sr, xs, T, K, ph, lane, hook);
}

/* norm_in_dot_h with the norm hook of a, b, nw (norm_in_hook<V>). */
template <int NT, int R, int U, bool FP8, int V, bool PIPE, bool HW>
static __device__ __forceinline__ void norm_in_dot(float (&acc)[R][NT], const void *w, const float *wsc, int ph,
                                                   int n0, int nend, int T, int K, float *xn, int lane, const float *a,
                                                   const float *b, const uint16_t *nw, float *sum, float *out,
                                                   int vt, float eps, float *part, bool early) {
    norm_in_hook<V> hook{a, b, nw, sum, out, xn, T, K, vt, eps, part, early};
    norm_in_dot_h<NT, R, U, FP8, PIPE, HW>(acc, w, wsc, ph, n0, nend, T, K, xn, lane, hook);
}

template <int NT, int R, int U, bool FP8, int V, bool PIPE = false, bool HW = false>
static __global__ void __launch_bounds__(NI_WARPS * 32)
    gemv_norm_in_kernel(float *y, const void *w, const float *wsc, int ph, const uint16_t *bias, int T, int N, int K,
                        const float *a, const float *b, const uint16_t *nw, float *sum, float *out, float eps, int vt,
                        bool early) {
    extern __shared__ float xn[]; /* [T][K]: the normed rows */
    __shared__ float part[32];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int n0 = (blockIdx.x * NI_WARPS + warp) * R;
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    float acc[R][NT];
    norm_in_dot<NT, R, U, FP8, V, PIPE, HW>(acc, w, wsc, ph, n0, N, T, K, xn, lane, a, b, nw, sum, out, vt, eps,
                                            part, early);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float bb = (bias && n0 + r < N) ? msm_bf(bias[n0 + r]) : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = msm_warp_sum(acc[r][t]);
            if (lane == 0 && t < T && n0 + r < N) y[(size_t)t * N + n0 + r] = s + bb;
        }
    }
}

/* The SIMT FP8 GEMVs' decode: the hardware's e4m3 conversion (tuning fp8_gemv_hw, or
 * MSM_CUDA_FP8_LINEAR=simt_hw, which also takes them at every T), else the integer one. */
static bool fp8_gemv_hw(const msm_cuda_tuning *t) {
    return t->fp8_gemv_hw || t->fp8_linear == MSM_CUDA_FP8_LINEAR_SIMT_HW;
}

/* ---- the one-token FP8 GEMV split over K (msm_cuda_tuning.fp8_gemv_split) ----
 * At one token a dense FP8 GEMV has few rows for its bytes (an o_proj of 2048 rows: 2048 warps at
 * a row a warp, 15 an SM), and each warp then waits on its loads, its x reads and its 16-long fmaf
 * chains in turn (Nsight Compute on Qwen3-30B-A3B's o_proj: an instruction every 4.2 cycles a
 * scheduler, 1.9 warps a scheduler, bench/results/2026-12-05-h200-s16 run 1). Here a block's 4
 * warps take the same R rows, warp w the 512-code steps j = w, w + 4, ... of each (D of them in
 * flight a lane a row), in few registers, so 4x the warps stream the same bytes. Each warp's lane
 * sums are msm_rows_dot_fp8's over its steps (16 fmaf from 0 in k order a load, then one fmaf by
 * the block scale; the hardware decode or the integer one), summed over the warp's lanes, then
 * the 4 warps' sums in warp order + bias: a fixed order (replay = eager), not the unsplit GEMV's
 * (its lanes run through all the steps): the same products, float32 sums in another order.
 * Measured (H200, bench/results/2026-12-05-h200-s16 run 2): slower at Qwen3-30B-A3B's rows of 2048
 * and 4096 codes in every form (the early weight loads before the PDL wait already hide the load
 * latency the extra warps were for), faster on GLM-4.5-Air's 12288-code o_proj rows at 2 rows a
 * block (batch 1 -0.19 ms); off by default (tuning.cu). */
#define SPLIT_WARPS 4
/* rows n0..n0 + R - 1 of w (FP8 codes, [N, K]) and their scales; NULL past N */
template <int R>
static __device__ __forceinline__ void fp8_split_rows(const uint8_t *w, const float *wsc, int ph, int n0, int N,
                                                      int K, const uint8_t *(&wr)[R], const float *(&sr)[R]) {
#pragma unroll
    for (int r = 0; r < R; r++) {
        wr[r] = n0 + r < N ? w + (size_t)(n0 + r) * K : NULL;
        sr[r] = n0 + r < N ? msm_srow(wsc, n0 + r, K, ph) : NULL;
    }
}

/* One warp's share of FP8 rows n0..n0 + R - 1 (of w [N, K], scales wsc at phase ph) dotted with x
 * (all of it here, K floats, global or shared): the
 * steps j = slice, slice + SPLIT_WARPS, ... (16 codes a lane a step, D steps a row in flight),
 * acc[r] = 0, then += scale * msm_fp8_step16 a step, in step order. hook() runs once on every
 * thread at one place, after the first loads are issued (a lane past K issues none): the norm-in
 * hook's barriers then never split a warp (a 768-wide row gives slice 1 half a warp's lanes; the
 * barrier inside the loop for some lanes and after it for others hung the sixteenth session's
 * run 2 test). */
template <int R, int D, bool HW, typename Hook>
static __device__ __forceinline__ void fp8_split_dot(float (&acc)[R], const uint8_t *w, const float *wsc, int ph,
                                                     int n0, int N, int K, const float *x, int lane, int slice,
                                                     Hook hook) {
    constexpr float SS = HW ? 1.0f : MSM_FP8_S_SCALE;
    const uint8_t *wr[R];
    const float *sr[R];
    fp8_split_rows<R>(w, wsc, ph, n0, N, K, wr, sr);
    constexpr int STEP = SPLIT_WARPS * 512; /* between a warp's steps */
    uint4 wv[D][R];
    float sv[D][R];
    auto load = [&](int k0) {
#pragma unroll
        for (int d = 0; d < D; d++)
#pragma unroll
            for (int r = 0; r < R; r++) {
                int k = k0 + d * STEP;
                bool ok = wr[r] && k < K;
                wv[d][r] = ok ? msm_ld_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
                sv[d][r] = ok ? __ldg(sr[r] + ((k + ph) >> 7)) * SS : 0.0f;
            }
    };
#pragma unroll
    for (int r = 0; r < R; r++) acc[r] = 0.0f;
    int k0 = lane * 16 + slice * 512;
    load(k0);
    hook();
    while (k0 < K) {
#pragma unroll
        for (int d = 0; d < D; d++) {
            int k = k0 + d * STEP;
            if (k >= K) break;
            float s[R];
            msm_fp8_step16<R, HW>(s, wv[d], x + k);
#pragma unroll
            for (int r = 0; r < R; r++) acc[r] = fmaf(s[r], sv[d][r], acc[r]);
        }
        k0 += STEP * D;
        if (k0 < K) load(k0);
    }
}

/* The G row groups of a block (SPLIT_WARPS warps each, warp w of group w / SPLIT_WARPS) put their
 * warps' sums (acc summed over the lanes) in ps; then y[n] = the group's warps' sums in warp order
 * + bias, for its R rows. */
template <int G, int R>
static __device__ __forceinline__ void fp8_split_store(float (&ps)[G * SPLIT_WARPS][R], const float (&acc)[R],
                                                       int n_first, int N, float *y, const uint16_t *bias) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; r++) {
        float v = msm_warp_sum(acc[r]);
        if (lane == 0) ps[warp][r] = v;
    }
    __syncthreads();
    const int i = threadIdx.x, g = i / R, r = i % R, n = n_first + i;
    if (i < G * R && n < N) {
        float v = ps[g * SPLIT_WARPS][r];
#pragma unroll
        for (int j = 1; j < SPLIT_WARPS; j++) v += ps[g * SPLIT_WARPS + j][r];
        y[n] = v + (bias ? msm_bf(bias[n]) : 0.0f);
    }
}

template <int R, int D, bool HW, int MINB>
static __global__ void __launch_bounds__(SPLIT_WARPS * 32, MINB)
    gemv_fp8_split_kernel(float *y, const float *x, const uint8_t *w, const float *wsc, int ph, const uint16_t *bias,
                          int N, int K, bool early) {
    __shared__ float ps[SPLIT_WARPS][R];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, n0 = blockIdx.x * R;
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    float acc[R];
    /* x is the previous kernel's output: read after the wait; y written after it on every path */
    fp8_split_dot<R, D, HW>(acc, w, wsc, ph, n0, N, K, x, lane, warp, msm_pdl_hook{early});
    fp8_split_store<1, R>(ps, acc, n0, N, y, bias);
}

/* tuning fp8_gemv_split: 1, a row a block and one load a lane in flight (32 registers: 16 blocks,
 * 64 warps an SM); 2, two rows a block, two loads a lane a row (64: 8 blocks, 32 warps, each x value
 * read once for both rows); 3, a row a block, two loads (40: 12 blocks, 48 warps; at 32 registers
 * this form spills). All without spills (CUDA 13.0, sm_90a). The decode: fp8_gemv_hw's, as the
 * unsplit GEMV's. */
static cudaError_t gemv_fp8_split_launch(float *y, const float *x, const uint8_t *w, const float *wsc, int ph,
                                         const uint16_t *bias, int N, int K, msm_cuda_exec ex) {
    bool hw = fp8_gemv_hw(ex.tune), early = ex.tune->gemv_early && !ex.w_written;
    int mode = ex.tune->fp8_gemv_split, R = mode == 2 ? 2 : 1;
    dim3 grid((unsigned)((N + R - 1) / R)), blk(SPLIT_WARPS * 32);
#define SPLIT(R_, D_, MINB_)                                                                                     \
    msm_launch(hw ? gemv_fp8_split_kernel<R_, D_, true, MINB_> : gemv_fp8_split_kernel<R_, D_, false, MINB_>, grid, \
               blk, 0, ex, y, x, w, wsc, ph, bias, N, K, early)
    if (mode == 1) return SPLIT(1, 1, 16);
    if (mode == 2) return SPLIT(2, 2, 8);
    return SPLIT(1, 2, 12);
#undef SPLIT
}

/* The norm-in GEMV (gemv_norm_in_kernel) of FP8 rows at one token, split over K as
 * gemv_fp8_split_kernel (msm_cuda_tuning.fp8_gemv_split): NI_WARPS / SPLIT_WARPS row groups of R
 * rows a block, a group's warps on its rows' steps, the normed row in shared memory (norm_in_hook,
 * after each warp's first loads). Each row's sum is the split GEMV's (the rows are independent of R),
 * so the node is bitwise msm_cuda_add_rmsnorm then the split GEMV. 4 rows a group: 8 a block, half
 * the unsplit kernel's 16, so twice the blocks each normalising the row (K <= 2048: one step a warp). */
template <int R, bool HW, int V>
static __global__ void __launch_bounds__(NI_WARPS * 32, 3)
    gemv_norm_in_fp8_split_kernel(float *y, const uint8_t *w, const float *wsc, int ph, const uint16_t *bias, int N,
                                  int K, const float *a, const float *b, const uint16_t *nw, float *sum, float *out,
                                  float eps, int vt, bool early) {
    constexpr int G = NI_WARPS / SPLIT_WARPS;
    extern __shared__ float xn[]; /* [K]: the normed row */
    __shared__ float part[32];
    __shared__ float ps[NI_WARPS][R];
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int n_first = blockIdx.x * G * R, n0 = n_first + (warp / SPLIT_WARPS) * R;
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    float acc[R];
    norm_in_hook<V> hook{a, b, nw, sum, out, xn, 1, K, vt, eps, part, early};
    fp8_split_dot<R, 1, HW>(acc, w, wsc, ph, n0, N, K, xn, lane, warp % SPLIT_WARPS, hook);
    fp8_split_store<G, R>(ps, acc, n_first, N, y, bias);
}

template <int NT, int R, int U, bool VEC, bool FP8, bool HW>
static void gemv_launch_r(float *y, const float *x, const void *w, const uint16_t *bias, int T, int N, int K,
                          msm_cuda_exec ex, const float *wsc, int ph) {
    dim3 grid((unsigned)((N + GEMV_WARPS * R - 1) / (GEMV_WARPS * R)), (unsigned)((T + NT - 1) / NT));
    /* (8 loads in flight for R = 1 measured the same at batch 1-32: 2.391 vs 2.363 ms, H200,
     * 2026-11-29; bench/results/2026-11-29-h200-s3) */
    auto kern = gemv_kernel<NT, R, U, VEC, FP8, HW>;
    if constexpr (VEC && !FP8 && NT == 2) /* bf16 rows of several steps: pipelined (tuning rows_pipe) */
        if ((ex.tune->rows_pipe & MSM_CUDA_PIPE_GEMV) && K > 256 * U) kern = gemv_kernel<NT, R, U, VEC, FP8, HW, true>;
    if constexpr (VEC && !FP8 && NT == 1 && R == 1 && U == 4) /* tuning gemv_minb */
        if (ex.tune->gemv_minb & MSM_CUDA_MINB_GEMV) kern = gemv_kernel<1, 1, 4, true, false, HW, false, GEMV_MINB>;
    (void)msm_launch(kern, grid, dim3(GEMV_WARPS * 32), 0, ex, y, x, w, wsc, ph, bias,
                     T, N, K, ex.tune->gemv_prefetch, ex.tune->gemv_early && !ex.w_written);
}

template <int NT, bool VEC, bool FP8 = false, bool HW = false>
static void gemv_launch(float *y, const float *x, const void *w, const uint16_t *bias, int T,
                        int N, int K, msm_cuda_exec ex, const float *wsc = NULL, int ph = 0) {
    /* More rows per warp as T grows: each x load (from L1) then feeds R rows, which keeps the
     * L1 traffic for x below the weight stream's share of DRAM bandwidth (measured on the H200:
     * T=8 with R=2 ran at 39% of the copy ceiling on the lm_head). R*U stays 4-8 loads. */
    constexpr int R = NT >= 5 || FP8 ? 4 : NT >= 3 ? 2 : 1;
    constexpr int U = R >= 4 ? 2 : 4;
    /* FP8: 4 rows a warp by default, so each x value read from L1 feeds 4 rows (16 codes a
     * 16-byte load read x at 4 bytes a code: one row a warp went L1-bound at 0.9 TB/s, H200);
     * tuning fp8_gemv_rows 1 or 2 takes fewer (more blocks for a narrow weight); by default 2 at
     * one token a chunk (ms a step at batch 1 / 2, 2 vs 4 rows, H200, 2026-12-01: Qwen3-30B-A3B FP8
     * 3.24 vs 3.34 / 4.53 vs 4.38, GLM-4.5-Air FP8 7.37 vs 7.50 / 11.37 vs 10.48). A row's sum runs
     * over the same k in the same order at any R and U, so the bits are the same. */
    if constexpr (FP8) {
        int rows = ex.tune->fp8_gemv_rows ? ex.tune->fp8_gemv_rows : NT == 1 ? 2 : 4;
        if (rows == 1) return gemv_launch_r<NT, 1, 4, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph);
        /* one token: 8 loads a lane a row (a 4096-code row requested at once, before the PDL wait)
         * instead of 4 (Qwen3-30B-A3B FP8 batch 1 3.24 -> 3.17 ms, H200, 2026-12-02; the same for bf16
         * rows, whose 2048-wide rows measured no faster: bench/results/2026-12-02-h200 run 2) */
        if (rows == 2 && NT == 1 && ex.tune->fp8_gemv_u8)
            return gemv_launch_r<NT, 2, 8, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph);
        if (rows == 2) return gemv_launch_r<NT, 2, 4, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph);
    }
    /* tuning aux_gemv_rows: 2 rows a warp at 2 loads a row on the aux stream (half the blocks beside
     * the routed experts; the same sums) */
    if constexpr (NT <= 2 && VEC && !FP8)
        if (ex.on_aux && ex.tune->aux_gemv_rows == 2)
            return gemv_launch_r<NT, 2, 2, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph);
    /* tuning gemv_u16: a bf16 row of 2048 < K <= 4096 at one token in one step of 16 loads a lane,
     * all requested before the PDL wait (the same sums) */
    if constexpr (NT == 1 && VEC && !FP8) {
        if (ex.tune->gemv_u16 && K > 2048 && K <= 4096)
            return gemv_launch_r<1, 1, 16, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph);
        /* tuning gemv_u8: likewise 1024 < K <= 2048 in one step of 8 */
        if (ex.tune->gemv_u8 && K > 1024 && K <= 2048)
            return gemv_launch_r<1, 1, 8, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph);
    }
    gemv_launch_r<NT, R, U, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph);
}

/* The token chunk of the GEMV over many tokens with a few rows (routers): the largest NT of 8, 4,
 * 2 whose grid (gemv_launch's rows a warp at NT) has per_sm blocks an SM (tuning
 * router_chunk_per_sm), else 1. */
static int router_chunk(int T, int N, int sms, int per_sm) {
    for (int nt = 8; nt >= 2; nt /= 2) {
        int R = nt >= 5 ? 4 : nt >= 3 ? 2 : 1;
        long blocks = (long)((N + GEMV_WARPS * R - 1) / (GEMV_WARPS * R)) * ((T + nt - 1) / nt);
        if (T >= 2 * nt && blocks >= (long)per_sm * sms) return nt;
    }
    return 1;
}

template <bool VEC, bool FP8 = false, bool HW = false>
static void gemv_dispatch(float *y, const float *x, const void *w, const uint16_t *bias, int T,
                          int N, int K, msm_cuda_exec ex, const float *wsc = NULL, int ph = 0) {
    switch (T < 8 ? T : 8) {
    case 1: gemv_launch<1, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph); break;
    case 2: gemv_launch<2, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph); break;
    case 3: gemv_launch<3, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph); break;
    case 4: gemv_launch<4, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph); break;
    case 5: gemv_launch<5, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph); break;
    case 6: gemv_launch<6, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph); break;
    case 7: gemv_launch<7, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph); break;
    default: gemv_launch<8, VEC, FP8, HW>(y, x, w, bias, T, N, K, ex, wsc, ph); break;
    }
}

template <int NT, int V, int F>
static cudaError_t gemv_norm_launch(float *sum, float *out, const float *x, const uint16_t *w, const uint16_t *bias,
                                    const float *r, const uint16_t *nw, int T, int N, int K, float eps, int vt,
                                    unsigned *ctr, msm_cuda_exec ex) {
    constexpr int R = NT >= 3 ? 2 : 1;
    dim3 grid((unsigned)((N + GEMV_WARPS * R - 1) / (GEMV_WARPS * R)));
    return msm_launch(gemv_norm_kernel<NT, true, V, F>, grid, dim3(GEMV_WARPS * 32), 0, ex, sum, out, x, w, bias, r,
                      nw, T, N, K, eps, vt, ctr, ex.tune->gemv_prefetch);
}

template <int V, int F>
static cudaError_t gemv_norm_t(float *sum, float *out, const float *x, const uint16_t *w, const uint16_t *bias,
                               const float *r, const uint16_t *nw, int T, int N, int K, float eps, int vt,
                               unsigned *ctr, msm_cuda_exec ex) {
    switch (T) {
    case 1: return gemv_norm_launch<1, V, F>(sum, out, x, w, bias, r, nw, T, N, K, eps, vt, ctr, ex);
    case 2: return gemv_norm_launch<2, V, F>(sum, out, x, w, bias, r, nw, T, N, K, eps, vt, ctr, ex);
    case 3: return gemv_norm_launch<3, V, F>(sum, out, x, w, bias, r, nw, T, N, K, eps, vt, ctr, ex);
    default: return gemv_norm_launch<4, V, F>(sum, out, x, w, bias, r, nw, T, N, K, eps, vt, ctr, ex);
    }
}

extern "C" int msm_cuda_linear_add_rmsnorm(float *sum, float *out, const float *x, const uint16_t *w,
                                           const uint16_t *bias, const float *r, const uint16_t *nw, int T, int N,
                                           int K, float eps, unsigned *ctr, msm_cuda_ctx *ctx, void *ws,
                                           size_t ws_bytes, msm_cuda_exec ex) {
    if (T < 0 || N <= 0 || K <= 0 || N > 32 * 1024) return -EINVAL;
    if (T == 0) return 0;
    const msm_cuda_tuning *tn = ex.tune;
    int vt = msm_norm_threads(N), V = msm_norm_vals(N, vt), F = vt <= GEMV_WARPS * 32 ? 1 : vt / (GEMV_WARPS * 32);
    /* the fused kernel where msm_cuda_linear takes gemv_kernel<T, R, 4> (so its y is that GEMV's)
     * and the norm's layout maps onto the block: F * V values a thread, at most 16 (the tail's
     * registers: 92 a thread at 16 against the GEMV's 42), the built (V, F) below */
    bool vec = K % 8 == 0 && ((uintptr_t)w | (uintptr_t)x) % 16 == 0;
    bool fused = tn->linear_norm_fused && ctr && vec && T <= 4 && T < tn->mmv_min_t && T < tn->linear_tiled_min_t &&
                 N > MSM_CUDA_GEMV_SMALL_N && (vt <= GEMV_WARPS * 32 || vt == F * GEMV_WARPS * 32);
    cudaError_t e = cudaSuccess;
#define GN(V_, F_) gemv_norm_t<V_, F_>(sum, out, x, w, bias, r, nw, T, N, K, eps, vt, ctr, ex)
    if (fused) {
        if (F == 1 && V == 1) e = GN(1, 1);
        else if (F == 1 && V == 2) e = GN(2, 1);
        else if (F == 1 && V == 4) e = GN(4, 1);
        else if (F == 1 && V == 8) e = GN(8, 1);
        else if (F == 2 && V == 4) e = GN(4, 2);
        else if (F == 2 && V == 8) e = GN(8, 2);
        else fused = false;
    }
#undef GN
    if (!fused) { /* the two kernels */
        int r2 = msm_cuda_linear(sum, x, w, bias, T, N, K, ctx, ws, ws_bytes, ex);
        return r2 ? r2 : msm_cuda_add_rmsnorm(sum, out, r, sum, nw, T, N, eps, ex);
    }
    CUDA_TRY(e);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- msm_cuda_norm_linear: ADD_RMSNORM + the LINEAR on its norm, one launch ---- */

/* The norm's layout (add_rmsnorm_kernel's: vt threads of V values, one a thread of the fused
 * block); 0 where the fused kernel has no instance. */
static bool norm_in_v(int K, int *vt, int *V) {
    *vt = msm_norm_threads(K), *V = msm_norm_vals(K, *vt);
    return *vt <= NI_WARPS * 32 && (*V == 4 || *V == 8); /* K <= 2048: 16 values took 179 registers */
}

extern "C" bool msm_cuda_norm_linear_fits(int T, int N, int K, bool fp8, int ph, const msm_cuda_tuning *tn) {
    int vt, V;
    if (!tn->norm_linear || T < 1 || N <= MSM_CUDA_GEMV_SMALL_N || (size_t)T * K * sizeof(float) > (48u << 10) ||
        !norm_in_v(K, &vt, &V))
        return false;
    /* measured against the two kernels (H200, 2026-12-02, Qwen3-30B-A3B, ms a step): bf16 batch 1
     * 3.325 vs 3.35, 2 4.57 vs 4.68, but 4 6.88 vs 6.77; FP8 batch 1 3.139 vs 3.185, but 2 4.58 vs
     * 4.35 (bench/results/2026-12-02-h200 run 6): bf16 up to 2 tokens, FP8 at one */
    if (fp8) /* where msm_cuda_linear_fp8 takes the SIMT GEMV (either decode, split or not, as it does) */
        return T == 1 && T <= tn->fp8_native_max_t && K % 16 == 0 && K >= 32 * 16 && ph % 16 == 0 &&
               !(tn->fp8_linear == MSM_CUDA_FP8_LINEAR_MMA && T >= tn->fp8_mma_min_t);
    /* where msm_cuda_linear takes the GEMV */
    return T <= 2 && T < tn->linear_tiled_min_t && (T < tn->mmv_min_t || T > tn->mmv_max_t) && K % 8 == 0 &&
           K >= 32 * 8;
}

/* Whether a norm-in kernel's bf16 rows of K at U loads a lane are software-pipelined (tuning rows_pipe:
 * rows of several steps). */
static bool norm_in_pipe(const msm_cuda_tuning *tn, int K, int U) {
    return (tn->rows_pipe & MSM_CUDA_PIPE_NORM_IN) && K > 256 * U;
}

template <int NT, int R, int U, bool FP8, int V, bool HW = false>
static cudaError_t norm_in_launch(float *y, const void *w, const float *wsc, int ph, const uint16_t *bias, int T,
                                  int N, int K, const float *a, const float *b, const uint16_t *nw, float *sum,
                                  float *out, float eps, int vt, msm_cuda_exec ex) {
    dim3 grid((unsigned)((N + NI_WARPS * R - 1) / (NI_WARPS * R)));
    auto kern = gemv_norm_in_kernel<NT, R, U, FP8, V, false, HW>;
    if constexpr (!FP8) /* bf16 rows of several steps: pipelined (tuning rows_pipe) */
        if (norm_in_pipe(ex.tune, K, U)) kern = gemv_norm_in_kernel<NT, R, U, FP8, V, true>;
    return msm_launch(kern, grid, dim3(NI_WARPS * 32),
                      (size_t)T * K * sizeof(float), ex, y, w, wsc, ph, bias, T, N, K, a, b, nw, sum, out, eps, vt,
                      ex.tune->gemv_early && !ex.w_written);
}

template <int V>
static cudaError_t norm_in_go(float *y, const void *w, const float *wsc, int ph, const uint16_t *bias, int T, int N,
                             int K, const float *a, const float *b, const uint16_t *nw, float *sum, float *out,
                             float eps, int vt, bool fp8, msm_cuda_exec ex) {
#define NI(NT_, R_, U_, F_, ...) \
    norm_in_launch<NT_, R_, U_, F_, V, ##__VA_ARGS__>(y, w, wsc, ph, bias, T, N, K, a, b, nw, sum, out, eps, vt, ex)
    /* two rows a warp, two loads a lane a row in flight before the norm (80 registers at K = 2048: three
     * blocks an SM; the bits are the same at any rows and loads); FP8 with the GEMV's decode */
    if (fp8 && ex.tune->fp8_gemv_split && K >= ex.tune->fp8_gemv_split_min_k) { /* the split GEMV's sums */
        constexpr int R = 4, G = NI_WARPS / SPLIT_WARPS;
        dim3 grid((unsigned)((N + G * R - 1) / (G * R)));
        bool early = ex.tune->gemv_early && !ex.w_written;
        auto kern =
            fp8_gemv_hw(ex.tune) ? gemv_norm_in_fp8_split_kernel<R, true, V> : gemv_norm_in_fp8_split_kernel<R, false, V>;
        return msm_launch(kern, grid, dim3(NI_WARPS * 32), (size_t)K * sizeof(float), ex, y, (const uint8_t *)w, wsc,
                          ph, bias, N, K, a, b, nw, sum, out, eps, vt, early);
    }
    if (fp8 && fp8_gemv_hw(ex.tune)) return NI(1, 2, 2, true, true);
    if (fp8) return NI(1, 2, 2, true);
    return T == 1 ? NI(1, 2, 2, false) : NI(2, 2, 2, false);
#undef NI
}

/* A norm-in kernel's weight as it takes it: the FP8 codes with their scales and phase (w8.q set), else
 * the bf16 rows w; false where it is missing or not 16-byte aligned. */
struct norm_in_wt {
    bool fp8;
    const void *w;
    const float *sc;
    int ph;
};
static bool norm_in_weight(const uint16_t *w, msm_cuda_fp8w w8, norm_in_wt *r) {
    r->fp8 = w8.q != NULL;
    r->w = r->fp8 ? (const void *)w8.q : (const void *)w;
    r->sc = r->fp8 ? w8.scale : NULL;
    r->ph = r->fp8 ? w8.phase : 0;
    return r->w && (!r->fp8 || r->sc) && (uintptr_t)r->w % 16 == 0;
}

extern "C" int msm_cuda_norm_linear(float *y, float *sum, float *out, const float *a, const float *b,
                                    const uint16_t *nw, float eps, const uint16_t *w, msm_cuda_fp8w w8,
                                    const uint16_t *bias, int T, int N, int K, msm_cuda_exec ex) {
    norm_in_wt wt;
    if (!y || !sum || !out || !a || !b || !nw || !norm_in_weight(w, w8, &wt) ||
        !msm_cuda_norm_linear_fits(T, N, K, wt.fp8, wt.ph, ex.tune))
        return -EINVAL;
    int vt, V;
    norm_in_v(K, &vt, &V);
    cudaError_t e = V == 4 ? norm_in_go<4>(y, wt.w, wt.sc, wt.ph, bias, T, N, K, a, b, nw, sum, out, eps, vt, wt.fp8, ex)
                           : norm_in_go<8>(y, wt.w, wt.sc, wt.ph, bias, T, N, K, a, b, nw, sum, out, eps, vt, wt.fp8, ex);
    CUDA_TRY(e);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- msm_cuda_norm_linear_swiglu: ADD_RMSNORM + the gate/up LINEAR on its norm + SWIGLU ----
 * gemv_norm_in_kernel's norm (norm_in_hook: every block norms the T rows into shared memory after
 * its warps' first weight loads; block 0 also writes sum and out) with linear_swiglu_kernel's rows:
 * block b's first NI_WARPS / 2 warps take R gate rows each (outputs OW b + R w ..), the others the
 * matching up rows I + OW b + R w' .., and act = silu(gate) * up from shared memory. Each row's sum
 * is gemv_kernel's (msm_rows_dot_w: the same lane partials in the same order, the same warp sum; no
 * bias), so act is bitwise msm_cuda_add_rmsnorm, msm_cuda_linear, msm_cuda_swiglu (the formula of
 * swiglu_kernel). For a shared expert forked before its norm (pass fork_before_norm): its gate/up
 * stream starts as soon as the o_proj is done, beside the main stream's norm and router. */
template <int NT, int R, int U, int V, bool PIPE>
static __global__ void __launch_bounds__(NI_WARPS * 32)
    norm_in_swiglu_kernel(float *act, const uint16_t *w, int T, int I, int K, const float *a, const float *b,
                          const uint16_t *nw, float *sum, float *out, float eps, int vt, bool early) {
    constexpr int HW = NI_WARPS / 2, OW = HW * R; /* gate (or up) warps; outputs a block */
    extern __shared__ float xn[];                 /* [T][K]: the normed rows */
    __shared__ float part[32];
    __shared__ float v[NT][2][OW]; /* [token][gate, up][the block's outputs] */
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, up = warp / HW;
    const int o0 = blockIdx.x * OW, i0 = o0 + (warp % HW) * R; /* the block's first output; the warp's */
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    float acc[R][NT];
    norm_in_dot<NT, R, U, false, V, PIPE, false>(acc, w, NULL, 0, up * I + i0, (up + 1) * I, T, K, xn, lane, a, b, nw, sum,
                                                 out, vt, eps, part, early);
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = msm_warp_sum(acc[r][t]);
            if (lane == 0) v[t][up][(warp % HW) * R + r] = s;
        }
    __syncthreads();
    int t = threadIdx.x / OW, j = threadIdx.x % OW;
    if (t < NT && t < T && o0 + j < I) {
        float g = v[t][0][j], u = v[t][1][j];
        act[(size_t)t * I + o0 + j] = g / (1.0f + expf(-g)) * u;
    }
}

extern "C" bool msm_cuda_norm_linear_swiglu_fits(int T, int I, int K, const void *w, const msm_cuda_tuning *tn) {
    return tn->norm_linear_swiglu && I > 0 && I <= (1 << 29) && (uintptr_t)w % 16 == 0 &&
           msm_cuda_norm_linear_fits(T, 2 * I, K, false, 0, tn);
}

template <int R, int V>
static cudaError_t norm_in_swiglu_go(float *act, const uint16_t *w, int T, int I, int K, const float *a,
                                     const float *b, const uint16_t *nw, float *sum, float *out, float eps, int vt,
                                     msm_cuda_exec ex) {
    /* norm_in_launch's loads (two a lane a row in flight before the norm; software-pipelined rows by
     * tuning rows_pipe), R rows a warp */
    constexpr int U = 2, OW = NI_WARPS / 2 * R;
    dim3 grid((unsigned)((I + OW - 1) / OW));
    bool pipe = norm_in_pipe(ex.tune, K, U);
    auto kern = T == 1 ? (pipe ? norm_in_swiglu_kernel<1, R, U, V, true> : norm_in_swiglu_kernel<1, R, U, V, false>)
                       : (pipe ? norm_in_swiglu_kernel<2, R, U, V, true> : norm_in_swiglu_kernel<2, R, U, V, false>);
    return msm_launch(kern, grid, dim3(NI_WARPS * 32), (size_t)T * K * sizeof(float), ex, act, w, T, I, K, a, b, nw,
                      sum, out, eps, vt, ex.tune->gemv_early && !ex.w_written);
}

extern "C" int msm_cuda_norm_linear_swiglu(float *act, float *sum, float *out, const float *a, const float *b,
                                           const uint16_t *nw, float eps, const uint16_t *w, int T, int I, int K,
                                           msm_cuda_exec ex) {
    if (!act || !sum || !out || !a || !b || !nw || !w || !msm_cuda_norm_linear_swiglu_fits(T, I, K, w, ex.tune))
        return -EINVAL;
    int vt, V;
    norm_in_v(K, &vt, &V);
#define NS(R_, V_) norm_in_swiglu_go<R_, V_>(act, w, T, I, K, a, b, nw, sum, out, eps, vt, ex)
    cudaError_t e = ex.tune->norm_swiglu_rows == 4 ? (V == 4 ? NS(4, 4) : NS(4, 8)) : (V == 4 ? NS(2, 4) : NS(2, 8));
#undef NS
    CUDA_TRY(e);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- msm_cuda_norm_linear_qk_rope: ADD_RMSNORM + the qkv LINEAR on its norm + QK_NORM +
 * ROPE_KV_WRITE ----
 * gemv_norm_in_kernel over the qkv weight (the same blocks of NI_WARPS warps of 2 rows, the same
 * loads, norm hook and sums), the hd / 16 blocks of a head one thread-block cluster. Each block
 * leaves its 16 rows' sums + bias (the GEMV's y) in shared memory; after a cluster barrier, warp t
 * of the cluster's first block reads token t's row of the head through distributed shared memory
 * in qkn_load's order and finishes it as qk_norm_rope_kv_kernel's warp does (qkr_head: the norm,
 * the rotation, the rows and the cache entries), with the norm weights, the slots and the cosines
 * and sines that block put in shared memory (qkr_prep: at decode before its first weight loads and
 * the PDL wait, as qk_norm_rope_kv_kernel's early prologue; else after its GEMV; done before the
 * loads rather than in the norm hook, where it held 100 registers against 80); a second barrier
 * keeps every block's rows until it has read them. So the rows and both caches are bitwise
 * msm_cuda_norm_linear then msm_cuda_qk_norm_rope_kv, the qkv and normed rows are never written,
 * and the q/k norm kernel
 * and its boundary leave the step: on Qwen3-30B-A3B at one token that kernel ends 1.2-2.7 us a
 * layer after the qkv GEMV (H200 timelines, bench/results/2026-12-04-h200-s13 run 5 and
 * 2026-12-05-h200-s15 run 2). */
#define QKR_RB (NI_WARPS * 2) /* rows a block: 2 a warp, as norm_in_go's GEMV */
#define QKR_MAX_T 2
#define QKR_MAX_HD (8 * QKR_RB) /* a head on at most 8 blocks: a portable cluster */

/* The lead block's share of the head's finish that needs no GEMV result: the head's norm weights
 * (q or k) into wv, the tokens' slots into sl and the cosines and sines of their positions (dims
 * f < rot / 2 at cs[t * rot / 2 + f]: qk_norm_rope_kv_kernel's msm_rope_cs calls), in shared
 * memory, a thread an entry. */
static __device__ __forceinline__ void qkr_prep(const msm_cuda_qk_rope &q, int h, int T, float *wv, float *cs,
                                                float *sn, int *sl) {
    const int tid = threadIdx.x, half = q.rot / 2;
    if (h < q.nh + q.kvh) {
        const uint16_t *w = h < q.nh ? q.wq : q.wk;
        if (tid < q.hd) wv[tid] = msm_bf(w[tid]);
        if (tid < T * half) msm_rope_cs(q.pos[tid / half], tid % half, q.rot, q.theta, &cs[tid], &sn[tid]);
    }
    if (tid < T) sl[tid] = q.slot[tid];
}

/* Token t's row of head h finished by one warp of the lead block: qkr_head with HJ = rot / 64, the
 * weights, cosines and sines from qkr_prep's shared arrays. */
template <int HJ, typename Ld>
static __device__ __forceinline__ void qkr_finish(Ld ld, int nh, int kvh, int hd, int rot, float eps, const float *swv,
                                                  const float *scs, const float *ssn, qkr_dst dst, int h, int t,
                                                  int lane) {
    float v[8], wv[8], cs[HJ], sn[HJ];
    float ss = qkn_load_f(hd, lane, v, ld);
    bool nk = h < nh + kvh; /* a q or k head */
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        wv[j] = nk && d < hd ? swv[d] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < HJ; j++) {
        int i = t * (rot / 2) + lane + 32 * j;
        cs[j] = nk ? scs[i] : 0.0f, sn[j] = nk ? ssn[i] : 0.0f;
    }
    qkr_head<HJ>(v, ss, wv, cs, sn, h, nh, kvh, hd, eps, lane, dst);
}

template <int NT, int U, bool FP8, int V, bool PIPE, bool HW>
static __global__ void __launch_bounds__(NI_WARPS * 32)
    norm_in_qkr_kernel(float *y, const void *w, const float *wsc, int ph, const uint16_t *bias, int T, int K,
                       const float *a, const float *b, const uint16_t *nw, float *sum, float *out, float eps, int vt,
                       msm_cuda_qk_rope q, bool early, bool cs_early) {
    constexpr int R = 2;
    extern __shared__ float xn[]; /* [T][K]: the normed rows */
    __shared__ float part[32];
    __shared__ float ys[NT][QKR_RB]; /* the block's rows' sums + bias */
    __shared__ float swv[QKR_MAX_HD], scs[QKR_MAX_T * QKR_MAX_HD / 2], ssn[QKR_MAX_T * QKR_MAX_HD / 2];
    __shared__ int ssl[QKR_MAX_T];
    cg::cluster_group cl = cg::this_cluster();
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31, N = (q.nh + 2 * q.kvh) * q.hd;
    const int n0 = (blockIdx.x * NI_WARPS + warp) * R, h = blockIdx.x * QKR_RB / q.hd;
    const bool lead = cl.block_rank() == 0;
    msm_pdl_trigger();
    /* before the first weight loads: at decode (cs_early) the positions and slots are step inputs,
     * written before the step's first kernel, as qk_norm_rope_kv_kernel's early prologue reads them */
    if (lead && cs_early) qkr_prep(q, h, T, swv, scs, ssn, ssl);
    if (!early) msm_pdl_wait();
    float acc[R][NT];
    norm_in_dot<NT, R, U, FP8, V, PIPE, HW>(acc, w, wsc, ph, n0, N, T, K, xn, lane, a, b, nw, sum, out, vt, eps, part,
                                            early);
#pragma unroll
    for (int r = 0; r < R; r++) {
        float bb = bias ? msm_bf(bias[n0 + r]) : 0.0f;
#pragma unroll
        for (int t = 0; t < NT; t++) {
            float s = msm_warp_sum(acc[r][t]);
            if (lane == 0 && t < T) ys[t][warp * R + r] = s + bb;
        }
    }
    if (lead && !cs_early) qkr_prep(q, h, T, swv, scs, ssn, ssl);
    msm_cluster_sync_smem(); /* every block's rows, and the lead block's weights, slots, cosines and sines */
    if (lead && warp < T) {
        const int t = warp;
        qkr_dst dst = {y + (size_t)t * N + (size_t)h * q.hd, q.kc, q.vc, ssl[t]};
        auto ld = [&](int d) { return *cl.map_shared_rank(&ys[t][d % QKR_RB], d / QKR_RB); };
        if (q.rot == 128) qkr_finish<2>(ld, q.nh, q.kvh, q.hd, q.rot, q.eps, swv, scs, ssn, dst, h, t, lane);
        else qkr_finish<1>(ld, q.nh, q.kvh, q.hd, q.rot, q.eps, swv, scs, ssn, dst, h, t, lane);
    }
    cl.sync(); /* the lead block has read every block's rows */
}

extern "C" bool msm_cuda_norm_linear_qk_rope_fits(int T, int K, int nh, int kvh, int hd, int rot, bool fp8, int ph,
                                                  const msm_cuda_tuning *tn) {
    /* a head on 4 or 8 blocks (a cluster of a power of two), rot / 64 rotated pairs a lane */
    if (!tn->norm_qk_rope || T < 1 || T > QKR_MAX_T || nh <= 0 || kvh <= 0 || (hd != 4 * QKR_RB && hd != QKR_MAX_HD) ||
        (rot != 64 && rot != 128) || rot > hd || !msm_cuda_qk_norm_rope_kv_fits(T, hd, rot))
        return false;
    /* where msm_cuda_norm_linear takes gemv_norm_in_kernel (not the FP8 split form) */
    return msm_cuda_norm_linear_fits(T, (nh + 2 * kvh) * hd, K, fp8, ph, tn) &&
           !(fp8 && tn->fp8_gemv_split && K >= tn->fp8_gemv_split_min_k);
}

template <int NT, int U, bool FP8, int V, bool PIPE = false, bool HW = false>
static cudaError_t qkr_launch(float *y, const void *w, const float *wsc, int ph, const uint16_t *bias, int T, int K,
                              const float *a, const float *b, const uint16_t *nw, float *sum, float *out, float eps,
                              int vt, const msm_cuda_qk_rope &q, msm_cuda_exec ex) {
    int N = (q.nh + 2 * q.kvh) * q.hd;
    return msm_launch_cluster(norm_in_qkr_kernel<NT, U, FP8, V, PIPE, HW>, dim3((unsigned)(N / QKR_RB)),
                              dim3(NI_WARPS * 32), (size_t)T * K * sizeof(float), (unsigned)(q.hd / QKR_RB), ex, y, w,
                              wsc, ph, bias, T, K, a, b, nw, sum, out, eps, vt, q, ex.tune->gemv_early && !ex.w_written,
                              ex.decode && ex.tune->small_early);
}

/* norm_in_go's choice of the norm-in GEMV (its sums: the same bits at any loads and pipelining). */
template <int V>
static cudaError_t qkr_go(float *y, const void *w, const float *wsc, int ph, const uint16_t *bias, int T, int K,
                          const float *a, const float *b, const uint16_t *nw, float *sum, float *out, float eps, int vt,
                          bool fp8, const msm_cuda_qk_rope &q, msm_cuda_exec ex) {
#define QG(NT_, F_, ...) qkr_launch<NT_, 2, F_, V, ##__VA_ARGS__>(y, w, wsc, ph, bias, T, K, a, b, nw, sum, out, eps, vt, q, ex)
    if (fp8 && fp8_gemv_hw(ex.tune)) return QG(1, true, false, true);
    if (fp8) return QG(1, true);
    bool pipe = norm_in_pipe(ex.tune, K, 2); /* norm_in_launch's U */
    if (T == 1) return pipe ? QG(1, false, true) : QG(1, false);
    return pipe ? QG(2, false, true) : QG(2, false);
#undef QG
}

extern "C" int msm_cuda_norm_linear_qk_rope(float *y, float *sum, float *out, const float *a, const float *b,
                                            const uint16_t *nw, float eps, const uint16_t *w, msm_cuda_fp8w w8,
                                            const uint16_t *bias, msm_cuda_qk_rope q, int T, int K, msm_cuda_exec ex) {
    norm_in_wt wt;
    if (!y || !sum || !out || !a || !b || !nw || !norm_in_weight(w, w8, &wt) || !q.wq || !q.wk || !q.pos ||
        !q.slot || !q.kc || !q.vc || !msm_cuda_norm_linear_qk_rope_fits(T, K, q.nh, q.kvh, q.hd, q.rot, wt.fp8, wt.ph, ex.tune))
        return -EINVAL;
    int vt, V;
    norm_in_v(K, &vt, &V);
    cudaError_t e = V == 4 ? qkr_go<4>(y, wt.w, wt.sc, wt.ph, bias, T, K, a, b, nw, sum, out, eps, vt, wt.fp8, q, ex)
                           : qkr_go<8>(y, wt.w, wt.sc, wt.ph, bias, T, K, a, b, nw, sum, out, eps, vt, wt.fp8, q, ex);
    CUDA_TRY(e);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- small N (routers): one block per (row n, token t), msm_small_dot ---- */
template <bool VEC>
static __global__ void __launch_bounds__(MSM_SMALL_THREADS)
    small_gemv_kernel(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int N, int K) {
    __shared__ float part[32];
    int n = blockIdx.x, t = blockIdx.y;
    msm_pdl_trigger();
    msm_pdl_wait();
    float s = msm_small_dot<VEC>(w + (size_t)n * K, x + (size_t)t * K, K, part);
    if (threadIdx.x == 0) y[(size_t)t * N + n] = s + (bias ? msm_bf(bias[n]) : 0.0f);
}

/* ---- MMV: tensor-core GEMV for medium T (MSM_CUDA_MMV_MIN_T <= T <= MSM_CUDA_MMV_MAX_T) ----
 * The GEMV kernel above is bound by fp32 FMAs and x loads once T passes ~8; cuBLASLt at T = 9..64
 * runs few, K-serial tiles (13-38% of the copy ceiling on N = 2048 shapes). Here every weight is
 * still read once, with 16-byte streaming loads straight into mma.sync m16n8k16 B fragments:
 * lane (g = lane/4, q = lane%4) loads W[row g][kc + 8q .. +8], which feeds two k16 MMAs under a
 * fixed permutation of k inside each 32-wide chunk (logical k 2q+j -> 8q+j, 2q+8+j -> 8q+2+j, +4
 * for the second MMA); the A fragments (tokens g and g+8 of each 16-token tile) read x at the same
 * physical k. x is split as bf16 hi + bf16 lo (x - hi), two MMAs each, so the products carry ~16
 * mantissa bits of x: close to the fp32 GEMV, unlike cuBLASLt's x rounded to bf16.
 * Block = 8 warps x 16 rows (two n8 tiles a warp), one K slice; a cluster of S blocks (S K slices
 * of the same 128 rows) sums its partials through distributed shared memory in rank order (fixed,
 * deterministic), each block writing 1/S of the outputs. No workspace, one launch. */
/* 32-wide K chunks whose weight loads a warp has in flight at once: U = 4 (8 for every grid measured
 * slower on the H200, 2026-12-01, ms a step: Qwen1.5-MoE batch 8 4.95 vs 4.86, Qwen3-30B-A3B 9.85 vs
 * 9.63; bench/results/2026-12-01-h200-mega run 2: more registers, fewer blocks an SM), or 8 where
 * the grid is small (mmv_u8_max_blocks: the o_proj's 256 blocks hold half its weights in flight at
 * U = 4, two round trips). The same chunks in the same order either way: the same bits. */
/* W warps a block (tuning mmv_warps: 8, or 4 for twice the blocks on narrow weights); each warp's
 * 16 rows and the cluster's rank-order sum are the same either way, so are the bits.
 * WS > 1 (S = 1, tuning mmv_bslice): the K slices are the block's own warps instead of a cluster's
 * blocks: W / WS warps on distinct rows, each of them WS times over K (warp w: rows (w % (W / WS)) * 16..,
 * slice w / (W / WS)), the WS partials summed in slice order through shared memory after one
 * __syncthreads: a slice's chunks and the slices' sum are a cluster of WS slices' (the same bits
 * as S = WS), with twice to four times the warps of the cluster grid on the same weights (more
 * loads in flight an SM: the 3-8-token qkv MMV held 12 warps an SM, H200, 2026-12-03) and no
 * cluster to place. Compiled for MMVB_WARPS_SM warps an SM (4 chunks in flight: 80 registers,
 * three blocks of 8 warps, where 84 made two). */
#define MMVB_WARPS_SM 24

/* ROPE (the block-sliced form, one token tile; msm_cuda_linear_rope_kv at 3-16 tokens, tuning
 * linear_rope_mmv): the qkv weight [(nh + 2 kvh) hd, K] with full rotary (rot = hd), and the
 * block's MMV_ROWS rows are not consecutive: block b takes rows o .. o + MMV_ROWS/2 - 1 of a head and
 * the same rows + hd/2 (mmv_rope_row), so both rows of every RoPE pair are in its shared memory.
 * Each row's sum is the same as in the plain kernel (the same K slices, chunks and order: a row's
 * dot does not depend on which block computes it), and the epilogue rotates them, writes the rows
 * and the K / V cache entries with rope_copy_kernel's arithmetic: bitwise msm_cuda_linear then
 * msm_cuda_rope_kv, one launch less. ra is unused otherwise. */
static __device__ __forceinline__ int mmv_rope_row(int lr, int rb, int hd) {
    int b = lr / rb, r = lr % rb, per = hd / rb, h = b / per, o = (b % per) * (rb / 2);
    return h * hd + (r < rb / 2 ? o + r : hd / 2 + o + r - rb / 2);
}

template <int MT, int S, int W, int MMV_U = 4, int WS = 1, int NJ = 2, bool ROPE = false>
static __global__ void __launch_bounds__(W * 32, WS > 1 ? MMVB_WARPS_SM / W : 0)
    mmv_kernel(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T, int N,
               int K, bool early, bool l2rest, lrk_args ra) {
    static_assert(WS == 1 || (S == 1 && W % WS == 0), "K slices in a cluster or in a block, not both");
    static_assert(NJ == 2 || (NJ == 4 && WS > 1), "4 n8 tiles a warp only in the block-sliced form");
    static_assert(!ROPE || (WS > 1 && MT == 1), "RoPE in the block-sliced form of one token tile");
    constexpr int WR = W / WS;          /* warps on distinct rows */
    constexpr int MMV_ROWS = WR * NJ * 8;
    constexpr int NS = WS > 1 ? WS : S; /* K slices */
    __shared__ float part[WS][MT * 16 * MMV_ROWS]; /* [slice][token][row in block] */
    msm_pdl_trigger();
    /* early (as gemv_rows'): the first chunks' weight loads go out before the wait */
    if (!early) msm_pdl_wait();
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int rank = S > 1 ? (int)cg::this_cluster().block_rank() : 0;
    int rg = warp % WR, ks = warp / WR; /* ks: 0 unless WS > 1 */
    int nb0 = blockIdx.y * MMV_ROWS;
    int nch = K / 32, per = (nch + NS - 1) / NS;
    int c0 = (WS > 1 ? ks : rank) * per, c1 = min(nch, c0 + per);
    const uint16_t *wr[NJ];
#pragma unroll
    for (int j = 0; j < NJ; j++) { /* rows past N repeat row N-1; never stored */
        int lr = min(nb0 + rg * NJ * 8 + j * 8 + g, N - 1);
        wr[j] = w + (size_t)(ROPE ? mmv_rope_row(lr, MMV_ROWS, ra.hd) : lr) * K + q * 8;
    }
    const float *xr[MT][2];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int t = m * 16 + h * 8 + g;
            xr[m][h] = t < T ? x + (size_t)t * K + q * 8 : NULL;
        }
    float acc[MT][NJ][4];
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NJ; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) acc[m][j][i] = 0.0f;

    if (early && c0 >= c1) msm_pdl_wait();
    for (int c = c0; c < c1; c += MMV_U) {
        uint4 wv[MMV_U][NJ];
#pragma unroll
        for (int u = 0; u < MMV_U; u++)
#pragma unroll
            for (int j = 0; j < NJ; j++)
                wv[u][j] = c + u < c1 ? msm_ld_stream16(wr[j] + (size_t)(c + u) * 32)
                                      : make_uint4(0, 0, 0, 0);
        if (early && c == c0) {
            /* l2rest: the slice's later chunks of each row towards L2 (one bulk prefetch a row), so
             * that the rounds after the wait read L2 instead of HBM */
            if (l2rest && q == 0 && c1 - c0 > MMV_U)
#pragma unroll
                for (int j = 0; j < NJ; j++)
                    msm_bulk_prefetch_l2(wr[j] + (size_t)(c0 + MMV_U) * 32, (unsigned)(c1 - c0 - MMV_U) * 64u);
            msm_pdl_wait();
        }
#pragma unroll
        for (int u = 0; u < MMV_U; u++) {
            if (c + u >= c1) break;
            size_t kc = (size_t)(c + u) * 32;
#pragma unroll
            for (int m = 0; m < MT; m++) {
                float4 xa0 = make_float4(0, 0, 0, 0), xa1 = xa0, xb0 = xa0, xb1 = xa0;
                if (xr[m][0]) {
                    const float4 *p = (const float4 *)(xr[m][0] + kc);
                    xa0 = p[0], xa1 = p[1];
                }
                if (xr[m][1]) {
                    const float4 *p = (const float4 *)(xr[m][1] + kc);
                    xb0 = p[0], xb1 = p[1];
                }
                uint32_t h1[4], l1[4], h2[4], l2[4];
                msm_split_bf16x2(xa0.x, xa0.y, h1[0], l1[0]);
                msm_split_bf16x2(xb0.x, xb0.y, h1[1], l1[1]);
                msm_split_bf16x2(xa0.z, xa0.w, h1[2], l1[2]);
                msm_split_bf16x2(xb0.z, xb0.w, h1[3], l1[3]);
                msm_split_bf16x2(xa1.x, xa1.y, h2[0], l2[0]);
                msm_split_bf16x2(xb1.x, xb1.y, h2[1], l2[1]);
                msm_split_bf16x2(xa1.z, xa1.w, h2[2], l2[2]);
                msm_split_bf16x2(xb1.z, xb1.w, h2[3], l2[3]);
#pragma unroll
                for (int j = 0; j < NJ; j++) {
                    msm_mma_bf16(acc[m][j], h1[0], h1[1], h1[2], h1[3], wv[u][j].x, wv[u][j].y);
                    msm_mma_bf16(acc[m][j], l1[0], l1[1], l1[2], l1[3], wv[u][j].x, wv[u][j].y);
                    msm_mma_bf16(acc[m][j], h2[0], h2[1], h2[2], h2[3], wv[u][j].z, wv[u][j].w);
                    msm_mma_bf16(acc[m][j], l2[0], l2[1], l2[2], l2[3], wv[u][j].z, wv[u][j].w);
                }
            }
        }
    }
    /* C fragment: c0,c1 = (token g, rows 2q, 2q+1), c2,c3 = (token g+8, same rows) */
#pragma unroll
    for (int m = 0; m < MT; m++)
#pragma unroll
        for (int j = 0; j < NJ; j++) {
            int col = rg * NJ * 8 + j * 8 + 2 * q, ta = m * 16 + g, tb = ta + 8;
            float *pk = part[ks];
            pk[ta * MMV_ROWS + col] = acc[m][j][0];
            pk[ta * MMV_ROWS + col + 1] = acc[m][j][1];
            pk[tb * MMV_ROWS + col] = acc[m][j][2];
            pk[tb * MMV_ROWS + col + 1] = acc[m][j][3];
        }
    if (S > 1)
        msm_cluster_sync_smem(); /* every block's part */
    else
        __syncthreads();
    for (int idx = rank * W * 32 + threadIdx.x; idx < MT * 16 * MMV_ROWS; idx += S * W * 32) {
        int t = idx / MMV_ROWS, n = nb0 + idx % MMV_ROWS;
        float s = part[0][idx];
        if (WS > 1) { /* the cluster's sum below, over the block's slices */
            s = 0.0f;
#pragma unroll
            for (int r = 0; r < WS; r++) s += part[r][idx];
        } else if (S > 1) {
            s = 0.0f;
#pragma unroll
            for (int r = 0; r < S; r++) s += cg::this_cluster().map_shared_rank(&part[0][0], r)[idx];
        }
        if constexpr (ROPE) {
            if (t >= T) continue;
            /* the RoPE partner: the same row of the block's other half */
            constexpr int HB = MMV_ROWS / 2;
            int lr = idx % MMV_ROWS, pidx = idx + (lr < HB ? HB : -HB);
            float s2 = 0.0f;
#pragma unroll
            for (int r = 0; r < WS; r++) s2 += part[r][pidx];
            int pn = mmv_rope_row(n, MMV_ROWS, ra.hd), pp = mmv_rope_row(nb0 + pidx % MMV_ROWS, MMV_ROWS, ra.hd);
            s += bias ? msm_bf(bias[pn]) : 0.0f;
            s2 += bias ? msm_bf(bias[pp]) : 0.0f;
            int h = pn / ra.hd, i = pn % ra.hd, half = ra.hd / 2, nrot = ra.nh + ra.kvh;
            const size_t krow = (size_t)ra.kvh * ra.hd;
            float v = s;
            if (h < nrot) { /* rope_copy_kernel's pair (a, b) = (dim i, dim i + half) */
                float c, sn;
                msm_rope_cs(ra.pos[t], i < half ? i : i - half, ra.rot, ra.theta, &c, &sn);
                v = i < half ? msm_rope_lo(s, s2, c, sn) : msm_rope_hi(s2, s, c, sn);
            }
            ra.out[(size_t)t * N + pn] = v;
            int sl = h >= ra.nh ? ra.slot[t] : -1;
            if (sl >= 0) {
                if (h < nrot) ra.kc[(size_t)sl * krow + (size_t)(h - ra.nh) * ra.hd + i] = msm_f2bf(v);
                else ra.vc[(size_t)sl * krow + (size_t)(h - nrot) * ra.hd + i] = msm_f2bf(v);
            }
        } else {
            if (t < T && n < N) y[(size_t)t * N + n] = s + (bias ? msm_bf(bias[n]) : 0.0f);
        }
    }
    if (S > 1) cg::this_cluster().sync(); /* keep part alive until every rank has read it */
}

template <int MT, int S, int W>
static cudaError_t mmv_launch_s(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T,
                         int N, int K, msm_cuda_exec ex) {
    dim3 grid((unsigned)S, (unsigned)((N + W * 16 - 1) / (W * 16)));
    bool early = ex.tune->gemv_early && !ex.w_written, l2 = early && ex.tune->mmv_l2_rest;
    /* one token tile, a grid of at most mmv_u8_max_blocks, slices of 8 chunks or more: 8 in flight */
    if constexpr (MT == 1)
        if ((int)(grid.x * grid.y) <= ex.tune->mmv_u8_max_blocks && K / 32 / S >= 8)
            return msm_launch_cluster(mmv_kernel<MT, S, W, 8>, grid, dim3(W * 32), 0, (unsigned)S, ex, y, x, w, bias, T,
                                      N, K, early, l2, lrk_args{});
    return msm_launch_cluster(mmv_kernel<MT, S, W>, grid, dim3(W * 32), 0, (unsigned)S, ex, y, x, w, bias, T, N, K,
                              early, l2, lrk_args{});
}

template <int MT, int W>
static cudaError_t mmv_launch(float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                              int T, int N, int K, int S, msm_cuda_exec ex) {
    switch (S) {
    case 1: return mmv_launch_s<MT, 1, W>(y, x, w, bias, T, N, K, ex);
    case 2: return mmv_launch_s<MT, 2, W>(y, x, w, bias, T, N, K, ex);
    case 4: return mmv_launch_s<MT, 4, W>(y, x, w, bias, T, N, K, ex);
    default: return mmv_launch_s<MT, 8, W>(y, x, w, bias, T, N, K, ex);
    }
}

static bool mmv_use(const msm_cuda_tuning *tn, int T, int N, int K, const void *w, const void *x) {
    return T >= tn->mmv_min_t && T <= tn->mmv_max_t && K % 32 == 0 && K > 0 && N > 0 &&
           ((uintptr_t)w | (uintptr_t)x) % 16 == 0;
}

template <int W>
static cudaError_t mmv_go(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T, int N, int K,
                          int S, msm_cuda_exec ex) {
    switch ((T + 15) / 16) {
    case 1: return mmv_launch<1, W>(y, x, w, bias, T, N, K, S, ex);
    case 2: return mmv_launch<2, W>(y, x, w, bias, T, N, K, S, ex);
    case 3: return mmv_launch<3, W>(y, x, w, bias, T, N, K, S, ex);
    default: return mmv_launch<4, W>(y, x, w, bias, T, N, K, S, ex);
    }
}

/* The block-sliced MMV (mmv_kernel<1, 1, WS, U, WS>: WS warps a block on the same 16 rows, WS K
 * slices), one token tile. */
template <int WS, int U, int NJ = 2, bool ROPE = false>
static cudaError_t mmvb_launch(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T, int N,
                               int K, msm_cuda_exec ex, lrk_args ra = lrk_args{}) {
    dim3 grid(1u, (unsigned)((N + NJ * 8 - 1) / (NJ * 8)));
    bool early = ex.tune->gemv_early && !ex.w_written;
    return msm_launch(mmv_kernel<1, 1, WS, U, WS, NJ, ROPE>, grid, dim3(WS * 32), 0, ex, y, x, w, bias, T, N, K,
                      early, early && ex.tune->mmv_l2_rest, ra);
}

/* The block-sliced MMV of mmv_bslice_pick's choice: WS K slices, U chunks in flight, NJ n8 tiles a
 * warp; ROPE: the qkv rows regrouped and rotated in its epilogue (ra). */
template <bool ROPE>
static cudaError_t mmvb_go(int WS, int U, int NJ, float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                           int T, int N, int K, msm_cuda_exec ex, lrk_args ra = lrk_args{}) {
    if (NJ == 4)
        return WS == 16 ? mmvb_launch<16, 2, 4, ROPE>(y, x, w, bias, T, N, K, ex, ra)
               : WS == 8 ? mmvb_launch<8, 2, 4, ROPE>(y, x, w, bias, T, N, K, ex, ra)
                         : mmvb_launch<4, 2, 4, ROPE>(y, x, w, bias, T, N, K, ex, ra);
    return WS == 16 ? (U == 8 ? mmvb_launch<16, 8, 2, ROPE>(y, x, w, bias, T, N, K, ex, ra)
                              : mmvb_launch<16, 4, 2, ROPE>(y, x, w, bias, T, N, K, ex, ra))
           : WS == 8 ? mmvb_launch<8, 4, 2, ROPE>(y, x, w, bias, T, N, K, ex, ra)
                     : mmvb_launch<4, 4, 2, ROPE>(y, x, w, bias, T, N, K, ex, ra);
}

/* mmv_bslice_pick: the K slices a block (16, 8 or 4: 0 where none fits), the chunks in flight a
 * warp (8, 4 or 2) and the n8 tiles a warp (2 or 4) of the block-sliced MMV for T <= 16 tokens of
 * an N x K weight. By the rule (bslice 1): the most slices whose grid of N / 16 blocks is one wave
 * at the kernel's occupancy (tuning mmvb_per_sm) with 4 chunks a slice or more; 8 in flight at 16
 * slices where the slice has 8 and the grid still fits at 8 (one block an SM either way; at 8 and 4
 * slices 8 in flight would spill under the kernel's 24 warps an SM). bslice 4 / 8 / 16 forces that
 * many slices (U 4; tests). 32 rows a warp (NJ 4, 2 chunks in flight: each x fragment serves twice
 * the rows) by the same rule on N / 32 blocks: always (mmv_nj 4), or (0, auto) where it keeps at
 * least the 16-row pick's warps, since a warp has as many bytes in flight either way, or on the aux
 * stream (on_aux: the shared expert's GEMVs, which leave the routed experts beside them more SMs
 * with half the blocks: Qwen1.5-MoE at 8 tokens, its down at 64 blocks instead of 128, the routed
 * gate/up 71 -> 59 us a layer, -s13 run 2; up to MMV_AUX32_MAX_T tokens: at 16, 6.23-6.37 ms a step
 * against 6.23-6.24 at 16 rows, -s13 run 3). Measured
 * (H200, 2026-12-04, bench/results/2026-12-04-h200-s12 run 8 and -s13 run 1): where the 32-row
 * grid had half the warps it lost (Qwen3-30B-A3B's qkv at 8 tokens, 160 blocks of 8 warps
 * against 320, 7.6 -> 11.0 us a layer; its o_proj at 64 blocks of 16, +0.2 ms a step); with the
 * same warps it won (Qwen1.5-MoE's shared gate/up, 352 x 8 against 704 x 4: 11.0 -> 10.0). */
#define MMV_AUX32_MAX_T 8
static int mmv_bslice_pick(const msm_cuda_tuning *tn, int T, int N, int K, bool on_aux, int *U, int *NJ) {
    int bs = tn->mmv_bslice, nch = K / 32;
    long nb = (N + 15) / 16, nb4 = (N + 31) / 32;
    *U = 4, *NJ = 2;
    if (bs <= 0 || T > 16) return 0;
    if (bs == 4 || bs == 8 || bs == 16) {
        if (tn->mmv_nj == 4) *U = 2, *NJ = 4;
        return nch >= bs ? bs : 0;
    }
    static const int cand[3] = {16, 8, 4};
    int ws16 = 0, ws32 = 0;
    for (int i = 0; i < 3 && !ws16; i++) {
        int ws = cand[i], per = (nch + ws - 1) / ws;
        if (per < 4 || nb > (long)tn->mmvb_per_sm[i][0] * tn->sms) continue;
        if (ws == 16 && per >= 8 && nb <= (long)tn->mmvb_per_sm[i][1] * tn->sms) *U = 8;
        ws16 = ws;
    }
    if (tn->mmv_nj == 2) return ws16;
    for (int i = 0; i < 3 && !ws32; i++) {
        int ws = cand[i], per = (nch + ws - 1) / ws;
        if (per >= 4 && nb4 <= (long)tn->mmvb4_per_sm[i] * tn->sms) ws32 = ws;
    }
    if (ws32 && (tn->mmv_nj == 4 || (on_aux && T <= MMV_AUX32_MAX_T) || (ws16 && nb4 * ws32 >= nb * ws16))) {
        *U = 2, *NJ = 4;
        return ws32;
    }
    return ws16;
}

static bool mmvs_fits(const msm_cuda_tuning *tn, int T, int K, const void *w, const void *x);
static int mmvs_run(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T, int N, int K, int WS,
                    msm_cuda_exec ex);

static int mmv_run(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T, int N,
                   int K, msm_cuda_exec ex) {
    int U, NJ, WS = mmv_bslice_pick(ex.tune, T, N, K, ex.on_aux, &U, &NJ);
    /* the pick of 8 or 16 slices streamed (tuning mmv_stream_bs_min_n): the same slices, chunks and
     * sums, so the same bits, with every weight tile copied into shared memory before the PDL wait */
    const msm_cuda_tuning *tn = ex.tune;
    if ((WS == 8 || WS == 16) && !ex.on_aux && tn->mmv_stream_bs_min_n > 0 && N >= tn->mmv_stream_bs_min_n &&
        mmvs_fits(tn, T, K, w, x))
        return mmvs_run(y, x, w, bias, T, N, K, WS, ex);
    if (WS) {
        CUDA_TRY(mmvb_go<false>(WS, U, NJ, y, x, w, bias, T, N, K, ex));
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    int sms = ex.tune->sms, W = ex.tune->mmv_warps == 4 ? 4 : 8;
    /* K slices: double S while the doubled grid still fits mmv_slots blocks an SM in one wave (a
     * second, partial wave costs a whole one: the FP8 MMV8 of a 5120-row weight took 320 blocks at S = 8
     * on the 264 slots of two blocks an SM), each slice at least 4 chunks of 32 */
    int rb = (N + W * 16 - 1) / (W * 16), nch = K / 32, S = 1;
    int slots = ex.tune->mmv_slots > 0 ? ex.tune->mmv_slots : W == 4 ? ex.tune->mmv4_per_sm : ex.tune->mmv_per_sm;
    /* ... and while the rb clusters of 2S blocks are co-resident at once (a cluster takes S blocks of one
     * GPC: Qwen1.5-MoE's qkv at 8 tokens, 96 clusters of 8 where 92 fit, ran its last 4 as a second wave) */
    const int *fit = ex.tune->mmv_cluster_fit[W == 8][min((T + 15) / 16, 4) - 1];
    while (S < 8 && rb * S * 2 <= slots * sms && nch / (2 * S) >= 4 &&
           (!ex.tune->mmv_fit_clusters || rb <= fit[S == 1 ? 0 : S == 2 ? 1 : 2]))
        S *= 2;
    CUDA_TRY(W == 4 ? mmv_go<4>(y, x, w, bias, T, N, K, S, ex) : mmv_go<8>(y, x, w, bias, T, N, K, S, ex));
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* ---- the streamed MMV: linears of many rows at 2-8 tokens (the lm_head) ----
 * The MMVs above give each warp (or block) its rows once: past one wave (the lm_head's 151936 rows
 * at 8 tokens, 2374 blocks of 64 rows) a warp streams 16 rows x K in steps of 4 chunks, each step's
 * loads 256 bytes of a row, and waits for each step before the next: 194 us for 622 MB (3.2 TB/s)
 * where the one-token GEMV of the same weight takes 156 (H200, 2026-12-05 seventeenth session,
 * bench/results/2026-12-05-h200-s17 run 1; Nsight Compute: DRAM 65% busy, 26 warps an SM).
 * Here one block of WS warps an SM (16; 8 for mmv_run's picks of 8 slices, below) walks 16-row
 * tiles (tile blockIdx.x, + gridDim.x, ...; K up to MMVS_MAX_K = 2048). A tile's rows are
 * contiguous weights: one thread brings each tile into shared memory with a bulk copy (TMA) a row,
 * completing on the stage's mbarrier, st - 1 tiles ahead of the MMAs (a ring of st stages, tuning
 * mmv_stream_st; rows MMVS_ROW_PAD bytes apart so the 8 rows a fragment load touches fall on other
 * banks; run 2's cp.async form, each lane copying its own fragments, kept the L2 90% busy at 82% of
 * DRAM). Warp ks owns the K slice
 * of chunks ks * per .. (per = ceil(K / 32 / WS) <= PC = 2048 / 32 / WS) in every tile, so its x
 * fragments (tokens 0-7, split into bf16 hi + lo as mmv_kernel does; at 2 tokens this replaces the
 * fp32 GEMV's products) are built once and stay in registers; its B fragments are mmv_kernel's
 * (row g, k 8q..8q+7 of each chunk), read from shared memory. The slices' partials meet in shared
 * memory (double-buffered: one barrier a tile, which also frees the stage the next copies
 * overwrite) and 128 threads sum them in slice order: each output is mmv_kernel<1, 1, WS, U,
 * WS>'s (the block-sliced MMV at WS slices: the same chunks, MMAs and order), bitwise. Every
 * stage's first tile is copied before the PDL wait (weights are never written during a step); a
 * stage's next tile right after the barrier that ends its reads. Run 3: the lm_head at 8 tokens
 * 150.9 us, DRAM 87% busy. */
#define MMVS_ST 3 /* stages at most (tuning mmv_stream_st: 2 or 3) */
#define MMVS_ROW_PAD 64
#define MMVS_NJ 2 /* n8 tiles a tile: 16 rows */
#define MMVS_MAX_K 2048 /* 4 chunks of 32 a slice at 16 slices, 8 at 8 */
/* shared memory at K, st stages and WS slices: the stages, the partials [2][WS][8 tokens][16 rows],
 * the stages' mbarriers */
static constexpr size_t mmvs_smem(int K, int st, int ws) {
    return (size_t)st * 8 * MMVS_NJ * (2 * (size_t)K + MMVS_ROW_PAD) + 2 * (size_t)ws * 64 * MMVS_NJ * 4 +
           (size_t)st * 8;
}
template <int WS>
static __global__ void __launch_bounds__(WS * 32, 1)
    mmv_stream_kernel(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T, int N, int K,
                      bool early, int st) {
    constexpr int NJ = MMVS_NJ, PC = MMVS_MAX_K / 32 / WS, TR = 8 * NJ, NOUT = 8 * TR; /* rows a tile, outputs */
    extern __shared__ __align__(128) unsigned char mmvs_sm[];
    const int rs = 2 * K + MMVS_ROW_PAD, sb = TR * rs; /* a row's and a stage's bytes */
    float *part = (float *)(mmvs_sm + (size_t)st * sb);
    uint64_t *bar = (uint64_t *)(part + 2 * WS * NOUT);
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    const int nch = K / 32, per = (nch + WS - 1) / WS;
    const int c0 = warp * per, nc = max(0, min(nch, c0 + per) - c0); /* warp-uniform */
    const int ntile = (N + TR - 1) / TR, G = gridDim.x;
    const bool producer = threadIdx.x == 0;
    if (producer) {
        for (int s = 0; s < st; s++) msm_mbar_init(&bar[s], 1);
        msm_mbar_init_fence();
    }
    __syncthreads();
    /* the producer: tile's TR rows into stage s (none past the last tile; rows past N repeat
     * row N-1, never stored) */
    auto issue = [&](int tile, int s) {
        if (tile >= ntile) return;
        unsigned char *d = mmvs_sm + (size_t)s * sb;
        msm_mbar_expect_tx(&bar[s], (unsigned)TR * 2u * (unsigned)K);
        for (int r = 0; r < TR; r++)
            msm_bulk_g2s(d + (size_t)r * rs, w + (size_t)min(tile * TR + r, N - 1) * K, 2u * (unsigned)K, &bar[s]);
    };
    int tile = blockIdx.x;
    if (producer)
        for (int s = 0; s < st; s++) issue(tile + s * G, s); /* every stage's first tile */
    if (early) msm_pdl_wait();
    /* x fragments of the slice's chunks: tokens g < T (A rows 0-7; rows 8-15 are zero) */
    uint32_t xf[PC][8];
    const float *xr = g < T ? x + (size_t)g * K + (size_t)c0 * 32 + q * 8 : NULL;
#pragma unroll
    for (int u = 0; u < PC; u++) {
        float4 a0 = make_float4(0, 0, 0, 0), a1 = a0;
        if (xr && u < nc) {
            const float4 *p = (const float4 *)(xr + (size_t)u * 32);
            a0 = p[0], a1 = p[1];
        }
        msm_split_bf16x2(a0.x, a0.y, xf[u][0], xf[u][1]); /* h1[0], l1[0] */
        msm_split_bf16x2(a0.z, a0.w, xf[u][2], xf[u][3]); /* h1[2], l1[2] */
        msm_split_bf16x2(a1.x, a1.y, xf[u][4], xf[u][5]); /* h2[0], l2[0] */
        msm_split_bf16x2(a1.z, a1.w, xf[u][6], xf[u][7]); /* h2[2], l2[2] */
    }
    for (int i = 0; tile < ntile; tile += G, i++) {
        msm_mbar_wait(&bar[i % st], (unsigned)(i / st) & 1u);
        const unsigned char *sl = mmvs_sm + (size_t)(i % st) * sb + (size_t)g * rs + ((size_t)c0 * 32 + q * 8) * 2;
        float acc[NJ][4];
#pragma unroll
        for (int j = 0; j < NJ; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
#pragma unroll
        for (int u = 0; u < PC; u++) {
            if (u >= nc) break;
#pragma unroll
            for (int j = 0; j < NJ; j++) {
                uint4 wv = *(const uint4 *)(sl + (size_t)j * 8 * rs + u * 64);
                msm_mma_bf16(acc[j], xf[u][0], 0u, xf[u][2], 0u, wv.x, wv.y);
                msm_mma_bf16(acc[j], xf[u][1], 0u, xf[u][3], 0u, wv.x, wv.y);
                msm_mma_bf16(acc[j], xf[u][4], 0u, xf[u][6], 0u, wv.z, wv.w);
                msm_mma_bf16(acc[j], xf[u][5], 0u, xf[u][7], 0u, wv.z, wv.w);
            }
        }
        /* C fragment: acc[j][0..1] = (token g, rows j * 8 + 2q, + 1); [2..3] are tokens 8-15 */
        float *pw = part + ((size_t)(i & 1) * WS + warp) * NOUT + g * TR + 2 * q;
#pragma unroll
        for (int j = 0; j < NJ; j++) pw[j * 8] = acc[j][0], pw[j * 8 + 1] = acc[j][1];
        __syncthreads();
        /* every thread is past its reads of this tile's stage: the tile st ahead into it */
        if (producer) issue(tile + st * G, i % st);
        if (threadIdx.x < NOUT) {
            const float *pr = part + (size_t)(i & 1) * WS * NOUT + threadIdx.x;
            float s = 0.0f;
#pragma unroll
            for (int r = 0; r < WS; r++) s += pr[r * NOUT];
            int t = threadIdx.x / TR, n = tile * TR + threadIdx.x % TR;
            if (t < T && n < N) y[(size_t)t * N + n] = s + (bias ? msm_bf(bias[n]) : 0.0f);
        }
    }
}

/* 16-row tiles up to K = 2048 (the lm_heads of Qwen1.5-MoE and Qwen3). The 8-row form for K up to
 * 4096 (GLM-4.5-Air's lm_head: 126 registers, 72 bytes of spills) lost to the MMV there (H200,
 * 2026-12-05, bench/results/2026-12-05-h200-s17 run 3: GLM-4.5-Air FP8 2 / 4 / 8 tokens +0.083 /
 * +0.056 / +0.053 ms), so it is not taken. */
static bool mmvs_fits(const msm_cuda_tuning *tn, int T, int K, const void *w, const void *x) {
    return tn->mmv_stream_ok && T >= 2 && T <= 8 && K % 32 == 0 && K > 0 && K <= MMVS_MAX_K &&
           ((uintptr_t)w | (uintptr_t)x) % 16 == 0;
}
static bool mmvs_use(const msm_cuda_tuning *tn, int T, int N, int K, const void *w, const void *x) {
    return tn->mmv_stream_min_n > 0 && N >= tn->mmv_stream_min_n && T >= tn->mmv_stream_min_t &&
           mmvs_fits(tn, T, K, w, x);
}

/* one block an SM, WS slices (16: the lm_head; 8 or 16: mmv_run's block-sliced pick, the same bits) */
static int mmvs_run(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T, int N, int K, int WS,
                    msm_cuda_exec ex) {
    int ntile = (N + 15) / 16, grid = ntile < ex.tune->sms ? ntile : ex.tune->sms;
    bool early = ex.tune->gemv_early && !ex.w_written;
    /* stages: 2 where every tile of a block but the third is copied before the PDL wait (and the
     * shared memory stays inside the attention's 196 KiB carveout), 3 for a longer stream */
    int sst = ex.tune->mmv_stream_st, st = sst == 2 || (sst != 3 && (ntile + grid - 1) / grid <= 3) ? 2 : MMVS_ST;
    WS = WS == 8 ? 8 : 16;
    CUDA_TRY(msm_launch(WS == 8 ? mmv_stream_kernel<8> : mmv_stream_kernel<16>, dim3((unsigned)grid), dim3(WS * 32),
                        mmvs_smem(K, st, WS), ex, y, x, w, bias, T, N, K, early, st));
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* Clusters of 2, 4 and 8 blocks of mmv_kernel<MT, S, W> the GPU holds at once (msm_max_clusters; 0
 * where the query fails: then no cluster of that size is taken where the fit is checked). */
template <int MT, int W>
static void mmv_fit(int (&f)[3]) {
    f[0] = msm_max_clusters(mmv_kernel<MT, 2, W>, 2, W * 32, 0);
    f[1] = msm_max_clusters(mmv_kernel<MT, 4, W>, 4, W * 32, 0);
    f[2] = msm_max_clusters(mmv_kernel<MT, 8, W>, 8, W * 32, 0);
}

/* The occupancy fields of the MMV kernels, for msm_cuda_tuning_init (decode's MMV range is one
 * 16-token tile). */
void msm__linear_tuning(msm_cuda_tuning *t) {
    t->mmv_per_sm = msm_blocks_per_sm(mmv_kernel<1, 8, 8>, 8 * 32, 0);
    t->mmv4_per_sm = msm_blocks_per_sm(mmv_kernel<1, 8, 4>, 4 * 32, 0);
    t->mmvb_per_sm[0][0] = msm_blocks_per_sm(mmv_kernel<1, 1, 16, 4, 16>, 16 * 32, 0);
    t->mmvb_per_sm[0][1] = msm_blocks_per_sm(mmv_kernel<1, 1, 16, 8, 16>, 16 * 32, 0);
    t->mmvb_per_sm[1][0] = msm_blocks_per_sm(mmv_kernel<1, 1, 8, 4, 8>, 8 * 32, 0);
    t->mmvb_per_sm[2][0] = msm_blocks_per_sm(mmv_kernel<1, 1, 4, 4, 4>, 4 * 32, 0);
    t->mmvb4_per_sm[0] = msm_blocks_per_sm(mmv_kernel<1, 1, 16, 2, 16, 4>, 16 * 32, 0);
    t->mmvb4_per_sm[1] = msm_blocks_per_sm(mmv_kernel<1, 1, 8, 2, 8, 4>, 8 * 32, 0);
    t->mmvb4_per_sm[2] = msm_blocks_per_sm(mmv_kernel<1, 1, 4, 2, 4, 4>, 4 * 32, 0);
    t->mmv_stream_ok = cudaFuncSetAttribute(mmv_stream_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)mmvs_smem(MMVS_MAX_K, MMVS_ST, 16)) == cudaSuccess &&
                       cudaFuncSetAttribute(mmv_stream_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            (int)mmvs_smem(MMVS_MAX_K, MMVS_ST, 8)) == cudaSuccess;
    if (!t->mmv_stream_ok) (void)cudaGetLastError();
    mmv_fit<1, 4>(t->mmv_cluster_fit[0][0]), mmv_fit<2, 4>(t->mmv_cluster_fit[0][1]);
    mmv_fit<3, 4>(t->mmv_cluster_fit[0][2]), mmv_fit<4, 4>(t->mmv_cluster_fit[0][3]);
    mmv_fit<1, 8>(t->mmv_cluster_fit[1][0]), mmv_fit<2, 8>(t->mmv_cluster_fit[1][1]);
    mmv_fit<3, 8>(t->mmv_cluster_fit[1][2]), mmv_fit<4, 8>(t->mmv_cluster_fit[1][3]);
    msm__linear_fp8_tuning(t);
}

/* ---- cuBLASLt path helpers ---- */

static __global__ void f32_to_bf16_kernel(uint16_t *dst, const float *src, size_t n) {
    msm_pdl_trigger();
    msm_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] = msm_f2bf(src[i]);
}

/* x = hi + lo with hi = bf16(x), lo = bf16(x - hi): hi + lo carries ~16 mantissa bits of x. */
static __global__ void f32_to_bf16_split_kernel(uint16_t *hi, uint16_t *lo, const float *src, size_t n) {
    msm_pdl_trigger();
    msm_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float v = src[i];
        uint16_t h = msm_f2bf(v);
        hi[i] = h;
        lo[i] = msm_f2bf(v - msm_bf(h));
    }
}

static __global__ void add_bias_kernel(float *y, const uint16_t *bias, int T, int N) {
    msm_pdl_trigger();
    msm_pdl_wait();
    size_t n = (size_t)T * N;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] += msm_bf(bias[i % N]);
}

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

extern "C" size_t msm_cuda_linear_ws_bytes(int T, int N, int K) {
    if (T <= MSM_CUDA_GEMV_MAX_T || K <= 0 || N <= MSM_CUDA_GEMV_SMALL_N) return 0;
    return 2 * round_up((size_t)T * K * 2, 256) + LT_WS_BYTES;
}

static unsigned grid_for(size_t n, int threads) {
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    if (b > 65536) b = 65536;
    return b ? (unsigned)b : 1u;
}

/* ---- the gate/up GEMV with SwiGLU in its epilogue (msm_cuda_linear_swiglu) ----
 * gu = x . W^T (W [2I, K]: gate rows, then up rows) and act = silu(gate) * up in one launch, for a
 * dense SwiGLU MLP or a shared expert at one or two tokens. Block b's 4 warps take R gate rows
 * each, 2Rb.. (warps 0, 1), and the matching up rows I + 2Rb.. (warps 2, 3), each row's sum
 * exactly as gemv_kernel<NT, 1, U> makes it (gemv_rows_at; a row's sum is the same at any R and
 * U), so act is bitwise
 * msm_cuda_linear then msm_cuda_swiglu (the same formula as swiglu_kernel); gu is never written.
 * Saves the SwiGLU launch and its round trip (Qwen1.5-MoE batch 1: ~3 us a layer on the shared
 * expert's chain, which ends later than the routed experts'). */
template <int NT, int R, int U, bool PIPE>
static __global__ void __launch_bounds__(GEMV_WARPS * 32)
    linear_swiglu_kernel(float *act, const float *x, const uint16_t *w, int T, int I, int K, bool prefetch,
                         bool early) {
    __shared__ float v[NT][2][2 * R]; /* [token][gate, up][the block's outputs] */
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31, up = warp >> 1;
    int o0 = blockIdx.x * 2 * R, i = o0 + (warp & 1) * R; /* the block's first output; the warp's */
    if (i < I)
        /* (a gate row past I - 1 at odd I is an up row, read and dropped: stored below only < I) */
        gemv_rows_at<NT, R, U, true, false, false, PIPE>(
            up * I + i,
            [&](int t, int n, float s) {
                if (lane == 0) v[t][up][n - up * I - o0] = s;
            },
            x, w, NULL, 0, NULL, T, 2 * I, K, prefetch, early, msm_pdl_hook{early});
    else
        msm_pdl_trigger();
    __syncthreads();
    int t = threadIdx.x / (2 * R), j = threadIdx.x % (2 * R);
    if (t < NT && t < T && o0 + j < I) {
        float g = v[t][0][j], u = v[t][1][j];
        act[(size_t)t * I + o0 + j] = g / (1.0f + expf(-g)) * u;
    }
}

/* Whether msm_cuda_linear of a [2I, K] bf16 weight at T tokens takes gemv_launch<T> with one row a
 * warp (16-byte vectors, one or two tokens: no tiled, MMV or small-N path), which
 * linear_swiglu_kernel reproduces. */
extern "C" bool msm_cuda_linear_swiglu_fits(int T, int I, int K, const void *w, const void *x,
                                           const msm_cuda_tuning *tn) {
    int gemv_max = tn->gemv_max_t < MSM_CUDA_GEMV_MAX_T ? MSM_CUDA_GEMV_MAX_T : tn->gemv_max_t > 64 ? 64 : tn->gemv_max_t;
    long N = 2L * I;
    return tn->linear_swiglu && T >= 1 && T <= 2 && T <= gemv_max && I > 0 && N > MSM_CUDA_GEMV_SMALL_N &&
           I <= (1 << 29) && K % 8 == 0 && K > 0 && ((uintptr_t)w | (uintptr_t)x) % 16 == 0 &&
           !(T >= tn->linear_tiled_min_t && msm__linear_tiled_fits(T, (int)N, K, w, x)) &&
           !mmv_use(tn, T, (int)N, K, w, x);
}

extern "C" int msm_cuda_linear_swiglu(float *act, const float *x, const uint16_t *w, int T, int I, int K,
                                      msm_cuda_exec ex) {
    if (!act || !x || !w) return -EINVAL;
    if (!msm_cuda_linear_swiglu_fits(T, I, K, w, x, ex.tune)) return -ENOTSUP;
    int R = ex.tune->linear_swiglu_rows == 4 ? 4 : ex.tune->linear_swiglu_rows == 2 ? 2 : 1;
    dim3 grid((unsigned)((I + 2 * R - 1) / (2 * R))), block(GEMV_WARPS * 32);
    bool pf = ex.tune->gemv_prefetch, early = ex.tune->gemv_early && !ex.w_written;
    /* gemv_launch's loads in flight at one token and its pipelined rows at two (the same sums); 2
     * or 4 rows a warp at 2 loads a row in flight */
    auto kern = R == 4 ? linear_swiglu_kernel<1, 4, 2, false>
                : R == 2 ? linear_swiglu_kernel<1, 2, 2, false>
                         : linear_swiglu_kernel<1, 1, 4, false>;
    if (R > 1) {
        if (T == 2) kern = R == 4 ? linear_swiglu_kernel<2, 4, 2, false> : linear_swiglu_kernel<2, 2, 2, false>;
    } else if (T == 1 && ex.tune->gemv_u16 && K > 2048 && K <= 4096) {
        kern = linear_swiglu_kernel<1, 1, 16, false>;
    } else if (T == 1 && ex.tune->gemv_u8 && K > 1024 && K <= 2048) {
        kern = linear_swiglu_kernel<1, 1, 8, false>;
    } else if (T == 2) {
        kern = (ex.tune->rows_pipe & MSM_CUDA_PIPE_GEMV) && K > 256 * 4 ? linear_swiglu_kernel<2, 1, 4, true>
                                                                        : linear_swiglu_kernel<2, 1, 4, false>;
    }
    CUDA_TRY(msm_launch(kern, grid, block, 0, ex, act, x, w, T, I, K, pf, early));
    return 0;
}

/* Whether msm_cuda_linear takes the block-sliced MMV for these shapes (main stream), which
 * mmv_kernel<..., ROPE> reproduces with the qkv rows of full-rotary heads regrouped (tuning
 * linear_rope_mmv); its slices, chunks in flight and rows a warp in *ws, *u, *nj. */
static bool linear_rope_mmv_fits(int T, int N, int K, int nh, int kvh, int hd, int rot, const void *w, const void *x,
                                 const msm_cuda_tuning *tn, int *ws, int *u, int *nj) {
    if (!tn->linear_rope || !tn->linear_rope_mmv || T < 3 || T > 16 || nh <= 0 || kvh <= 0 || rot != hd ||
        hd % 32 != 0 || N != (nh + 2 * kvh) * hd || N <= MSM_CUDA_GEMV_SMALL_N ||
        (T >= tn->linear_tiled_min_t && msm__linear_tiled_fits(T, N, K, w, x)) || !mmv_use(tn, T, N, K, w, x))
        return false;
    *ws = mmv_bslice_pick(tn, T, N, K, false, u, nj);
    return *ws > 0 && hd % (*nj * 8) == 0;
}

/* Whether msm_cuda_linear of these shapes takes gemv_launch<T> (bf16, 16-byte vectors, one or two
 * tokens: no tiled, MMV or small-N path), which linear_rope_kernel reproduces, and the qkv rows fit
 * its row hand-out. */
static bool linear_rope_gemv_fits(int T, int N, int K, int nh, int kvh, int hd, int rot, const void *w, const void *x,
                                  const msm_cuda_tuning *tn) {
    int gemv_max = tn->gemv_max_t < MSM_CUDA_GEMV_MAX_T ? MSM_CUDA_GEMV_MAX_T : tn->gemv_max_t > 64 ? 64 : tn->gemv_max_t;
    return tn->linear_rope && T >= 1 && T <= 2 && T <= gemv_max && nh > 0 && kvh > 0 && hd > 0 && hd % 4 == 0 &&
           rot > 0 && rot % 4 == 0 && rot <= hd && (hd - rot) % 4 == 0 && N == (nh + 2 * kvh) * hd &&
           N > MSM_CUDA_GEMV_SMALL_N && K % 8 == 0 && K >= 32 * 8 && ((uintptr_t)w | (uintptr_t)x) % 16 == 0 &&
           !(T >= tn->linear_tiled_min_t && msm__linear_tiled_fits(T, N, K, w, x)) && !mmv_use(tn, T, N, K, w, x);
}

extern "C" bool msm_cuda_linear_rope_kv_fits(int T, int N, int K, int nh, int kvh, int hd, int rot, const void *w,
                                             const void *x, const msm_cuda_tuning *tn) {
    int ws, u, nj;
    return linear_rope_mmv_fits(T, N, K, nh, kvh, hd, rot, w, x, tn, &ws, &u, &nj) ||
           linear_rope_gemv_fits(T, N, K, nh, kvh, hd, rot, w, x, tn);
}

extern "C" int msm_cuda_linear_rope_kv(float *out, const float *x, const uint16_t *w, const uint16_t *bias,
                                       const int32_t *pos, const int32_t *slot, uint16_t *kc, uint16_t *vc, int T,
                                       int K, int nh, int kvh, int hd, int rot, float theta, msm_cuda_exec ex) {
    int N = (nh + 2 * kvh) * hd;
    if (!out || !x || !w || !pos || !slot || !kc || !vc) return -EINVAL;
    lrk_args a = {out, pos, slot, kc, vc, nh, kvh, hd, rot, theta};
    int ws, u, nj;
    if (linear_rope_mmv_fits(T, N, K, nh, kvh, hd, rot, w, x, ex.tune, &ws, &u, &nj)) {
        /* the block-sliced MMV's choice (mmv_run), its rows regrouped by head halves */
        CUDA_TRY(mmvb_go<true>(ws, u, nj, NULL, x, w, bias, T, N, K, ex, a));
        return 0;
    }
    if (!linear_rope_gemv_fits(T, N, K, nh, kvh, hd, rot, w, x, ex.tune)) return -ENOTSUP;
    dim3 grid((unsigned)(N / GEMV_WARPS)), block(GEMV_WARPS * 32);
    bool pf = ex.tune->gemv_prefetch, early = ex.tune->gemv_early && !ex.w_written;
    /* gemv_launch's loads in flight at one token and its pipelined rows at two */
    auto kern = linear_rope_kernel<1, 4, false>;
    if (T == 1 && ex.tune->gemv_u16 && K > 2048 && K <= 4096) kern = linear_rope_kernel<1, 16, false>;
    else if (T == 1 && ex.tune->gemv_u8 && K > 1024 && K <= 2048) kern = linear_rope_kernel<1, 8, false>;
    else if (T == 2) kern = (ex.tune->rows_pipe & MSM_CUDA_PIPE_GEMV) && K > 256 * 4 ? linear_rope_kernel<2, 4, true>
                                                                                     : linear_rope_kernel<2, 4, false>;
    else if (ex.tune->gemv_minb & MSM_CUDA_MINB_QKV) kern = linear_rope_kernel<1, 4, false, GEMV_MINB>;
    CUDA_TRY(msm_launch(kern, grid, block, 0, ex, a, x, w, bias, T, N, K, pf, early, ex.decode && ex.tune->small_early));
    return 0;
}

extern "C" int msm_cuda_linear(float *y, const float *x, const uint16_t *w, const uint16_t *bias,
                               int T, int N, int K, msm_cuda_ctx *ctx, void *ws, size_t ws_bytes,
                               msm_cuda_exec ex) {
    if (T < 0 || N <= 0 || K <= 0) return -EINVAL;
    if (T == 0) return 0;
    const msm_cuda_tuning *tn = ex.tune;
    int gemv_max = tn->gemv_max_t < MSM_CUDA_GEMV_MAX_T ? MSM_CUDA_GEMV_MAX_T : tn->gemv_max_t > 64 ? 64 : tn->gemv_max_t;
    /* routers (N <= MSM_CUDA_GEMV_SMALL_N) keep the fp32 GEMV: their top-k must not flip on
     * rounding, and at T = 8 the MMV took 7 us for a 60-row router against 3.5 us (H200) */
    if (T >= tn->linear_tiled_min_t && N > MSM_CUDA_GEMV_SMALL_N && msm__linear_tiled_fits(T, N, K, w, x))
        return msm__linear_tiled_run(y, x, w, bias, T, N, K, ex);
    if (mmvs_use(tn, T, N, K, w, x)) return mmvs_run(y, x, w, bias, T, N, K, 16, ex);
    if (T <= 64 && N > MSM_CUDA_GEMV_SMALL_N && mmv_use(tn, T, N, K, w, x))
        return mmv_run(y, x, w, bias, T, N, K, ex);
    if (T <= gemv_max || N <= MSM_CUDA_GEMV_SMALL_N) {
        bool vec = K % 8 == 0 && ((uintptr_t)w | (uintptr_t)x) % 16 == 0;
        if (N <= MSM_CUDA_GEMV_SMALL_N && msm_small_block(T, N)) {
            /* a router: one block per (row, token) (msm_small_dot), the few weight rows re-read from
             * L2 for each token (token chunks leave a 60-row router with 4-16 blocks: 34 us at
             * T = 32; one warp a row left Qwen3-30B-A3B's 128-row router at 10 us at T = 1, H200) */
            dim3 grid((unsigned)N, (unsigned)T);
            if (vec)
                (void)msm_launch(small_gemv_kernel<true>, grid, dim3(MSM_SMALL_THREADS), 0, ex, y, x, w, bias, N, K);
            else
                (void)msm_launch(small_gemv_kernel<false>, grid, dim3(MSM_SMALL_THREADS), 0, ex, y, x, w, bias, N, K);
        } else if ((T > gemv_max || (N <= MSM_CUDA_GEMV_SMALL_N && T > 1)) && T <= 65535) {
            /* a router over more tokens: token chunks of NT while they still give two blocks an
             * SM (tuning router_chunk_per_sm) (each weight row then read from L2 once a chunk instead of once a token: one
             * warp per (row, token) took Qwen3-30B-A3B's 128-row router 25.8 us at T = 256, ncu,
             * H200), else one warp per (row, token) (token chunks leave a 60-row router with 4-16
             * blocks: 34 us at T = 32, and ~15 us at T = 8 against ~3.5 us this way). The same
             * bits at every NT: each lane's products are summed in one order. */
            switch (router_chunk(T, N, tn->sms, tn->router_chunk_per_sm > 0 ? tn->router_chunk_per_sm : 2)) {
            case 8: vec ? gemv_launch<8, true>(y, x, w, bias, T, N, K, ex) : gemv_launch<8, false>(y, x, w, bias, T, N, K, ex); break;
            case 4: vec ? gemv_launch<4, true>(y, x, w, bias, T, N, K, ex) : gemv_launch<4, false>(y, x, w, bias, T, N, K, ex); break;
            case 2: vec ? gemv_launch<2, true>(y, x, w, bias, T, N, K, ex) : gemv_launch<2, false>(y, x, w, bias, T, N, K, ex); break;
            default: vec ? gemv_launch<1, true>(y, x, w, bias, T, N, K, ex) : gemv_launch<1, false>(y, x, w, bias, T, N, K, ex);
            }
        } else if (vec) {
            gemv_dispatch<true>(y, x, w, bias, T, N, K, ex);
        } else {
            gemv_dispatch<false>(y, x, w, bias, T, N, K, ex);
        }
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    if (!ctx || !ws || ws_bytes < msm_cuda_linear_ws_bytes(T, N, K) || (uintptr_t)ws % 256)
        return -EINVAL;
    lt_plan *p;
    int r = plan_get(ctx, T, N, K, ptr_align(w), ptr_align(y), &p);
    if (r < 0) return r;
    size_t xb_bytes = round_up((size_t)T * K * 2, 256), n = (size_t)T * K;
    uint16_t *xb = (uint16_t *)ws, *xlo = (uint16_t *)((char *)ws + xb_bytes);
    void *lt_ws = (char *)ws + 2 * xb_bytes;
    const float alpha = 1.0f, beta0 = 0.0f, beta1 = 1.0f;
    if (T >= tn->lt_split_min_t) {
        CUDA_TRY(msm_launch(f32_to_bf16_split_kernel, dim3(grid_for(n, 256)), dim3(256), 0, ex, xb, xlo, x, n));
        CUBLAS_TRY(cublasLtMatmul(ctx->lt, p->op, &alpha, w, p->la, xb, p->lb, &beta0, y, p->ld, y,
                                  p->ld, &p->algo, lt_ws, LT_WS_BYTES, ex.stream));
        CUBLAS_TRY(cublasLtMatmul(ctx->lt, p->op, &alpha, w, p->la, xlo, p->lb, &beta1, y, p->ld, y,
                                  p->ld, &p->algo, lt_ws, LT_WS_BYTES, ex.stream));
    } else {
        CUDA_TRY(msm_launch(f32_to_bf16_kernel, dim3(grid_for(n, 256)), dim3(256), 0, ex, xb, x, n));
        CUBLAS_TRY(cublasLtMatmul(ctx->lt, p->op, &alpha, w, p->la, xb, p->lb, &beta0, y, p->ld, y,
                                  p->ld, &p->algo, lt_ws, LT_WS_BYTES, ex.stream));
    }
    if (bias) {
        CUDA_TRY(msm_launch(add_bias_kernel, dim3(grid_for((size_t)T * N, 256)), dim3(256), 0, ex, y, bias, T, N));
    }
    return 0;
}

/* ---- FP8-resident weights (docs/adr/0006-fp8.md) ---- */

extern "C" size_t msm_cuda_linear_fp8_deq_bytes(int N, int K) {
    return N > 0 && K > 0 ? ((size_t)N * K * 2 + 255) / 256 * 256 : 0;
}

extern "C" int msm_cuda_linear_fp8(float *y, const float *x, msm_cuda_fp8w w, const uint16_t *bias, int T, int N,
                                   int K, msm_cuda_ctx *ctx, void *ws, size_t ws_bytes, uint16_t *deq,
                                   size_t deq_bytes, msm_cuda_exec ex) {
    if (T < 0 || N <= 0 || K <= 0 || !w.q || !w.scale || w.phase < 0 || w.phase >= MSM_CUDA_FP8_BLOCK) return -EINVAL;
    if (T == 0) return 0;
    /* the tensor-core MMV8, else the SIMT FP8 GEMV (each code read once per 8-token chunk): float32
     * weights either way (see linear_fp8.cu, msm_rows_dot_fp8) */
    int kern = ex.tune->fp8_linear;
    /* fp8_linear_tiled_min_t..64 tokens: the tiled GEMM on the codes (linear_tiled_fp8.cu; float32
     * weights); routers (N <= MSM_CUDA_GEMV_SMALL_N) keep the GEMVs */
    if (T >= ex.tune->fp8_linear_tiled_min_t && T <= ex.tune->fp8_native_max_t && N > MSM_CUDA_GEMV_SMALL_N &&
        msm__linear_tiled_fp8_fits(T, N, K, w, x, ws, ws_bytes))
        return msm__linear_tiled_fp8_run(y, x, w, bias, T, N, K, ws, ws_bytes, ex);
    /* past fp8_linear_max_t tokens (decode steps: MSM_CUDA_FP8_LINEAR_DECODE_MAX_T), dequantised below */
    bool fp8 = T <= ex.tune->fp8_native_max_t && T <= ex.tune->fp8_linear_max_t;
    if (fp8 && kern == MSM_CUDA_FP8_LINEAR_MMA && T >= ex.tune->fp8_mma_min_t &&
        msm__linear_fp8_mma_fits(T, N, K, w, x, ex.tune->sms))
        return msm__linear_fp8_mma_run(y, x, w, bias, T, N, K, ex);
    if (fp8 && K % 16 == 0 && w.phase % 16 == 0 && ((uintptr_t)w.q | (uintptr_t)x) % 16 == 0) {
        if (T > 1 && N <= MSM_CUDA_GEMV_SMALL_N && T <= 65535) /* few rows: one warp per (row, token) */
            gemv_launch<1, true, true>(y, x, w.q, bias, T, N, K, ex, w.scale, w.phase);
        else if (T == 1 && ex.tune->fp8_gemv_split && K >= ex.tune->fp8_gemv_split_min_k &&
                 N > MSM_CUDA_GEMV_SMALL_N) /* 4 warps a row (long rows) */
            CUDA_TRY(gemv_fp8_split_launch(y, x, (const uint8_t *)w.q, w.scale, w.phase, bias, N, K, ex));
        else if (fp8_gemv_hw(ex.tune)) /* the hardware decode */
            gemv_dispatch<true, true, true>(y, x, w.q, bias, T, N, K, ex, w.scale, w.phase);
        else
            gemv_dispatch<true, true>(y, x, w.q, bias, T, N, K, ex, w.scale, w.phase);
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    /* larger T: the weight dequantised to bf16 (as a bf16-resident one would be) for the bf16 paths */
    if (!deq || deq_bytes < msm_cuda_linear_fp8_deq_bytes(N, K)) return -EINVAL;
    int r = msm_cuda_fp8_dequant(deq, w, 1, N, K, NULL, ex);
    if (r) return r;
    msm_cuda_exec ed = ex;
    ed.w_written = true; /* deq is the previous kernel's output: no loads of it before the PDL wait */
    return msm_cuda_linear(y, x, deq, bias, T, N, K, ctx, ws, ws_bytes, ed);
}

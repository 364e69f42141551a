/* msm_cuda: error mapping for the CUDA side of libmsmoe, plus small device helpers the kernels
 * share.
 *
 * Every CUDA, cuBLAS(Lt) call whose failure a caller must see goes through CUDA_TRY or
 * CUBLAS_TRY: on failure they log the expression, file:line, current device and the library's
 * error string once (to stderr, the daemon's log), and return a negative errno from the
 * enclosing function. Launchers end with CUDA_LAUNCH_CHECK(), which catches bad launch
 * configurations (and, outside a graph capture, earlier asynchronous faults).
 *
 * The header is valid C and C++; the device helpers at the end exist only under nvcc. */
#ifndef MSM_CUDA_H
#define MSM_CUDA_H

#include <cublasLt.h>
#include <cuda_runtime_api.h>

#include "msm_cuda_kernels.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Logs the failed expression and maps err to a negative errno (-ENOMEM for allocation
 * failures, -EINVAL for invalid values, -ENOTSUP for unsupported, -EIO otherwise). */
int msm__cuda_fail(const char *expr, const char *file, int line, cudaError_t err);
int msm__cublas_fail(const char *expr, const char *file, int line, cublasStatus_t st);

/* The same mappings without logging, for callers that report elsewhere. */
int msm_cuda_errno(cudaError_t err);
int msm_cublas_errno(cublasStatus_t st);

/* Per-module parts of msm_cuda_tuning_init (tuning.cu): the occupancy of the kernels whose grids
 * are sized by it. */
void msm__moe_tuning(msm_cuda_tuning *t);
void msm__moe_pair_tuning(msm_cuda_tuning *t);
void msm__attention_tuning(msm_cuda_tuning *t);
void msm__router_tuning(msm_cuda_tuning *t); /* router.cu: router_cluster_max */
/* The tensor-core GQA attention (attention_mma.cu): its shared-memory limits, whether a call fits
 * it (head dim 16/32/64/128, alignment), the launch. */
int msm__attention_mma_prepare(void);
bool msm__attention_mma_fits(int hd, const void *q, size_t q_ld, const void *kc, const void *vc);
int msm__attention_mma_run(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                           const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks,
                           int T, int nh, int kvh, int hd, float scale, msm_cuda_exec ex);
/* Clusters an attention launch leaves free for the kernel before it, which under programmatic
 * dependent launch still holds slots (one a GPC on the H100/H200's 8): in run 2 of
 * bench/results/2026-12-01-h200-mega, clustered splits won where this held (Qwen1.5-MoE batch 1:
 * 16 clusters of 16, 2.108 -> 2.020 ms with early loads; Qwen3-30B-A3B batch 8: 256 of 2, 9.85 ->
 * 9.65) and lost where it did not (Qwen1.5 batch 8: 128 of 4, 4.95 -> 5.04; Qwen3 batch 1: 32 of
 * 16, 3.43 -> 3.53) */
#define MSM_ATT_CLUSTER_SPARE 8
/* ... its context split over a thread-block cluster (tuning att_mma_split): the occupancy facts
 * (msm_cuda_tuning_init), the launch (the splits: msm_cuda_attention_mma_splits). */
void msm__attention_mma_tuning(msm_cuda_tuning *t);
int msm__attention_mma_split_run(float *out, const float *q, size_t q_ld, const uint16_t *kc, const uint16_t *vc,
                                 const int32_t *seq, const int32_t *pos, const int32_t *block_tables, int max_blocks,
                                 int T, int nh, int kvh, int hd, float scale, int ns, msm_cuda_exec ex);
void msm__linear_tuning(msm_cuda_tuning *t); /* linear.cu, linear_fp8.cu */
void msm__linear_fp8_tuning(msm_cuda_tuning *t);
/* The tiled MoE kernels' shared-memory limit on the current device (moe_tiled.cu). */
int msm__moe_tiled_prepare(void);
/* The tiled linear (linear_tiled.cu): its shared-memory limit, whether a call fits it, the launch. */
int msm__linear_tiled_prepare(void);
bool msm__linear_tiled_fits(int T, int N, int K, const void *w, const void *x);
int msm__linear_tiled_run(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T,
                          int N, int K, msm_cuda_exec ex);
/* The FP8 tensor-core linear (linear_fp8.cu): its shared-memory limit, whether a call fits, the launch. */
int msm__linear_fp8_mma_prepare(void);
/* linear_tiled_fp8.cu: FP8 dense linears of 9..64 tokens (ws: msm_cuda_linear_ws_bytes(T, N, K)) */
int msm__linear_tiled_fp8_prepare(void);
bool msm__linear_tiled_fp8_fits(int T, int N, int K, msm_cuda_fp8w w, const float *x, const void *ws, size_t ws_bytes);
int msm__linear_tiled_fp8_run(float *y, const float *x, msm_cuda_fp8w w, const uint16_t *bias, int T, int N, int K,
                              void *ws, size_t ws_bytes, msm_cuda_exec ex);
bool msm__linear_fp8_mma_fits(int T, int N, int K, msm_cuda_fp8w w, const float *x, int sms);
int msm__linear_fp8_mma_run(float *y, const float *x, msm_cuda_fp8w w, const uint16_t *bias, int T, int N, int K,
                            msm_cuda_exec ex);

#ifdef __cplusplus
}
#endif

#define CUDA_TRY(expr)                                                                  \
    do {                                                                                \
        cudaError_t msm_e_ = (expr);                                                    \
        if (msm_e_ != cudaSuccess) return msm__cuda_fail(#expr, __FILE__, __LINE__, msm_e_); \
    } while (0)

#define CUBLAS_TRY(expr)                                                                \
    do {                                                                                \
        cublasStatus_t msm_s_ = (expr);                                                 \
        if (msm_s_ != CUBLAS_STATUS_SUCCESS)                                            \
            return msm__cublas_fail(#expr, __FILE__, __LINE__, msm_s_);                 \
    } while (0)

/* After every <<<>>>: a launch error (bad grid, too much shared memory) surfaces here. */
#define CUDA_LAUNCH_CHECK() CUDA_TRY(cudaGetLastError())

/* Row norms (RMSNorm and the kernels that fuse it): one block per row, thread i owning elements
 * i, i + threads, i + 2*threads, ... (msm_norm_vals of them); the sum of squares adds them in
 * that order, then warp sums, then the warps in order (msm_block_sum). Every kernel that norms a
 * row picks threads and values with these two, so they all agree bitwise. */
static inline int msm_norm_threads(int dim) {
    if (dim <= 8192) return dim >= 1024 ? 256 : dim > 128 ? 128 : 64;
    int t = (dim + 31) / 32;
    return (t + 31) / 32 * 32;
}

/* Values per thread: the smallest of 1, 2, 4, ..., 32 that covers dim (dim <= 32 * 1024). */
static inline int msm_norm_vals(int dim, int threads) {
    int v = 1;
    while (v * threads < dim) v *= 2;
    return v;
}

#ifdef __CUDACC__
#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#define MSM_FULL_MASK 0xffffffffu

static __device__ __forceinline__ float msm_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(MSM_FULL_MASK, v, o);
    return v;
}

static __device__ __forceinline__ float msm_warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(MSM_FULL_MASK, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32): warp sums, then the warps in order; every
 * thread gets the total. part: shared memory of 32 floats. */
static __device__ __forceinline__ float msm_block_sum(float v, float *part) {
    v = msm_warp_sum(v);
    int warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    __syncthreads(); /* part may still be read from a previous call */
    if ((threadIdx.x & 31) == 0) part[warp] = v;
    __syncthreads();
    float tot = 0.0f;
    for (int i = 0; i < nwarps; i++) tot += part[i];
    return tot;
}

/* bf16 bits to float: exact (a bf16 is the top half of a float). */
static __device__ __forceinline__ float msm_bf(uint16_t h) {
    return __uint_as_float((uint32_t)h << 16);
}

/* One token row's residual add + RMSNorm by a block of TH threads playing the vt virtual threads of
 * add_rmsnorm_kernel (msm_norm_threads(N); thread i plays i, i + TH, ... F of them, V values each):
 * v = ld(i) for element i (virtual thread tv owns i = tv + j * vt), squares summed in j order, warp
 * sums, then the vt / 32 virtual warps in order (msm_block_sum's), so the bits of
 * msm_cuda_add_rmsnorm; then st(i, v, wv * (v * inv)) for every element. wv: this thread's norm
 * weights in that layout. part: shared memory of 32 floats. Every thread of the block calls it. */
template <int V, int F, int TH, typename Ld, typename St>
static __device__ __forceinline__ void msm_block_norm_row(Ld ld, St st, const float (&wv)[F][V], int N, float eps,
                                                           int vt, float *part) {
    float v[F][V];
    float ss[F];
#pragma unroll
    for (int f = 0; f < F; f++) {
        int tv = threadIdx.x + f * TH; /* this thread's virtual thread */
        ss[f] = 0.0f;
#pragma unroll
        for (int j = 0; j < V; j++) {
            int i = tv + j * vt;
            v[f][j] = tv < vt && i < N ? ld(i) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < V; j++) {
            int i = tv + j * vt;
            if (tv < vt && i < N) ss[f] += v[f][j] * v[f][j];
        }
        ss[f] = msm_warp_sum(ss[f]);
    }
    __syncthreads(); /* part may still be read for the previous row */
#pragma unroll
    for (int f = 0; f < F; f++) {
        int tv = threadIdx.x + f * TH;
        if ((threadIdx.x & 31) == 0 && tv < vt) part[tv / 32] = ss[f];
    }
    __syncthreads();
    float tot = 0.0f;
    for (int i = 0; i < vt / 32; i++) tot += part[i];
    float inv = 1.0f / sqrtf(tot / (float)N + eps);
#pragma unroll
    for (int f = 0; f < F; f++) {
        int tv = threadIdx.x + f * TH;
#pragma unroll
        for (int j = 0; j < V; j++) {
            int i = tv + j * vt;
            if (tv < vt && i < N) st(i, v[f][j], wv[f][j] * (v[f][j] * inv));
        }
    }
}

/* This thread's norm weights in msm_block_norm_row's layout (0 past N). */
template <int V, int F, int TH>
static __device__ __forceinline__ void msm_block_norm_w(const uint16_t *nw, int N, int vt, float (&wv)[F][V]) {
#pragma unroll
    for (int f = 0; f < F; f++)
#pragma unroll
        for (int j = 0; j < V; j++) {
            int i = threadIdx.x + f * TH + j * vt;
            wv[f][j] = threadIdx.x + f * TH < vt && i < N ? msm_bf(__ldg(nw + i)) : 0.0f;
        }
}

/* This thread's norm weights in the msm_norm_row_store layout (0 past dim). Norm weights are never
 * written during a step: kernels load them before their PDL wait, so the load's latency overlaps
 * the previous kernel instead of following the block sum (H200, 2026-12-01: a one-block
 * add_rmsnorm cost a decode step ~3.5 us). */
template <int V>
static __device__ __forceinline__ void msm_norm_w_load(const uint16_t *w, int dim, float (&wv)[V]) {
#pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        wv[j] = i < dim ? msm_bf(__ldg(w + i)) : 0.0f;
    }
}

/* The tail of a row norm (msm_norm_threads/msm_norm_vals layout): v[j] is element
 * threadIdx.x + j * blockDim.x of the row at off (0 past dim); stores it into sum (unless NULL),
 * then out = rmsnorm(row) * w (wv: msm_norm_w_load), the sum of squares in j order, then
 * msm_block_sum. Every kernel that ends in a residual norm calls this, so they agree bitwise.
 * part: shared memory of 32 floats. */
template <int V>
static __device__ __forceinline__ void msm_norm_row_store(const float (&v)[V], float *sum, float *out, size_t off,
                                                          const float (&wv)[V], int dim, float eps, float *part) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < dim) {
            if (sum) sum[off + i] = v[j];
            ss += v[j] * v[j];
        }
    }
    float tot = msm_block_sum(ss, part);
    float inv = 1.0f / sqrtf(tot / (float)dim + eps);
#pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        if (i < dim) out[off + i] = wv[j] * (v[j] * inv);
    }
}

/* The two bf16 packed in one 32-bit word, low half first (memory order). */
static __device__ __forceinline__ float2 msm_bf2(uint32_t w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

/* 16-byte load of data read once (weights): skip L1 so activations keep it. */
static __device__ __forceinline__ uint4 msm_ld_stream16(const void *p) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* Round to nearest even, as msm_f32_to_bf16 on the host. */
static __device__ __forceinline__ uint16_t msm_f2bf(float f) {
    __nv_bfloat16 b = __float2bfloat16_rn(f);
    return *reinterpret_cast<uint16_t *>(&b);
}

/* RoPE, as the CPU (and HF): inv_freq = 1 / theta^(2i/rot) in float32, angle pos * inv_freq. */
static __device__ __forceinline__ void msm_rope_cs(int pos, int i, int rot, float theta, float *c, float *s) {
    float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)rot);
    float ang = (float)pos * inv_freq;
    *c = cosf(ang);
    *s = sinf(ang);
}

/* The rotation of the pair (a = x[i], b = x[i + rot/2]): a' = a c - b s, b' = b c + a s, each
 * product and sum rounded on its own (no contraction into an FMA, as the CPU computes them), so
 * every kernel that rotates (the RoPE kernels, decode attention with RoPE) gives the same bits. */
static __device__ __forceinline__ float msm_rope_lo(float a, float b, float c, float s) {
    return __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
}
static __device__ __forceinline__ float msm_rope_hi(float a, float b, float c, float s) {
    return __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

/* s + w . (xa, xb) over 8 elements, in this fixed order (the GEMV and MoE kernels share it, so
 * their results stay bit-identical to each other and run to run). */
static __device__ __forceinline__ float msm_fma8(const float w[8], float4 xa, float4 xb, float s) {
    s = fmaf(w[0], xa.x, s);
    s = fmaf(w[1], xa.y, s);
    s = fmaf(w[2], xa.z, s);
    s = fmaf(w[3], xa.w, s);
    s = fmaf(w[4], xb.x, s);
    s = fmaf(w[5], xb.y, s);
    s = fmaf(w[6], xb.z, s);
    s = fmaf(w[7], xb.w, s);
    return s;
}

/* 8 bf16 weights packed in 16 bytes (memory order) as f32 (exact). */
static __device__ __forceinline__ void msm_bf16x8(uint4 w, float (&f)[8]) {
    float2 a = msm_bf2(w.x), b = msm_bf2(w.y), c = msm_bf2(w.z), d = msm_bf2(w.w);
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
}

/* msm_fma8 with the 8 weights as bf16 packed in 16 bytes (memory order). */
static __device__ __forceinline__ float msm_fma8_bf16(uint4 w, float4 xa, float4 xb, float s) {
    float f[8];
    msm_bf16x8(w, f);
    return msm_fma8(f, xa, xb, s);
}

/* acc[r][t] += this lane's share of dot(row r, vector t) over K: R bf16 weight rows wr[r] against
 * NT f32 vectors xs[t], of which only the first nt are live (nt warp-uniform). With DIAG, row r
 * pairs with vector r alone (NT == R) and the sum goes to acc[r][r]. Lane l reads
 * k = 8l + 256u (+ 256U per step) with 16-byte loads that bypass L1, all R*U loads of a step
 * issued before any is used; with PIPE also those of the next step before this step's
 * arithmetic (software pipelining: a warp keeps weights in flight across a K of several steps, for
 * more registers; the same sums); a NULL row reads nothing and adds nothing. Every partial sum runs
 * over the same 8-element groups in the same order (msm_fma8), so the GEMV and MoE kernels that
 * share this loop agree bit for bit. VEC false (K % 8 != 0 or unaligned rows): one element a lane
 * a step, in k order. The caller reduces acc over the warp.
 * hook() runs once, after the first step's weight loads are issued and before any vector is read
 * (VEC; else first): a GEMV passes its PDL wait there, so its first weight loads, which no kernel
 * writes during a step, overlap the previous kernel's tail (msm_cuda_tuning.gemv_early). */
struct msm_no_hook {
    __device__ __forceinline__ void operator()() const {}
};
template <int R, int NT, int U, bool VEC, bool DIAG = false, bool PIPE = false, typename Hook = msm_no_hook>
static __device__ __forceinline__ void msm_rows_dot(float (&acc)[R][NT], const uint16_t *const (&wr)[R],
                                                    const float *const (&xs)[NT], int nt, int K,
                                                    int lane, Hook hook = Hook()) {
    static_assert(!DIAG || NT == R, "a diagonal dot pairs each row with its own vector");
    if (VEC) {
        constexpr int STEP = 256 * U;
        /* step k0's loads, zeros past K or for a NULL row (no memory access) */
        auto load = [&](uint4 (&dst)[R][U], int k0) {
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int k = k0 + u * 256;
                    dst[r][u] = (wr[r] && k < K) ? msm_ld_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
                }
        };
        /* step k0's arithmetic on its loaded weights */
        auto step = [&](const uint4 (&wv)[R][U], int k0) {
#pragma unroll
            for (int u = 0; u < U; u++) {
                int k = k0 + u * 256;
                if (k >= K) break;
                float wf[R][8];
#pragma unroll
                for (int r = 0; r < R; r++) msm_bf16x8(wv[r][u], wf[r]);
                if constexpr (DIAG) {
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        if (!wr[r]) continue;
                        const float4 *xp = (const float4 *)(xs[r] + k);
                        acc[r][r] = msm_fma8(wf[r], xp[0], xp[1], acc[r][r]);
                    }
                } else {
#pragma unroll
                    for (int t = 0; t < NT; t++) {
                        if (t >= nt) break;
                        const float4 *xp = (const float4 *)(xs[t] + k);
                        float4 xa = xp[0], xb = xp[1];
#pragma unroll
                        for (int r = 0; r < R; r++) /* a NULL row's zeros: its acc is never read */
                            acc[r][t] = msm_fma8(wf[r], xa, xb, acc[r][t]);
                    }
                }
            }
        };
        uint4 wv[R][U];
        if constexpr (PIPE) {
            load(wv, lane * 8);
            hook();
            for (int k0 = lane * 8; k0 < K; k0 += STEP) {
                uint4 nx[R][U];
                load(nx, k0 + STEP); /* the next step's loads before this step's arithmetic */
                step(wv, k0);
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int u = 0; u < U; u++) wv[r][u] = nx[r][u];
            }
        } else {
            if (lane * 8 >= K) hook(); /* no step: nothing to overlap */
            for (int k0 = lane * 8; k0 < K; k0 += STEP) {
                load(wv, k0);
                if (k0 == lane * 8) hook();
                step(wv, k0);
            }
        }
    } else {
        hook();
        for (int k = lane; k < K; k += 32)
#pragma unroll
            for (int r = 0; r < R; r++) {
                if (!wr[r]) continue;
                float wf = msm_bf(wr[r][k]);
                if constexpr (DIAG) {
                    acc[r][r] = fmaf(wf, xs[r][k], acc[r][r]);
                } else {
#pragma unroll
                    for (int t = 0; t < NT; t++)
                        if (t < nt) acc[r][t] = fmaf(wf, xs[t][k], acc[r][t]);
                }
            }
    }
}

/* dot(row, x) over K by a whole block of MSM_SMALL_THREADS threads (one output of a small-N
 * linear: a router logit): VEC (K % 8 == 0, 16-byte aligned row and x), thread i reads the 8
 * weights at 8i + 8 * MSM_SMALL_THREADS * j, all its loads in flight at once, and sums them in j
 * order (msm_fma8); else one element at i + MSM_SMALL_THREADS * j. Then warp sums and the warps
 * in order (msm_block_sum): every thread gets the same total, bitwise the same run to run. The
 * small-N GEMV (linear.cu) and the fused router (router.cu) both compute their logits with it,
 * so they agree bit for bit. K up to 8 * MSM_SMALL_THREADS * MSM_SMALL_U in one round of loads. */
#define MSM_SMALL_THREADS 128
#define MSM_SMALL_U 4
/* Whether a small-N linear of T tokens takes msm_small_dot (one block an output), else the GEMV's
 * one warp an output (gemv_kernel<1, 1, 4>); the fused router decides the same way. Blocks pay at
 * few outputs (Qwen3-30B-A3B's router, 128 x 1: 10 -> ~5 us a layer) and cost at many (Qwen1.5-MoE
 * batch 32, 60 x 32 outputs: the step 9.3 -> 9.56 ms with blocks; H200, 2026-12-01). */
static inline bool msm_small_block(int T, int N) { return (long)T * N <= 1024; }
/* hook: as msm_rows_dot's (run by every thread once, after its first round of weight loads and
 * before x is read; first without VEC). */
template <bool VEC, typename Hook = msm_no_hook>
static __device__ __forceinline__ float msm_small_dot(const uint16_t *row, const float *x, int K, float *part,
                                                     Hook hook = Hook()) {
    float acc = 0.0f;
    const int tid = threadIdx.x;
    if constexpr (VEC) {
        if (tid * 8 >= K) hook(); /* no round: nothing to overlap */
        for (int k0 = tid * 8; k0 < K; k0 += 8 * MSM_SMALL_THREADS * MSM_SMALL_U) {
            uint4 wv[MSM_SMALL_U];
#pragma unroll
            for (int u = 0; u < MSM_SMALL_U; u++) {
                int k = k0 + u * 8 * MSM_SMALL_THREADS;
                wv[u] = k < K ? msm_ld_stream16(row + k) : make_uint4(0, 0, 0, 0);
            }
            if (k0 == tid * 8) hook();
#pragma unroll
            for (int u = 0; u < MSM_SMALL_U; u++) {
                int k = k0 + u * 8 * MSM_SMALL_THREADS;
                if (k >= K) break;
                const float4 *xp = (const float4 *)(x + k);
                acc = msm_fma8_bf16(wv[u], xp[0], xp[1], acc);
            }
        }
    } else {
        hook();
        for (int k = tid; k < K; k += MSM_SMALL_THREADS) acc = fmaf(msm_bf(row[k]), x[k], acc);
    }
    return msm_block_sum(acc, part);
}

/* ---- FP8 block-scaled weights (docs/adr/0006-fp8.md) ----
 * An e4m3 weight row is read 16 codes (16 bytes) at a time; every run of 16 lies inside one
 * 128-column scale block, so a lane's 16 products share one scale: the kernels sum
 * f32(q) * x over the 16 in the msm_fma8 order, then multiply that partial by the block's scale
 * and add it to the accumulator (one fmaf). The weight each x meets is therefore the float32
 * value f32(q) * scale the CPU oracle holds, up to where the rounding happens (one multiply per
 * 16 products instead of one per weight): not bf16-rounded.
 *
 * Decoding: a code is decoded with integer operations as f32(q) * 2^-120: its 7 exponent and
 * mantissa bits
 * placed under float32's exponent bias (the code's subnormals become float32 subnormals of the
 * same value), which needs no add and no case. x is multiplied by 2^100 as it is read (exact for
 * |x| < 2^28) so no product underflows, and the scale by 2^20 (exact). The tensor-core kernels
 * need this decode (there is no e4m3 -> bf16 conversion instruction on sm_90); the SIMT ones use
 * it too, so every path multiplies by the same values. On the H200 it measured as fast as
 * cvt.rn.f16x2.e4m3x2 plus half-to-float (12.7 vs 12.5 us for a 5120 x 2048 GEMV, one row a
 * warp; MSM_CUDA_FP8_LINEAR=simt_hw keeps that one for comparison). The two NaN codes decode as
 * finite numbers this way: the loader refuses FP8-resident weights holding them. */
#define MSM_FP8_X_SCALE 0x1p100f
#define MSM_FP8_S_SCALE 0x1p20f

/* Four codes (memory order) to float32: HW, exactly (NaN included); else times 2^-120. */
template <bool HW>
static __device__ __forceinline__ void msm_fp8x4_f32(uint32_t v, float *f) {
    if constexpr (HW) {
        __half2_raw a = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
        __half2_raw b = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3);
        float2 fa = __half22float2(__half2(a)), fb = __half22float2(__half2(b));
        f[0] = fa.x, f[1] = fa.y, f[2] = fb.x, f[3] = fb.y;
    } else {
        f[0] = __int_as_float(((int)(v << 24) >> 4) & (int)0x87f00000);
        f[1] = __int_as_float(((int)(v << 16) >> 4) & (int)0x87f00000);
        f[2] = __int_as_float(((int)(v << 8) >> 4) & (int)0x87f00000);
        f[3] = __int_as_float(((int)v >> 4) & (int)0x87f00000);
    }
}

/* Two codes at bits 8..15 and 24..31 of t (the rest zero, e.g. __byte_perm(v, 0, 0x1404) for
 * codes 0 and 1 of v) as a bf16 pair of f32(q) * 2^-120, exactly: sign to bit 15, exponent and
 * mantissa to bits 10..4 (the tensor-core FP8 kernels; their x is scaled by 2^100). */
static __device__ __forceinline__ uint32_t msm_fp8x2_bf16x2(uint32_t t) {
    return ((t >> 4) & 0x07f007f0u) | (t & 0x80008000u);
}

/* The A fragments of four m16n8k16 MMAs from 16 codes of row g (a4) and of row g + 8 (b4) of a
 * 16-row tile: MMA j's a0..a3 are rows g / g + 8, codes 4j, 4j + 1 (a0, a1) and 4j + 2, 4j + 3
 * (a2, a3), decoded by msm_fp8x2_bf16x2 (the k permutation of the FP8 tensor-core kernels). */
static __device__ __forceinline__ void msm_fp8_a_frags(const uint32_t (&a4)[4], const uint32_t (&b4)[4],
                                                       uint32_t (&A)[4][4]) {
#pragma unroll
    for (int j = 0; j < 4; j++) {
        A[j][0] = msm_fp8x2_bf16x2(__byte_perm(a4[j], 0, 0x1404));
        A[j][1] = msm_fp8x2_bf16x2(__byte_perm(b4[j], 0, 0x1404));
        A[j][2] = msm_fp8x2_bf16x2(__byte_perm(a4[j], 0, 0x3424));
        A[j][3] = msm_fp8x2_bf16x2(__byte_perm(b4[j], 0, 0x3424));
    }
}

/* Sixteen codes (a 16-byte load) to float32. */
template <bool HW>
static __device__ __forceinline__ void msm_fp8x16_f32(uint4 v, float (&f)[16]) {
    msm_fp8x4_f32<HW>(v.x, f), msm_fp8x4_f32<HW>(v.y, f + 4), msm_fp8x4_f32<HW>(v.z, f + 8),
        msm_fp8x4_f32<HW>(v.w, f + 12);
}

/* x[0..15] * xs as four float4 (x 16-byte aligned; xs 1 or 2^100, exact). */
static __device__ __forceinline__ void msm_x16(const float *x, float xs, float4 (&v)[4]) {
    const float4 *xp = (const float4 *)x;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float4 a = xp[i];
        v[i] = make_float4(a.x * xs, a.y * xs, a.z * xs, a.w * xs);
    }
}

/* dot(16 weights, 16 x values) in the msm_fma8 order. */
static __device__ __forceinline__ float msm_dot16(const float (&w)[16], const float4 (&x)[4]) {
    float s = msm_fma8(w, x[0], x[1], 0.0f);
    return msm_fma8(w + 8, x[2], x[3], s);
}

/* msm_rows_dot for FP8 rows: wr[r] points at row r's codes (16-byte aligned, K % 16 == 0), sr[r]
 * at its scales (column k's is sr[r][(k + ph) / 128]; ph, the weight's column phase, a multiple
 * of 16). Lane l reads k = 16l + 512u (+ 512U a step), 16 codes per 16-byte load, all R*U loads
 * (and their scales) issued before any is used; acc[r][t] += scale * dot16 per load, in that
 * order (deterministic). G = 0: every row with every vector, each x value read once for all R
 * rows. G > 0: row r with vector r / G alone (NT == R / G; G = 1 is msm_rows_dot's DIAG), the
 * sum in acc[r][r / G], each x value read once for its G rows. HW: the hardware decode. hook:
 * as msm_rows_dot's, after the first step's code and scale loads. */
template <int R, int NT, int U, int G = 0, bool HW = false, typename Hook = msm_no_hook>
static __device__ __forceinline__ void msm_rows_dot_fp8(float (&acc)[R][NT], const uint8_t *const (&wr)[R],
                                                        const float *const (&sr)[R],
                                                        const float *const (&xs)[NT], int nt, int K,
                                                        int ph, int lane, Hook hook = Hook()) {
    static_assert(G == 0 || NT * G == R, "grouped rows: R / G vectors");
    constexpr float XS = HW ? 1.0f : MSM_FP8_X_SCALE, SS = HW ? 1.0f : MSM_FP8_S_SCALE;
    if (lane * 16 >= K) hook();
    for (int k0 = lane * 16; k0 < K; k0 += 512 * U) {
        uint4 wv[R][U];
        float sv[R][U];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int u = 0; u < U; u++) {
                int k = k0 + u * 512;
                bool ok = wr[r] && k < K;
                wv[r][u] = ok ? msm_ld_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
                sv[r][u] = ok ? __ldg(sr[r] + ((k + ph) >> 7)) * SS : 0.0f;
            }
        if (k0 == lane * 16) hook();
#pragma unroll
        for (int u = 0; u < U; u++) {
            int k = k0 + u * 512;
            if (k >= K) break;
            if constexpr (G > 0) { /* a vector's x read once, its G rows decoded one by one */
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    bool any = false;
#pragma unroll
                    for (int g = 0; g < G; g++) any |= wr[t * G + g] != NULL;
                    if (!any) continue;
                    float4 xv[4];
                    msm_x16(xs[t] + k, XS, xv);
#pragma unroll
                    for (int g = 0; g < G; g++) {
                        int r = t * G + g;
                        if (!wr[r]) continue;
                        float wf[16];
                        msm_fp8x16_f32<HW>(wv[r][u], wf);
                        acc[r][t] = fmaf(msm_dot16(wf, xv), sv[r][u], acc[r][t]);
                    }
                }
            } else { /* every row decoded once, each x value read once and used for all R rows */
                float wf[R][16];
#pragma unroll
                for (int r = 0; r < R; r++) msm_fp8x16_f32<HW>(wv[r][u], wf[r]);
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= nt) break;
                    float4 xv[4];
                    msm_x16(xs[t] + k, XS, xv);
#pragma unroll
                    for (int r = 0; r < R; r++) /* a NULL row's zeros: its acc is never read */
                        acc[r][t] = fmaf(msm_dot16(wf[r], xv), sv[r][u], acc[r][t]);
                }
            }
        }
    }
}

/* One step of the lean FP8 dots (msm_rows_dot_fp8_lean, linear.cu fp8_split_dot): s[r] = row r's
 * 16 codes wv[r] dotted with x[0..15] (16-byte aligned; times 2^100 for the integer decode), the
 * codes decoded four at a time and each x float4 read as it is used: 16 fmaf from 0 in k order, the
 * general dot's (msm_dot16) products and order. */
template <int R, bool HW>
static __device__ __forceinline__ void msm_fp8_step16(float (&s)[R], const uint4 (&wv)[R], const float *x) {
    constexpr float XS = HW ? 1.0f : MSM_FP8_X_SCALE;
#pragma unroll
    for (int r = 0; r < R; r++) s[r] = 0.0f;
    const float4 *xp = (const float4 *)x;
#pragma unroll
    for (int g = 0; g < 4; g++) {
        float4 a = xp[g];
        a = make_float4(a.x * XS, a.y * XS, a.z * XS, a.w * XS);
#pragma unroll
        for (int r = 0; r < R; r++) {
            uint32_t v = g == 0 ? wv[r].x : g == 1 ? wv[r].y : g == 2 ? wv[r].z : wv[r].w;
            float f[4];
            msm_fp8x4_f32<HW>(v, f);
            s[r] = fmaf(f[0], a.x, s[r]);
            s[r] = fmaf(f[1], a.y, s[r]);
            s[r] = fmaf(f[2], a.z, s[r]);
            s[r] = fmaf(f[3], a.w, s[r]);
        }
    }
}

/* msm_rows_dot_fp8 for one vector (NT 1, G 0) at one 16-byte load a lane a row in flight, in fewer
 * registers: a step's R loads and scales, then the 16 codes four at a time, each group's x float4
 * read as it is used, both decoded and multiplied before the next group. The same products summed
 * in the same order (per load: 16 fmaf from 0 in k order, then one fmaf by the scale into acc), so
 * bit for bit msm_rows_dot_fp8<R, 1, U, 0, HW>'s sums at any U. For the one-token expert GEMVs that
 * must hold a grid in one wave (msm_cuda_tuning.fp8_moe_lean): at 40 or 64 registers a thread the
 * general form spills. PIPE: the next step's codes are loaded before this step's arithmetic (two
 * loads a row in flight, R * 4 registers more). hook() runs once, after the first step's codes and
 * scales are requested and before x is read (msm_rows_dot's hook: a PDL wait there lets the loads
 * of constant weights overlap the kernel before). */
template <int R, bool HW = false, bool PIPE = false, typename Hook = msm_no_hook>
static __device__ __forceinline__ void msm_rows_dot_fp8_lean(float (&acc)[R], const uint8_t *const (&wr)[R],
                                                             const float *const (&sr)[R], const float *x, int K,
                                                             int ph, int lane, Hook hook = Hook()) {
    constexpr float SS = HW ? 1.0f : MSM_FP8_S_SCALE;
    uint4 nv[R]; /* PIPE: the next step's codes, loaded before this step's arithmetic */
#pragma unroll
    for (int r = 0; r < R; r++)
        nv[r] = PIPE && wr[r] && lane * 16 < K ? msm_ld_stream16(wr[r] + lane * 16) : make_uint4(0, 0, 0, 0);
    if (PIPE || lane * 16 >= K) hook(); /* else in the first step, after its loads */
    for (int k = lane * 16; k < K; k += 512) {
        uint4 wv[R];
        float sv[R], s[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            if (PIPE) {
                wv[r] = nv[r];
                nv[r] = wr[r] && k + 512 < K ? msm_ld_stream16(wr[r] + k + 512) : make_uint4(0, 0, 0, 0);
            } else {
                wv[r] = wr[r] ? msm_ld_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
            }
            sv[r] = wr[r] ? __ldg(sr[r] + ((k + ph) >> 7)) * SS : 0.0f;
        }
        if (!PIPE && k == lane * 16) hook();
        msm_fp8_step16<R, HW>(s, wv, x + k); /* a NULL row's zeros: its acc is never read */
#pragma unroll
        for (int r = 0; r < R; r++) acc[r] = fmaf(s[r], sv[r], acc[r]);
    }
}

/* Either kind of weight row: bf16 (FP8 false; sr unused; PIPE as msm_rows_dot's) or FP8 (VEC must be
 * true; PIPE unused). */
template <int R, int NT, int U, bool VEC, bool FP8, bool DIAG = false, bool HW = false, bool PIPE = false,
          typename Hook = msm_no_hook>
static __device__ __forceinline__ void msm_rows_dot_w(float (&acc)[R][NT], const void *const (&wr)[R],
                                                      const float *const (&sr)[R],
                                                      const float *const (&xs)[NT], int nt, int K, int ph,
                                                      int lane, Hook hook = Hook()) {
    if constexpr (FP8) {
        const uint8_t *w8[R];
#pragma unroll
        for (int r = 0; r < R; r++) w8[r] = (const uint8_t *)wr[r];
        msm_rows_dot_fp8<R, NT, U, DIAG ? 1 : 0, HW>(acc, w8, sr, xs, nt, K, ph, lane, hook);
    } else {
        const uint16_t *w16[R];
#pragma unroll
        for (int r = 0; r < R; r++) w16[r] = (const uint16_t *)wr[r];
        msm_rows_dot<R, NT, U, VEC, DIAG, PIPE>(acc, w16, xs, nt, K, lane, hook);
    }
}

/* Row n of weight w ([rows, K] of one expert, at element offset `base`): its first element and,
 * for FP8, its scales (sc: the expert's [rows, ceil((K + ph) / 128)] scales). */
template <bool FP8>
static __device__ __forceinline__ const void *msm_wrow(const void *w, size_t base, int n, int K) {
    return FP8 ? (const void *)((const uint8_t *)w + base + (size_t)n * K)
               : (const void *)((const uint16_t *)w + base + (size_t)n * K);
}
static __device__ __forceinline__ const float *msm_srow(const float *sc, int n, int K, int ph) {
    return sc ? sc + (size_t)n * (size_t)((K + ph + 127) >> 7) : NULL;
}

/* (a, b) as bf16 pairs: hi = rn(a, b), lo = rn(a - hi, b - hi), so hi + lo carries ~16 mantissa
 * bits of each (the tensor-core GEMVs feed both to the MMAs). */
static __device__ __forceinline__ void msm_split_bf16x2(float a, float b, uint32_t &hi, uint32_t &lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    float2 hf = __bfloat1622float2(h);
    __nv_bfloat162 l = __floats2bfloat162_rn(a - hf.x, b - hf.y);
    hi = *reinterpret_cast<uint32_t *>(&h);
    lo = *reinterpret_cast<uint32_t *>(&l);
}

/* c += A . B, mma.sync m16n8k16, bf16 operands, fp32 accumulate (PTX fragment layouts). */
static __device__ __forceinline__ void msm_mma_bf16(float c[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                    uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* The cluster barrier after which the cluster's blocks read, through distributed shared memory, what
 * each block stored to its own shared memory (local stores only: nothing in global memory or in
 * another block's shared memory to publish). cluster_group::sync() arrives with release semantics
 * at cluster scope, which compiles to a GPU-scope MEMBAR (an L2 round trip on the critical path);
 * here the release is restricted to this thread's shared::cta accesses (fence.release.sync_restrict:
 * a CTA-scope MEMBAR), followed by a relaxed arrive, then the wait (acquire at cluster scope). The
 * PTX memory model's release pattern (a release fence, then the arrive) orders those stores before
 * every read after the other blocks' waits. */
static __device__ __forceinline__ void msm_cluster_sync_smem() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("fence.release.sync_restrict::shared::cta.cluster;\n\t"
                 "barrier.cluster.arrive.relaxed;\n\t"
                 "barrier.cluster.wait;" ::: "memory");
#endif
}

/* The split-K epilogue of the cluster GEMMs (linear_tiled.cu, linear_fp8.cu): each of the S
 * blocks of a cluster (S = 1: one block, no cluster) holds its partial [tokens][ROWS] tile in
 * `part` (shared memory at the same offset in every block). After a cluster barrier, block `rank`
 * takes outputs rank * threads + i, then every S * threads, sums them over the S blocks in rank
 * order (distributed shared memory; fixed order, deterministic) and writes
 * y[t][nb0 + n] = sum + bias[nb0 + n] for t < T and nb0 + n < N, over n_out = tokens * ROWS
 * entries; a second barrier keeps every part alive until all ranks have read it. */
template <int ROWS>
static __device__ __forceinline__ void msm_cluster_sum_store(float *part, int n_out, int S, int rank, int nb0, int T,
                                                             int N, float *y, const uint16_t *bias) {
    if (S > 1)
        msm_cluster_sync_smem(); /* every block's part */
    else
        __syncthreads();
    for (int idx = rank * (int)blockDim.x + (int)threadIdx.x; idx < n_out; idx += S * (int)blockDim.x) {
        int t = idx / ROWS, n = nb0 + idx % ROWS;
        float s = part[idx];
        if (S > 1) {
            s = 0.0f;
            for (int r = 0; r < S; r++) s += cooperative_groups::this_cluster().map_shared_rank(part, r)[idx];
        }
        if (t < T && n < N) y[(size_t)t * N + n] = s + (bias ? msm_bf(bias[n]) : 0.0f);
    }
    if (S > 1) cooperative_groups::this_cluster().sync();
}

/* ---- Shared-memory tiles for the tensor-core GEMMs (moe_tiled.cu, linear_tiled.cu) ---- */

static __device__ __forceinline__ uint32_t msm_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, L2 only; src_bytes 0 zero-fills (src must still be a valid address). */
static __device__ __forceinline__ void msm_cp_async16(uint32_t dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}
static __device__ __forceinline__ void msm_cp_async_commit(void) { asm volatile("cp.async.commit_group;"); }
template <int N>
static __device__ __forceinline__ void msm_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

/* Bulk copies (TMA, sm_90) into shared memory, completing on an mbarrier: msm_mbar_init once (one
 * arrival a phase) and msm_mbar_init_fence before other threads or the copy engine use it; each
 * phase, one thread's msm_mbar_expect_tx(bytes) then the copies of those bytes (msm_bulk_g2s:
 * 16-byte aligned addresses, a multiple of 16 bytes); readers msm_mbar_wait(parity of the phase). */
static __device__ __forceinline__ void msm_mbar_init(uint64_t *bar, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(msm_smem_addr(bar)), "r"(count) : "memory");
}
static __device__ __forceinline__ void msm_mbar_init_fence(void) {
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}
static __device__ __forceinline__ void msm_mbar_expect_tx(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(msm_smem_addr(bar)), "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void msm_bulk_g2s(void *dst, const void *src, unsigned bytes, uint64_t *bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     msm_smem_addr(dst)),
                 "l"(src), "r"(bytes), "r"(msm_smem_addr(bar))
                 : "memory");
}
/* the wait loop, sem: the try_wait's semantics and scope ("": acquire at CTA scope) */
#define MSM_MBAR_WAIT_LOOP(sem, bar, parity)                                                                      \
    asm volatile("{\n\t.reg .pred p;\n"                                                                          \
                 "MSM_MBAR_WAIT_%=:\n\t"                                                                          \
                 "mbarrier.try_wait.parity" sem ".shared::cta.b64 p, [%0], %1;\n\t"                             \
                 "@!p bra MSM_MBAR_WAIT_%=;\n}" ::"r"(msm_smem_addr(bar)),                                        \
                 "r"(parity)                                                                                    \
                 : "memory")
static __device__ __forceinline__ void msm_mbar_wait(uint64_t *bar, unsigned parity) {
    MSM_MBAR_WAIT_LOOP("", bar, parity);
}

/* Distributed shared memory by st.async (sm_90): block `rank`'s copy of the shared float at p gets v,
 * and its mbarrier at bar (the same offsets in every block) completes 4 bytes of its transaction
 * count as the value lands. The receiver arms its barrier (msm_mbar_init, then
 * msm_mbar_arm_cluster with the bytes it awaits, then msm_mbar_init_fence) before a cluster barrier
 * that the senders wait for, then waits with msm_mbar_wait_cluster: no fence, no barrier after the
 * stores, and a sender may end at once (only the receiver's shared memory must outlive them). */
static __device__ __forceinline__ void msm_mbar_arm_cluster(uint64_t *bar, unsigned bytes) {
    asm volatile("mbarrier.arrive.expect_tx.release.cluster.shared::cta.b64 _, [%0], %1;" ::"r"(msm_smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
}
static __device__ __forceinline__ void msm_st_async_f32(float *p, uint64_t *bar, unsigned rank, float v) {
    uint32_t rp, rb;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rp) : "r"(msm_smem_addr(p)), "r"(rank));
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(rb) : "r"(msm_smem_addr(bar)), "r"(rank));
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(rp),
                 "r"(__float_as_uint(v)), "r"(rb)
                 : "memory");
}
static __device__ __forceinline__ void msm_mbar_wait_cluster(uint64_t *bar, unsigned parity) {
    MSM_MBAR_WAIT_LOOP(".acquire.cluster", bar, parity);
}

static __device__ __forceinline__ void msm_ldmatrix_x4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}

/* Byte offset of 16-byte chunk c (0..7) of row r in a tile of 128-byte rows: the chunk index is
 * XORed with the row's low 3 bits, so the 8 rows an ldmatrix phase reads hit 8 distinct bank
 * groups. */
static __device__ __forceinline__ uint32_t msm_swz128(int r, int c) {
    return (uint32_t)(r * 128 + ((c ^ (r & 7)) << 4));
}

/* One 64-wide K step of the tiled tensor-core GEMMs: acc[t] (t < ntile <= 8) += the warp's 16
 * weight rows . the 8 token rows 8t.. of x hi and of x lo (both into the same accumulator).
 * w: the 128 x 64 bf16 weight tile, xh / xl: the token tiles, all msm_swz128 layouts in shared
 * memory. ldmatrix lane addresses: A rows warp*16 + (lane & 15), chunk +1 for lanes >= 16; B rows
 * 16p + (lane & 7) + 8 * (lane >= 16), chunk +1 for lanes 8..15 and 24..31. C fragment:
 * acc[t][j] = (weight row warp*16 + g + 8*(j>>1), token 8t + 2q + (j&1)), g = lane/4, q = lane%4. */
static __device__ __forceinline__ void msm_tile_mma_k64(float acc[8][4], uint32_t w, uint32_t xh, uint32_t xl,
                                                        int warp, int lane, int ntile) {
    const int a_row = warp * 16 + (lane & 15), a_hi = lane >> 4;
    const int b_row = (lane & 7) + ((lane >> 4) << 3), b_hi = (lane >> 3) & 1;
#pragma unroll
    for (int kk = 0; kk < 4; kk++) {
        uint32_t a[4];
        msm_ldmatrix_x4(a, w + msm_swz128(a_row, 2 * kk + a_hi));
#pragma unroll
        for (int p = 0; p < 4; p++) {
            if (2 * p >= ntile) break;
            uint32_t bh[4], bl[4];
            int row = 16 * p + b_row;
            msm_ldmatrix_x4(bh, xh + msm_swz128(row, 2 * kk + b_hi));
            msm_ldmatrix_x4(bl, xl + msm_swz128(row, 2 * kk + b_hi));
            msm_mma_bf16(acc[2 * p], a[0], a[1], a[2], a[3], bh[0], bh[1]);
            msm_mma_bf16(acc[2 * p], a[0], a[1], a[2], a[3], bl[0], bl[1]);
            if (2 * p + 1 < ntile) {
                msm_mma_bf16(acc[2 * p + 1], a[0], a[1], a[2], a[3], bh[2], bh[3]);
                msm_mma_bf16(acc[2 * p + 1], a[0], a[1], a[2], a[3], bl[2], bl[3]);
            }
        }
    }
}

/* 16 bytes from shared memory. */
static __device__ __forceinline__ uint4 msm_lds128(uint32_t addr) {
    uint4 r;
    asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "r"(addr));
    return r;
}

/* One 64-wide K step of the FP8 tiled GEMMs (moe_tiled.cu): acc[t] (t < ntile <= 8) += the warp's
 * 16 code rows . the 8 token rows 8t.. of x hi + lo, times the rows' scales.
 * w: the 128 x 64 code tile, plain 64-byte rows (lane (g, q) reads bytes 16q..16q+15 of rows
 * warp*16 + g and + 8: a quarter-warp reads 128 contiguous bytes, no bank conflict); xh / xl: the
 * token tiles of x * 2^100 as bf16 hi / lo, msm_swz128 layout (lane (g, q) reads chunks 2q and
 * 2q+1 of row 8t + g: a quarter-warp's 8 reads land in 8 distinct bank groups).
 * The codes become bf16 f32(q) * 2^-120 by bit placement (msm_fp8x2_bf16x2) and feed four k16 MMAs
 * under the permutation of linear_fp8.cu / mma_rows_fp8: logical k 2q, 2q+1, 2q+8, 2q+9 of MMA j
 * are physical 16q + 4j + 0..3, for A (this lane's 32-bit code word j) and for B (bf16 pairs
 * {4j, 4j+1} and {4j+2, 4j+3} of the lane's 16 x values) alike. Per token tile the MMAs on x hi
 * and on x lo go into two fresh step accumulators (two chains of 4 instead of one of 8), whose sum
 * is multiplied by the row's scale (sa: row g, sb: row g + 8, each times 2^20) and added to acc:
 * the products are the codes' exact values times ~16 mantissa bits of x, and each weight met is
 * f32(q) * scale, as the FP8 GEMVs. The step lies inside one scale block (64-aligned phase). C
 * fragment as msm_tile_mma_k64: acc[t][j] = (row warp*16 + g + 8*(j>>1), token 8t + 2q + (j&1)). */
static __device__ __forceinline__ void msm_tile_mma_fp8_k64(float acc[8][4], uint32_t w, uint32_t xh, uint32_t xl,
                                                            float sa, float sb, int warp, int lane, int ntile) {
    const int g = lane >> 2, q = lane & 3;
    const uint4 va = msm_lds128(w + (warp * 16 + g) * 64 + 16 * q);
    const uint4 vb = msm_lds128(w + (warp * 16 + g + 8) * 64 + 16 * q);
    const uint32_t a4[4] = {va.x, va.y, va.z, va.w}, b4[4] = {vb.x, vb.y, vb.z, vb.w};
    uint32_t A[4][4];
    msm_fp8_a_frags(a4, b4, A);
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t >= ntile) break;
        const int row = 8 * t + g;
        /* x of token row at physical k 16q .. 16q+7 (h0, l0) and 16q+8 .. 16q+15 (h1, l1) */
        const uint4 h0 = msm_lds128(xh + msm_swz128(row, 2 * q)), h1 = msm_lds128(xh + msm_swz128(row, 2 * q + 1));
        const uint4 l0 = msm_lds128(xl + msm_swz128(row, 2 * q)), l1 = msm_lds128(xl + msm_swz128(row, 2 * q + 1));
        float ch[4] = {0.0f, 0.0f, 0.0f, 0.0f}, cl[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        msm_mma_bf16(ch, A[0][0], A[0][1], A[0][2], A[0][3], h0.x, h0.y);
        msm_mma_bf16(cl, A[0][0], A[0][1], A[0][2], A[0][3], l0.x, l0.y);
        msm_mma_bf16(ch, A[1][0], A[1][1], A[1][2], A[1][3], h0.z, h0.w);
        msm_mma_bf16(cl, A[1][0], A[1][1], A[1][2], A[1][3], l0.z, l0.w);
        msm_mma_bf16(ch, A[2][0], A[2][1], A[2][2], A[2][3], h1.x, h1.y);
        msm_mma_bf16(cl, A[2][0], A[2][1], A[2][2], A[2][3], l1.x, l1.y);
        msm_mma_bf16(ch, A[3][0], A[3][1], A[3][2], A[3][3], h1.z, h1.w);
        msm_mma_bf16(cl, A[3][0], A[3][1], A[3][2], A[3][3], l1.z, l1.w);
        acc[t][0] = fmaf(ch[0] + cl[0], sa, acc[t][0]);
        acc[t][1] = fmaf(ch[1] + cl[1], sa, acc[t][1]);
        acc[t][2] = fmaf(ch[2] + cl[2], sb, acc[t][2]);
        acc[t][3] = fmaf(ch[3] + cl[3], sb, acc[t][3]);
    }
}

/* ---- Programmatic dependent launch (Hopper) ----
 * A kernel launched with msm_launch() may be scheduled while the kernel before it in the stream
 * is still running. Such a kernel must call msm_pdl_wait() before it reads anything an earlier
 * kernel wrote and before it writes anything: the wait returns once the previous grid has
 * completed and its memory is visible (and, since that grid waited for its own predecessor, every
 * earlier one). Before the wait it may only read data no step writes (weights) — the GEMVs start
 * pulling their weight rows into L2 there. msm_pdl_trigger() lets the next kernel's blocks be
 * scheduled before this grid finishes. Without the launch attribute both are no-ops, so a kernel
 * stays correct however it is launched. */
static __device__ __forceinline__ void msm_pdl_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

/* A rows-dot hook (msm_rows_dot) that passes the PDL wait there when `on` (the kernel did not
 * wait before its first weight loads), else nothing. */
struct msm_pdl_hook {
    bool on;
    __device__ __forceinline__ void operator()() const {
        if (on) msm_pdl_wait();
    }
};

static __device__ __forceinline__ void msm_pdl_trigger(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Pulls the bytes [p, p + n) towards L2 (hint only; no fault for any address in an allocation). */
static __device__ __forceinline__ void msm_prefetch_l2(const void *p, size_t n) {
    const char *c = (const char *)p;
    for (size_t o = (size_t)threadIdx.x * 128; o < n; o += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(c + o));
}

/* One bulk prefetch of [p, p + bytes) into L2 (p 16-byte aligned, bytes a multiple of 16; hint
 * only): cp.async.bulk.prefetch.L2 on sm_90, 128-byte prefetches before. */
static __device__ __forceinline__ void msm_bulk_prefetch_l2(const void *p, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    size_t g = __cvta_generic_to_global(p);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(g), "r"(bytes) : "memory");
#else
    for (unsigned o = 0; o < bytes; o += 128) asm volatile("prefetch.global.L2 [%0];" ::"l"((const char *)p + o));
#endif
}

/* kernel<<<grid, block, smem, ex.stream>>>(args...) as a grid of thread-block clusters of
 * cluster_x blocks along x when cluster_x > 1 (the kernel syncs and reads its cluster's shared
 * memory through cooperative_groups::this_cluster()), with programmatic stream serialisation
 * allowed when the rank's tuning says so (ex.tune->pdl; see above: every kernel launched this way
 * calls msm_pdl_wait()). Returns the launch error. */
template <typename... KArgs, typename... Args>
static inline cudaError_t msm_launch_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                             unsigned cluster_x, msm_cuda_exec ex, Args... args) {
    cudaLaunchAttribute at[3];
    unsigned n = 0;
    if (ex.priority) {
        at[n].id = cudaLaunchAttributePriority;
        at[n++].val.priority = ex.priority;
    }
    if (cluster_x > 1) {
        at[n].id = cudaLaunchAttributeClusterDimension;
        at[n].val.clusterDim.x = cluster_x;
        at[n].val.clusterDim.y = 1;
        at[n++].val.clusterDim.z = 1;
    }
    if (ex.tune->pdl && !ex.no_pdl) {
        at[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = ex.stream;
    cfg.attrs = at;
    cfg.numAttrs = n;
    return cudaLaunchKernelEx(&cfg, kernel, ((KArgs)args)...);
}

/* How many clusters of cluster_x blocks of `threads` threads (smem dynamic shared memory each) of
 * `kernel` an idle GPU holds at once: a cluster is placed whole inside one GPC, so a grid of more
 * clusters runs the rest as a second wave. 0 if it holds none or the query fails. */
template <typename... KArgs>
static inline int msm_max_clusters(void (*kernel)(KArgs...), unsigned cluster_x, unsigned threads, size_t smem) {
    cudaLaunchAttribute at;
    at.id = cudaLaunchAttributeClusterDimension;
    at.val.clusterDim.x = cluster_x, at.val.clusterDim.y = 1, at.val.clusterDim.z = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(cluster_x, 1, 1);
    cfg.blockDim = dim3(threads);
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = &at;
    cfg.numAttrs = 1;
    int n = 0;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) != cudaSuccess) {
        (void)cudaGetLastError();
        n = 0;
    }
    return n;
}

/* How many blocks of `threads` threads (smem dynamic shared memory each) of `kernel` one SM holds
 * at once (occupancy); 1 if the query fails. */
template <typename... KArgs>
static inline int msm_blocks_per_sm(void (*kernel)(KArgs...), int threads, size_t smem) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, threads, smem) != cudaSuccess || n <= 0) {
        (void)cudaGetLastError();
        n = 1;
    }
    return n;
}

/* The same without clusters: every kernel launch of ours goes through one of the two. */
template <typename... KArgs, typename... Args>
static inline cudaError_t msm_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                     msm_cuda_exec ex, Args... args) {
    return msm_launch_cluster(kernel, grid, block, smem, 1u, ex, args...);
}

/* Exactly msm_rng_uniform (kernels/cpu/sample.c): the counter-based generator that sampling
 * and the dummy weights share, so seeded GPU results equal the CPU's. */
static __device__ __forceinline__ float msm_rng_uniform_dev(uint64_t seed, uint64_t counter) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + counter * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f);
}

#endif

#endif

/* linear_fp8.cu: y = x . W^T (+ b) for an FP8-resident weight (docs/adr/0006-fp8.md) at 1..64
 * tokens, on tensor cores ("MMV8").
 *
 * Why: the SIMT FP8 GEMV (linear.cu, msm_rows_dot_fp8) decodes 16 codes and runs 16 dependent
 * FMAs per token for every 16 bytes it loads, so at one byte a weight it is bound by the ALUs and
 * their latency, not by HBM (H200, 2026-12-01: 7.5 us for the 10.5 MB of a 5120 x 2048 weight at
 * T = 1, 1.45 TB/s; 22 us at T = 8, where the bf16 MMV takes 11). Here the multiply-adds are
 * mma.sync m16n8k16 (bf16 in, fp32 accumulate), and a code costs two integer operations:
 *   1. block (s, b) owns 128 weight rows (8 warps x 16 rows) and K slice s of S; the S blocks of a
 *      row block form a cluster (S = 1..8) and sum their partials through distributed shared
 *      memory in rank order, each writing 1/S of the outputs (+ bias);
 *   2. the block's x slice is split once into bf16 hi + lo of x * 2^100 (exact scaling; the
 *      products then carry ~16 mantissa bits of x: near-fp32) in shared memory, laid out so a
 *      lane's two B fragments (hi and lo) of one MMA are one 16-byte read;
 *   3. lane (g, q) of a warp streams 16 codes of its rows g and g+8 per 64-column chunk (16-byte
 *      loads, rounds of M8_U chunks, the next round in flight during this one's MMAs, the first
 *      before the PDL wait) and turns each pair of codes into a bf16 pair by bit
 *      placement: sign to bit 15, exponent and mantissa to bits 10..4, i.e. f32(q) * 2^-120 exactly
 *      (the codes' subnormals become bf16 subnormals of the same value); the 16 codes feed four
 *      k16 MMAs under a fixed permutation of k inside the chunk (logical k 2q, 2q+1, 2q+8, 2q+9 of
 *      MMA j are physical 16q + 4j + 0..3; x's B fragments use the same map);
 *   4. a chunk lies inside one 128-column scale block (the weight's column phase is a multiple of
 *      64), so its MMAs go into a fresh accumulator that is then multiplied by the rows' scales
 *      (times 2^20, exact) and added to the total: the weights met are f32(q) * scale.
 * Every output is a fixed sequence of MMAs and a fixed-order sum: deterministic, no workspace,
 * one launch. Needs K % 64 == 0, phase % 64 == 0, T <= 64, 16-byte aligned codes and x, and the
 * x slice within the shared memory (msm__linear_fp8_mma_fits). The two NaN codes decode as finite
 * numbers: the loader refuses FP8-resident weights holding them. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>

#define M8_WARPS 8
#define M8_ROWS (M8_WARPS * 16) /* weight rows a block owns */
#define M8_U 4                  /* 64-column chunks a round; the next round's loads fly during this one's MMAs */
#define M8_SMEM_MAX (200 << 10)

/* x slice -> shared memory: for token t < NTT*8 (zeros past T) and 4-column group i of the
 * slice, {hi(k), hi(k+1)} {hi(k+2), hi(k+3)} {lo(k), lo(k+1)} {lo(k+2), lo(k+3)} as one uint4. */
static __device__ __forceinline__ uint4 split4(float4 v) {
    uint32_t h0, l0, h1, l1;
    msm_split_bf16x2(v.x * MSM_FP8_X_SCALE, v.y * MSM_FP8_X_SCALE, h0, l0);
    msm_split_bf16x2(v.z * MSM_FP8_X_SCALE, v.w * MSM_FP8_X_SCALE, h1, l1);
    return make_uint4(h0, h1, l0, l1);
}

template <int NTT>
static __global__ void __launch_bounds__(M8_WARPS * 32)
    linear_fp8_mma_kernel(float *y, const float *x, const uint8_t *q8, const float *sc, int ph, const uint16_t *bias,
                          int T, int N, int K) {
    extern __shared__ __align__(16) unsigned char smem[];
    msm_pdl_trigger();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int S = (int)gridDim.x, rank = (int)blockIdx.x; /* cluster = the S blocks along x */
    const int nb0 = (int)blockIdx.y * M8_ROWS;
    const int nch = K >> 6, per = (nch + S - 1) / S, c0 = rank * per, c1 = min(nch, c0 + per);
    const int G = per * 16; /* 4-column groups of a (full) slice */
    uint4 *xs = (uint4 *)smem;                       /* [NTT*8][G] */
    float *part = (float *)(smem + (size_t)NTT * 8 * G * 16); /* [NTT*8][M8_ROWS] */

    /* this lane's rows (clamped to N-1: never stored) and their codes / scales */
    const int ra = min(nb0 + warp * 16 + g, N - 1), rb = min(nb0 + warp * 16 + g + 8, N - 1);
    const int ncs = (K + ph + 127) >> 7;
    const uint8_t *wa = q8 + (size_t)ra * K + 16 * q, *wb = q8 + (size_t)rb * K + 16 * q;
    const float *sa = sc + (size_t)ra * ncs, *sb = sc + (size_t)rb * ncs;

    /* the first round's codes and scales are requested before the PDL wait: weights are never
     * written during a step, so they stream in while the previous kernel finishes */
    uint4 va[M8_U], vb[M8_U];
    float s_a[M8_U], s_b[M8_U];
    auto fetch = [&](int c) {
#pragma unroll
        for (int u = 0; u < M8_U; u++) {
            bool ok = c + u < c1;
            size_t k = (size_t)(c + u) * 64;
            va[u] = ok ? msm_ld_stream16(wa + k) : make_uint4(0, 0, 0, 0);
            vb[u] = ok ? msm_ld_stream16(wb + k) : make_uint4(0, 0, 0, 0);
            int blk = ((c + u) * 64 + ph) >> 7;
            s_a[u] = ok ? __ldg(sa + blk) * MSM_FP8_S_SCALE : 0.0f;
            s_b[u] = ok ? __ldg(sb + blk) * MSM_FP8_S_SCALE : 0.0f;
        }
    };
    fetch(c0);

    msm_pdl_wait();
    const int ng = (c1 - c0) * 16;
    for (int i = tid; i < NTT * 8 * G; i += M8_WARPS * 32) {
        int t = i / G, gi = i % G;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (t < T && gi < ng) v = split4(*(const float4 *)(x + (size_t)t * K + (size_t)c0 * 64 + gi * 4));
        xs[i] = v;
    }
    __syncthreads();

    float acc[NTT][4];
#pragma unroll
    for (int n = 0; n < NTT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int c = c0; c < c1; c += M8_U) {
        uint4 ca[M8_U], cb[M8_U];
        float cs_a[M8_U], cs_b[M8_U];
#pragma unroll
        for (int u = 0; u < M8_U; u++) ca[u] = va[u], cb[u] = vb[u], cs_a[u] = s_a[u], cs_b[u] = s_b[u];
        if (c + M8_U < c1) fetch(c + M8_U);
#pragma unroll
        for (int u = 0; u < M8_U; u++) {
            if (c + u >= c1) break;
            float ct[NTT][4];
#pragma unroll
            for (int n = 0; n < NTT; n++) ct[n][0] = ct[n][1] = ct[n][2] = ct[n][3] = 0.0f;
            const uint32_t wa4[4] = {ca[u].x, ca[u].y, ca[u].z, ca[u].w}, wb4[4] = {cb[u].x, cb[u].y, cb[u].z, cb[u].w};
#pragma unroll
            for (int j = 0; j < 4; j++) {
                /* A: rows g (a0, a2) and g+8 (a1, a3), codes 4j..4j+3 of this lane's 16 */
                uint32_t a0 = msm_fp8x2_bf16x2(__byte_perm(wa4[j], 0, 0x1404)), a2 = msm_fp8x2_bf16x2(__byte_perm(wa4[j], 0, 0x3424));
                uint32_t a1 = msm_fp8x2_bf16x2(__byte_perm(wb4[j], 0, 0x1404)), a3 = msm_fp8x2_bf16x2(__byte_perm(wb4[j], 0, 0x3424));
                int gi = (c + u - c0) * 16 + 4 * q + j;
#pragma unroll
                for (int n = 0; n < NTT; n++) {
                    if (n * 8 >= T) break;
                    uint4 b = xs[(n * 8 + g) * G + gi];
                    msm_mma_bf16(ct[n], a0, a1, a2, a3, b.x, b.y);
                    msm_mma_bf16(ct[n], a0, a1, a2, a3, b.z, b.w);
                }
            }
            /* C fragment: c0, c1 = row g (tokens 2q, 2q+1), c2, c3 = row g+8 */
#pragma unroll
            for (int n = 0; n < NTT; n++) {
                acc[n][0] = fmaf(ct[n][0], cs_a[u], acc[n][0]);
                acc[n][1] = fmaf(ct[n][1], cs_a[u], acc[n][1]);
                acc[n][2] = fmaf(ct[n][2], cs_b[u], acc[n][2]);
                acc[n][3] = fmaf(ct[n][3], cs_b[u], acc[n][3]);
            }
        }
    }
#pragma unroll
    for (int n = 0; n < NTT; n++) {
        int col = warp * 16 + g, t0 = n * 8 + 2 * q;
        part[t0 * M8_ROWS + col] = acc[n][0];
        part[(t0 + 1) * M8_ROWS + col] = acc[n][1];
        part[t0 * M8_ROWS + col + 8] = acc[n][2];
        part[(t0 + 1) * M8_ROWS + col + 8] = acc[n][3];
    }
    msm_cluster_sum_store<M8_ROWS>(part, min(T, NTT * 8) * M8_ROWS, S, rank, nb0, T, N, y, bias);
}

static size_t smem_bytes(int ntt, int per) { return (size_t)ntt * 8 * per * 16 * 16 + (size_t)ntt * 8 * M8_ROWS * 4; }

template <int NTT>
static cudaError_t launch(float *y, const float *x, msm_cuda_fp8w w, const uint16_t *bias, int T, int N, int K, int S,
                          msm_cuda_exec ex) {
    int nch = K / 64, per = (nch + S - 1) / S;
    dim3 grid((unsigned)S, (unsigned)((N + M8_ROWS - 1) / M8_ROWS));
    return msm_launch_cluster(linear_fp8_mma_kernel<NTT>, grid, dim3(M8_WARPS * 32), smem_bytes(NTT, per), (unsigned)S,
                              ex, y, x, w.q, w.scale, w.phase, bias, T, N, K);
}

extern "C" int msm__linear_fp8_mma_prepare(void) {
    CUDA_TRY(cudaFuncSetAttribute(linear_fp8_mma_kernel<1>, cudaFuncAttributeMaxDynamicSharedMemorySize, M8_SMEM_MAX));
    CUDA_TRY(cudaFuncSetAttribute(linear_fp8_mma_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, M8_SMEM_MAX));
    CUDA_TRY(cudaFuncSetAttribute(linear_fp8_mma_kernel<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, M8_SMEM_MAX));
    CUDA_TRY(cudaFuncSetAttribute(linear_fp8_mma_kernel<8>, cudaFuncAttributeMaxDynamicSharedMemorySize, M8_SMEM_MAX));
    return 0;
}

/* Resident MMV8 blocks on one SM at token tiles NTT (1 if the query fails), with a typical x slice
 * (K = 2048 over 8 slices) in shared memory. */
template <int NTT>
static int mma_per_sm(void) {
    return msm_blocks_per_sm(linear_fp8_mma_kernel<NTT>, M8_WARPS * 32, smem_bytes(NTT, 4));
}

void msm__linear_fp8_tuning(msm_cuda_tuning *t) {
    t->mmv8_per_sm[0] = mma_per_sm<1>(), t->mmv8_per_sm[1] = mma_per_sm<2>();
    t->mmv8_per_sm[2] = mma_per_sm<4>(), t->mmv8_per_sm[3] = mma_per_sm<8>();
}

/* K slices: double S while the doubled grid still fits `slots` blocks an SM (the kernel's
 * occupancy) in one wave (a second, partial wave doubles the time: 320 blocks of a 5120-row
 * weight at S = 8 on the 264 slots of two blocks an SM) and each slice keeps a round of M8_U
 * chunks (at T = 1 a block's whole slice is then requested before its PDL wait); then more slices
 * (up to 8) while the x slice does not fit the shared memory. 0: it never fits. */
static int slices(int T, int N, int K, int sms, int slots) {
    int rb = (N + M8_ROWS - 1) / M8_ROWS, nch = K / 64, S = 1, ntt = T <= 8 ? 1 : T <= 16 ? 2 : T <= 32 ? 4 : 8;
    while (S < 8 && rb * S * 2 <= slots * sms && nch >= M8_U * S * 2) S *= 2;
    while (S < 8 && smem_bytes(ntt, (nch + S - 1) / S) > M8_SMEM_MAX) S *= 2;
    return smem_bytes(ntt, (nch + S - 1) / S) <= M8_SMEM_MAX ? S : 0;
}

extern "C" bool msm__linear_fp8_mma_fits(int T, int N, int K, msm_cuda_fp8w w, const float *x, int sms) {
    return T >= 1 && T <= 64 && N > 0 && K > 0 && K % 64 == 0 && w.phase % 64 == 0 &&
           ((uintptr_t)w.q | (uintptr_t)x) % 16 == 0 && slices(T, N, K, sms, 2) > 0; /* slots only sets S below the fit */
}

extern "C" int msm__linear_fp8_mma_run(float *y, const float *x, msm_cuda_fp8w w, const uint16_t *bias, int T, int N,
                                       int K, msm_cuda_exec ex) {
    int ti = T <= 8 ? 0 : T <= 16 ? 1 : T <= 32 ? 2 : 3;
    int S = slices(T, N, K, ex.tune->sms, ex.tune->mmv_slots > 0 ? ex.tune->mmv_slots : ex.tune->mmv8_per_sm[ti]);
    if (S <= 0) return -EINVAL;
    cudaError_t e;
    if (T <= 8) e = launch<1>(y, x, w, bias, T, N, K, S, ex);
    else if (T <= 16) e = launch<2>(y, x, w, bias, T, N, K, S, ex);
    else if (T <= 32) e = launch<4>(y, x, w, bias, T, N, K, S, ex);
    else e = launch<8>(y, x, w, bias, T, N, K, S, ex);
    CUDA_TRY(e);
    CUDA_LAUNCH_CHECK();
    return 0;
}

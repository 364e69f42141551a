/* linear_tiled_fp8.cu: y = x . W^T (+ b) for an FP8-resident weight (docs/adr/0006-fp8.md) at 5..64
 * tokens: the routed experts' tiled GEMM on the codes (tiled.h, tf_gemm) as a split-K dense GEMM.
 *
 * Why: past 8 tokens the MMV8 (linear_fp8.cu) is bound by its instructions, not by the codes'
 * bytes (each warp decodes its rows' codes and reads every x fragment from shared memory for its
 * 16 rows; at 32 tokens 141 registers, one block an SM: 35 us for each of Qwen3-30B-A3B's qkv and
 * o_proj, 0.3 TB/s), and dequantising to bf16 for cuBLASLt costs 2 + 2 bytes a code of extra
 * traffic and rounds the weights (and x) to bf16. Here:
 *   1. split_x_kernel writes x * 2^100 as bf16 hi + lo rows once ([T, K] each, in the linear's
 *      workspace), so the GEMM copies x tiles like the codes, with no conversion in its loop;
 *   2. block (s, b) owns the 128 weight rows b*128.. (8 warps x 16 rows) and K slice s of S (the
 *      S blocks of a row block form a thread-block cluster), and runs tf_gemm over its slice: each
 *      K step of 64 copies the 128 x 64 code tile (8 KB) and the x tiles into shared memory with
 *      cp.async, 8 / 6 / 4 steps in flight for passes of 16 / 32 / 64 tokens (all T tokens in one
 *      pass); the codes become bf16 f32(q) * 2^-120 by bit placement and feed mma.sync m16n8k16
 *      with x hi and x lo, a step's sums times the rows' scales (the weights met are f32(q) *
 *      scale, as in the MMV8: the CPU's float32 weights are the oracle);
 *   3. the cluster sums its S partial tiles through distributed shared memory in rank order and
 *      each block writes 1/S of the outputs (+ bias), as linear_tiled.cu.
 * The first steps' weight rows are pulled towards L2 before the PDL wait (weights are never
 * written in a step), while the split kernel runs. Every output is a fixed sequence of MMAs and a
 * fixed-order sum: deterministic. Needs K % 64 == 0, phase % 64 == 0, 16-byte aligned codes and x,
 * and 2 x T x K bf16 of workspace (msm_cuda_linear_ws_bytes). */
#include "tiled.h"
#include "msm_cuda_kernels.h"

#include <errno.h>

/* xh, xl [n] = bf16 hi + lo of x * 2^100 (exact scaling), n % 4 == 0, 16-byte aligned */
static __global__ void split_x_kernel(uint16_t *xh, uint16_t *xl, const float *x, size_t n) {
    msm_pdl_trigger();
    msm_pdl_wait();
    for (size_t i = 4 * (blockIdx.x * (size_t)blockDim.x + threadIdx.x); i < n; i += 4 * (size_t)gridDim.x * blockDim.x) {
        float4 v = *(const float4 *)(x + i);
        uint2 h, l;
        msm_split_bf16x2(v.x * MSM_FP8_X_SCALE, v.y * MSM_FP8_X_SCALE, h.x, l.x);
        msm_split_bf16x2(v.z * MSM_FP8_X_SCALE, v.w * MSM_FP8_X_SCALE, h.y, l.y);
        *(uint2 *)(xh + i) = h;
        *(uint2 *)(xl + i) = l;
    }
}

/* One pass of BM >= T tokens; smem: the pipeline, then the partial tile [T][128] f32. */
template <int BM>
static __global__ void __launch_bounds__(TL_WARPS * 32, 2)
    linear_tiled_fp8_kernel(float *y, const uint16_t *xh, const uint16_t *xl, const uint8_t *q8, const float *sc,
                            int ph, const uint16_t *bias, int T, int N, int K) {
    extern __shared__ __align__(128) unsigned char smem[];
    msm_pdl_trigger();
    const int S = (int)gridDim.x, rank = (int)blockIdx.x; /* cluster = the S blocks along x */
    const int nb0 = (int)blockIdx.y * TL_ROWS;
    const int nk = K / TL_BK, per = (nk + S - 1) / S, c0 = rank * per, nloc = max(0, min(nk, c0 + per) - c0);
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    auto w_row = [&](int r) { /* rows past N repeat row N-1: never stored */
        return q8 + (size_t)min(nb0 + r, N - 1) * K + (size_t)c0 * TL_BK;
    };
    if ((tid & 3) == 0) /* one thread a row: its first steps' 64-byte pieces */
        for (int j = 0; j < 2; j++)
            for (int s = 0; s < nloc && s < TF_ST(BM) - 1; s++)
                asm volatile("prefetch.global.L2 [%0];" ::"l"(w_row(tid / 4 + 64 * j) + s * TL_BK));
    msm_pdl_wait(); /* xh / xl: the split kernel's */
    const int ncs = (K + ph + 127) >> 7;
    const float *sa = sc + (size_t)min(nb0 + warp * 16 + g, N - 1) * ncs;
    const float *sb = sc + (size_t)min(nb0 + warp * 16 + g + 8, N - 1) * ncs;
    const int ntile = (T + 7) >> 3;
    float acc[8][4];
    if (nloc > 0) {
        size_t xo = (size_t)c0 * TL_BK;
        tf_gemm<BM>(acc, smem, w_row, sa, sb, ph + c0 * TL_BK, xh + xo, xl + xo, 0, T, ntile, nloc * TL_BK, K);
    } else {
#pragma unroll
        for (int t = 0; t < 8; t++) acc[t][0] = acc[t][1] = acc[t][2] = acc[t][3] = 0.0f;
    }
    __syncthreads(); /* the pipeline's shared memory becomes the partial tile */
    /* C fragment: acc[t][j] = (weight row warp*16 + g + 8*(j>>1), token 8t + 2q + (j&1)) */
    float *part = (float *)smem; /* [T][TL_ROWS] */
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t >= ntile) break;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = 8 * t + 2 * q + (j & 1), n = warp * 16 + g + 8 * (j >> 1);
            if (r < T) part[r * TL_ROWS + n] = acc[t][j];
        }
    }
    msm_cluster_sum_store<TL_ROWS>(part, T * TL_ROWS, S, rank, nb0, T, N, y, bias);
}

static_assert(64 * TL_ROWS * 4 <= TF_SMEM_BM(64) && 32 * TL_ROWS * 4 <= TF_SMEM_BM(32) &&
                  16 * TL_ROWS * 4 <= TF_SMEM_BM(16),
              "the partial tile reuses the pipeline");

static size_t xb_bytes(int T, int K) { return ((size_t)T * K * 2 + 255) / 256 * 256; }

extern "C" int msm__linear_tiled_fp8_prepare(void) {
    CUDA_TRY(cudaFuncSetAttribute(linear_tiled_fp8_kernel<16>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  TF_SMEM_BM(16)));
    CUDA_TRY(cudaFuncSetAttribute(linear_tiled_fp8_kernel<32>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  TF_SMEM_BM(32)));
    CUDA_TRY(cudaFuncSetAttribute(linear_tiled_fp8_kernel<64>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  TF_SMEM_BM(64)));
    return 0;
}

extern "C" bool msm__linear_tiled_fp8_fits(int T, int N, int K, msm_cuda_fp8w w, const float *x, const void *ws,
                                           size_t ws_bytes) {
    return T >= 1 && T <= 64 && N > 0 && (N + TL_ROWS - 1) / TL_ROWS <= 65535 && K >= TL_BK && K % TL_BK == 0 &&
           w.phase % TL_BK == 0 && ((uintptr_t)w.q | (uintptr_t)x | (uintptr_t)ws) % 16 == 0 && ws &&
           ws_bytes >= 2 * xb_bytes(T, K);
}

template <int BM>
static cudaError_t launch(float *y, const uint16_t *xh, const uint16_t *xl, msm_cuda_fp8w w, const uint16_t *bias,
                          int T, int N, int K, int S, msm_cuda_exec ex) {
    dim3 grid((unsigned)S, (unsigned)((N + TL_ROWS - 1) / TL_ROWS));
    return msm_launch_cluster(linear_tiled_fp8_kernel<BM>, grid, dim3(TL_WARPS * 32), TF_SMEM_BM(BM), (unsigned)S, ex,
                              y, xh, xl, w.q, w.scale, w.phase, bias, T, N, K);
}

extern "C" int msm__linear_tiled_fp8_run(float *y, const float *x, msm_cuda_fp8w w, const uint16_t *bias, int T,
                                         int N, int K, void *ws, size_t ws_bytes, msm_cuda_exec ex) {
    if (!msm__linear_tiled_fp8_fits(T, N, K, w, x, ws, ws_bytes)) return -EINVAL;
    uint16_t *xh = (uint16_t *)ws, *xl = (uint16_t *)((char *)ws + xb_bytes(T, K));
    size_t n = (size_t)T * K, blocks = (n / 4 + 255) / 256;
    CUDA_TRY(msm_launch(split_x_kernel, dim3((unsigned)(blocks < 1024 ? blocks : 1024)), dim3(256), 0, ex, xh, xl, x,
                        n));
    /* K slices: double S while the grid keeps at most two blocks an SM (one wave) and every slice
     * at least 4 K steps */
    int rb = (N + TL_ROWS - 1) / TL_ROWS, nk = K / TL_BK, S = 1;
    while (S < 8 && rb * S * 2 <= 2 * ex.tune->sms && nk >= 4 * S * 2) S *= 2;
    cudaError_t e = T <= 16   ? launch<16>(y, xh, xl, w, bias, T, N, K, S, ex)
                    : T <= 32 ? launch<32>(y, xh, xl, w, bias, T, N, K, S, ex)
                              : launch<64>(y, xh, xl, w, bias, T, N, K, S, ex);
    CUDA_TRY(e);
    CUDA_LAUNCH_CHECK();
    return 0;
}

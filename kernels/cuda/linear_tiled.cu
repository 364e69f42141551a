/* linear_tiled.cu: y = x . W^T (+ b) for 9..64 tokens (decode batches, short prefill chunks) as a
 * split-K tensor-core GEMM that streams W from HBM once through a shared-memory pipeline.
 *
 * Why: at these T the dense linears went to cuBLASLt (x rounded to bf16 by a conversion launch,
 * then one matmul at 17-66% of the copy ceiling on the model's N = 2048..11264 shapes, measured
 * on the H200) or to the MMV kernel (every warp loads x from global memory for every K chunk, so
 * its x traffic is 2x the weights' per 16 tokens). Here:
 *   1. block (s, b) owns the 128 weight rows b*128.. (8 warps x 16 rows) and K slice s of S; the
 *      S blocks of a row block form a thread-block cluster;
 *   2. each K step of 64 copies the 128 x 64 bf16 weight tile and the T x 64 fp32 x tile into
 *      shared memory with cp.async, LT_STAGES steps in flight. The weight tiles of the first
 *      steps are issued before the PDL wait (weights are never written during a step), and the
 *      rest of the block's weights are pulled towards L2, so they stream in while the previous
 *      kernel finishes;
 *   3. the x tile is split once per step into bf16 hi + lo tiles (swizzled 128-byte rows, read
 *      with ldmatrix), and mma.sync m16n8k16 takes A = 16 weight rows, B = 8 tokens of x hi and
 *      of x lo into the same fp32 accumulator: the products carry ~16 mantissa bits of x
 *      (near-fp32, like the MMV linear and the tiled MoE GEMMs; cuBLASLt rounded x to bf16);
 *   4. the cluster sums its S partial tiles through distributed shared memory in rank order and
 *      each block writes 1/S of the outputs (+ bias).
 * Every output is a fixed sequence of MMAs and a fixed-order sum: deterministic, no workspace,
 * one launch. Needs K % 64 == 0, T <= 64 and 16-byte aligned w and x. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>

#define LT_WARPS 8
#define LT_ROWS (LT_WARPS * 16) /* weight rows a block owns */
#define LT_BK 64                /* K a pipeline step */
#define LT_STAGES 3
#define LT_W_BYTES (LT_ROWS * LT_BK * 2)                  /* 16 KB: bf16 [128][64], swizzled */
#define LT_XF_BYTES (MSM_CUDA_LINEAR_TILED_MAX_T * LT_BK * 4) /* 16 KB: fp32 [T][64], plain */
#define LT_STAGE_BYTES (LT_W_BYTES + LT_XF_BYTES)
#define LT_HL_BYTES (MSM_CUDA_LINEAR_TILED_MAX_T * LT_BK * 2) /* 8 KB: one of x hi / x lo */
#define LT_SMEM (LT_STAGES * LT_STAGE_BYTES + 2 * LT_HL_BYTES) /* 112 KB: two blocks an SM */

static_assert(MSM_CUDA_LINEAR_TILED_MAX_T == 64, "the tiles assume at most 64 tokens (8 n8 tiles)");
static_assert(MSM_CUDA_LINEAR_TILED_MAX_T * LT_ROWS * 4 <= LT_SMEM, "the partial tile reuses the pipeline");

/* smem: LT_STAGES x {weights, x fp32} | x hi | x lo; after the K loop: partial [T][128] f32 */
static __global__ void __launch_bounds__(LT_WARPS * 32, 2)
    linear_tiled_kernel(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T,
                        int N, int K) {
    extern __shared__ __align__(128) unsigned char smem[];
    msm_pdl_trigger();
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, q = lane & 3;
    const int S = (int)gridDim.x, rank = (int)blockIdx.x; /* cluster = the S blocks along x */
    const int nb0 = (int)blockIdx.y * LT_ROWS;
    const int nk = K / LT_BK, per = (nk + S - 1) / S, c0 = rank * per;
    const int nloc = max(0, min(nk, c0 + per) - c0), ntile = (T + 7) >> 3;
    const uint32_t base = msm_smem_addr(smem), hl = base + LT_STAGES * LT_STAGE_BYTES;

    /* this thread's copies: weight rows tid/8 + 32j (clamped to N-1: never stored), chunk tid%8 */
    const uint16_t *wsrc[4];
#pragma unroll
    for (int j = 0; j < 4; j++)
        wsrc[j] = w + (size_t)min(nb0 + tid / 8 + 32 * j, N - 1) * K + (size_t)c0 * LT_BK + (tid % 8) * 8;
    auto load_w = [&](int stage, int kc) {
        uint32_t sb = base + stage * LT_STAGE_BYTES;
#pragma unroll
        for (int j = 0; j < 4; j++)
            msm_cp_async16(sb + msm_swz128(tid / 8 + 32 * j, tid % 8), wsrc[j] + (size_t)kc * LT_BK, 16);
    };
    /* x: T rows x 16 chunks of 4 floats, rows of 256 bytes */
    auto load_x = [&](int stage, int kc) {
        uint32_t sb = base + stage * LT_STAGE_BYTES + LT_W_BYTES;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int idx = tid + 256 * j, m = idx >> 4, c = idx & 15;
            if (m < T)
                msm_cp_async16(sb + m * 256 + c * 16, x + (size_t)m * K + (size_t)(c0 + kc) * LT_BK + c * 4, 16);
        }
    };
#pragma unroll
    for (int s = 0; s < LT_STAGES - 1; s++)
        if (s < nloc) load_w(s, s);
    /* the rest of the block's weights towards L2: one 128-byte line per (row, K step) */
    for (int i = tid; i < LT_ROWS * nloc; i += LT_WARPS * 32) {
        int r = i / nloc, l = i % nloc;
        if (l >= LT_STAGES - 1 && nb0 + r < N)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(w + (size_t)(nb0 + r) * K + (size_t)(c0 + l) * LT_BK));
    }
    msm_pdl_wait(); /* x is the previous kernel's output */
#pragma unroll
    for (int s = 0; s < LT_STAGES - 1; s++) {
        if (s < nloc) load_x(s, s);
        msm_cp_async_commit(); /* group 0 also holds the early weight tiles */
    }

    float acc[8][4];
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
    for (int kc = 0; kc < nloc; kc++) {
        msm_cp_async_wait<LT_STAGES - 2>();
        __syncthreads(); /* stage kc landed for every thread; the hi/lo tiles are free again */
        const int stage = kc % LT_STAGES;
        const uint32_t sb = base + stage * LT_STAGE_BYTES;
        /* x fp32 -> hi + lo bf16 tiles: 16-byte chunk c (8 values) of row m; rows >= T are zero */
        const float4 *xf = (const float4 *)(smem + stage * LT_STAGE_BYTES + LT_W_BYTES);
        for (int idx = tid; idx < ntile * 64; idx += LT_WARPS * 32) {
            int m = idx >> 3, c = idx & 7;
            uint4 h = make_uint4(0, 0, 0, 0), l = h;
            if (m < T) {
                float4 a = xf[m * 16 + 2 * c], b = xf[m * 16 + 2 * c + 1];
                msm_split_bf16x2(a.x, a.y, h.x, l.x);
                msm_split_bf16x2(a.z, a.w, h.y, l.y);
                msm_split_bf16x2(b.x, b.y, h.z, l.z);
                msm_split_bf16x2(b.z, b.w, h.w, l.w);
            }
            uint32_t o = msm_swz128(m, c);
            *(uint4 *)(smem + LT_STAGES * LT_STAGE_BYTES + o) = h;
            *(uint4 *)(smem + LT_STAGES * LT_STAGE_BYTES + LT_HL_BYTES + o) = l;
        }
        __syncthreads();
        msm_tile_mma_k64(acc, sb, hl, hl + LT_HL_BYTES, warp, lane, ntile);
        int nx = kc + LT_STAGES - 1; /* refills the stage every thread finished with (sync above) */
        if (nx < nloc) {
            load_w(nx % LT_STAGES, nx);
            load_x(nx % LT_STAGES, nx);
        }
        msm_cp_async_commit();
    }
    msm_cp_async_wait<0>();
    __syncthreads(); /* the pipeline's shared memory becomes the partial tile */

    /* C fragment: acc[t][j] = (weight row warp*16 + g + 8*(j>>1), token 8t + 2q + (j&1)) */
    float *part = (float *)smem; /* [T][LT_ROWS] */
#pragma unroll
    for (int t = 0; t < 8; t++) {
        if (t >= ntile) break;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = 8 * t + 2 * q + (j & 1), n = warp * 16 + g + 8 * (j >> 1);
            if (r < T) part[r * LT_ROWS + n] = acc[t][j];
        }
    }
    msm_cluster_sum_store<LT_ROWS>(part, T * LT_ROWS, S, rank, nb0, T, N, y, bias);
}

extern "C" int msm__linear_tiled_prepare(void) {
    CUDA_TRY(cudaFuncSetAttribute(linear_tiled_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, LT_SMEM));
    return 0;
}

extern "C" bool msm__linear_tiled_fits(int T, int N, int K, const void *w, const void *x) {
    return T >= 1 && T <= MSM_CUDA_LINEAR_TILED_MAX_T && N > 0 && K > 0 && K % LT_BK == 0 &&
           ((uintptr_t)w | (uintptr_t)x) % 16 == 0;
}

extern "C" int msm__linear_tiled_run(float *y, const float *x, const uint16_t *w, const uint16_t *bias, int T,
                          int N, int K, msm_cuda_exec ex) {
    /* K slices: double S while the grid still fits one wave of two blocks an SM and every slice
     * keeps at least 2 K steps (the pipeline's depth minus one) */
    int rb = (N + LT_ROWS - 1) / LT_ROWS, nk = K / LT_BK, S = 1;
    while (S < 8 && rb * S * 2 <= 2 * ex.tune->sms && nk >= 2 * S * 2) S *= 2;
    if (rb > 65535) return -EINVAL;
    dim3 grid((unsigned)S, (unsigned)rb);
    CUDA_TRY(msm_launch_cluster(linear_tiled_kernel, grid, dim3(LT_WARPS * 32), LT_SMEM, (unsigned)S, ex, y, x, w,
                                bias, T, N, K));
    CUDA_LAUNCH_CHECK();
    return 0;
}

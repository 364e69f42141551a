/* tiled.h: the tiled tensor-core GEMM cores that moe_tiled.cu (the routed experts at large decode
 * batches) and linear_fp8.cu (FP8 dense linears of 9..64 tokens) share (not a public header):
 * a block of 8 warps owns 128 weight rows and up to BM tokens a pass; each K step of 64 copies the
 * weight tile (bf16: 128 x 64 swizzled, 16 KB; FP8 codes: 128 x 64 plain, 8 KB) and the x tiles
 * (bf16 hi + lo, swizzled) into shared memory with cp.async, several steps in flight, and the
 * warps run mma.sync m16n8k16 on them (msm_tile_mma_k64 / msm_tile_mma_fp8_k64). See moe_tiled.cu
 * for the design and the measurements behind the stage counts. */
#ifndef MSM_TILED_H
#define MSM_TILED_H

#include "msm_cuda.h"

#define TL_WARPS 8
#define TL_ROWS (TL_WARPS * 16) /* weight rows a block owns */
#define TL_BM 64                /* tokens a pass: 8 n8 tiles */
#define TL_BK 64                /* K a pipeline step: 128-byte bf16 rows, 8 chunks of 16 bytes */
#define TL_STAGES 3
#define TL_W_BYTES (TL_ROWS * TL_BK * 2)      /* 16 KB */
#define TL_X_BYTES (TL_BM * TL_BK * 2)        /* 8 KB, one of hi / lo */
#define TL_STAGE_BYTES (TL_W_BYTES + 2 * TL_X_BYTES)
#define TL_SMEM (TL_STAGES * TL_STAGE_BYTES) /* 96 KB: two blocks an SM */

static_assert(TL_BM == 64 && TL_BK == 64, "the copy and fragment loops assume 64 x 64 tiles");

/* The bf16 kernels also come with fewer tokens a pass and a deeper pipeline, for steps whose experts
 * have few tokens each (MSM_CUDA_MOE_TILED_BM): a pass of BM tokens keeps 2 x BM x-rows a stage, so
 * the shared memory of two blocks an SM holds TL_ST(BM) stages, TL_ST(BM) - 1 weight tiles in
 * flight a block instead of 2 (the down GEMM at batch 32 streamed at 60% of the copy ceiling,
 * gate/up at 81%, bench/results/2026-12-02-h200-s4). */
#define TL_XB(BM) ((BM) * TL_BK * 2)                /* bytes of one of hi / lo */
#define TL_ST(BM) ((BM) == 16 ? 5 : (BM) == 32 ? 4 : TL_STAGES)
#define TL_SMEM_BM(BM) (TL_ST(BM) * (TL_W_BYTES + 2 * TL_XB(BM)))
static_assert(TL_SMEM_BM(16) <= 100 * 1024 && TL_SMEM_BM(32) <= TL_SMEM && TL_SMEM_BM(64) == TL_SMEM,
              "two blocks an SM at every pass size");

/* The x tiles of a K step at k0 into shared memory at dst (hi, then lo, TL_XB(BM) bytes each,
 * 16-byte chunks swizzled for ldmatrix): 2 x BM rows x 8 chunks over the block's 256 threads,
 * only the live rows (xrows); rows past r1 are zero-filled. */
template <int BM = TL_BM>
static __device__ __forceinline__ void tl_load_x(uint32_t dst, const uint16_t *xh, const uint16_t *xl, int rb, int r1,
                                                 int xrows, int K, size_t k0, int tid) {
#pragma unroll
    for (int j = 0; j < BM / 16; j++) {
        int idx = tid + 256 * j, half = idx / (BM * 8), m = (idx >> 3) % BM, c = idx & 7;
        if (m >= xrows) continue;
        int rr = rb + m;
        const uint16_t *src = (half ? xl : xh) + (size_t)(rr < r1 ? rr : rb) * K + k0 + c * 8;
        msm_cp_async16(dst + half * TL_XB(BM) + msm_swz128(m, c), src, rr < r1 ? 16 : 0);
    }
}

/* ---- the tiled GEMM core ----
 * acc[t] (t < ntile) = sum over K of W[this warp's 16 rows] . B[tokens 8t .. 8t+7] for B = hi + lo.
 * w_row(r): global address of the block's weight row r (0..127) at k = 0; rows past the matrix
 * are clamped by the caller (never stored). xh / xl rows rb .. rb + 8*ntile - 1 (those past r1 are
 * zero-filled). K % 64 == 0. The caller syncs before reusing the shared memory. */
template <int BM, typename RowFn>
static __device__ __forceinline__ void tl_gemm(float acc[8][4], unsigned char *smem, RowFn w_row,
                                               const uint16_t *xh, const uint16_t *xl, int rb,
                                               int r1, int ntile, int K) {
    constexpr int ST = TL_ST(BM), STAGE = TL_W_BYTES + 2 * TL_XB(BM);
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
    int nk = K / TL_BK, xrows = ntile * 8;
    /* this thread's copies: 4 weight chunks (rows tid/8 + 32j, chunk tid%8) and up to 4 x chunks */
    const uint16_t *wsrc[4];
#pragma unroll
    for (int j = 0; j < 4; j++) wsrc[j] = w_row(tid / 8 + 32 * j) + (tid % 8) * 8;
    uint32_t base = msm_smem_addr(smem);
    auto load = [&](int stage, int kc) {
        uint32_t sb = base + stage * STAGE;
        size_t k0 = (size_t)kc * TL_BK;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int r = tid / 8 + 32 * j;
            msm_cp_async16(sb + msm_swz128(r, tid % 8), wsrc[j] + k0, 16);
        }
        tl_load_x<BM>(sb + TL_W_BYTES, xh, xl, rb, r1, xrows, K, k0, tid);
    };
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < nk) load(s, s);
        msm_cp_async_commit();
    }
    for (int kc = 0; kc < nk; kc++) {
        msm_cp_async_wait<ST - 2>();
        __syncthreads();
        uint32_t sb = base + (kc % ST) * STAGE;
        msm_tile_mma_k64(acc, sb, sb + TL_W_BYTES, sb + TL_W_BYTES + TL_XB(BM), warp, lane, ntile);
        int nx = kc + ST - 1;
        if (nx < nk) load(nx % ST, nx);
        msm_cp_async_commit();
    }
    msm_cp_async_wait<0>();
}

#define TF_STAGES 4
#define TF_W_BYTES (TL_ROWS * TL_BK)                 /* 8 KB: [128][64] codes, plain 64-byte rows */
#define TF_STAGE_BYTES (TF_W_BYTES + 2 * TL_X_BYTES) /* 24 KB */
#define TF_SMEM (TF_STAGES * TF_STAGE_BYTES)         /* 96 KB: two blocks an SM, as the bf16 kernels */
/* As the bf16 kernels, fewer tokens a pass leave room for more stages in the same shared memory:
 * 16 tokens 8 stages (12 KB each), 32 tokens 6 (16 KB), 64 tokens 4. A code tile is half a bf16
 * tile, so at 4 stages a block had half the weight bytes in flight of the bf16 kernels' and the
 * FP8 experts streamed no faster than bf16 ones (Qwen3-30B-A3B batch 128: 19.98 vs 20.00 ms). */
#define TF_ST(BM) ((BM) == 16 ? 8 : (BM) == 32 ? 6 : TF_STAGES)
#define TF_SMEM_BM(BM) (TF_ST(BM) * (TF_W_BYTES + 2 * TL_XB(BM)))

static_assert(TF_SMEM <= TL_SMEM, "the FP8 kernels hold two blocks an SM like the bf16 ones");
static_assert(TF_SMEM_BM(16) <= TL_SMEM && TF_SMEM_BM(32) <= TL_SMEM && TF_SMEM_BM(64) == TF_SMEM,
              "two blocks an SM at every FP8 pass size");

/* Two 64-wide K steps a pipeline stage (the FP8 expert GEMMs' tuning fp8_tiled_ks = 2, 16 and 32
 * tokens a pass): a block reads 128 contiguous bytes of each of its 128 code rows a stage instead
 * of 64 (the bf16 kernels' 128 bytes a row a step) and waits at half as many barriers for the same
 * codes; 16 tokens 4 stages of 24 KB, 32 tokens 3 of 32 KB (the same 96 KB, two blocks an SM). */
#define TF_ST2(BM) ((BM) == 16 ? 4 : 3)
#define TF_SMEM_BM2(BM) (TF_ST2(BM) * 2 * (TF_W_BYTES + 2 * TL_XB(BM)))
static_assert(TF_SMEM_BM2(16) <= TL_SMEM && TF_SMEM_BM2(32) <= TL_SMEM, "two blocks an SM at KS = 2 too");

/* tl_gemm on codes: acc[t] = sum over the K steps of scale(step) * (W codes . B) for this warp's 16
 * rows; w_row(r) as in tl_gemm (codes, K bytes a row); sa / sb: the scale rows ([ceil((K + ph) /
 * 128)] floats) of this thread's C rows warp*16 + g and + 8, the step at column k0 taking
 * scale[(k0 + ph) / 128]. xh / xl: x * 2^100 as bf16 hi / lo (rows as in tl_gemm, ld elements
 * apart: K, or more for a K slice of wider rows). K % 64 == 0, K >= 64, ph % 64 == 0. KS: 64-wide
 * steps a pipeline stage (1, or 2 at BM 16 / 32: TF_ST2 stages of two sub-tiles, each laid out as
 * a KS = 1 stage); the same steps in the same order either way, so the same sums. The caller syncs
 * before reusing the shared memory. */
template <int BM, int KS = 1, typename RowFn>
static __device__ __forceinline__ void tf_gemm(float acc[8][4], unsigned char *smem, RowFn w_row, const float *sa,
                                               const float *sb, int ph, const uint16_t *xh, const uint16_t *xl,
                                               int rb, int r1, int ntile, int K, int ld) {
    static_assert(KS == 1 || (KS == 2 && BM <= 32), "two steps a stage at 16 or 32 tokens a pass");
    constexpr int ST = KS == 1 ? TF_ST(BM) : TF_ST2(BM), SUB = TF_W_BYTES + 2 * TL_XB(BM), STAGE = KS * SUB;
    int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
#pragma unroll
    for (int t = 0; t < 8; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = 0.0f;
    int nk = K / TL_BK, ns = (nk + KS - 1) / KS, xrows = ntile * 8;
    /* this thread's copies a step: 2 weight chunks (rows tid/4 + 64j, bytes 16 * (tid%4)) and up to 4 x chunks */
    const uint8_t *wsrc[2];
#pragma unroll
    for (int j = 0; j < 2; j++) wsrc[j] = w_row(tid / 4 + 64 * j) + (tid % 4) * 16;
    uint32_t base = msm_smem_addr(smem);
    auto load = [&](int stage, int sc) { /* the K steps of stage step sc */
#pragma unroll
        for (int u = 0; u < KS; u++) {
            int kc = sc * KS + u;
            if (KS > 1 && kc >= nk) break;
            uint32_t st = base + stage * STAGE + u * SUB;
            size_t k0 = (size_t)kc * TL_BK;
#pragma unroll
            for (int j = 0; j < 2; j++)
                msm_cp_async16(st + (tid / 4 + 64 * j) * TL_BK + (tid % 4) * 16, wsrc[j] + k0, 16);
            tl_load_x<BM>(st + TF_W_BYTES, xh, xl, rb, r1, xrows, ld, k0, tid);
        }
    };
    auto scale = [&](const float *s, int kc) { return __ldg(s + ((kc * TL_BK + ph) >> 7)) * MSM_FP8_S_SCALE; };
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < ns) load(s, s);
        msm_cp_async_commit();
    }
    float s_a[KS], s_b[KS]; /* this stage's steps' scales; the next stage's are loaded while it waits */
#pragma unroll
    for (int u = 0; u < KS; u++) {
        int kc = KS > 1 ? min(u, nk - 1) : u; /* nk >= 1 */
        s_a[u] = scale(sa, kc), s_b[u] = scale(sb, kc);
    }
    for (int sc = 0; sc < ns; sc++) {
        float ca[KS], cb[KS];
#pragma unroll
        for (int u = 0; u < KS; u++) {
            ca[u] = s_a[u], cb[u] = s_b[u];
            int kn = (sc + 1) * KS + u; /* the next stage's, in flight */
            if (kn < nk) s_a[u] = scale(sa, kn), s_b[u] = scale(sb, kn);
        }
        msm_cp_async_wait<ST - 2>();
        __syncthreads(); /* stage sc landed for every thread; every thread is done with stage sc - 1 */
        int nx = sc + ST - 1; /* refills stage sc - 1's buffer */
        if (nx < ns) load(nx % ST, nx);
        msm_cp_async_commit();
#pragma unroll
        for (int u = 0; u < KS; u++) {
            if (KS > 1 && sc * KS + u >= nk) break;
            uint32_t st = base + (sc % ST) * STAGE + u * SUB;
            msm_tile_mma_fp8_k64(acc, st, st + TF_W_BYTES, st + TF_W_BYTES + TL_XB(BM), ca[u], cb[u], warp, lane,
                                 ntile);
        }
    }
    msm_cp_async_wait<0>();
}

#endif

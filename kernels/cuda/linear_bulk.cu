/* linear_bulk.cu: y = x . W^T (+ b) at decode (a few tokens) with the weight rows streamed into
 * shared memory by the copy engine ("bulk GEMV"), for bf16 and FP8-resident weights.
 *
 * Why: gemv_kernel (linear.cu) holds its weight loads in registers, 4 x 16 bytes a lane a row, so
 * a decode weight of 8-25 MB (o_proj, qkv, a shared expert) streams in two or three rounds of
 * loads at 1.5-2.5 TB/s (ncu, H200, 2026-12-01), and only its first round can be in flight before
 * the PDL wait, while the small kernel before it (norm, RoPE, attention) still runs. A bulk copy
 * (cp.async.bulk) holds no registers: one lane asks for whole rows at once, as many as the block's
 * shared memory holds (~26 MB over the GPU at the default budget: all of a dense decoder weight),
 * and since weights are never written during a step it asks before the PDL wait.
 *
 * How: every warp is a pipeline of its own. The weight is cut into groups of R rows (the rows a
 * warp of gemv_kernel owns at the same token count); warp w of the grid takes groups w, w + W,
 * w + 2W, ... (W warps in all), through a ring of ns slots in its block's shared memory with a
 * transaction barrier a slot. Lane 0 copies a group's R rows (contiguous) and, for FP8, their R
 * block-scale rows (contiguous; when a row's scales are a multiple of 16 bytes, else the lanes read
 * them from global memory) into a slot and arms its barrier with the bytes; the first ns groups
 * before the PDL wait. The warp then computes the group exactly as gemv_kernel's warp does: the
 * same rows-dot loop reading the slot (msm_rows_dot_w with msm_src_shared), the same lane partials
 * in the same order, the same warp sum, + bias. So y is bitwise gemv_kernel's (kernel test), and
 * every tuning of the ring or the grid gives the same bits. The slot goes back to lane 0 for group
 * i + ns once the warp has read it (__syncwarp, then a proxy fence before the copy).
 *
 * Grid: as many groups a warp as two blocks an SM of 8 warps need to cover the weight in one wave
 * (tuning gemv_bulk_per_sm), each warp's ring as deep as its groups or as the block's budget
 * (gemv_bulk_kb) allows, at least one slot. Needs 16-byte rows (bf16 K % 8, FP8 K % 16 and phase
 * % 16), 16-byte aligned W and x, T <= 4 (bf16) or 2 (FP8: past them the MMV and MMV8), and eight
 * slots within the shared memory of a block. At most 128 registers a thread (two blocks an SM). */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>

#define LB_WARPS 8
#define LB_SMEM_MAX (227 << 10) /* sm_90's opt-in shared memory a block */

/* Bytes of the block's ns transaction barriers a warp, ahead of the slots (128-byte aligned). */
static MSM_CUDA_HD size_t lb_bar_bytes(int ns) { return ((size_t)LB_WARPS * ns * 8 + 127) / 128 * 128; }

template <int NT, int R, bool FP8>
static __global__ void __launch_bounds__(LB_WARPS * 32, 2)
    linear_bulk_kernel(float *y, const float *x, const void *w, const float *wsc, int ph, const uint16_t *bias,
                       int T, int N, int K, int ns, unsigned sb, bool sc_bulk, bool early) {
    extern __shared__ __align__(128) unsigned char smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const size_t rb = (size_t)K * (FP8 ? 1 : 2); /* bytes of a weight row */
    const int ncs = FP8 ? (K + ph + 127) >> 7 : 0;  /* scales of a row */
    const int G = (N + R - 1) / R, W = (int)gridDim.x * LB_WARPS, gw = (int)blockIdx.x * LB_WARPS + warp;
    const int nmy = gw < G ? (G - 1 - gw) / W + 1 : 0; /* groups of this warp: gw + i * W */
    uint64_t *bar = (uint64_t *)smem + (size_t)warp * ns;
    unsigned char *ring = smem + lb_bar_bytes(ns) + (size_t)warp * ns * sb;
    msm_pdl_trigger();
    if (lane == 0) {
        for (int s = 0; s < ns; s++) msm_mbar_init(bar + s, 1);
        msm_mbar_init_fence();
    }
    __syncwarp();
    /* lane 0: group i's rows (and scales) into slot i % ns */
    auto issue = [&](int i) {
        int n0 = (gw + i * W) * R, nr = min(R, N - n0), s = i % ns;
        unsigned char *slot = ring + (size_t)s * sb;
        unsigned wbytes = (unsigned)(nr * rb), sbytes = sc_bulk ? (unsigned)(nr * ncs * 4) : 0u;
        msm_mbar_arm(bar + s, wbytes + sbytes);
        msm_bulk_g2s(slot, (const char *)w + (size_t)n0 * rb, wbytes, bar + s);
        if (sbytes) msm_bulk_g2s(slot + R * rb, wsc + (size_t)n0 * ncs, sbytes, bar + s);
    };
    if (!early) msm_pdl_wait();
    if (lane == 0)
        for (int i = 0; i < min(ns, nmy); i++) issue(i);
    if (early) msm_pdl_wait();

    const float *xs[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) xs[t] = x + (size_t)min(t, T - 1) * K;
    for (int i = 0; i < nmy; i++) {
        const int s = i % ns, n0 = (gw + i * W) * R;
        msm_mbar_wait(bar + s, (unsigned)(i / ns) & 1u);
        const unsigned char *slot = ring + (size_t)s * sb;
        const void *wr[R];
        const float *sr[R];
#pragma unroll
        for (int r = 0; r < R; r++) {
            wr[r] = n0 + r < N ? (const void *)(slot + r * rb) : NULL;
            sr[r] = !FP8 ? NULL : sc_bulk ? (const float *)(slot + R * rb) + (size_t)r * ncs : msm_srow(wsc, n0 + r, K, ph);
        }
        float acc[R][NT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
        msm_rows_dot_w<R, NT, 4, true, FP8, false, false, msm_no_hook, msm_src_shared>(acc, wr, sr, xs, T, K, ph,
                                                                                       lane);
#pragma unroll
        for (int r = 0; r < R; r++) {
            float b = (bias && n0 + r < N) ? msm_bf(bias[n0 + r]) : 0.0f;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = msm_warp_sum(acc[r][t]);
                if (lane == 0 && t < T && n0 + r < N) y[(size_t)t * N + n0 + r] = v + b;
            }
        }
        __syncwarp(); /* every lane has read the slot */
        if (lane == 0 && i + ns < nmy) {
            msm_fence_proxy_async();
            issue(i + ns);
        }
    }
}

typedef struct lb_plan {
    int NT, R, ns, blocks;
    unsigned sb;
    bool sc_bulk;
    size_t smem;
} lb_plan;

/* The launch of a call, or false where the bulk GEMV does not take it (see the file's head). */
static bool lb_make(lb_plan *p, bool fp8, const void *w, const float *wsc, int ph, const float *x, int T, int N,
                    int K, const msm_cuda_tuning *tn) {
    if (T < 1 || T > (fp8 ? 2 : 4) || N <= MSM_CUDA_GEMV_SMALL_N || K <= 0 || ((uintptr_t)w | (uintptr_t)x) % 16) return false;
    if (fp8 ? (K % 16 || ph % 16 || ph < 0 || !wsc) : K % 8) return false;
    p->NT = T == 1 ? 1 : T == 2 ? 2 : 4;
    /* gemv_launch's rows a warp at the same token chunk (bf16), two for FP8 (one with fp8_gemv_rows
     * 1): four rows of codes took 158-199 registers, past two blocks an SM */
    p->R = fp8 ? (tn->fp8_gemv_rows == 1 ? 1 : 2) : p->NT >= 3 ? 2 : 1;
    size_t rb = (size_t)K * (fp8 ? 1 : 2);
    int ncs = fp8 ? (K + ph + 127) >> 7 : 0;
    p->sc_bulk = fp8 && ncs % 4 == 0 && (uintptr_t)wsc % 16 == 0;
    size_t sb = ((size_t)p->R * rb + (p->sc_bulk ? (size_t)p->R * ncs * 4 : 0) + 127) / 128 * 128;
    if ((size_t)LB_WARPS * sb + lb_bar_bytes(1) > LB_SMEM_MAX) return false;
    p->sb = (unsigned)sb;
    long G = (N + p->R - 1) / p->R;
    long slots = (long)tn->sms * (tn->gemv_bulk_per_sm > 0 ? tn->gemv_bulk_per_sm : 2) * LB_WARPS;
    long rpw = (G + slots - 1) / slots, warps = (G + rpw - 1) / rpw;
    p->blocks = (int)((warps + LB_WARPS - 1) / LB_WARPS);
    size_t budget = (size_t)(tn->gemv_bulk_kb > 0 ? tn->gemv_bulk_kb : 100) << 10;
    long ns = (long)(budget / ((size_t)LB_WARPS * sb));
    if (ns > rpw) ns = rpw;
    if (ns < 1) ns = 1;
    while (ns > 1 && (size_t)LB_WARPS * ns * sb + lb_bar_bytes((int)ns) > LB_SMEM_MAX) ns--;
    p->ns = (int)ns;
    p->smem = (size_t)LB_WARPS * ns * sb + lb_bar_bytes((int)ns);
    return true;
}

#define LB_KERNELS(X)                                                                                          \
    X(1, 1, false) X(2, 1, false) X(4, 2, false) X(1, 1, true) X(1, 2, true) X(2, 1, true) X(2, 2, true)

extern "C" int msm__linear_bulk_prepare(void) {
#define LB_ATTR(NT, R, F)                                                                                      \
    CUDA_TRY(cudaFuncSetAttribute(linear_bulk_kernel<NT, R, F>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                  LB_SMEM_MAX));
    LB_KERNELS(LB_ATTR)
#undef LB_ATTR
    return 0;
}

extern "C" bool msm__linear_bulk_fits(bool fp8, const void *w, const float *wsc, int ph, const float *x, int T,
                                      int N, int K, const msm_cuda_tuning *tn) {
    lb_plan p;
    return tn->gemv_bulk && T <= (fp8 ? tn->fp8_bulk_max_t : tn->gemv_bulk_max_t) &&
           lb_make(&p, fp8, w, wsc, ph, x, T, N, K, tn);
}

extern "C" bool msm_cuda_linear_bulk_takes(bool fp8, int T, int N, int K, int ph, const msm_cuda_tuning *tn) {
    const void *a = (const void *)(uintptr_t)256; /* 16-byte aligned operands, as cudaMalloc gives */
    return msm__linear_bulk_fits(fp8, a, (const float *)a, ph, (const float *)a, T, N, K, tn);
}

extern "C" int msm__linear_bulk_run(float *y, const float *x, const void *w, const float *wsc, int ph,
                                    const uint16_t *bias, int T, int N, int K, msm_cuda_exec ex) {
    lb_plan p;
    bool fp8 = wsc != NULL;
    if (!lb_make(&p, fp8, w, wsc, ph, x, T, N, K, ex.tune)) return -EINVAL;
    bool early = ex.tune->gemv_early && !ex.w_written;
    cudaError_t e = cudaErrorInvalidConfiguration;
#define LB_GO(NT_, R_, F_)                                                                                    \
    if (p.NT == NT_ && p.R == R_ && fp8 == F_)                                                                \
        e = msm_launch(linear_bulk_kernel<NT_, R_, F_>, dim3((unsigned)p.blocks), dim3(LB_WARPS * 32), p.smem, ex, y, \
                       x, w, wsc, ph, bias, T, N, K, p.ns, p.sb, p.sc_bulk, early);
    LB_KERNELS(LB_GO)
#undef LB_GO
    CUDA_TRY(e);
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* moe_stream.cu: the routed experts' grouped SIMT GEMVs (moe_grouped.cu) with each block's weight
 * rows brought into shared memory by bulk copies (TMA) at once (tuning moe_gg_stream, bf16 rows,
 * after the grouping).
 *
 * Why: at 8 tokens the grouped SIMT gate/up and down read each selected expert's rows once, and on
 * the H200 they reach 3.94 / 3.83 TB/s against its 4.19 copy rate where the H100's reach their
 * card's (2026-12-06 s26 run 1, s30 run 1). Their loads in flight are registers: 4 blocks an SM of 4
 * warps, 2 16-byte chunks a lane a row, ~64 KiB an SM, less across each short block's item load and
 * reduction; the H200 needs ~55 KiB an SM at its ~1.75 us round trip under load, so it sits at the
 * edge (Little's law). Here a block of the same grid (compact: a grid row per selected expert)
 * requests all of its rows at once, one thread's bulk copies completing on an mbarrier, so an SM
 * has up to 192 KiB in flight without registers holding them: the gate/up 4 columns a block (their
 * gate and up rows, 32 KiB at H = 2048: 6 blocks an SM) or 8 (moe_gg_stream's GATEUP2 bit: 64 KiB,
 * 3 blocks), the down 16 rows a block (24 KiB at I = 768). The down, as the SIMT one, may read its
 * item and issue its copies before its PDL wait (early: the gate/up before it triggers only after
 * its own wait).
 * (Measured and replaced, s31 run 2 on an H100: one persistent block an SM streaming a ring of
 * 3 x 64 KiB tiles of 8 columns, every warp on the same tile: Qwen3-30B-A3B 8 tokens 10.22 ->
 * 15.26 ms, the gate/up 107 -> 176 us a layer: each tile waits for its item, pair and x loads in
 * turn, and 8 warps hide none of it.)
 *
 * The arithmetic is msm_rows_dot's (VEC) on the same bf16 weights and f32 vectors: lane l sums the
 * 8-element groups at k = 8l, 8l + 256, ... in K order (msm_fma8), then a warp sum; a row's dot does
 * not depend on the rows or tokens beside it, so every output is the grouped SIMT kernels' bits. */
#include "moe_internal.h"

#include <errno.h>

#define MS_WARPS 4
#define MS_NT 4        /* tokens a pass (the rows are reread from shared memory) */
#define MS_DN_RW 4     /* down rows a warp */
#define MS_MAX_SMEM (64 * 1024 + 16)

/* acc[r][t] += this lane's share of dot(row r, vector t) over K, rows in shared memory (bf16, 16-byte
 * aligned), only the first nt vectors live: msm_rows_dot's VEC sums (K % 8 == 0). */
template <int R>
static __device__ __forceinline__ void ms_rows_dot(float (&acc)[R][MS_NT], const unsigned char *const (&rows)[R],
                                                   const float *const (&xs)[MS_NT], int nt, int K, int lane) {
#pragma unroll 4
    for (int k0 = lane * 8; k0 < K; k0 += 256) {
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) msm_bf16x8(*(const uint4 *)(rows[r] + 2 * (size_t)k0), wf[r]);
#pragma unroll
        for (int t = 0; t < MS_NT; t++) {
            if (t >= nt) break;
            const float4 *xp = (const float4 *)(xs[t] + k0);
            float4 xa = xp[0], xb = xp[1];
#pragma unroll
            for (int r = 0; r < R; r++) acc[r][t] = msm_fma8(wf[r], xa, xb, acc[r][t]);
        }
    }
}

/* Thread 0: the mbarrier (one arrival, the expected bytes) and the copies of n runs of contiguous
 * rows (src[j], bytes[j]) to dst[j], each split into copies of at most 4 KiB. Then the block's
 * barrier, after which every thread may wait on bar (parity 0). */
template <int N>
static __device__ __forceinline__ void ms_fetch(uint64_t *bar, unsigned char *const (&dst)[N],
                                                const void *const (&src)[N], const unsigned (&bytes)[N]) {
    if (threadIdx.x == 0) {
        msm_mbar_init(bar, 1);
        msm_mbar_init_fence();
        unsigned total = 0;
#pragma unroll
        for (int j = 0; j < N; j++) total += bytes[j];
        msm_mbar_expect_tx(bar, total);
#pragma unroll
        for (int j = 0; j < N; j++)
            for (unsigned o = 0; o < bytes[j]; o += 4096)
                msm_bulk_g2s(dst[j] + o, (const char *)src[j] + o, min(4096u, bytes[j] - o), bar);
    }
    __syncthreads();
}

/* Gate/up + SwiGLU: block (column chunk, s-th selected expert) computes columns i0 .. i0 + 4RW - 1,
 * warp w columns i0 + w RW .. + RW - 1. H % 8 == 0, rows and x 16-byte aligned. */
template <int RW>
static __global__ void __launch_bounds__(MS_WARPS * 32)
    moe_gateup_stream_kernel(moe_ws ws, const float *x, const uint16_t *gate_up, int H, int I, int k) {
    extern __shared__ __align__(128) unsigned char ms_sm[];
    __shared__ uint64_t bar;
    constexpr int NC = MS_WARPS * RW; /* columns a block */
    msm_pdl_wait();
    msm_pdl_trigger();
    const int4 item = (int)blockIdx.y < *ws.n_sel ? ws.items[blockIdx.y] : make_int4(0, 0, 0, 0);
    const int i0 = blockIdx.x * NC;
    if (item.y >= item.z || i0 >= I) return;
    const size_t rb = 2 * (size_t)H; /* a row's bytes */
    const uint16_t *ge = gate_up + (size_t)item.x * 2 * I * H;
    const unsigned nb = (unsigned)(min(NC, I - i0) * rb);
    unsigned char *const dst[2] = {ms_sm, ms_sm + NC * rb};
    const void *const src[2] = {ge + (size_t)i0 * H, ge + (size_t)(I + i0) * H};
    const unsigned bytes[2] = {nb, nb};
    ms_fetch<2>(&bar, dst, src, bytes);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int c0 = warp * RW; /* the warp's first column in the block */
    if (i0 + c0 >= I) return;
    const unsigned char *rows[2 * RW];
#pragma unroll
    for (int r = 0; r < RW; r++) {
        int c = min(c0 + r, I - 1 - i0); /* columns past I: the last one again, never stored */
        rows[r] = ms_sm + c * rb, rows[RW + r] = ms_sm + (NC + c) * rb;
    }
    float *act = (float *)ws.act;
    for (int gb = item.y; gb < item.z; gb += MS_NT) {
        int nt = min(MS_NT, item.z - gb);
        const float *xs[MS_NT];
#pragma unroll
        for (int t = 0; t < MS_NT; t++) xs[t] = x + (size_t)(ws.perm[gb + min(t, nt - 1)] / k) * H;
        float acc[2 * RW][MS_NT];
#pragma unroll
        for (int r = 0; r < 2 * RW; r++)
#pragma unroll
            for (int t = 0; t < MS_NT; t++) acc[r][t] = 0.0f;
        if (gb == item.y) msm_mbar_wait(&bar, 0u); /* the rows, after the first pass's x addresses */
        ms_rows_dot<2 * RW>(acc, rows, xs, nt, H, lane);
#pragma unroll
        for (int t = 0; t < MS_NT; t++) {
            if (t >= nt) break;
#pragma unroll
            for (int r = 0; r < RW; r++) {
                float g = msm_warp_sum(acc[r][t]), u = msm_warp_sum(acc[RW + r][t]);
                if (lane == 0 && i0 + c0 + r < I) act[(size_t)(gb + t) * I + i0 + c0 + r] = g / (1.0f + expf(-g)) * u;
            }
        }
    }
}

/* Down: block (row chunk, s-th selected expert) computes rows h0 .. h0 + 4 MS_DN_RW - 1 of outp for
 * the expert's grouped rows. I % 8 == 0, rows and act 16-byte aligned. early: the item and the
 * copies before the PDL wait. */
static __global__ void __launch_bounds__(MS_WARPS * 32)
    moe_down_stream_kernel(moe_ws ws, const uint16_t *down, int H, int I, bool early) {
    extern __shared__ __align__(128) unsigned char ms_sm[];
    __shared__ uint64_t bar;
    constexpr int NR = MS_WARPS * MS_DN_RW, RW = MS_DN_RW;
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    const int4 item = (int)blockIdx.y < __ldcg(ws.n_sel) ? __ldcg(ws.items + blockIdx.y) : make_int4(0, 0, 0, 0);
    const int h0 = blockIdx.x * NR;
    if (item.y >= item.z || h0 >= H) { /* still wait: this grid's completion must imply its predecessors' */
        if (early) msm_pdl_wait();
        return;
    }
    const size_t rb = 2 * (size_t)I;
    unsigned char *const dst[1] = {ms_sm};
    const void *const src[1] = {down + ((size_t)item.x * H + h0) * I};
    const unsigned bytes[1] = {(unsigned)(min(NR, H - h0) * rb)};
    ms_fetch<1>(&bar, dst, src, bytes);
    if (early) msm_pdl_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int r0 = warp * RW;
    if (h0 + r0 >= H) return;
    const unsigned char *rows[RW];
#pragma unroll
    for (int r = 0; r < RW; r++) rows[r] = ms_sm + min(r0 + r, H - 1 - h0) * rb; /* past H: never stored */
    const float *act = (const float *)ws.act;
    for (int gb = item.y; gb < item.z; gb += MS_NT) {
        int nt = min(MS_NT, item.z - gb);
        const float *xs[MS_NT];
#pragma unroll
        for (int t = 0; t < MS_NT; t++) xs[t] = act + (size_t)(gb + min(t, nt - 1)) * I;
        float acc[RW][MS_NT];
#pragma unroll
        for (int r = 0; r < RW; r++)
#pragma unroll
            for (int t = 0; t < MS_NT; t++) acc[r][t] = 0.0f;
        if (gb == item.y) msm_mbar_wait(&bar, 0u);
        ms_rows_dot<RW>(acc, rows, xs, nt, I, lane);
#pragma unroll
        for (int t = 0; t < MS_NT; t++) {
            if (t >= nt) break;
#pragma unroll
            for (int r = 0; r < RW; r++) {
                float d = msm_warp_sum(acc[r][t]);
                if (lane == 0 && h0 + r0 + r < H) ws.outp[(size_t)(gb + t) * H + h0 + r0 + r] = d;
            }
        }
    }
}

/* Whether the streamed form takes the gate/up (gateup) or the down of these shapes: chosen (tuning
 * moe_gg_stream), its shared memory granted, bf16 rows with 16-byte loads (vec) and a block's rows
 * within MS_MAX_SMEM. */
bool msm__moe_stream_fits(const msm_cuda_tuning *tn, bool gateup, int H, int I, bool vec) {
    int bit = gateup ? MSM_CUDA_MOE_STREAM_GATEUP : MSM_CUDA_MOE_STREAM_DOWN;
    int rw = tn->moe_gg_stream & MSM_CUDA_MOE_STREAM_GATEUP2 ? 2 : 1;
    size_t sm = gateup ? (size_t)2 * MS_WARPS * rw * 2 * H : (size_t)MS_WARPS * MS_DN_RW * 2 * I;
    return (tn->moe_gg_stream & bit) && tn->moe_stream_ok && vec && sm <= MS_MAX_SMEM;
}

int msm__moe_stream_run(const moe_ws &ws, const float *x, const uint16_t *gate_up, const uint16_t *down, bool gateup,
                        int T, int H, int I, int k, int E, msm_cuda_exec ex) {
    const msm_cuda_tuning *tn = ex.tune;
    size_t P = (size_t)T * k;
    unsigned ny = (unsigned)(P < (size_t)E ? P : (size_t)E); /* a grid row per selected expert at most */
    dim3 blk(MS_WARPS * 32);
    if (gateup) {
        bool rw2 = tn->moe_gg_stream & MSM_CUDA_MOE_STREAM_GATEUP2;
        int nc = MS_WARPS * (rw2 ? 2 : 1);
        dim3 grid((unsigned)((I + nc - 1) / nc), ny);
        CUDA_TRY(msm_launch(rw2 ? moe_gateup_stream_kernel<2> : moe_gateup_stream_kernel<1>, grid, blk,
                            (size_t)2 * nc * 2 * H, ex, ws, x, gate_up, H, I, k));
    } else {
        constexpr int nr = MS_WARPS * MS_DN_RW;
        dim3 grid((unsigned)((H + nr - 1) / nr), ny);
        bool early = tn->moe_gg_early && !ex.w_written;
        CUDA_TRY(msm_launch(moe_down_stream_kernel, grid, blk, (size_t)nr * 2 * I, ex, ws, down, H, I, early));
    }
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* The kernels' shared memory (up to MS_MAX_SMEM a block, the most shared memory an SM offers, so
 * as many blocks fit as their copies allow), for msm_cuda_tuning_init (moe_stream_ok: granted). */
template <typename Kernel>
static bool ms_grant(Kernel kernel) {
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, MS_MAX_SMEM) == cudaSuccess &&
           cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                cudaSharedmemCarveoutMaxShared) == cudaSuccess;
}
void msm__moe_stream_tuning(msm_cuda_tuning *t) {
    t->moe_stream_ok = ms_grant(moe_gateup_stream_kernel<1>) && ms_grant(moe_gateup_stream_kernel<2>) &&
                       ms_grant(moe_down_stream_kernel);
    if (!t->moe_stream_ok) (void)cudaGetLastError();
}

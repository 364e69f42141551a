/* moe_stream.cu: the routed experts' grouped SIMT GEMVs (moe_grouped.cu) with their weights streamed
 * through shared memory by bulk copies (tuning moe_gg_stream, bf16 rows, after the grouping).
 *
 * Why: at 8 tokens the grouped SIMT gate/up and down read each selected expert's rows once, and on
 * the H200 they reach 3.94 / 3.83 TB/s against its 4.19 copy rate where the H100's reach their
 * card's (2026-12-06 s26 run 1, s30 run 1). Their loads in flight are registers: 4 blocks an SM of 4
 * warps, 2 16-byte chunks a lane a row, ~64 KiB an SM, less across each short block's item load and
 * reduction; the H200 needs ~55 KiB an SM at its ~1.75 us round trip under load, so it sits at the
 * edge (Little's law). Here one block of MS_WARPS warps an SM (persistent) keeps a ring of st
 * stages of up to 64 KiB in flight (192 KiB: the attention's 196 KiB carveout), each a tile of
 * weight rows brought in by one thread's bulk copies (TMA) completing on the stage's mbarrier; the
 * block's items are a contiguous run of the n_sel * tiles (expert, tile) items, so consecutive
 * tiles mostly share an expert and its tokens' rows stay in L1.
 *
 * The arithmetic is msm_rows_dot's (VEC) on the same bf16 weights and f32 vectors: lane l sums the
 * 8-element groups at k = 8l, 8l + 256, ... in K order (msm_fma8), then a warp sum; a row's dot does
 * not depend on the rows or tokens beside it, so every output is the grouped SIMT kernels' bits.
 *   gate/up: a tile is 8 columns i0..i0+7: their gate rows then their up rows (two copies of
 *            contiguous rows, 16 x 2H bytes); warp w owns column i0 + w, writes act[g, i] =
 *            silu(gate) * up for the expert's grouped rows g.
 *   down:    a tile is 16 rows h0..h0+15 (one copy, 16 x 2I bytes); warp w owns rows h0 + 2w and
 *            h0 + 2w + 1, writes outp[g, h].
 * Rows past I (past H) are not copied and never read. The gate/up passes its PDL wait first (the
 * items come from the grouping) and triggers after it, so, as moe_down_mma_kernel does, the down may
 * read the complete item table and issue its first stages' copies before its own wait (early). */
#include "moe_internal.h"

#include <errno.h>

#define MS_WARPS 8
#define MS_NT 4                /* tokens a pass (the stage's rows are reread from shared memory) */
#define MS_RING 196608         /* the stages' bytes at most */
#define MS_MAX_ST 8            /* stages at most */
#define MS_GU_ROWS (2 * MS_WARPS) /* rows of a gate/up tile: MS_WARPS columns' gate and up rows */
#define MS_DN_ROWS (2 * MS_WARPS) /* rows of a down tile: 2 a warp */

/* The ring's stages at a tile of tb bytes (0: not even 2 fit). */
static int ms_stages(size_t tb) {
    size_t st = tb ? MS_RING / tb : 0;
    return st < 2 ? 0 : st > MS_MAX_ST ? MS_MAX_ST : (int)st;
}
static size_t ms_smem(size_t tb, int st) { return (size_t)st * tb + (size_t)st * 8; }

/* acc[r][t] += this lane's share of dot(row r, vector t) over K, rows in shared memory (bf16, 16-byte
 * aligned), only the first nt vectors live: msm_rows_dot's VEC sums (K % 8 == 0). */
template <int R>
static __device__ __forceinline__ void ms_rows_dot(float (&acc)[R][MS_NT], const unsigned char *const (&rows)[R],
                                                   const float *const (&xs)[MS_NT], int nt, int K, int lane) {
#pragma unroll 4
    for (int k0 = lane * 8; k0 < K; k0 += 256) {
        float wf[R][8];
#pragma unroll
        for (int r = 0; r < R; r++) {
            uint4 v = *(const uint4 *)(rows[r] + 2 * (size_t)k0);
            float2 a = msm_bf2(v.x), b = msm_bf2(v.y), c = msm_bf2(v.z), d = msm_bf2(v.w);
            wf[r][0] = a.x, wf[r][1] = a.y, wf[r][2] = b.x, wf[r][3] = b.y;
            wf[r][4] = c.x, wf[r][5] = c.y, wf[r][6] = d.x, wf[r][7] = d.y;
        }
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

/* The block's run [beg, end) of n items (balanced within one). */
static __device__ __forceinline__ void ms_run(int n, int *beg, int *end) {
    *beg = (int)((long long)blockIdx.x * n / gridDim.x);
    *end = (int)((long long)(blockIdx.x + 1) * n / gridDim.x);
}

/* The ring: st stages of tb bytes, then st mbarriers (one arrival a phase: the producer's
 * expect_tx), initialised by thread 0. Block-wide. */
static __device__ __forceinline__ uint64_t *ms_ring_init(unsigned char *sm, int tb, int st) {
    uint64_t *bar = (uint64_t *)(sm + (size_t)st * tb);
    if (threadIdx.x == 0) {
        for (int s = 0; s < st; s++) msm_mbar_init(&bar[s], 1);
        msm_mbar_init_fence();
    }
    __syncthreads();
    return bar;
}

/* Gate/up + SwiGLU, item = (s-th selected expert, 8 columns from i0). H % 8 == 0, rows and x
 * 16-byte aligned. */
static __global__ void __launch_bounds__(MS_WARPS * 32, 1)
    moe_gateup_stream_kernel(moe_ws ws, const float *x, const uint16_t *gate_up, int H, int I, int k, int st) {
    extern __shared__ __align__(128) unsigned char ms_sm[];
    msm_pdl_wait();
    msm_pdl_trigger();
    const int tb = MS_GU_ROWS * 2 * H, rb = 2 * H; /* a tile's and a row's bytes */
    const int nchunk = (I + MS_WARPS - 1) / MS_WARPS;
    int beg, end;
    ms_run(*ws.n_sel * nchunk, &beg, &end);
    if (beg >= end) return;
    uint64_t *bar = ms_ring_init(ms_sm, tb, st);
    /* the producer: item it's gate rows and up rows into stage s */
    auto issue = [&](int it, int s) {
        if (it >= end) return;
        int e = ws.items[it / nchunk].x, i0 = (it % nchunk) * MS_WARPS, nr = min(MS_WARPS, I - i0);
        const uint16_t *ge = gate_up + (size_t)e * 2 * I * H;
        unsigned char *d = ms_sm + (size_t)s * tb;
        unsigned bytes = (unsigned)nr * (unsigned)rb;
        msm_mbar_expect_tx(&bar[s], 2 * bytes);
        msm_bulk_g2s(d, ge + (size_t)i0 * H, bytes, &bar[s]);
        msm_bulk_g2s(d + (size_t)MS_WARPS * rb, ge + (size_t)(I + i0) * H, bytes, &bar[s]);
    };
    const bool producer = threadIdx.x == 0;
    if (producer)
        for (int s = 0; s < st; s++) issue(beg + s, s);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    float *act = (float *)ws.act;
    for (int it = beg, j = 0; it < end; it++, j++) {
        const int s = j % st;
        const int4 item = ws.items[it / nchunk];
        const int i = (it % nchunk) * MS_WARPS + warp;
        msm_mbar_wait(&bar[s], (unsigned)(j / st) & 1u);
        if (i < I) {
            const unsigned char *d = ms_sm + (size_t)s * tb;
            const unsigned char *rows[2] = {d + (size_t)warp * rb, d + (size_t)(MS_WARPS + warp) * rb};
            for (int gb = item.y; gb < item.z; gb += MS_NT) {
                int nt = min(MS_NT, item.z - gb);
                const float *xs[MS_NT];
#pragma unroll
                for (int t = 0; t < MS_NT; t++) xs[t] = x + (size_t)(ws.perm[gb + min(t, nt - 1)] / k) * H;
                float acc[2][MS_NT];
#pragma unroll
                for (int t = 0; t < MS_NT; t++) acc[0][t] = acc[1][t] = 0.0f;
                ms_rows_dot<2>(acc, rows, xs, nt, H, lane);
#pragma unroll
                for (int t = 0; t < MS_NT; t++) {
                    if (t >= nt) break;
                    float g = msm_warp_sum(acc[0][t]), u = msm_warp_sum(acc[1][t]);
                    if (lane == 0) act[(size_t)(gb + t) * I + i] = g / (1.0f + expf(-g)) * u;
                }
            }
        }
        __syncthreads(); /* every warp is past its reads of stage s: the item st ahead into it */
        if (producer) issue(it + st, s);
    }
}

/* Down, item = (s-th selected expert, 16 rows from h0): outp[g, h] for the expert's grouped rows g.
 * I % 8 == 0, rows and act 16-byte aligned. early: the item table and the first stages' copies
 * before the PDL wait (see the top). */
static __global__ void __launch_bounds__(MS_WARPS * 32, 1)
    moe_down_stream_kernel(moe_ws ws, const uint16_t *down, int H, int I, int st, bool early) {
    extern __shared__ __align__(128) unsigned char ms_sm[];
    msm_pdl_trigger();
    if (!early) msm_pdl_wait();
    const int tb = MS_DN_ROWS * 2 * I, rb = 2 * I;
    const int nchunk = (H + MS_DN_ROWS - 1) / MS_DN_ROWS;
    int beg, end;
    ms_run(__ldcg(ws.n_sel) * nchunk, &beg, &end);
    if (beg >= end) { /* still wait: this grid's completion must imply its predecessors' */
        if (early) msm_pdl_wait();
        return;
    }
    uint64_t *bar = ms_ring_init(ms_sm, tb, st);
    auto issue = [&](int it, int s) {
        if (it >= end) return;
        int e = __ldcg(&ws.items[it / nchunk].x), h0 = (it % nchunk) * MS_DN_ROWS, nr = min(MS_DN_ROWS, H - h0);
        unsigned bytes = (unsigned)nr * (unsigned)rb;
        msm_mbar_expect_tx(&bar[s], bytes);
        msm_bulk_g2s(ms_sm + (size_t)s * tb, down + ((size_t)e * H + h0) * I, bytes, &bar[s]);
    };
    const bool producer = threadIdx.x == 0;
    if (producer)
        for (int s = 0; s < st; s++) issue(beg + s, s);
    if (early) msm_pdl_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const float *act = (const float *)ws.act;
    for (int it = beg, j = 0; it < end; it++, j++) {
        const int s = j % st;
        const int4 item = ws.items[it / nchunk];
        const int h = (it % nchunk) * MS_DN_ROWS + 2 * warp;
        msm_mbar_wait(&bar[s], (unsigned)(j / st) & 1u);
        if (h < H) {
            const unsigned char *d = ms_sm + (size_t)s * tb + (size_t)(2 * warp) * rb;
            const unsigned char *rows[2] = {d, h + 1 < H ? d + rb : d}; /* past H: row h again, never stored */
            for (int gb = item.y; gb < item.z; gb += MS_NT) {
                int nt = min(MS_NT, item.z - gb);
                const float *xs[MS_NT];
#pragma unroll
                for (int t = 0; t < MS_NT; t++) xs[t] = act + (size_t)(gb + min(t, nt - 1)) * I;
                float acc[2][MS_NT];
#pragma unroll
                for (int t = 0; t < MS_NT; t++) acc[0][t] = acc[1][t] = 0.0f;
                ms_rows_dot<2>(acc, rows, xs, nt, I, lane);
#pragma unroll
                for (int t = 0; t < MS_NT; t++) {
                    if (t >= nt) break;
                    float a = msm_warp_sum(acc[0][t]), b = msm_warp_sum(acc[1][t]);
                    if (lane == 0) {
                        ws.outp[(size_t)(gb + t) * H + h] = a;
                        if (h + 1 < H) ws.outp[(size_t)(gb + t) * H + h + 1] = b;
                    }
                }
            }
        }
        __syncthreads();
        if (producer) issue(it + st, s);
    }
}

/* Whether the streamed form takes the gate/up (gateup) or the down of these shapes: chosen
 * (tuning moe_gg_stream), its shared memory granted, bf16 rows with 16-byte loads (vec) and at
 * least 2 stages of a tile. */
bool msm__moe_stream_fits(const msm_cuda_tuning *tn, bool gateup, int H, int I, bool vec) {
    int bit = gateup ? MSM_CUDA_MOE_STREAM_GATEUP : MSM_CUDA_MOE_STREAM_DOWN;
    size_t tb = gateup ? (size_t)MS_GU_ROWS * 2 * H : (size_t)MS_DN_ROWS * 2 * I;
    return (tn->moe_gg_stream & bit) && tn->moe_stream_ok && vec && ms_stages(tb) > 0;
}

int msm__moe_stream_run(const moe_ws &ws, const float *x, const uint16_t *gate_up, const uint16_t *down, bool gateup,
                        int T, int H, int I, int k, int E, msm_cuda_exec ex) {
    const msm_cuda_tuning *tn = ex.tune;
    size_t P = (size_t)T * k, max_sel = P < (size_t)E ? P : (size_t)E;
    int sms = tn->sms > 0 ? tn->sms : 1;
    if (gateup) {
        size_t tb = (size_t)MS_GU_ROWS * 2 * H, items = max_sel * ((I + MS_WARPS - 1) / MS_WARPS);
        int st = ms_stages(tb);
        unsigned grid = (unsigned)(items < (size_t)sms ? (items ? items : 1) : sms);
        CUDA_TRY(msm_launch(moe_gateup_stream_kernel, dim3(grid), dim3(MS_WARPS * 32), ms_smem(tb, st), ex, ws, x,
                            gate_up, H, I, k, st));
    } else {
        size_t tb = (size_t)MS_DN_ROWS * 2 * I, items = max_sel * ((H + MS_DN_ROWS - 1) / MS_DN_ROWS);
        int st = ms_stages(tb);
        unsigned grid = (unsigned)(items < (size_t)sms ? (items ? items : 1) : sms);
        bool early = tn->moe_gg_early && !ex.w_written;
        CUDA_TRY(msm_launch(moe_down_stream_kernel, dim3(grid), dim3(MS_WARPS * 32), ms_smem(tb, st), ex, ws, down, H,
                            I, st, early));
    }
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* The streamed kernels' shared memory, for msm_cuda_tuning_init (moe_stream_ok: granted). */
void msm__moe_stream_tuning(msm_cuda_tuning *t) {
    int need = MS_RING + MS_MAX_ST * 8; /* at least what any stage count takes (ms_smem) */
    t->moe_stream_ok =
        cudaFuncSetAttribute(moe_gateup_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, need) ==
            cudaSuccess &&
        cudaFuncSetAttribute(moe_down_stream_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, need) == cudaSuccess;
    if (!t->moe_stream_ok) (void)cudaGetLastError();
}

/* moe.cu: the routed experts of a MoE layer, reading only the selected experts' weights, with the
 * routing (ids, weights) kept on the device. Every kernel is launched with msm_launch
 * (programmatic dependent launch, see msm_cuda.h) and waits before touching anything an earlier
 * kernel wrote; the one exception is documented at moe_down_mma_kernel.
 *
 * Small T (decode, T <= MSM_CUDA_MOE_GEMV_MAX_T): "pair" path, two fp32 SIMT GEMV kernels.
 *   A: one warp per (pair p = t*k+j, i): the gate row i and the up row I+i of expert ids[p] are
 *      streamed with 16-byte loads and dotted with x[t]; the warp writes silu(g)*u to act[p,i].
 *   B: one warp per (t, h): y[t,h] = sum_j w[t,j] * dot(down[ids[t,j]][h,:], act[t*k+j,:]),
 *      accumulated in slot order as the CPU does.
 *
 * Medium T (up to MSM_CUDA_MOE_GROUPED_GEMV_MAX_T): "grouped GEMV" path. One block groups the
 * T*k pairs by expert on the device (counts, offsets, a permutation and its inverse, a table of
 * the selected experts); gate/up and down GEMVs then stream each selected expert's rows once for
 * all of its tokens, the down GEMV writing one f32 row per pair; a combine kernel sums the k rows
 * of each token with its weights in slot order. Two kinds of grouped GEMV:
 *   - SIMT (T < MOE_MMA_MIN_T): block (row chunk, expert), fp32 FMAs on the exact bf16 weights,
 *     up to 4 tokens a pass.
 *   - tensor-core ("MMA", T >= MOE_MMA_MIN_T): a warp owns 16 weight rows (rows g and g+8 of
 *     m16n8k16's A) and 8 tokens (n8); lane (g = lane/4, q = lane%4) streams
 *     W[row][32c + 8q .. +8] of rows g and g+8 with 16-byte loads, which feed two k16 MMAs under
 *     a fixed permutation of k inside each 32-wide chunk (logical k 2q+j -> 8q+j, 2q+8+j ->
 *     8q+2+j, +4 for the second MMA); the B fragment reads x of token g at the same physical k.
 *     x is split as bf16 hi + bf16 lo (x - hi), so the products carry ~16 mantissa bits of x (as
 *     the MMV linear): near-fp32, within the GEMV tolerance of the CPU oracle. The 4 warps of a
 *     block split K and sum their partials in warp order (deterministic). Its cost per weight
 *     byte does not grow with the tokens an expert has (up to 16 a pass), so it pulls ahead once
 *     experts have ~4 tokens or more. The grids are persistent (the blocks the GPU holds, each
 *     looping over (expert, row chunk) items), so there is no partial last wave.
 *
 * Large T (prefill, big batches): the same grouping, then two grouped tensor-core GEMMs (WMMA
 * bf16 -> fp32) whose grid is an upper bound on the number of 64-row tiles: each block finds its
 * expert from the tile offsets and exits when past the last tile, so no host ever sees the
 * counts and the launch can be captured. The gate/up GEMM computes matching gate and up columns
 * in one block and writes bf16 silu(g)*u; the down GEMM writes one fp32 row per pair; the combine
 * kernel as above. x and the activations are rounded to bf16 on this path.
 *
 * Rows are computed independently of their position inside a group, so results are
 * deterministic even though the grouping uses atomics. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

using namespace nvcuda;

#define MOE_WARPS 4
#define MOE_U 4

/* Grouped path: the tensor-core GEMVs from this many tokens on (measured on the H200 at the
 * Qwen1.5-MoE shapes, whole call: SIMT ahead up to T = 32, e.g. 261 us against 292; MMA at
 * T = 48, 322 against 331, and T = 64, 337 against 404). */
#define MOE_MMA_MIN_T 48
#define MMA_NW 4     /* warps of a tensor-core GEMV block, splitting K */
#define MMA_U 4      /* 32-wide K chunks in flight per warp: 2 * MMA_U 16-byte loads a lane */
#define MMA_NT 2     /* 8-token tiles a pass */
#define MMA_MINB 5   /* blocks an SM should hold: caps the registers at 96 a thread */
#define DOWN_ROWS 16 /* rows of a down MMA item */

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* ---- workspace ---- */

#define G_BM 64 /* rows of a WMMA tile (also counted by the group kernel) */

typedef struct moe_ws {
    int32_t *expert_off; /* [E+1] first grouped row of each expert */
    int32_t *tile_off;   /* [E+1] first 64-row tile of each expert; tile_off[E] = tiles */
    int4 *items;         /* [E] {e, first, end grouped row} of the s-th selected expert (e
                          * ascending), for s < n_sel */
    int32_t *n_sel;      /* [1] how many experts have pairs */
    int32_t *perm;       /* [P] grouped row -> pair */
    int32_t *inv;        /* [P] pair -> grouped row (-1: invalid expert id) */
    uint16_t *act;       /* [P, I] bf16 silu(g)*u, grouped order (GEMV paths: f32 [P, I]) */
    float *outp;         /* [P, H] per-pair down output, grouped order */
} moe_ws;

static size_t moe_ws_layout(int T, int H, int I, int k, int E, char *base, moe_ws *ws) {
    size_t P = (size_t)T * k, off = 0;
    size_t o_eo = off; off += round_up((size_t)(E + 1) * 4, 256);
    size_t o_to = off; off += round_up((size_t)(E + 1) * 4, 256);
    size_t o_it = off; off += round_up((size_t)E * 16 + 4, 256);
    size_t o_pe = off; off += round_up(P * 4, 256);
    size_t o_in = off; off += round_up(P * 4, 256);
    /* act: bf16 on the WMMA path, f32 on the GEMV paths (sized for f32: any path can be forced) */
    size_t o_ac = off; off += round_up(P * I * 4, 256);
    size_t o_op = off; off += round_up(P * H * 4, 256);
    if (ws) {
        ws->expert_off = (int32_t *)(base + o_eo);
        ws->tile_off = (int32_t *)(base + o_to);
        ws->items = (int4 *)(base + o_it);
        ws->n_sel = (int32_t *)(ws->items + E);
        ws->perm = (int32_t *)(base + o_pe);
        ws->inv = (int32_t *)(base + o_in);
        ws->act = (uint16_t *)(base + o_ac);
        ws->outp = (float *)(base + o_op);
    }
    return off;
}

/* ---- small T: SIMT GEMVs ---- */

/* Lane-partial dots of NR bf16 rows (each K long) with one f32 vector x. */
template <int NR, bool VEC>
static __device__ __forceinline__ void rows_dot(float acc[NR], const uint16_t *const wr[NR],
                                                const float *x, int K, int lane) {
    if (VEC) {
        for (int k0 = lane * 8; k0 < K; k0 += 256 * MOE_U) {
            uint4 wv[NR][MOE_U];
#pragma unroll
            for (int r = 0; r < NR; r++)
#pragma unroll
                for (int u = 0; u < MOE_U; u++) {
                    int k = k0 + u * 256;
                    wv[r][u] = k < K ? msm_ld_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
            for (int u = 0; u < MOE_U; u++) {
                int k = k0 + u * 256;
                if (k >= K) break;
                const float4 *xp = (const float4 *)(x + k);
                float4 xa = xp[0], xb = xp[1];
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    acc[r] = msm_fma8_bf16(wv[r][u], xa, xb, acc[r]);
                }
            }
        }
    } else {
        for (int k = lane; k < K; k += 32)
#pragma unroll
            for (int r = 0; r < NR; r++) acc[r] = fmaf(msm_bf(wr[r][k]), x[k], acc[r]);
    }
}

static __device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* One warp per (pair p, column i). (Two columns a warp, a single wave at T = 1, measured 15%
 * slower there on the H200.) */
template <bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gateup_gemv_kernel(float *act, const float *x, const int32_t *ids,
                           const uint16_t *gate_up, int H, int I, int k, int E) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int i = blockIdx.x * MOE_WARPS + warp, p = blockIdx.y;
    if (i >= I) return;
    int e = ids[p];
    if (e < 0 || e >= E) return; /* not a valid expert: the down kernel skips the pair */
    const uint16_t *ge = gate_up + (size_t)e * 2 * I * H;
    const uint16_t *const wr[2] = {ge + (size_t)i * H, ge + (size_t)(I + i) * H};
    float acc[2] = {0.0f, 0.0f};
    rows_dot<2, VEC>(acc, wr, x + (size_t)(p / k) * H, H, lane);
    float g = msm_warp_sum(acc[0]), u = msm_warp_sum(acc[1]);
    if (lane == 0) act[(size_t)p * I + i] = silu_mul(g, u);
}

/* Lane-partial dots of NR bf16 rows with NR different f32 vectors (row r with xs[r]); a NULL
 * row is skipped. All rows' loads are issued before any is consumed. */
template <int NR, int U, bool VEC>
static __device__ __forceinline__ void rows_dot_multi(float acc[NR], const uint16_t *const wr[NR],
                                                      const float *const xs[NR], int K, int lane) {
    if (VEC) {
        for (int k0 = lane * 8; k0 < K; k0 += 256 * U) {
            uint4 wv[NR][U];
#pragma unroll
            for (int r = 0; r < NR; r++)
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int k = k0 + u * 256;
                    wv[r][u] = (wr[r] && k < K) ? msm_ld_stream16(wr[r] + k) : make_uint4(0, 0, 0, 0);
                }
#pragma unroll
            for (int u = 0; u < U; u++) {
                int k = k0 + u * 256;
                if (k >= K) break;
#pragma unroll
                for (int r = 0; r < NR; r++) {
                    if (!wr[r]) continue;
                    const float4 *xp = (const float4 *)(xs[r] + k);
                    float4 xa = xp[0], xb = xp[1];
                    acc[r] = msm_fma8_bf16(wv[r][u], xa, xb, acc[r]);
                }
            }
        }
    } else {
        for (int k = lane; k < K; k += 32)
#pragma unroll
            for (int r = 0; r < NR; r++)
                if (wr[r]) acc[r] = fmaf(msm_bf(wr[r][k]), xs[r][k], acc[r]);
    }
}

/* One warp per (t, h): the k down rows of the token's experts are streamed together (KMAX >= k
 * slots, unused ones skipped), then combined in slot order as the CPU does. */
template <int KMAX, bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_gemv_kernel(float *y, const float *act, const int32_t *ids, const float *w,
                         const uint16_t *down, int H, int I, int k, int E) {
    constexpr int U = KMAX >= 8 ? 1 : KMAX >= 4 ? 2 : 4;
    msm_pdl_trigger();
    msm_pdl_wait();
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int h = blockIdx.x * MOE_WARPS + warp, t = blockIdx.y;
    if (h >= H) return;
    const uint16_t *wr[KMAX];
    const float *xs[KMAX];
    float acc[KMAX];
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        int p = t * k + j, e = j < k ? ids[p] : -1;
        bool ok = j < k && e >= 0 && e < E;
        wr[j] = ok ? down + ((size_t)e * H + h) * I : NULL;
        xs[j] = act + (size_t)p * I;
        acc[j] = 0.0f;
    }
    rows_dot_multi<KMAX, U, VEC>(acc, wr, xs, I, lane);
    float y_th = 0.0f;
#pragma unroll
    for (int j = 0; j < KMAX; j++) {
        float d = msm_warp_sum(acc[j]);
        if (wr[j]) y_th += w[t * k + j] * d;
    }
    if (lane == 0) y[(size_t)t * H + h] = y_th;
}

/* ---- grouping (grouped GEMV and WMMA paths) ---- */

/* One block: per-expert counts, offsets (rows and 64-row tiles), the selected-expert table, a
 * permutation grouping the pairs by expert and its inverse. */
__global__ void __launch_bounds__(1024) moe_group_kernel(moe_ws ws, const int32_t *ids, int P, int E) {
    __shared__ int cnt[256], cur[256];
    msm_pdl_trigger();
    msm_pdl_wait();
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        int e = ids[p];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x < 32) { /* warp 0: lane-owned runs of experts, exclusive scans over lanes */
        int lane = threadIdx.x, per = (E + 31) / 32, lo = min(E, lane * per), hi = min(E, lo + per);
        int rows = 0, tiles = 0, ns = 0;
        for (int e = lo; e < hi; e++) {
            rows += cnt[e];
            tiles += (cnt[e] + G_BM - 1) / G_BM;
            ns += cnt[e] > 0;
        }
        int xr = rows, xt = tiles, xn = ns;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            int a = __shfl_up_sync(MSM_FULL_MASK, xr, o), b = __shfl_up_sync(MSM_FULL_MASK, xt, o),
                c = __shfl_up_sync(MSM_FULL_MASK, xn, o);
            if (lane >= o) xr += a, xt += b, xn += c;
        }
        xr -= rows, xt -= tiles, xn -= ns; /* exclusive */
        for (int e = lo; e < hi; e++) {
            ws.expert_off[e] = xr;
            ws.tile_off[e] = xt;
            cur[e] = xr;
            if (cnt[e] > 0) ws.items[xn++] = make_int4(e, xr, xr + cnt[e], 0);
            xr += cnt[e];
            xt += (cnt[e] + G_BM - 1) / G_BM;
        }
        if (lane == 31) {
            ws.expert_off[E] = xr;
            ws.tile_off[E] = xt;
            *ws.n_sel = xn;
        }
    }
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        int e = ids[p], pos = -1;
        if (e >= 0 && e < E) {
            pos = atomicAdd(&cur[e], 1);
            ws.perm[pos] = p;
        }
        ws.inv[p] = pos;
    }
}

/* ---- medium T, SIMT: grouped GEMVs (fp32 FMAs) ----
 * After moe_group_kernel, block (row chunk, e) streams its rows of expert e once and dots every
 * one with all the grouped rows (token copies) routed to e, GG_NT tokens per pass (a later pass
 * re-reads the rows, mostly from L2). fp32 math on the exact bf16 weights and f32 activations,
 * like the CPU oracle; act and the per-pair down rows stay f32. The gate/up kernel triggers its
 * dependants only after its wait (see moe_down_mma_kernel).
 * GG_NT = 4: the fp32 partials per token are what limits the blocks an SM holds (gate/up: 166
 * registers a thread at 8 tokens, 96 at 4), and an expert mostly has 1-4 tokens up to T = 32;
 * measured on the H200 at the Qwen1.5-MoE shapes, 4 against 8 (2): T = 8 112 us against 127
 * (113), T = 16 173 against 198 (184), T = 32 261 against 300 (303). */
#define GG_NT 4
#define GG_U 2

template <int R, bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gateup_grouped_gemv_kernel(moe_ws ws, const float *x, const uint16_t *gate_up, int H,
                                   int I, int k) {
    msm_pdl_wait();
    msm_pdl_trigger();
    int e = blockIdx.y;
    int g0 = ws.expert_off[e], g1 = ws.expert_off[e + 1];
    if (g0 >= g1) return;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int i0 = (blockIdx.x * MOE_WARPS + warp) * R;
    if (i0 >= I) return;
    float *act = (float *)ws.act;
    const uint16_t *ge = gate_up + (size_t)e * 2 * I * H;
    const uint16_t *wr[2 * R];
#pragma unroll
    for (int r = 0; r < R; r++) {
        int i = min(i0 + r, I - 1); /* rows past I duplicate the last one; never stored */
        wr[r] = ge + (size_t)i * H;
        wr[R + r] = ge + (size_t)(I + i) * H;
    }
    for (int gb = g0; gb < g1; gb += GG_NT) {
        int nt = min(GG_NT, g1 - gb);
        const float *xs[GG_NT];
#pragma unroll
        for (int t = 0; t < GG_NT; t++) xs[t] = x + (size_t)(ws.perm[gb + min(t, nt - 1)] / k) * H;
        float acc[2 * R][GG_NT];
#pragma unroll
        for (int r = 0; r < 2 * R; r++)
#pragma unroll
            for (int t = 0; t < GG_NT; t++) acc[r][t] = 0.0f;
        if (VEC) {
            for (int k0 = lane * 8; k0 < H; k0 += 256 * GG_U) {
                uint4 wv[2 * R][GG_U];
#pragma unroll
                for (int r = 0; r < 2 * R; r++)
#pragma unroll
                    for (int u = 0; u < GG_U; u++) {
                        int kk = k0 + u * 256;
                        wv[r][u] = kk < H ? msm_ld_stream16(wr[r] + kk) : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                for (int u = 0; u < GG_U; u++) {
                    int kk = k0 + u * 256;
                    if (kk >= H) break;
                    float wf[2 * R][8];
#pragma unroll
                    for (int r = 0; r < 2 * R; r++) {
                        float2 a = msm_bf2(wv[r][u].x), b = msm_bf2(wv[r][u].y);
                        float2 c = msm_bf2(wv[r][u].z), d = msm_bf2(wv[r][u].w);
                        wf[r][0] = a.x, wf[r][1] = a.y, wf[r][2] = b.x, wf[r][3] = b.y;
                        wf[r][4] = c.x, wf[r][5] = c.y, wf[r][6] = d.x, wf[r][7] = d.y;
                    }
#pragma unroll
                    for (int t = 0; t < GG_NT; t++) {
                        if (t >= nt) break;
                        const float4 *xp = (const float4 *)(xs[t] + kk);
                        float4 xa = xp[0], xb = xp[1];
#pragma unroll
                        for (int r = 0; r < 2 * R; r++) {
                            acc[r][t] = msm_fma8(wf[r], xa, xb, acc[r][t]);
                        }
                    }
                }
            }
        } else {
            for (int kk = lane; kk < H; kk += 32)
#pragma unroll
                for (int r = 0; r < 2 * R; r++) {
                    float wf = msm_bf(wr[r][kk]);
#pragma unroll
                    for (int t = 0; t < GG_NT; t++)
                        if (t < nt) acc[r][t] = fmaf(wf, xs[t][kk], acc[r][t]);
                }
        }
        /* only the nt live token columns are reduced (nt is warp-uniform; an expert mostly has
         * 1-3 tokens at T=32, so reducing all GG_NT cost as much as the loads) */
#pragma unroll
        for (int t = 0; t < GG_NT; t++) {
            if (t >= nt) break;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float g = msm_warp_sum(acc[r][t]), u = msm_warp_sum(acc[R + r][t]);
                if (lane == 0 && i0 + r < I) act[(size_t)(gb + t) * I + i0 + r] = g / (1.0f + expf(-g)) * u;
            }
        }
    }
}

/* outp[g, h] = dot(down_e[h, :], act[g, :]) for the grouped rows g of expert e. */
template <int R, bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_down_grouped_gemv_kernel(moe_ws ws, const uint16_t *down, int H, int I) {
    msm_pdl_wait();
    msm_pdl_trigger();
    int e = blockIdx.y;
    int g0 = ws.expert_off[e], g1 = ws.expert_off[e + 1];
    if (g0 >= g1) return;
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int h0 = (blockIdx.x * MOE_WARPS + warp) * R;
    if (h0 >= H) return;
    const float *act = (const float *)ws.act;
    const uint16_t *de = down + (size_t)e * H * I;
    const uint16_t *wr[R];
#pragma unroll
    for (int r = 0; r < R; r++) wr[r] = de + (size_t)min(h0 + r, H - 1) * I;
    for (int gb = g0; gb < g1; gb += GG_NT) {
        int nt = min(GG_NT, g1 - gb);
        float acc[R][GG_NT];
#pragma unroll
        for (int r = 0; r < R; r++)
#pragma unroll
            for (int t = 0; t < GG_NT; t++) acc[r][t] = 0.0f;
        if (VEC) {
            for (int k0 = lane * 8; k0 < I; k0 += 256 * GG_U) {
                uint4 wv[R][GG_U];
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int u = 0; u < GG_U; u++) {
                        int kk = k0 + u * 256;
                        wv[r][u] = kk < I ? msm_ld_stream16(wr[r] + kk) : make_uint4(0, 0, 0, 0);
                    }
#pragma unroll
                for (int u = 0; u < GG_U; u++) {
                    int kk = k0 + u * 256;
                    if (kk >= I) break;
                    float wf[R][8];
#pragma unroll
                    for (int r = 0; r < R; r++) {
                        float2 a = msm_bf2(wv[r][u].x), b = msm_bf2(wv[r][u].y);
                        float2 c = msm_bf2(wv[r][u].z), d = msm_bf2(wv[r][u].w);
                        wf[r][0] = a.x, wf[r][1] = a.y, wf[r][2] = b.x, wf[r][3] = b.y;
                        wf[r][4] = c.x, wf[r][5] = c.y, wf[r][6] = d.x, wf[r][7] = d.y;
                    }
#pragma unroll
                    for (int t = 0; t < GG_NT; t++) {
                        if (t >= nt) break;
                        const float4 *xp = (const float4 *)(act + (size_t)(gb + t) * I + kk);
                        float4 xa = xp[0], xb = xp[1];
#pragma unroll
                        for (int r = 0; r < R; r++) {
                            acc[r][t] = msm_fma8(wf[r], xa, xb, acc[r][t]);
                        }
                    }
                }
            }
        } else {
            for (int kk = lane; kk < I; kk += 32)
#pragma unroll
                for (int r = 0; r < R; r++) {
                    float wf = msm_bf(wr[r][kk]);
#pragma unroll
                    for (int t = 0; t < GG_NT; t++)
                        if (t < nt) acc[r][t] = fmaf(wf, act[(size_t)(gb + t) * I + kk], acc[r][t]);
                }
        }
#pragma unroll
        for (int t = 0; t < GG_NT; t++) {
            if (t >= nt) break;
#pragma unroll
            for (int r = 0; r < R; r++) {
                float d = msm_warp_sum(acc[r][t]);
                if (lane == 0 && h0 + r < H) ws.outp[(size_t)(gb + t) * H + h0 + r] = d;
            }
        }
    }
}


/* ---- medium T, tensor cores: grouped MMA GEMVs ---- */

/* ch += W[16 rows, 32-chunk] . Xhi[32-chunk, 8 tokens], cl += the same with Xlo, for this lane's
 * share: wa, wb = 8 weights of rows g and g+8 at physical k 8q..8q+7 of the chunk, xa, xb = x of
 * token g at the same k. Two accumulators halve the chain of dependent MMAs. */
static __device__ __forceinline__ void mma_chunk(float ch[4], float cl[4], uint4 wa, uint4 wb,
                                                 float4 xa, float4 xb) {
    uint32_t h0, l0, h1, l1, h2, l2, h3, l3;
    msm_split_bf16x2(xa.x, xa.y, h0, l0);
    msm_split_bf16x2(xa.z, xa.w, h1, l1);
    msm_split_bf16x2(xb.x, xb.y, h2, l2);
    msm_split_bf16x2(xb.z, xb.w, h3, l3);
    msm_mma_bf16(ch, wa.x, wb.x, wa.y, wb.y, h0, h1);
    msm_mma_bf16(cl, wa.x, wb.x, wa.y, wb.y, l0, l1);
    msm_mma_bf16(ch, wa.z, wb.z, wa.w, wb.w, h2, h3);
    msm_mma_bf16(cl, wa.z, wb.z, wa.w, wb.w, l2, l3);
}

/* acc = this warp's K share (a contiguous run of 32-wide chunks, K split over NW warps) of rows
 * wa_row (g) and wb_row (g+8) against up to NT tiles of 8 tokens (xr[t]: token t*8+g's row,
 * NULL past the last token; only the first ntile tiles, a warp-uniform count, are live).
 * K % 8 == 0; rows and xr 16-byte aligned. All 2*U weight loads of a step are issued before
 * any is used. (Interleaving the warps' chunks, so a block step reads 1 KB of each row, measured
 * 10% slower on the H200.) */
template <int NW, int U, int NT>
static __device__ __forceinline__ void mma_rows(float acc[NT][4], const uint16_t *wa_row,
                                                const uint16_t *wb_row, const float *const xr[NT],
                                                int ntile, int K, int warp, int q) {
    float lo[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = lo[t][i] = 0.0f;
    int nch = (K + 31) / 32, per = (nch + NW - 1) / NW;
    int c0 = warp * per, c1 = min(nch, c0 + per);
    for (int c = c0; c < c1; c += U) {
        uint4 wa[U], wb[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            int kk = (c + u) * 32 + q * 8;
            bool ok = c + u < c1 && kk < K;
            wa[u] = ok ? msm_ld_stream16(wa_row + kk) : make_uint4(0, 0, 0, 0);
            wb[u] = ok ? msm_ld_stream16(wb_row + kk) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            if (c + u >= c1) break;
            int kk = (c + u) * 32 + q * 8;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= ntile) break;
                float4 xa = make_float4(0, 0, 0, 0), xb = xa;
                if (xr[t] && kk < K) {
                    const float4 *p = (const float4 *)(xr[t] + kk);
                    xa = p[0], xb = p[1];
                }
                mma_chunk(acc[t], lo[t], wa[u], wb[u], xa, xb);
            }
        }
    }
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] += lo[t][i];
}

/* Warp 0's acc += the other warps' partials, in warp order (deterministic). Block-wide. */
template <int NW, int NT>
static __device__ __forceinline__ void mma_reduce(float acc[NT][4], float4 (*red)[NT][32],
                                                  int ntile, int warp, int lane) {
    if (warp > 0)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (t < ntile) red[warp - 1][t][lane] = make_float4(acc[t][0], acc[t][1], acc[t][2], acc[t][3]);
    __syncthreads();
    if (warp == 0)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            if (t >= ntile) break;
#pragma unroll
            for (int w = 1; w < NW; w++) {
                float4 v = red[w - 1][t][lane];
                acc[t][0] += v.x, acc[t][1] += v.y, acc[t][2] += v.z, acc[t][3] += v.w;
            }
        }
}

/* Gate/up + SwiGLU, persistent: block b runs items b, b + gridDim.x, ... of n_sel * nchunk,
 * item = (s-th selected expert, 8 columns from i0). Rows g / g+8 of the MMA are the gate row
 * and the up row of column i0+g, so warp 0 ends holding matching gate and up sums: c0/c2 for
 * token 2q, c1/c3 for token 2q+1. The next item's descriptor is loaded while the current one
 * streams. Waits, then triggers (see moe_down_mma_kernel). */
template <int NW, int U, int NT>
__global__ void __launch_bounds__(NW * 32, MMA_MINB)
    moe_gateup_mma_kernel(moe_ws ws, const float *x, const uint16_t *gate_up, int H, int I, int k) {
    __shared__ float4 red[NW - 1][NT][32];
    msm_pdl_wait();
    msm_pdl_trigger();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int nchunk = (I + 7) / 8, n_items = *ws.n_sel * nchunk;
    float *act = (float *)ws.act;
    int it = blockIdx.x;
    int4 cur = it < n_items ? ws.items[it / nchunk] : make_int4(0, 0, 0, 0);
    for (; it < n_items; it += gridDim.x) {
        int nx = it + gridDim.x;
        int4 nxt = nx < n_items ? ws.items[nx / nchunk] : make_int4(0, 0, 0, 0);
        int e = cur.x, r0 = cur.y, r1 = cur.z;
        cur = nxt;
        int i0 = (it % nchunk) * 8, i = min(i0 + g, I - 1); /* columns past I: never stored */
        const uint16_t *ge = gate_up + (size_t)e * 2 * I * H;
        for (int rb = r0; rb < r1; rb += NT * 8) {
            int ntile = min(NT, (r1 - rb + 7) >> 3);
            const float *xr[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int r = rb + t * 8 + g;
                xr[t] = r < r1 ? x + (size_t)(ws.perm[r] / k) * H : NULL;
            }
            float acc[NT][4];
            mma_rows<NW, U, NT>(acc, ge + (size_t)i * H, ge + (size_t)(I + i) * H, xr, ntile, H, warp, q);
            mma_reduce<NW, NT>(acc, red, ntile, warp, lane);
            if (warp == 0 && i0 + g < I)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= ntile) break;
                    int ra = rb + t * 8 + 2 * q;
                    if (ra < r1) act[(size_t)ra * I + i0 + g] = silu_mul(acc[t][0], acc[t][2]);
                    if (ra + 1 < r1) act[(size_t)(ra + 1) * I + i0 + g] = silu_mul(acc[t][1], acc[t][3]);
                }
            __syncthreads(); /* red is reused by the next pass or item */
        }
    }
}

/* Down, persistent like the gate/up kernel: item = (s-th selected expert, 16 rows from h0)
 * writes outp[r, h] for the expert's grouped rows r. The one read ahead of a PDL wait in this
 * file: the item table was complete before the gate/up kernel passed its wait, and that kernel
 * triggers only after its wait, so before this grid can start. A block therefore reads its first
 * item (through L2, never a stale L1 line) and pulls that item's weight rows into L2 while
 * gate/up still runs; it writes nothing before the wait. */
template <int NW, int U, int NT>
__global__ void __launch_bounds__(NW * 32, MMA_MINB)
    moe_down_mma_kernel(moe_ws ws, const uint16_t *down, int H, int I, bool prefetch) {
    __shared__ float4 red[NW - 1][NT][32];
    msm_pdl_trigger();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, q = lane & 3;
    int nchunk = (H + DOWN_ROWS - 1) / DOWN_ROWS, n_items = __ldcg(ws.n_sel) * nchunk;
    int it = blockIdx.x;
    if (it >= n_items) { /* still wait: this grid's completion must imply its predecessors' */
        msm_pdl_wait();
        return;
    }
    int4 cur = __ldcg(ws.items + it / nchunk);
    if (prefetch) { /* the item's rows are contiguous */
        int h0 = (it % nchunk) * DOWN_ROWS;
        uintptr_t a = (uintptr_t)(down + ((size_t)cur.x * H + h0) * I) & ~(uintptr_t)127;
        uintptr_t end = (uintptr_t)(down + ((size_t)cur.x * H + min(h0 + DOWN_ROWS, H)) * I);
        for (a += (uintptr_t)threadIdx.x * 128; a < end; a += NW * 32 * 128)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(a));
    }
    msm_pdl_wait();
    const float *act = (const float *)ws.act;
    for (; it < n_items; it += gridDim.x) {
        int nx = it + gridDim.x;
        int4 nxt = nx < n_items ? ws.items[nx / nchunk] : make_int4(0, 0, 0, 0);
        int e = cur.x, r0 = cur.y, r1 = cur.z;
        cur = nxt;
        int h0 = (it % nchunk) * DOWN_ROWS, ha = h0 + g, hb = h0 + 8 + g;
        const uint16_t *de = down + (size_t)e * H * I;
        for (int rb = r0; rb < r1; rb += NT * 8) {
            int ntile = min(NT, (r1 - rb + 7) >> 3);
            const float *xr[NT];
#pragma unroll
            for (int t = 0; t < NT; t++) {
                int r = rb + t * 8 + g;
                xr[t] = r < r1 ? act + (size_t)r * I : NULL;
            }
            float acc[NT][4];
            mma_rows<NW, U, NT>(acc, de + (size_t)min(ha, H - 1) * I, de + (size_t)min(hb, H - 1) * I,
                                xr, ntile, I, warp, q);
            mma_reduce<NW, NT>(acc, red, ntile, warp, lane);
            if (warp == 0)
#pragma unroll
                for (int t = 0; t < NT; t++) {
                    if (t >= ntile) break;
                    int ra = rb + t * 8 + 2 * q;
                    if (ra < r1) {
                        if (ha < H) ws.outp[(size_t)ra * H + ha] = acc[t][0];
                        if (hb < H) ws.outp[(size_t)ra * H + hb] = acc[t][2];
                    }
                    if (ra + 1 < r1) {
                        if (ha < H) ws.outp[(size_t)(ra + 1) * H + ha] = acc[t][1];
                        if (hb < H) ws.outp[(size_t)(ra + 1) * H + hb] = acc[t][3];
                    }
                }
            __syncthreads();
        }
    }
}

/* ---- large T: grouped WMMA GEMMs ---- */

#define G_BN 64
#define G_BK 32
#define G_LDS (G_BK + 8) /* bf16 smem row stride: 80 bytes keeps WMMA's 32-byte alignment */
#define G_LDC (G_BN + 4) /* f32 epilogue stride */

/* The expert owning 64-row tile `tile`: the e with tile_off[e] <= tile < tile_off[e+1]. */
static __device__ int tile_expert(const int32_t *tile_off, int E, int tile) {
    int lo = 0, hi = E - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (tile_off[mid] <= tile) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

typedef wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> frag_b;
typedef wmma::fragment<wmma::accumulator, 16, 16, 16, float> frag_c;

/* Gate/up GEMM + SwiGLU: block (n-tile of act columns, grouped row tile). 4 warps in 2x2, each
 * owning 32x32 of the gate and of the up product. */
__global__ void __launch_bounds__(128)
    moe_gateup_gemm_kernel(moe_ws ws, const float *x, const uint16_t *gate_up, int H, int I,
                           int k, int E) {
    __shared__ __align__(128) unsigned char smem[2 * G_BM * G_LDC * sizeof(float)];
    __nv_bfloat16 *As = (__nv_bfloat16 *)smem;
    __nv_bfloat16 *Bg = As + G_BM * G_LDS, *Bu = Bg + G_BN * G_LDS;
    msm_pdl_trigger();
    msm_pdl_wait();
    int tile = blockIdx.y;
    if (tile >= ws.tile_off[E]) return;
    int e = tile_expert(ws.tile_off, E, tile);
    int row0 = ws.expert_off[e] + (tile - ws.tile_off[e]) * G_BM, row_end = ws.expert_off[e + 1];
    int n0 = blockIdx.x * G_BN;
    int tid = threadIdx.x, warp = tid / 32, wm = warp / 2, wn = warp % 2;
    const uint16_t *ge = gate_up + (size_t)e * 2 * I * H;

    /* A loader: thread -> (row tid/2, 16 columns at (tid%2)*16) */
    int ar = tid / 2, ac = (tid % 2) * 16;
    const float *xrow = NULL;
    if (row0 + ar < row_end) xrow = x + (size_t)(ws.perm[row0 + ar] / k) * H;

    frag_c cg[2][2], cu[2][2];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 2; b++) wmma::fill_fragment(cg[a][b], 0.0f), wmma::fill_fragment(cu[a][b], 0.0f);

    for (int k0 = 0; k0 < H; k0 += G_BK) {
        /* A: 16 floats -> bf16 */
#pragma unroll
        for (int q = 0; q < 4; q++) {
            float4 v = xrow ? *(const float4 *)(xrow + k0 + ac + q * 4) : make_float4(0, 0, 0, 0);
            __nv_bfloat16 *d = As + ar * G_LDS + ac + q * 4;
            d[0] = __float2bfloat16_rn(v.x);
            d[1] = __float2bfloat16_rn(v.y);
            d[2] = __float2bfloat16_rn(v.z);
            d[3] = __float2bfloat16_rn(v.w);
        }
        /* B: 64 rows x 32 bf16 = 4 x 16 bytes a row, for gate and for up: 2 chunks each */
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int c = tid + q * 128, r = c / 4, cc = (c % 4) * 8;
            bool ok = n0 + r < I;
            uint4 g = ok ? *(const uint4 *)(ge + (size_t)(n0 + r) * H + k0 + cc) : make_uint4(0, 0, 0, 0);
            uint4 u = ok ? *(const uint4 *)(ge + (size_t)(I + n0 + r) * H + k0 + cc) : make_uint4(0, 0, 0, 0);
            *(uint4 *)(Bg + r * G_LDS + cc) = g;
            *(uint4 *)(Bu + r * G_LDS + cc) = u;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < G_BK; kk += 16) {
            frag_a fa[2];
            frag_b fg[2], fu[2];
#pragma unroll
            for (int a = 0; a < 2; a++)
                wmma::load_matrix_sync(fa[a], As + (wm * 32 + a * 16) * G_LDS + kk, G_LDS);
#pragma unroll
            for (int b = 0; b < 2; b++) {
                wmma::load_matrix_sync(fg[b], Bg + (wn * 32 + b * 16) * G_LDS + kk, G_LDS);
                wmma::load_matrix_sync(fu[b], Bu + (wn * 32 + b * 16) * G_LDS + kk, G_LDS);
            }
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int b = 0; b < 2; b++) {
                    wmma::mma_sync(cg[a][b], fa[a], fg[b], cg[a][b]);
                    wmma::mma_sync(cu[a][b], fa[a], fu[b], cu[a][b]);
                }
        }
        __syncthreads();
    }
    float *Cg = (float *)smem, *Cu = Cg + G_BM * G_LDC;
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 2; b++) {
            int r = wm * 32 + a * 16, c = wn * 32 + b * 16;
            wmma::store_matrix_sync(Cg + r * G_LDC + c, cg[a][b], G_LDC, wmma::mem_row_major);
            wmma::store_matrix_sync(Cu + r * G_LDC + c, cu[a][b], G_LDC, wmma::mem_row_major);
        }
    __syncthreads();
    for (int idx = tid; idx < G_BM * G_BN; idx += 128) {
        int r = idx / G_BN, c = idx % G_BN;
        if (row0 + r >= row_end || n0 + c >= I) continue;
        float g = Cg[r * G_LDC + c], u = Cu[r * G_LDC + c];
        ws.act[(size_t)(row0 + r) * I + n0 + c] = msm_f2bf(g / (1.0f + expf(-g)) * u);
    }
}

/* Down GEMM: outp[row, h] = act[row, :] . down[e][h, :] for the grouped rows. */
__global__ void __launch_bounds__(128)
    moe_down_gemm_kernel(moe_ws ws, const uint16_t *down, int H, int I, int E) {
    __shared__ __align__(128) unsigned char smem[G_BM * G_LDC * sizeof(float)];
    __nv_bfloat16 *As = (__nv_bfloat16 *)smem, *Bs = As + G_BM * G_LDS;
    msm_pdl_trigger();
    msm_pdl_wait();
    int tile = blockIdx.y;
    if (tile >= ws.tile_off[E]) return;
    int e = tile_expert(ws.tile_off, E, tile);
    int row0 = ws.expert_off[e] + (tile - ws.tile_off[e]) * G_BM, row_end = ws.expert_off[e + 1];
    int n0 = blockIdx.x * G_BN;
    int tid = threadIdx.x, warp = tid / 32, wm = warp / 2, wn = warp % 2;
    const uint16_t *de = down + (size_t)e * H * I;

    frag_c acc[2][2];
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 2; b++) wmma::fill_fragment(acc[a][b], 0.0f);

    for (int k0 = 0; k0 < I; k0 += G_BK) {
#pragma unroll
        for (int q = 0; q < 2; q++) {
            int c = tid + q * 128, r = c / 4, cc = (c % 4) * 8;
            bool oka = row0 + r < row_end, okb = n0 + r < H;
            uint4 a = oka ? *(const uint4 *)(ws.act + (size_t)(row0 + r) * I + k0 + cc) : make_uint4(0, 0, 0, 0);
            uint4 b = okb ? *(const uint4 *)(de + (size_t)(n0 + r) * I + k0 + cc) : make_uint4(0, 0, 0, 0);
            *(uint4 *)(As + r * G_LDS + cc) = a;
            *(uint4 *)(Bs + r * G_LDS + cc) = b;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < G_BK; kk += 16) {
            frag_a fa[2];
            frag_b fb[2];
#pragma unroll
            for (int a = 0; a < 2; a++)
                wmma::load_matrix_sync(fa[a], As + (wm * 32 + a * 16) * G_LDS + kk, G_LDS);
#pragma unroll
            for (int b = 0; b < 2; b++)
                wmma::load_matrix_sync(fb[b], Bs + (wn * 32 + b * 16) * G_LDS + kk, G_LDS);
#pragma unroll
            for (int a = 0; a < 2; a++)
#pragma unroll
                for (int b = 0; b < 2; b++) wmma::mma_sync(acc[a][b], fa[a], fb[b], acc[a][b]);
        }
        __syncthreads();
    }
    float *C = (float *)smem;
#pragma unroll
    for (int a = 0; a < 2; a++)
#pragma unroll
        for (int b = 0; b < 2; b++)
            wmma::store_matrix_sync(C + (wm * 32 + a * 16) * G_LDC + wn * 32 + b * 16, acc[a][b],
                                    G_LDC, wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < G_BM * G_BN; idx += 128) {
        int r = idx / G_BN, c = idx % G_BN;
        if (row0 + r >= row_end || n0 + c >= H) continue;
        ws.outp[(size_t)(row0 + r) * H + n0 + c] = C[r * G_LDC + c];
    }
}


__global__ void moe_combine_kernel(float *y, moe_ws ws, const float *w, int T, int H, int k) {
    msm_pdl_trigger();
    msm_pdl_wait();
    size_t n = (size_t)T * H;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t t = idx / H, h = idx % H;
        float s = 0.0f;
        for (int j = 0; j < k; j++) {
            int row = ws.inv[t * k + j];
            if (row >= 0) s += w[t * k + j] * ws.outp[(size_t)row * H + h];
        }
        y[idx] = s;
    }
}

/* ---- host side ---- */

static bool grouped_ok(int T, int H, int I) {
    return T > MSM_CUDA_MOE_GEMV_MAX_T && H % G_BK == 0 && I % G_BK == 0 && H % 8 == 0;
}

/* Path override (tests, benchmarks): 0 = by T; else a MSM_CUDA_MOE_PATH_*. The environment
 * variable MSM_CUDA_MOE_PATH (pair | grouped_gemv | wmma) sets it for a whole process. */
static int moe_forced = -1;

extern "C" void msm_cuda_moe_set_path(int path) { moe_forced = path; }

static int moe_path(int T, int H, int I) {
    if (moe_forced < 0) {
        const char *s = getenv("MSM_CUDA_MOE_PATH");
        moe_forced = !s                            ? 0
                     : !strcmp(s, "pair")          ? MSM_CUDA_MOE_PATH_PAIR
                     : !strcmp(s, "grouped_gemv")  ? MSM_CUDA_MOE_PATH_GROUPED_GEMV
                     : !strcmp(s, "wmma")          ? MSM_CUDA_MOE_PATH_WMMA
                                                   : 0;
    }
    int p = moe_forced;
    if (p == MSM_CUDA_MOE_PATH_WMMA && (H % G_BK || I % G_BK || H % 8)) p = 0;
    if (p) return p;
    if (T <= MSM_CUDA_MOE_GEMV_MAX_T) return MSM_CUDA_MOE_PATH_PAIR;
    if (T <= MSM_CUDA_MOE_GROUPED_GEMV_MAX_T) return MSM_CUDA_MOE_PATH_GROUPED_GEMV;
    return grouped_ok(T, H, I) ? MSM_CUDA_MOE_PATH_WMMA : MSM_CUDA_MOE_PATH_GROUPED_GEMV;
}

/* Kernel variants (tests, benchmarks): MSM_CUDA_MOE_K_* flags; the environment variable
 * MSM_CUDA_MOE_KERNELS (a list of simt, mma, no_prefetch) sets them for a whole process. */
static int moe_kflags = -1;

extern "C" void msm_cuda_moe_set_kernels(int flags) { moe_kflags = flags < 0 ? 0 : flags; }

static int moe_kernel_flags(void) {
    if (moe_kflags < 0) {
        const char *s = getenv("MSM_CUDA_MOE_KERNELS");
        int f = 0;
        if (s && strstr(s, "simt")) f |= MSM_CUDA_MOE_K_SIMT;
        if (s && strstr(s, "mma")) f |= MSM_CUDA_MOE_K_MMA;
        if (s && strstr(s, "no_prefetch")) f |= MSM_CUDA_MOE_K_NO_PREFETCH;
        moe_kflags = f;
    }
    return moe_kflags;
}

template <int KMAX>
static cudaError_t down_gemv_launch(dim3 grid, cudaStream_t stream, bool vec, float *y,
                                    const float *act, const int32_t *ids, const float *w,
                                    const uint16_t *down, int H, int I, int k, int E) {
    dim3 blk(MOE_WARPS * 32);
    if (vec)
        return msm_launch(moe_down_gemv_kernel<KMAX, true>, grid, blk, 0, stream, y, act, ids, w,
                          down, H, I, k, E);
    return msm_launch(moe_down_gemv_kernel<KMAX, false>, grid, blk, 0, stream, y, act, ids, w, down,
                      H, I, k, E);
}

static cudaError_t grouped_simt_launch(const moe_ws &ws, const float *x, const uint16_t *gate_up,
                                       const uint16_t *down, bool vec_h, bool vec_i, bool gateup,
                                       int H, int I, int k, int E, cudaStream_t stream) {
    constexpr int RG = 2, RD = 4;
    dim3 blk(MOE_WARPS * 32);
    if (gateup) {
        dim3 ga((unsigned)((I + MOE_WARPS * RG - 1) / (MOE_WARPS * RG)), (unsigned)E);
        if (vec_h)
            return msm_launch(moe_gateup_grouped_gemv_kernel<RG, true>, ga, blk, 0, stream, ws, x,
                              gate_up, H, I, k);
        return msm_launch(moe_gateup_grouped_gemv_kernel<RG, false>, ga, blk, 0, stream, ws, x,
                          gate_up, H, I, k);
    }
    dim3 gd((unsigned)((H + MOE_WARPS * RD - 1) / (MOE_WARPS * RD)), (unsigned)E);
    if (vec_i)
        return msm_launch(moe_down_grouped_gemv_kernel<RD, true>, gd, blk, 0, stream, ws, down, H, I);
    return msm_launch(moe_down_grouped_gemv_kernel<RD, false>, gd, blk, 0, stream, ws, down, H, I);
}

/* Resident blocks an SM holds of a kernel with MMA_NW warps (1 if the query fails). */
template <typename Kernel>
static int blocks_per_sm(Kernel kernel) {
    int n = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, MMA_NW * 32, 0) != cudaSuccess)
        n = 1;
    return n < 1 ? 1 : n;
}

/* Blocks of a persistent kernel: what the current GPU holds resident, at most `items`. */
static unsigned persistent_grid(int per_sm, size_t items) {
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || sms < 1)
        sms = 1;
    size_t cap = (size_t)sms * per_sm;
    return (unsigned)(items < cap ? (items ? items : 1) : cap);
}

static cudaError_t combine_launch(float *y, const moe_ws &ws, const float *w, int T, int H, int k,
                                  cudaStream_t stream) {
    size_t n = (size_t)T * H, blocks = (n + 255) / 256;
    return msm_launch(moe_combine_kernel, dim3((unsigned)(blocks > 65536 ? 65536 : blocks)),
                      dim3(256), 0, stream, y, ws, w, T, H, k);
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

extern "C" size_t msm_cuda_moe_experts_ws_bytes(int T, int H, int I, int k, int E) {
    if (T <= 0 || H <= 0 || I <= 0 || k <= 0 || E <= 0) return 0;
    /* the grouped layout (f32 act) also covers the pair GEMV path's f32 act [P, I] */
    return moe_ws_layout(T, H, I, k, E, NULL, NULL);
}

extern "C" int msm_cuda_moe_experts(float *y, const float *x, const int32_t *ids, const float *w,
                                    const uint16_t *gate_up, const uint16_t *down, int T, int H,
                                    int I, int k, int E, void *ws_base, size_t ws_bytes,
                                    cudaStream_t stream) {
    if (T < 0 || H <= 0 || I <= 0 || k <= 0 || E <= 0 || E > 256 || k > 8)
        return -EINVAL;
    if (T == 0) return 0;
    if (!ws_base || (uintptr_t)ws_base % 256 ||
        ws_bytes < msm_cuda_moe_experts_ws_bytes(T, H, I, k, E))
        return -EINVAL;
    size_t P = (size_t)T * k;
    int path = moe_path(T, H, I), kf = moe_kernel_flags();
    moe_ws ws;
    moe_ws_layout(T, H, I, k, E, (char *)ws_base, &ws);
    /* 16-byte loads of weight rows and of x / act rows (ws is 256-byte aligned) */
    bool vec_h = H % 8 == 0 && aligned16(x) && aligned16(gate_up);
    bool vec_i = I % 8 == 0 && aligned16(down);

    if (path == MSM_CUDA_MOE_PATH_GROUPED_GEMV) {
        CUDA_TRY(msm_launch(moe_group_kernel, dim3(1), dim3(1024), 0, stream, ws, ids, (int)P, E));
        bool mma = !(kf & MSM_CUDA_MOE_K_SIMT) && (T >= MOE_MMA_MIN_T || (kf & MSM_CUDA_MOE_K_MMA));
        size_t max_sel = P < (size_t)E ? P : (size_t)E;
        if (mma && vec_h) {
            auto kern = moe_gateup_mma_kernel<MMA_NW, MMA_U, MMA_NT>;
            static const int per_sm = blocks_per_sm(kern); /* thread-safe once */
            unsigned grid = persistent_grid(per_sm, max_sel * ((I + 7) / 8));
            CUDA_TRY(msm_launch(kern, dim3(grid), dim3(MMA_NW * 32), 0, stream, ws, x, gate_up, H, I, k));
        } else {
            CUDA_TRY(grouped_simt_launch(ws, x, gate_up, down, vec_h, vec_i, true, H, I, k, E, stream));
        }
        if (mma && vec_i) {
            auto kern = moe_down_mma_kernel<MMA_NW, MMA_U, MMA_NT>;
            static const int per_sm = blocks_per_sm(kern);
            unsigned grid = persistent_grid(per_sm, max_sel * ((H + DOWN_ROWS - 1) / DOWN_ROWS));
            CUDA_TRY(msm_launch(kern, dim3(grid), dim3(MMA_NW * 32), 0, stream, ws, down, H, I,
                                !(kf & MSM_CUDA_MOE_K_NO_PREFETCH)));
        } else {
            CUDA_TRY(grouped_simt_launch(ws, x, gate_up, down, vec_h, vec_i, false, H, I, k, E, stream));
        }
        CUDA_TRY(combine_launch(y, ws, w, T, H, k, stream));
        return 0;
    }
    if (path == MSM_CUDA_MOE_PATH_WMMA) {
        CUDA_TRY(msm_launch(moe_group_kernel, dim3(1), dim3(1024), 0, stream, ws, ids, (int)P, E));
        size_t max_tiles = (P + G_BM - 1) / G_BM + (P < (size_t)E ? P : (size_t)E);
        if (max_tiles > 65535) return -EINVAL; /* grid.y; > 4M pairs a call */
        dim3 g1((unsigned)((I + G_BN - 1) / G_BN), (unsigned)max_tiles);
        CUDA_TRY(msm_launch(moe_gateup_gemm_kernel, g1, dim3(128), 0, stream, ws, x, gate_up, H, I, k, E));
        dim3 g2((unsigned)((H + G_BN - 1) / G_BN), (unsigned)max_tiles);
        CUDA_TRY(msm_launch(moe_down_gemm_kernel, g2, dim3(128), 0, stream, ws, down, H, I, E));
        CUDA_TRY(combine_launch(y, ws, w, T, H, k, stream));
        return 0;
    }
    if (P > 65535) return -EINVAL; /* grid.y of the gate/up kernel */
    float *act = (float *)ws.act;
    dim3 ga((unsigned)((I + MOE_WARPS - 1) / MOE_WARPS), (unsigned)P), blk(MOE_WARPS * 32);
    if (vec_h)
        CUDA_TRY(msm_launch(moe_gateup_gemv_kernel<true>, ga, blk, 0, stream, act, x, ids, gate_up, H,
                            I, k, E));
    else
        CUDA_TRY(msm_launch(moe_gateup_gemv_kernel<false>, ga, blk, 0, stream, act, x, ids, gate_up, H,
                            I, k, E));
    dim3 gb((unsigned)((H + MOE_WARPS - 1) / MOE_WARPS), (unsigned)T);
    if (k <= 1)
        CUDA_TRY(down_gemv_launch<1>(gb, stream, vec_i, y, act, ids, w, down, H, I, k, E));
    else if (k <= 2)
        CUDA_TRY(down_gemv_launch<2>(gb, stream, vec_i, y, act, ids, w, down, H, I, k, E));
    else if (k <= 4)
        CUDA_TRY(down_gemv_launch<4>(gb, stream, vec_i, y, act, ids, w, down, H, I, k, E));
    else
        CUDA_TRY(down_gemv_launch<8>(gb, stream, vec_i, y, act, ids, w, down, H, I, k, E));
    return 0;
}

/* moe.cu: the routed experts of a MoE layer, reading only the selected experts' weights, with the
 * routing (ids, weights) kept on the device.
 *
 * Small T (decode, T <= MSM_CUDA_MOE_GEMV_MAX_T): two fused GEMV kernels.
 *   A: one warp per (pair p = t*k+j, i): the gate row i and the up row I+i of expert ids[p] are
 *      streamed with 16-byte loads and dotted with x[t]; the warp writes silu(g)*u to act[p,i].
 *   B: one warp per (t, h): y[t,h] = sum_j w[t,j] * dot(down[ids[t,j]][h,:], act[t*k+j,:]),
 *      accumulated in slot order as the CPU does.
 *   fp32 math on the bf16 weight values, like the CPU oracle.
 *
 * Large T (prefill, big batches): group the T*k (token, slot) pairs by expert on the device
 * (one block: counts, offsets, a permutation, and per-expert tile offsets), then two grouped
 * tensor-core GEMMs (WMMA bf16 -> fp32) whose grid is an upper bound on the number of 64-row
 * tiles: each block finds its expert from the tile offsets and exits when past the last tile, so
 * no host ever sees the counts and the launch can be captured. The gate/up GEMM computes matching
 * gate and up columns in one block and writes bf16 silu(g)*u; the down GEMM writes one fp32 row
 * per pair; a combine kernel sums the k rows of each token with its weights in slot order. Rows
 * are computed independently of their position inside a group, so results are deterministic even
 * though the grouping uses atomics. x and the activations are rounded to bf16 on this path. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"

#include <errno.h>
#include <mma.h>
#include <stdlib.h>
#include <string.h>

using namespace nvcuda;

#define MOE_WARPS 4
#define MOE_U 4

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* ---- small T: fused GEMVs ---- */

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

template <bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gateup_gemv_kernel(float *act, const float *x, const int32_t *ids,
                           const uint16_t *gate_up, int H, int I, int k, int E) {
    int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
    int i = blockIdx.x * MOE_WARPS + warp, p = blockIdx.y;
    if (i >= I) return;
    int e = ids[p];
    float *out = act + (size_t)p * I + i;
    if (e < 0 || e >= E) { /* not a valid expert: contributes nothing */
        if (lane == 0) *out = 0.0f;
        return;
    }
    const uint16_t *ge = gate_up + (size_t)e * 2 * I * H;
    const uint16_t *const wr[2] = {ge + (size_t)i * H, ge + (size_t)(I + i) * H};
    float acc[2] = {0.0f, 0.0f};
    rows_dot<2, VEC>(acc, wr, x + (size_t)(p / k) * H, H, lane);
    float g = msm_warp_sum(acc[0]), u = msm_warp_sum(acc[1]);
    if (lane == 0) *out = g / (1.0f + expf(-g)) * u;
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

template <int KMAX>
static void down_gemv_launch(dim3 grid, cudaStream_t stream, bool vec, float *y, const float *act,
                             const int32_t *ids, const float *w, const uint16_t *down, int H, int I,
                             int k, int E) {
    if (vec)
        moe_down_gemv_kernel<KMAX, true><<<grid, MOE_WARPS * 32, 0, stream>>>(y, act, ids, w, down, H, I, k, E);
    else
        moe_down_gemv_kernel<KMAX, false><<<grid, MOE_WARPS * 32, 0, stream>>>(y, act, ids, w, down, H, I, k, E);
}

/* ---- large T: grouping + grouped WMMA GEMMs ---- */

#define G_BM 64
#define G_BN 64
#define G_BK 32
#define G_LDS (G_BK + 8) /* bf16 smem row stride: 80 bytes keeps WMMA's 32-byte alignment */
#define G_LDC (G_BN + 4) /* f32 epilogue stride */

typedef struct moe_ws {
    int32_t *expert_off; /* [E+1] first grouped row of each expert */
    int32_t *tile_off;   /* [E+1] first 64-row tile of each expert; tile_off[E] = tiles */
    int32_t *perm;       /* [P] grouped row -> pair */
    int32_t *inv;        /* [P] pair -> grouped row (-1: invalid expert id) */
    uint16_t *act;       /* [P, I] bf16 silu(g)*u, grouped order (GEMV paths: f32 [P, I]) */
    float *outp;         /* [P, H] per-pair down output, grouped order */
} moe_ws;

static size_t moe_ws_layout(int T, int H, int I, int k, int E, char *base, moe_ws *ws) {
    size_t P = (size_t)T * k, off = 0;
    size_t o_eo = off; off += round_up((size_t)(E + 1) * 4, 256);
    size_t o_to = off; off += round_up((size_t)(E + 1) * 4, 256);
    size_t o_pe = off; off += round_up(P * 4, 256);
    size_t o_in = off; off += round_up(P * 4, 256);
    /* act: bf16 on the WMMA path, f32 on the GEMV paths (sized for f32: any path can be forced) */
    size_t o_ac = off; off += round_up(P * I * 4, 256);
    size_t o_op = off; off += round_up(P * H * 4, 256);
    if (ws) {
        ws->expert_off = (int32_t *)(base + o_eo);
        ws->tile_off = (int32_t *)(base + o_to);
        ws->perm = (int32_t *)(base + o_pe);
        ws->inv = (int32_t *)(base + o_in);
        ws->act = (uint16_t *)(base + o_ac);
        ws->outp = (float *)(base + o_op);
    }
    return off;
}

__global__ void __launch_bounds__(1024)
    moe_group_kernel(moe_ws ws, const int32_t *ids, int P, int E) {
    __shared__ int cnt[256], cur[256];
    for (int e = threadIdx.x; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = threadIdx.x; p < P; p += blockDim.x) {
        int e = ids[p];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int off = 0, tiles = 0;
        for (int e = 0; e < E; e++) {
            ws.expert_off[e] = off;
            ws.tile_off[e] = tiles;
            cur[e] = off;
            off += cnt[e];
            tiles += (cnt[e] + G_BM - 1) / G_BM;
        }
        ws.expert_off[E] = off;
        ws.tile_off[E] = tiles;
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


/* ---- medium T: grouping + grouped GEMVs (each selected expert's weights read once) ----
 * After moe_group_kernel, block (row chunk, e) streams its rows of expert e once and dots every
 * one with all the grouped rows (token copies) routed to e, NT tokens per pass (a later pass
 * re-reads the rows, mostly from L2). fp32 math on the exact bf16 weights and f32 activations,
 * like the CPU oracle; act and the per-pair down rows stay f32. */
#define GG_NT 8
#define GG_U 2

template <int R, bool VEC>
__global__ void __launch_bounds__(MOE_WARPS * 32)
    moe_gateup_grouped_gemv_kernel(moe_ws ws, const float *x, const uint16_t *gate_up, int H,
                                   int I, int k) {
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

__global__ void moe_combine_kernel(float *y, moe_ws ws, const float *w, int T, int H, int k) {
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
    int path = moe_path(T, H, I);
    if (path == MSM_CUDA_MOE_PATH_GROUPED_GEMV) {
        moe_ws ws;
        moe_ws_layout(T, H, I, k, E, (char *)ws_base, &ws);
        moe_group_kernel<<<1, 1024, 0, stream>>>(ws, ids, (int)P, E);
        CUDA_LAUNCH_CHECK();
        bool vec_h = H % 8 == 0 && ((uintptr_t)x % 16 == 0) && ((uintptr_t)gate_up % 16 == 0);
        bool vec_i = I % 8 == 0 && ((uintptr_t)down % 16 == 0);
        constexpr int RG = 2, RD = 4;
        dim3 ga((unsigned)((I + MOE_WARPS * RG - 1) / (MOE_WARPS * RG)), (unsigned)E);
        if (vec_h)
            moe_gateup_grouped_gemv_kernel<RG, true><<<ga, MOE_WARPS * 32, 0, stream>>>(ws, x, gate_up, H, I, k);
        else
            moe_gateup_grouped_gemv_kernel<RG, false><<<ga, MOE_WARPS * 32, 0, stream>>>(ws, x, gate_up, H, I, k);
        CUDA_LAUNCH_CHECK();
        dim3 gd((unsigned)((H + MOE_WARPS * RD - 1) / (MOE_WARPS * RD)), (unsigned)E);
        if (vec_i)
            moe_down_grouped_gemv_kernel<RD, true><<<gd, MOE_WARPS * 32, 0, stream>>>(ws, down, H, I);
        else
            moe_down_grouped_gemv_kernel<RD, false><<<gd, MOE_WARPS * 32, 0, stream>>>(ws, down, H, I);
        CUDA_LAUNCH_CHECK();
        size_t n = (size_t)T * H, blocks = (n + 255) / 256;
        moe_combine_kernel<<<(unsigned)(blocks > 65536 ? 65536 : blocks), 256, 0, stream>>>(
            y, ws, w, T, H, k);
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    if (path == MSM_CUDA_MOE_PATH_WMMA) {
        moe_ws ws;
        moe_ws_layout(T, H, I, k, E, (char *)ws_base, &ws);
        moe_group_kernel<<<1, 1024, 0, stream>>>(ws, ids, (int)P, E);
        CUDA_LAUNCH_CHECK();
        size_t max_tiles = (P + G_BM - 1) / G_BM + (P < (size_t)E ? P : (size_t)E);
        if (max_tiles > 65535) return -EINVAL; /* grid.y; > 4M pairs a call */
        dim3 g1((unsigned)((I + G_BN - 1) / G_BN), (unsigned)max_tiles);
        moe_gateup_gemm_kernel<<<g1, 128, 0, stream>>>(ws, x, gate_up, H, I, k, E);
        CUDA_LAUNCH_CHECK();
        dim3 g2((unsigned)((H + G_BN - 1) / G_BN), (unsigned)max_tiles);
        moe_down_gemm_kernel<<<g2, 128, 0, stream>>>(ws, down, H, I, E);
        CUDA_LAUNCH_CHECK();
        size_t n = (size_t)T * H, blocks = (n + 255) / 256;
        moe_combine_kernel<<<(unsigned)(blocks > 65536 ? 65536 : blocks), 256, 0, stream>>>(
            y, ws, w, T, H, k);
        CUDA_LAUNCH_CHECK();
        return 0;
    }
    if (P > 65535) return -EINVAL; /* grid.y of the GEMV kernels */
    float *act = (float *)ws_base;
    bool vec_h = H % 8 == 0 && ((uintptr_t)x % 16 == 0) && ((uintptr_t)gate_up % 16 == 0);
    bool vec_i = I % 8 == 0 && ((uintptr_t)down % 16 == 0);
    dim3 ga((unsigned)((I + MOE_WARPS - 1) / MOE_WARPS), (unsigned)P);
    if (vec_h)
        moe_gateup_gemv_kernel<true><<<ga, MOE_WARPS * 32, 0, stream>>>(act, x, ids, gate_up, H, I, k, E);
    else
        moe_gateup_gemv_kernel<false><<<ga, MOE_WARPS * 32, 0, stream>>>(act, x, ids, gate_up, H, I, k, E);
    CUDA_LAUNCH_CHECK();
    dim3 gb((unsigned)((H + MOE_WARPS - 1) / MOE_WARPS), (unsigned)T);
    if (k <= 1)
        down_gemv_launch<1>(gb, stream, vec_i, y, act, ids, w, down, H, I, k, E);
    else if (k <= 2)
        down_gemv_launch<2>(gb, stream, vec_i, y, act, ids, w, down, H, I, k, E);
    else if (k <= 4)
        down_gemv_launch<4>(gb, stream, vec_i, y, act, ids, w, down, H, I, k, E);
    else if (k <= 8)
        down_gemv_launch<8>(gb, stream, vec_i, y, act, ids, w, down, H, I, k, E);
    else
        return -EINVAL;
    CUDA_LAUNCH_CHECK();
    return 0;
}

/* moe_gemm.cu: the routed experts at large T (prefill, big batches), after moe.cu has grouped the
 * (token, slot) pairs by expert: two grouped tensor-core GEMMs (WMMA bf16 -> fp32) whose grid is
 * an upper bound on the number of 64-row tiles: each block finds its expert from the tile offsets
 * and exits when past the last tile, so no host ever sees the counts and the launch can be
 * captured. The gate/up GEMM computes matching gate and up columns in one block and writes bf16
 * silu(g)*u; the down GEMM writes one fp32 row per pair (combined by moe.cu). x and the
 * activations are rounded to bf16 on this path. */
#include "moe_internal.h"

#include <errno.h>
#include <mma.h>

using namespace nvcuda;

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
static __global__ void __launch_bounds__(128)
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
static __global__ void __launch_bounds__(128)
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

bool msm__moe_gemm_fits(int H, int I) { return H % G_BK == 0 && I % G_BK == 0 && H % 8 == 0; }

int msm__moe_gemm_run(const moe_ws &ws, const float *x, const uint16_t *gate_up,
                      const uint16_t *down, int T, int H, int I, int k, int E, msm_cuda_exec ex) {
    size_t P = (size_t)T * k;
    size_t max_tiles = (P + G_BM - 1) / G_BM + (P < (size_t)E ? P : (size_t)E);
    if (max_tiles > 65535) return -EINVAL; /* grid.y; > 4M pairs a call */
    dim3 g1((unsigned)((I + G_BN - 1) / G_BN), (unsigned)max_tiles);
    CUDA_TRY(msm_launch(moe_gateup_gemm_kernel, g1, dim3(128), 0, ex, ws, x, gate_up, H, I, k, E));
    dim3 g2((unsigned)((H + G_BN - 1) / G_BN), (unsigned)max_tiles);
    CUDA_TRY(msm_launch(moe_down_gemm_kernel, g2, dim3(128), 0, ex, ws, down, H, I, E));
    return 0;
}

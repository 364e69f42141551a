/* moe.cu: the routed experts of a MoE layer, reading only the selected experts' weights, with the
 * routing (ids, weights) kept on the device. Every kernel is launched with msm_launch
 * (programmatic dependent launch, see msm_cuda.h) and waits before touching anything an earlier
 * kernel wrote; the one exception is documented at moe_down_mma_kernel (moe_grouped.cu).
 *
 * Paths, by T (msm_cuda_tuning.moe_path can force one), each in its own file:
 *   - small T (decode, T <= MSM_CUDA_MOE_GEMV_MAX_T): "pair" GEMVs, moe_pair.cu;
 *   - medium T (below MSM_CUDA_MOE_TILED_MIN_T): grouped GEMVs, moe_grouped.cu;
 *   - large decode batches (up to MSM_CUDA_MOE_TILED_MAX_T): tiled GEMMs, moe_tiled.cu;
 *   - larger T (prefill chunks): grouped WMMA GEMMs, moe_gemm.cu.
 * This file holds what the grouped paths share: one block groups the T*k pairs by expert on the
 * device (counts, offsets, a permutation and its inverse, a table of the selected experts); the
 * path's gate/up and down kernels then stream each selected expert's rows once for all of its
 * tokens, the down kernel writing one f32 row per pair; a combine kernel here sums the k rows of
 * each token with its weights in slot order.
 *
 * FP8-resident experts (msm_cuda_moe_experts_fp8, docs/adr/0006-fp8.md) take the FP8 pair and
 * grouped GEMVs below fp8_moe_tiled_min_t tokens, then the FP8 tiled GEMMs (moe_tiled.cu: the
 * codes stream from HBM once and are decoded in shared memory) up to MSM_CUDA_MOE_TILED_MAX_T;
 * only beyond that, for column phases that are not multiples of 64, or with fp8_moe_tiled off
 * (then past fp8_native_max_t) are the selected experts dequantised to bf16 for the bf16 paths.
 *
 * Rows are computed independently of their position inside a group, so results are
 * deterministic even though the grouping uses atomics. */
#include "moe_internal.h"
#include "moe_norm.h"

#include <errno.h>

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

/* ---- workspace ---- */

size_t msm__moe_ws_layout(int T, int H, int I, int k, int E, char *base, moe_ws *ws) {
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

/* ---- grouping (grouped GEMV and WMMA paths) ---- */

/* One block of 1024 threads: msm__moe_group_block (moe_internal.h). */
static __global__ void __launch_bounds__(1024) moe_group_kernel(moe_ws ws, const int32_t *ids, int P, int E) {
    __shared__ int cnt[256], cur[256];
    msm_pdl_trigger();
    msm_pdl_wait();
    msm__moe_group_block(ws, ids, P, E, cnt, cur);
}

/* ---- the combine inside the norm after the experts (msm_cuda_moe_add_rmsnorm,
 * msm_cuda_moe_combine_rmsnorm_routed; tuning moe_fused_combine) ----
 * The kernel that reads the routed sum next (the residual add + RMSNorm, or the shared expert's
 * combine + add + norm) computes it itself while it loads the row: the combine kernel, its launch
 * and the [T, H] round trip leave the step. Each thread finds its token's k pair rows and weights
 * once (moe_tok_rows), then every row element's k loads are independent. Bitwise the combine kernel
 * (moe_tok_sum: the same fmaf chain in slot order) followed by msm_cuda_add_rmsnorm
 * (add_rmsnorm_kernel's row: a + routed, msm_norm_row_store) or by msm_cuda_moe_combine_rmsnorm
 * (msm_moe_combine_norm_row). */
#define MOE_MAX_K 8
struct moe_tok {
    int row[MOE_MAX_K]; /* -1: no row (a slot past k, an invalid expert id) */
    float w[MOE_MAX_K];
};

static __device__ __forceinline__ void moe_tok_rows(moe_tok &r, const moe_ws &ws, const int32_t *ids, int E,
                                                    const float *w, size_t t, int k) {
#pragma unroll
    for (int j = 0; j < MOE_MAX_K; j++) {
        size_t p = t * k + j;
        int e = j < k && ids ? __ldcg(ids + p) : 0;
        r.row[j] = j >= k ? -1 : ids ? (e >= 0 && e < E ? (int)p : -1) : __ldcg(ws.inv + p);
        r.w[j] = j < k ? __ldcg(w + p) : 0.0f;
    }
}

/* The combine kernels' early routing (tuning moe_combine_early): a token's rows and weights
 * (moe_tok_rows: the routing and the grouping's inverse, through L2) read before the PDL wait. Safe
 * where the experts' gate/up kernel triggers only after its own wait (the grouped GEMVs and tiled
 * GEMMs, bf16 or FP8: moe_combine_early_ok): the combine's grid can then start only after the
 * gate/up's has passed its wait, so after the router and the grouping were complete. */
#define MOE_EARLY_ROWS(early, rows) \
    do {                            \
        if (early) rows;            \
        msm_pdl_wait();             \
        if (!(early)) rows;         \
    } while (0)

/* Token r's routed sum at column h: sum_j w[t, j] * outp[row of pair (t, j)] in slot order (one fmaf
 * chain), rows by inv (grouped), or, where the GEMVs scanned (ids given), the pair itself for a valid
 * expert id (moe_tok_rows). */
static __device__ __forceinline__ float moe_tok_sum(const moe_tok &r, const float *outp, size_t h, int H) {
    float s = 0.0f;
#pragma unroll
    for (int j = 0; j < MOE_MAX_K; j++)
        if (r.row[j] >= 0) s = fmaf(r.w[j], outp[(size_t)r.row[j] * H + h], s);
    return s;
}

/* y[t, h] = moe_tok_sum(t, h) for every (t, h). A thread's k index and weight loads, then its k row
 * loads, each all in flight at once: two round trips, where a loop over the slots chained an index
 * load and a row load a slot (2k). Measured against that loop (H100, bench/results/2026-12-06-h200-s24
 * run 4, three rounds): Qwen3-30B-A3B at 5 / 8 / 16 tokens -0.01 / +0.02 / -0.05 ms a step, its FP8
 * preset 0.00 / -0.03 / -0.08; the kernel still takes ~5.5 us a layer at 8 tokens, mostly its
 * boundary with the down before it. */
static __global__ void moe_combine_kernel(float *y, moe_ws ws, const int32_t *ids, int E, const float *w, int T,
                                          int H, int k, bool early) {
    msm_pdl_trigger();
    size_t n = (size_t)T * H, idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    moe_tok r; /* the first element's token (early: before the wait) */
    MOE_EARLY_ROWS(early, moe_tok_rows(r, ws, ids, E, w, (idx < n ? idx : 0) / H, k));
    for (size_t t0 = (idx < n ? idx : 0) / H; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        size_t t = idx / H, h = idx % H;
        if (t != t0) moe_tok_rows(r, ws, ids, E, w, t, k), t0 = t;
        y[idx] = moe_tok_sum(r, ws.outp, h, H);
    }
}

template <int V>
static __global__ void moe_add_rmsnorm_kernel(float *sum, float *out, const float *a, moe_ws ws, const int32_t *ids,
                                              int E, const float *w, int H, int k, const uint16_t *nw, float eps,
                                              bool early) {
    msm_pdl_trigger();
    float wv[V];
    msm_norm_w_load<V>(nw, H, wv);
    __shared__ float part[32];
    size_t t = blockIdx.x, off = t * (size_t)H;
    moe_tok r;
    MOE_EARLY_ROWS(early, moe_tok_rows(r, ws, ids, E, w, t, k));
    float v[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        v[j] = i < H ? a[off + i] + moe_tok_sum(r, ws.outp, (size_t)i, H) : 0.0f;
    }
    msm_norm_row_store<V>(v, sum, out, off, wv, H, eps, part);
}

/* moe_add_rmsnorm_kernel<V> as a cluster of V blocks a token (tuning moe_combine_cluster): block b
 * (its cluster rank) takes the row's values j = b of that kernel's layout, element threadIdx.x + b *
 * blockDim.x, so the row's k rows are read by V times the threads, each with one batch of loads.
 * Each block leaves its values in shared memory; after a cluster barrier every thread forms that
 * kernel's partial of its thread index (ss += v * v over the V blocks' values in j order, through
 * distributed shared memory) and every block the same msm_block_sum of them: each block gets that
 * kernel's total, and writes its values' sum and norm as msm_norm_row_store does (the same bits).
 * A second barrier keeps the values readable until every block has read them. */
template <int V>
static __global__ void __launch_bounds__(1024)
    moe_add_rmsnorm_cl_kernel(float *sum, float *out, const float *a, moe_ws ws, const int32_t *ids, int E,
                              const float *w, int H, int k, const uint16_t *nw, float eps, bool early) {
    __shared__ float val[1024], part[32];
    cooperative_groups::cluster_group cl = cooperative_groups::this_cluster();
    msm_pdl_trigger();
    const int i = threadIdx.x + blockIdx.x * blockDim.x;
    const size_t t = blockIdx.y, off = t * (size_t)H;
    float wv = i < H ? msm_bf(__ldg(nw + i)) : 0.0f;
    moe_tok r;
    MOE_EARLY_ROWS(early, moe_tok_rows(r, ws, ids, E, w, t, k));
    float v = i < H ? a[off + i] + moe_tok_sum(r, ws.outp, (size_t)i, H) : 0.0f;
    val[threadIdx.x] = v;
    msm_cluster_sync_smem(); /* every block's values */
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++) {
        int ij = threadIdx.x + j * blockDim.x;
        float vj = cl.map_shared_rank(val, j)[threadIdx.x];
        if (ij < H) ss += vj * vj;
    }
    float tot = msm_block_sum(ss, part);
    float inv = 1.0f / sqrtf(tot / (float)H + eps);
    if (i < H) {
        sum[off + i] = v;
        out[off + i] = wv * (v * inv);
    }
    cl.sync(); /* every block has read the values (after the stores: its fence waits for them, as the
                * kernel's end would) */
}

template <int V>
static __global__ void moe_combine_rmsnorm_routed_kernel(float *sum, float *out, const float *x, moe_ws ws,
                                                         const int32_t *ids, int E, const float *w, int k,
                                                         const float *shared, const float *h, const uint16_t *wg,
                                                         const uint16_t *nw, int H, float eps, bool early) {
    moe_tok r; /* the routing's rows and weights: before the PDL wait (early) or after it */
    if (early) moe_tok_rows(r, ws, ids, E, w, blockIdx.x, k);
    msm_moe_combine_norm_row<V, true>([&] { if (!early) moe_tok_rows(r, ws, ids, E, w, blockIdx.x, k); },
                                      [&](size_t i) { return moe_tok_sum(r, ws.outp, i % (size_t)H, H); }, sum, out, x,
                                      shared, h, wg, nw, H, eps);
}

/* ---- host side ---- */

static int moe_path(const msm_cuda_tuning *tn, int T, int H, int I) {
    int p = tn->moe_path;
    if (p == MSM_CUDA_MOE_PATH_WMMA && !msm__moe_gemm_fits(H, I)) p = 0;
    if (p == MSM_CUDA_MOE_PATH_TILED && !msm__moe_tiled_fits(H, I)) p = 0;
    if (p) return p;
    if (T <= MSM_CUDA_MOE_GEMV_MAX_T) return MSM_CUDA_MOE_PATH_PAIR;
    bool tiled = T >= tn->moe_tiled_min_t && T <= MSM_CUDA_MOE_TILED_MAX_T && msm__moe_tiled_fits(H, I);
    if (tiled) return MSM_CUDA_MOE_PATH_TILED;
    if (T <= MSM_CUDA_MOE_GROUPED_GEMV_MAX_T) return MSM_CUDA_MOE_PATH_GROUPED_GEMV;
    return msm__moe_gemm_fits(H, I) ? MSM_CUDA_MOE_PATH_WMMA : MSM_CUDA_MOE_PATH_GROUPED_GEMV;
}

/* Whether the combine after path may read the routing before its PDL wait (MOE_EARLY_ROWS): the
 * grouped GEMVs' and the tiled GEMMs' gate/up kernels trigger only after their own wait (the WMMA
 * GEMMs' trigger first). */
static bool moe_combine_early_ok(const msm_cuda_tuning *tn, int path) {
    return tn->moe_combine_early && (path == MSM_CUDA_MOE_PATH_GROUPED_GEMV || path == MSM_CUDA_MOE_PATH_TILED);
}

static cudaError_t combine_launch(float *y, const moe_ws &ws, const int32_t *scan_ids, int E, const float *w, int T,
                                  int H, int k, bool early, msm_cuda_exec ex) {
    size_t n = (size_t)T * H, blocks = (n + 255) / 256;
    return msm_launch(moe_combine_kernel, dim3((unsigned)(blocks > 65536 ? 65536 : blocks)),
                      dim3(256), 0, ex, y, ws, scan_ids, E, w, T, H, k, early);
}

static bool aligned16(const void *p) { return (uintptr_t)p % 16 == 0; }

extern "C" size_t msm_cuda_moe_experts_ws_bytes(int T, int H, int I, int k, int E) {
    if (T <= 0 || H <= 0 || I <= 0 || k <= 0 || E <= 0) return 0;
    /* the grouped layout (f32 act) also covers the pair GEMV path's f32 act [P, I] */
    return msm__moe_ws_layout(T, H, I, k, E, NULL, NULL);
}

/* The grouped SIMT GEMVs of few tokens find their pairs themselves (no grouping kernel): the ids the
 * combine then reads rows by (NULL: by the grouping's inverse permutation). */
static const int32_t *moe_scan_ids(const msm_cuda_tuning *tn, int path, int T, int k, const int32_t *ids) {
    return path == MSM_CUDA_MOE_PATH_GROUPED_GEMV && msm__moe_grouped_scans(tn, T, k) ? ids : NULL;
}

/* msm_cuda_moe_experts; defer: a path that ends with the combine leaves it (and y) to the caller's
 * msm_cuda_moe_add_rmsnorm / msm_cuda_moe_combine_rmsnorm_routed (msm_cuda_moe_defers); grouped: ws
 * already holds the grouping of ids (msm_cuda_moe_args.grouped; where msm_cuda_moe_groups). */
static int moe_experts_run(float *y, const float *x, const int32_t *ids, const float *w, const uint16_t *gate_up,
                           const uint16_t *down, int T, int H, int I, int k, int E, void *ws_base, size_t ws_bytes,
                           bool defer, bool grouped, msm_cuda_exec ex) {
    if (T < 0 || H <= 0 || I <= 0 || k <= 0 || E <= 0 || E > 256 || k > 8)
        return -EINVAL;
    if (T == 0) return 0;
    if (!ws_base || (uintptr_t)ws_base % 256 ||
        ws_bytes < msm_cuda_moe_experts_ws_bytes(T, H, I, k, E))
        return -EINVAL;
    int path = moe_path(ex.tune, T, H, I);
    moe_ws ws;
    msm__moe_ws_layout(T, H, I, k, E, (char *)ws_base, &ws);
    /* 16-byte loads of weight rows and of x / act rows (ws is 256-byte aligned) */
    bool vec_h = H % 8 == 0 && aligned16(x) && aligned16(gate_up);
    bool vec_i = I % 8 == 0 && aligned16(down);
    if (path == MSM_CUDA_MOE_PATH_PAIR)
        return msm__moe_pair_run(y, x, ids, w, gate_up, NULL, 0, down, NULL, 0, (float *)ws.act, T, H, I, k, E,
                                 vec_h, vec_i, ex);
    const int32_t *scan = moe_scan_ids(ex.tune, path, T, k, ids);
    if (!scan && !grouped) {
        CUDA_TRY(msm_launch(moe_group_kernel, dim3(1), dim3(1024), 0, ex, ws, ids, T * k, E));
        ex.no_pdl = false; /* only the first kernel (msm_cuda_exec.no_pdl) */
    }
    int r = path == MSM_CUDA_MOE_PATH_WMMA    ? msm__moe_gemm_run(ws, x, gate_up, down, T, H, I, k, E, ex)
            : path == MSM_CUDA_MOE_PATH_TILED ? msm__moe_tiled_run(ws, x, gate_up, down, T, H, I, k, E, ex)
                                              : msm__moe_grouped_run(ws, scan, x, gate_up, down, T, H, I, k, E,
                                                                     vec_h, vec_i, ex);
    if (r) return r;
    if (defer) return 0;
    ex.no_pdl = false;
    CUDA_TRY(combine_launch(y, ws, scan, E, w, T, H, k, moe_combine_early_ok(ex.tune, path), ex));
    return 0;
}

extern "C" int msm_cuda_moe_experts(float *y, const float *x, const int32_t *ids, const float *w,
                                    const uint16_t *gate_up, const uint16_t *down, int T, int H,
                                    int I, int k, int E, void *ws_base, size_t ws_bytes,
                                    msm_cuda_exec ex) {
    return moe_experts_run(y, x, ids, w, gate_up, down, T, H, I, k, E, ws_base, ws_bytes, false, false, ex);
}

/* ---- FP8-resident experts (docs/adr/0006-fp8.md) ---- */

/* The bf16 scratch of the dequantising path: gate_up [E, 2I, H], down [E, H, I], used [E]. */
extern "C" size_t msm_cuda_moe_fp8_deq_bytes(int H, int I, int E) {
    if (H <= 0 || I <= 0 || E <= 0) return 0;
    return round_up((size_t)E * 2 * I * H * 2, 256) + round_up((size_t)E * H * I * 2, 256) + round_up((size_t)E * 4, 256);
}

/* How msm_cuda_moe_experts_fp8 runs T tokens: the FP8 pair GEMVs, the grouped FP8 GEMVs or the tiled
 * FP8 GEMMs on the codes (both ending with the combine), or dequantised for the bf16 paths. */
enum moe_fp8_way { FP8_PAIR, FP8_GROUPED, FP8_TILED, FP8_DEQUANT };
static moe_fp8_way moe_fp8_plan(const msm_cuda_tuning *tn, int T, int H, int I, const float *x, msm_cuda_fp8w gu,
                                msm_cuda_fp8w dn) {
    int forced = tn->moe_path;
    /* from fp8_moe_tiled_min_t tokens (or forced tiled) up to MSM_CUDA_MOE_TILED_MAX_T: the tiled
     * GEMMs on the codes, unless switched off (fp8_moe_tiled) or the shapes / phases do not allow
     * them; below, and past it up to fp8_native_max_t, the FP8 GEMVs. Against the grouped FP8
     * GEMVs (H200, 2026-12-01, ms a step at 8 / 16 / 32 / 64 tokens): Qwen3-30B-A3B FP8 9.99 /
     * 15.52 / 21.32 / 27.36 -> 9.21 / 12.59 / 17.30 / 22.30, GLM-4.5-Air FP8 27.0 / 42.3 / 62.7 /
     * 99.6 -> 23.8 / 37.5 / 54.0 / 85.1 (bench/results/2026-12-01-h200-s6 run 3) */
    bool tiled = tn->fp8_moe_tiled &&
                 (forced == MSM_CUDA_MOE_PATH_TILED ||
                  (forced == MSM_CUDA_MOE_PATH_AUTO && (T >= tn->fp8_moe_tiled_min_t || T > tn->fp8_native_max_t))) &&
                 T <= MSM_CUDA_MOE_TILED_MAX_T && msm__moe_tiled_fp8_fits(H, I, gu, dn);
    bool native = !tiled && T <= tn->fp8_native_max_t && H % 16 == 0 && I % 16 == 0 && gu.phase % 16 == 0 &&
                  dn.phase % 16 == 0 && aligned16(x) && aligned16(gu.q) && aligned16(dn.q) &&
                  forced != MSM_CUDA_MOE_PATH_TILED && forced != MSM_CUDA_MOE_PATH_WMMA;
    if (tiled) return FP8_TILED;
    if (!native) return FP8_DEQUANT;
    bool pair = forced == MSM_CUDA_MOE_PATH_PAIR || (forced == MSM_CUDA_MOE_PATH_AUTO && T <= MSM_CUDA_MOE_GEMV_MAX_T);
    return pair ? FP8_PAIR : FP8_GROUPED;
}

/* moe_combine_early_ok for an FP8 way that combines on the codes (grouped GEMVs, tiled GEMMs: the
 * bf16 paths' gate/up order). */
static bool moe_fp8_combine_early_ok(const msm_cuda_tuning *tn, moe_fp8_way way) {
    return moe_combine_early_ok(tn, way == FP8_TILED ? MSM_CUDA_MOE_PATH_TILED : MSM_CUDA_MOE_PATH_GROUPED_GEMV);
}

static int moe_experts_fp8_run(float *y, const float *x, const int32_t *ids, const float *w, msm_cuda_fp8w gu,
                               msm_cuda_fp8w dn, int T, int H, int I, int k, int E, void *ws_base, size_t ws_bytes,
                               void *deq, size_t deq_bytes, bool defer, bool grouped, msm_cuda_exec ex) {
    if (T < 0 || H <= 0 || I <= 0 || k <= 0 || E <= 0 || E > 256 || k > 8 || !gu.q || !gu.scale || !dn.q ||
        !dn.scale || gu.phase < 0 || gu.phase >= MSM_CUDA_FP8_BLOCK || dn.phase < 0 || dn.phase >= MSM_CUDA_FP8_BLOCK)
        return -EINVAL;
    if (T == 0) return 0;
    if (!ws_base || (uintptr_t)ws_base % 256 || ws_bytes < msm_cuda_moe_experts_ws_bytes(T, H, I, k, E))
        return -EINVAL;
    moe_fp8_way way = moe_fp8_plan(ex.tune, T, H, I, x, gu, dn);
    if (way != FP8_DEQUANT) {
        moe_ws ws;
        msm__moe_ws_layout(T, H, I, k, E, (char *)ws_base, &ws);
        if (way == FP8_PAIR)
            return msm__moe_pair_run(y, x, ids, w, gu.q, gu.scale, gu.phase, dn.q, dn.scale, dn.phase,
                                     (float *)ws.act, T, H, I, k, E, true, true, ex);
        if (!grouped) {
            CUDA_TRY(msm_launch(moe_group_kernel, dim3(1), dim3(1024), 0, ex, ws, ids, T * k, E));
            ex.no_pdl = false; /* only the first kernel (msm_cuda_exec.no_pdl) */
        }
        int r = way == FP8_TILED ? msm__moe_tiled_fp8_run(ws, x, gu, dn, T, H, I, k, E, ex)
                                 : msm__moe_grouped_fp8_run(ws, x, gu, dn, T, H, I, k, E, ex);
        if (r) return r;
        if (defer) return 0;
        CUDA_TRY(combine_launch(y, ws, NULL, E, w, T, H, k, moe_fp8_combine_early_ok(ex.tune, way), ex));
        return 0;
    }
    /* the selected experts dequantised to bf16, then the bf16 paths (WMMA past
     * MSM_CUDA_MOE_TILED_MAX_T, phases that are not multiples of 64, fp8_moe_tiled off) */
    if (!deq || (uintptr_t)deq % 256 || deq_bytes < msm_cuda_moe_fp8_deq_bytes(H, I, E)) return -EINVAL;
    uint16_t *gb = (uint16_t *)deq;
    uint16_t *db = (uint16_t *)((char *)deq + round_up((size_t)E * 2 * I * H * 2, 256));
    int32_t *used = (int32_t *)((char *)db + round_up((size_t)E * H * I * 2, 256));
    int r = msm_cuda_fp8_mark(used, ids, T * k, E, ex);
    ex.no_pdl = false;
    if (!r) r = msm_cuda_fp8_dequant(gb, gu, E, 2 * I, H, used, ex);
    if (!r) r = msm_cuda_fp8_dequant(db, dn, E, H, I, used, ex);
    if (r) return r;
    return moe_experts_run(y, x, ids, w, gb, db, T, H, I, k, E, ws_base, ws_bytes, defer, false, ex);
}

extern "C" int msm_cuda_moe_experts_fp8(float *y, const float *x, const int32_t *ids, const float *w,
                                        msm_cuda_fp8w gu, msm_cuda_fp8w dn, int T, int H, int I, int k, int E,
                                        void *ws_base, size_t ws_bytes, void *deq, size_t deq_bytes,
                                        msm_cuda_exec ex) {
    return moe_experts_fp8_run(y, x, ids, w, gu, dn, T, H, I, k, E, ws_base, ws_bytes, deq, deq_bytes, false, false,
                               ex);
}

/* ---- the grouping left to the router (msm_cuda_moe_args.grouped) ---- */

extern "C" bool msm_cuda_moe_groups(const msm_cuda_moe_args *m, const msm_cuda_tuning *tn) {
    if (m->T <= 0 || m->H <= 0 || m->I <= 0 || m->k <= 0 || m->k > 8 || m->E <= 0 || m->E > 256) return false;
    if (m->gu.q) {
        moe_fp8_way way = moe_fp8_plan(tn, m->T, m->H, m->I, m->x, m->gu, m->dn);
        return way == FP8_GROUPED || way == FP8_TILED;
    }
    int path = moe_path(tn, m->T, m->H, m->I);
    return path != MSM_CUDA_MOE_PATH_PAIR && !moe_scan_ids(tn, path, m->T, m->k, m->ids);
}

extern "C" int msm_cuda_moe_experts_args(float *y, const msm_cuda_moe_args *m, msm_cuda_exec ex) {
    if (m->grouped && !msm_cuda_moe_groups(m, ex.tune)) return -EINVAL;
    if (m->gu.q)
        return moe_experts_fp8_run(y, m->x, m->ids, m->w, m->gu, m->dn, m->T, m->H, m->I, m->k, m->E, m->ws,
                                   m->ws_bytes, m->deq, m->deq_bytes, false, m->grouped, ex);
    return moe_experts_run(y, m->x, m->ids, m->w, m->gate_up, m->down, m->T, m->H, m->I, m->k, m->E, m->ws,
                           m->ws_bytes, false, m->grouped, ex);
}

/* ---- the combine left to the norm after the experts (tuning moe_fused_combine) ---- */

/* Whether m's path ends with the combine kernel, the ids its rows are found by (*scan; NULL: the
 * grouping's inverse permutation) and whether that combine reads them early (*early,
 * moe_combine_early_ok): the decisions moe_experts_run / moe_experts_fp8_run make. */
static bool moe_combines(const msm_cuda_moe_args *m, const msm_cuda_tuning *tn, const int32_t **scan,
                         bool *early = NULL) {
    *scan = NULL;
    if (early) *early = false;
    if (m->T <= 0 || m->H <= 0 || m->I <= 0 || m->k <= 0 || m->E <= 0) return false;
    if (m->gu.q) {
        moe_fp8_way way = moe_fp8_plan(tn, m->T, m->H, m->I, m->x, m->gu, m->dn);
        if (way == FP8_GROUPED || way == FP8_TILED) {
            if (early) *early = moe_fp8_combine_early_ok(tn, way);
            return true;
        }
        if (way == FP8_PAIR) return false;
    }
    int path = moe_path(tn, m->T, m->H, m->I);
    *scan = moe_scan_ids(tn, path, m->T, m->k, m->ids);
    if (early) *early = moe_combine_early_ok(tn, path);
    return path != MSM_CUDA_MOE_PATH_PAIR;
}

/* Mode 2 (the default, into an ADD_RMSNORM only, as a cluster a token) up to this many tokens:
 * measured against the combine kernel (H100, bench/results/2026-12-06-h200-s24 runs 5-6, ms a step):
 * Qwen3-30B-A3B at 5 / 8 / 16 / 32 / 64 tokens -0.026 / -0.050 / -0.036 / -0.050 / -0.044, its FP8
 * preset -0.113 / -0.088 / -0.047 / -0.051 / -0.032 (three rounds; 64: two), but at 128 / 256 +0.21 /
 * +0.49 and +0.16 / +0.50 (the clusters past one wave) */
#define MOE_COMBINE_NORM_MAX_T 64

/* Whether the tuning leaves the combine of m's T tokens to the reader at all (its path aside). */
static bool moe_defer_on(const msm_cuda_moe_args *m, const msm_cuda_tuning *tn) {
    return tn->moe_fused_combine && !(tn->moe_fused_combine == 2 && m->T > MOE_COMBINE_NORM_MAX_T);
}

extern "C" bool msm_cuda_moe_defers(const msm_cuda_moe_args *m, const msm_cuda_tuning *tn) {
    const int32_t *scan;
    return moe_defer_on(m, tn) && moe_combines(m, tn, &scan);
}

extern "C" int msm_cuda_moe_experts_deferred(const msm_cuda_moe_args *m, msm_cuda_exec ex) {
    if (!msm_cuda_moe_defers(m, ex.tune) || (m->grouped && !msm_cuda_moe_groups(m, ex.tune))) return -EINVAL;
    if (m->gu.q)
        return moe_experts_fp8_run(NULL, m->x, m->ids, m->w, m->gu, m->dn, m->T, m->H, m->I, m->k, m->E, m->ws,
                                   m->ws_bytes, m->deq, m->deq_bytes, true, m->grouped, ex);
    return moe_experts_run(NULL, m->x, m->ids, m->w, m->gate_up, m->down, m->T, m->H, m->I, m->k, m->E, m->ws,
                           m->ws_bytes, true, m->grouped, ex);
}

/* The deferred combine's workspace view, scan ids and early routing; false where m does not defer. */
static bool moe_deferred_ws(const msm_cuda_moe_args *m, const msm_cuda_tuning *tn, moe_ws *ws, const int32_t **scan,
                            bool *early) {
    if (!moe_defer_on(m, tn) || !moe_combines(m, tn, scan, early) || !m->ws || (uintptr_t)m->ws % 256 || !m->w ||
        m->ws_bytes < msm_cuda_moe_experts_ws_bytes(m->T, m->H, m->I, m->k, m->E))
        return false;
    msm__moe_ws_layout(m->T, m->H, m->I, m->k, m->E, (char *)m->ws, ws);
    return true;
}

extern "C" int msm_cuda_moe_add_rmsnorm(float *sum, float *out, const float *a, const uint16_t *nw, float eps,
                                        const msm_cuda_moe_args *m, msm_cuda_exec ex) {
    moe_ws ws;
    const int32_t *scan;
    bool early;
    if (!sum || !out || !a || !nw || !moe_deferred_ws(m, ex.tune, &ws, &scan, &early) || m->H > 32 * 1024)
        return -EINVAL;
    int H = m->H, threads = msm_norm_threads(H), nv = msm_norm_vals(H, threads);
    if (ex.tune->moe_combine_cluster && nv >= 2 && nv <= 8 && threads <= 1024 && m->T <= 65535) {
        dim3 grid((unsigned)nv, (unsigned)m->T);
#define MAN_CL(V)                                                                                                   \
    case V:                                                                                                         \
        CUDA_TRY(msm_launch_cluster(moe_add_rmsnorm_cl_kernel<V>, grid, dim3((unsigned)threads), 0, (unsigned)V, ex,  \
                                    sum, out, a, ws, scan, m->E, m->w, H, m->k, nw, eps, early));                   \
        return 0;
        switch (nv) { MAN_CL(2) MAN_CL(4) MAN_CL(8) }
#undef MAN_CL
    }
    switch (nv) { /* add_rmsnorm_launch's layout */
#define MAN_CASE(V)                                                                                                 \
    case V:                                                                                                         \
        CUDA_TRY(msm_launch(moe_add_rmsnorm_kernel<V>, dim3((unsigned)m->T), dim3((unsigned)threads), 0, ex, sum, out, \
                            a, ws, scan, m->E, m->w, H, m->k, nw, eps, early));                                     \
        break;
        MAN_CASE(1) MAN_CASE(2) MAN_CASE(4) MAN_CASE(8) MAN_CASE(16) MAN_CASE(32)
#undef MAN_CASE
    default: return -EINVAL;
    }
    return 0;
}

extern "C" int msm_cuda_moe_combine_rmsnorm_routed(float *sum, float *out, const float *x, const float *shared,
                                                   const float *h, const uint16_t *wg, const uint16_t *nw, float eps,
                                                   const msm_cuda_moe_args *m, msm_cuda_exec ex) {
    moe_ws ws;
    const int32_t *scan;
    bool early;
    if (!sum || !out || !x || !shared || !h || !wg || !nw || !moe_deferred_ws(m, ex.tune, &ws, &scan, &early) ||
        m->H > 32 * 1024)
        return -EINVAL;
    int H = m->H, threads = msm_moe_combine_threads(H);
    if (!threads) return -EINVAL;
    switch (msm_norm_vals(H, threads)) { /* moe_combine_launch's layout (elementwise.cu) */
#define MCR_CASE(V)                                                                                                  \
    case V:                                                                                                          \
        CUDA_TRY(msm_launch(moe_combine_rmsnorm_routed_kernel<V>, dim3((unsigned)m->T), dim3((unsigned)threads), 0, ex, \
                            sum, out, x, ws, scan, m->E, m->w, m->k, shared, h, wg, nw, H, eps, early));             \
        break;
        MCR_CASE(1) MCR_CASE(2) MCR_CASE(4) MCR_CASE(8) MCR_CASE(16)
#undef MCR_CASE
    default: return -EINVAL;
    }
    return 0;
}

/* elementwise.cu: the small kernels of a step: embedding gather, RMSNorm, RoPE, KV-cache write,
 * residual add, row scaling, sigmoid, SwiGLU and the row gather. They are memory-bound and simple: one pass over
 * their data, the same float formulas as the CPU oracle (kernels/cpu), no fast-math
 * intrinsics, so they agree with it to float32 rounding. */
#include "msm_cuda.h"
#include "msm_cuda_kernels.h"
#include "moe_norm.h"
#include "qk_rope.h"

#include <errno.h>

/* A 1-D grid over n items: enough blocks to fill the GPU several times, grid-stride beyond. */
static unsigned grid_for(size_t n, int threads) {
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    if (b > 65536) b = 65536;
    return b ? (unsigned)b : 1u;
}

/* ---- embed: one block per token, bf16 row -> f32 row ---- */
static __global__ void embed_kernel(float *out, const uint16_t *table, const int32_t *ids, int H) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int t = blockIdx.x;
    const uint16_t *row = table + (size_t)ids[t] * H;
    float *o = out + (size_t)t * H;
    for (int h = threadIdx.x; h < H; h += blockDim.x) o[h] = msm_bf(row[h]);
}

extern "C" int msm_cuda_embed(float *out, const uint16_t *table, const int32_t *ids, int T, int H,
                              msm_cuda_exec ex) {
    if (T < 0 || H <= 0) return -EINVAL;
    if (T == 0) return 0;
    CUDA_TRY(msm_launch(embed_kernel, dim3(T), dim3(256), 0, ex, out, table, ids, H));
    return 0;
}

/* ---- row norms: one block per row, the row held in registers (msm_norm_threads and
 * msm_norm_vals in msm_cuda.h say how many threads and values: rmsnorm, add_rmsnorm and the
 * all-reduce's fused norm pick them the same way, so they agree bitwise). All loads of a row are
 * issued before the first store (sum may alias a or b). */

/* sum = a (+ b), out = rmsnorm(sum) * w; sum NULL: not stored. */
template <int V>
static __global__ void add_rmsnorm_kernel(float *sum, float *out, const float *a, const float *b,
                                   const uint16_t *w, int dim, float eps) {
    msm_pdl_trigger();
    float wv[V];
    msm_norm_w_load<V>(w, dim, wv);
    msm_pdl_wait();
    __shared__ float part[32];
    size_t off = (size_t)blockIdx.x * dim;
    float v[V];
#pragma unroll
    for (int j = 0; j < V; j++) {
        int i = threadIdx.x + j * blockDim.x;
        v[j] = i < dim ? (b ? a[off + i] + b[off + i] : a[off + i]) : 0.0f;
    }
    msm_norm_row_store<V>(v, sum, out, off, wv, dim, eps, part);
}

static int add_rmsnorm_launch(float *sum, float *out, const float *a, const float *b,
                              const uint16_t *w, int rows, int dim, float eps, msm_cuda_exec ex) {
    if (rows < 0 || dim <= 0 || dim > 32 * 1024) return -EINVAL;
    if (rows == 0) return 0;
    int threads = msm_norm_threads(dim);
    switch (msm_norm_vals(dim, threads)) {
#define NORM_CASE(V)                                                                               \
    case V:                                                                                        \
        CUDA_TRY(msm_launch(add_rmsnorm_kernel<V>, dim3((unsigned)rows), dim3((unsigned)threads), 0, \
                            ex, sum, out, a, b, w, dim, eps));                                 \
        break;
        NORM_CASE(1) NORM_CASE(2) NORM_CASE(4) NORM_CASE(8) NORM_CASE(16) NORM_CASE(32)
    default: return -EINVAL;
    }
    return 0;
}

extern "C" int msm_cuda_rmsnorm(float *out, const float *x, const uint16_t *w, int rows, int dim,
                                float eps, msm_cuda_exec ex) {
    return add_rmsnorm_launch(NULL, out, x, NULL, w, rows, dim, eps, ex);
}

/* ---- add + rmsnorm: the residual sum and its norm in one pass (same order as the two kernels) */
extern "C" int msm_cuda_add_rmsnorm(float *sum, float *out, const float *a, const float *b,
                                    const uint16_t *w, int rows, int dim, float eps,
                                    msm_cuda_exec ex) {
    if (!sum || !b) return -EINVAL;
    return add_rmsnorm_launch(sum, out, a, b, w, rows, dim, eps, ex);
}

/* ---- MoE combine + residual add + rmsnorm: one block per row; block sums in a fixed order ---- */
/* NORM false: only the combine (x, w, eps unused; sum gets routed + shared * gate). The row's
 * arithmetic: msm_moe_combine_norm_row (moe_norm.h). */
template <int V, bool NORM>
static __global__ void moe_combine_rmsnorm_kernel(float *sum, float *out, const float *x, const float *routed,
                                           const float *shared, const float *h, const uint16_t *wg,
                                           const uint16_t *w, int dim, float eps) {
    msm_moe_combine_norm_row<V, NORM>([] {}, [&](size_t i) { return routed[i]; }, sum, out, x, shared, h, wg, w, dim,
                                      eps);
}

template <bool NORM>
static int moe_combine_launch(float *sum, float *out, const float *x, const float *routed, const float *shared,
                              const float *h, const uint16_t *wg, const uint16_t *w, int rows, int dim, float eps,
                              msm_cuda_exec ex) {
    if (rows < 0 || dim <= 0 || dim > 32 * 1024) return -EINVAL;
    if (rows == 0) return 0;
    int threads = msm_moe_combine_threads(dim);
    if (!threads) return -EINVAL;
    switch (msm_norm_vals(dim, threads)) {
#define COMBINE_CASE(V)                                                                            \
    case V:                                                                                        \
        CUDA_TRY(msm_launch(moe_combine_rmsnorm_kernel<V, NORM>, dim3((unsigned)rows), dim3((unsigned)threads), \
                            0, ex, sum, out, x, routed, shared, h, wg, w, dim, eps));          \
        break;
        COMBINE_CASE(1) COMBINE_CASE(2) COMBINE_CASE(4) COMBINE_CASE(8) COMBINE_CASE(16)
    default: return -EINVAL;
    }
    return 0;
}

extern "C" int msm_cuda_moe_combine_rmsnorm(float *sum, float *out, const float *x, const float *routed,
                                            const float *shared, const float *h, const uint16_t *wg,
                                            const uint16_t *w, int rows, int dim, float eps,
                                            msm_cuda_exec ex) {
    return moe_combine_launch<true>(sum, out, x, routed, shared, h, wg, w, rows, dim, eps, ex);
}

extern "C" int msm_cuda_moe_combine(float *out, const float *routed, const float *shared, const float *h,
                                    const uint16_t *wg, int rows, int dim, msm_cuda_exec ex) {
    return moe_combine_launch<false>(out, NULL, NULL, routed, shared, h, wg, NULL, rows, dim, 0.0f, ex);
}

/* ---- rope: one thread per (token, frequency), rotating that pair in every head ----
 * Only the first rot dims of each head rotate (rot = hd: full RoPE; less with GLM's
 * partial_rotary_factor); dims [rot, hd) pass through. */
/* msm_rope_cs's frequencies, msm_rope_lo / _hi's rotation (msm_cuda.h). */

static __global__ void rope_kernel(float *x, const int32_t *pos, int T, int nheads, int hd, int rot,
                                   float theta) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int half = rot / 2;
    size_t n = (size_t)T * half;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(idx / half), i = (int)(idx % half);
        float c, s;
        msm_rope_cs(pos[t], i, rot, theta, &c, &s);
        for (int h = 0; h < nheads; h++) {
            float *v = x + ((size_t)t * nheads + h) * hd;
            float a = v[i], b = v[i + half];
            v[i] = msm_rope_lo(a, b, c, s);
            v[i + half] = msm_rope_hi(a, b, c, s);
        }
    }
}

static bool rope_shape_ok(int hd, int rot) { return hd > 0 && rot > 0 && rot % 2 == 0 && rot <= hd; }

extern "C" int msm_cuda_rope(float *x, const int32_t *pos, int T, int nheads, int hd, int rot,
                             float theta, msm_cuda_exec ex) {
    if (T < 0 || nheads <= 0 || !rope_shape_ok(hd, rot)) return -EINVAL;
    if (T == 0) return 0;
    size_t n = (size_t)T * (rot / 2);
    CUDA_TRY(msm_launch(rope_kernel, dim3(grid_for(n, 128)), dim3(128), 0, ex, x, pos, T, nheads, hd,
                        rot, theta));
    return 0;
}

/* ---- rope_copy / rope_kv: out = x with the first nrot heads of every row rotated, one thread
 * per (token, head, frequency), per passed-through dim [rot, hd) of those heads, and per copied
 * element of the rest (one launch instead of a copy + an in-place rope); the rotation is
 * rope_kernel's formula. With kc/vc (rope_kv), the k heads [nq, nrot) (rotated and passed-through
 * dims) and the following kvh v heads are also written to the bf16 cache at slot[t] (rows with
 * slot < 0 are not written), which is exactly what msm_cuda_kv_write_ld does from `out`. */
static __global__ void rope_copy_kernel(float *__restrict__ out, const float *__restrict__ x, const int32_t *pos,
                                 int T, int C, int nrot, int hd, int rot, float theta, const int32_t *slot,
                                 uint16_t *kc, uint16_t *vc, int nq, int kvh, bool early) {
    msm_pdl_trigger();
    /* per rotated head: half rotation items, then hd - rot pass-through items */
    int half = rot / 2, per_h = half + (hd - rot), rest = C - nrot * hd, per_t = nrot * per_h;
    size_t n1 = (size_t)T * per_t, n = n1 + (size_t)T * rest;
    size_t krow = (size_t)kvh * hd;
    /* what an item needs besides x: its cache slot (-1: none) and, rotating, its cosine and sine;
     * with early (decode, msm_cuda_tuning.small_early) the first item's before the PDL wait (the
     * step's inputs were written before its first kernel) */
    auto prep = [&](size_t idx, float &c, float &s, int &sl) {
        c = s = 0.0f, sl = -1;
        if (idx < n1) {
            int t = (int)(idx / per_t), r = (int)(idx % per_t), h = r / per_h, i = r % per_h;
            if (kc && h >= nq) sl = slot[t];
            if (i < half) msm_rope_cs(pos[t], i, rot, theta, &c, &s);
        } else if (vc && (idx - n1) % rest < krow) {
            sl = slot[(idx - n1) / rest];
        }
    };
    const size_t idx0 = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    float c0, s0;
    int sl0;
    if (early && idx0 < n) prep(idx0, c0, s0, sl0);
    msm_pdl_wait();
    for (size_t idx = idx0; idx < n; idx += (size_t)gridDim.x * blockDim.x) {
        float c, s;
        int sl;
        if (early && idx == idx0) c = c0, s = s0, sl = sl0;
        else prep(idx, c, s, sl);
        if (idx < n1) {
            int t = (int)(idx / per_t), r = (int)(idx % per_t), h = r / per_h, i = r % per_h;
            size_t o = (size_t)t * C + (size_t)h * hd;
            uint16_t *kr = sl >= 0 ? kc + (size_t)sl * krow + (size_t)(h - nq) * hd : NULL;
            if (i >= half) { /* a dim past the rotary part: copied (and cached for k heads) */
                int d = rot + (i - half);
                float v = x[o + d];
                out[o + d] = v;
                if (kr) kr[d] = msm_f2bf(v);
                continue;
            }
            float a = x[o + i], b = x[o + i + half];
            float ra = msm_rope_lo(a, b, c, s), rb = msm_rope_hi(a, b, c, s);
            out[o + i] = ra;
            out[o + i + half] = rb;
            if (kr) {
                kr[i] = msm_f2bf(ra);
                kr[i + half] = msm_f2bf(rb);
            }
        } else {
            size_t j = idx - n1;
            int t = (int)(j / rest), col = (int)(j % rest);
            size_t o = (size_t)t * C + (size_t)nrot * hd + col;
            float v = x[o];
            out[o] = v;
            if (sl >= 0) vc[(size_t)sl * krow + col] = msm_f2bf(v);
        }
    }
}

/* Threads of rope_copy_kernel: per row, (rot/2 + hd - rot) per rotated head, then the rest. */
static size_t rope_copy_items(int T, int C, int nrot, int hd, int rot) {
    return (size_t)T * nrot * (size_t)(rot / 2 + hd - rot) + (size_t)T * (size_t)(C - nrot * hd);
}

extern "C" int msm_cuda_rope_copy(float *out, const float *x, const int32_t *pos, int T, int C,
                                  int nrot, int hd, int rot, float theta, msm_cuda_exec ex) {
    if (T < 0 || nrot <= 0 || !rope_shape_ok(hd, rot) || C < nrot * hd) return -EINVAL;
    if (T == 0) return 0;
    size_t n = rope_copy_items(T, C, nrot, hd, rot);
    CUDA_TRY(msm_launch(rope_copy_kernel, dim3(grid_for(n, 128)), dim3(128), 0, ex, out, x, pos, T,
                        C, nrot, hd, rot, theta, (const int32_t *)NULL, (uint16_t *)NULL, (uint16_t *)NULL, 0, 0,
                        ex.decode && ex.tune->small_early));
    return 0;
}

extern "C" int msm_cuda_rope_kv(float *out, const float *x, const int32_t *pos, const int32_t *slot,
                                uint16_t *kc, uint16_t *vc, int T, int nh, int kvh, int hd, int rot,
                                float theta, msm_cuda_exec ex) {
    if (T < 0 || nh <= 0 || kvh <= 0 || !rope_shape_ok(hd, rot) || !slot || !kc || !vc) return -EINVAL;
    if (T == 0) return 0;
    int nrot = nh + kvh, C = (nh + 2 * kvh) * hd;
    size_t n = rope_copy_items(T, C, nrot, hd, rot);
    CUDA_TRY(msm_launch(rope_copy_kernel, dim3(grid_for(n, 128)), dim3(128), 0, ex, out, x, pos, T,
                        C, nrot, hd, rot, theta, slot, kc, vc, nh, kvh, ex.decode && ex.tune->small_early));
    return 0;
}

/* ---- qk_norm: per-head RMSNorm of the q heads (wq) and k heads (wk) of qkv rows, v heads
 * copied; one warp per (token, head), lane l owning dims l, l+32, ... (hd <= 256). A warp reads
 * its whole head before writing it, so out may equal x. ---- */
#define QKN_WARPS 4

/* The same with the bf16 weights w [hd]. */
static __device__ __forceinline__ void qkn_norm(float (&v)[8], float ss, const uint16_t *w, int hd, float eps,
                                                int lane) {
    float wv[8];
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        wv[j] = d < hd ? msm_bf(w[d]) : 0.0f;
    }
    qkn_norm_wv(v, ss, wv, hd, eps, lane);
}

static __global__ void __launch_bounds__(QKN_WARPS * 32)
    qk_norm_kernel(float *out, const float *x, const uint16_t *wq,
                   const uint16_t *wk, int T, int C, int nh, int kvh, int hd, float eps) {
    msm_pdl_trigger();
    msm_pdl_wait();
    int heads = C / hd, lane = threadIdx.x & 31;
    int h = blockIdx.x * QKN_WARPS + threadIdx.x / 32, t = blockIdx.y;
    if (h >= heads) return;
    size_t o = (size_t)t * C + (size_t)h * hd;
    float v[8];
    float ss = qkn_load(x + o, hd, lane, v);
    const uint16_t *w = h < nh ? wq : h < nh + kvh ? wk : NULL;
    if (!w) { /* v head: copied */
#pragma unroll
        for (int j = 0; j < 8; j++)
            if (lane + 32 * j < hd) out[o + lane + 32 * j] = v[j];
        return;
    }
    qkn_norm(v, ss, w, hd, eps, lane);
#pragma unroll
    for (int j = 0; j < 8; j++)
        if (lane + 32 * j < hd) out[o + lane + 32 * j] = v[j];
}

extern "C" int msm_cuda_qk_norm(float *out, const float *x, const uint16_t *wq, const uint16_t *wk,
                                int T, int C, int nh, int kvh, int hd, float eps, msm_cuda_exec ex) {
    if (T < 0 || nh <= 0 || kvh < 0 || hd <= 0 || hd > 256 || C % hd || C < (nh + kvh) * hd ||
        T > 65535)
        return -EINVAL;
    if (T == 0) return 0;
    int heads = C / hd;
    dim3 grid((unsigned)((heads + QKN_WARPS - 1) / QKN_WARPS), (unsigned)T);
    CUDA_TRY(msm_launch(qk_norm_kernel, grid, dim3(QKN_WARPS * 32), 0, ex, out, x, wq, wk, T, C, nh,
                        kvh, hd, eps));
    return 0;
}

/* ---- qk_norm + rope_kv: qk_norm_kernel's warp per (token, head) and its arithmetic, then on the
 * normed values in registers rope_copy_kernel's (msm_rope_cs / _lo / _hi; the pair (d, d + rot/2)
 * is v[j], v[j + rot/64] of one lane), the k heads (all hd dims) and the v heads into the caches
 * at slot[t] (none when negative). So out and both caches are bitwise the two kernels'. The warp's
 * work after its loads is qkr_head (qk_rope.h), which the qkv norm-in GEMV's head epilogue
 * (msm_cuda_norm_linear_qk_rope) shares. ---- */
template <int HJ> /* rot / 64: v[j + HJ] is the other half of v[j]'s pair */
static __global__ void __launch_bounds__(QKN_WARPS * 32)
    qk_norm_rope_kv_kernel(float *out, const float *x, const uint16_t *wq, const uint16_t *wk, const int32_t *pos,
                           const int32_t *slot, uint16_t *kc, uint16_t *vc, int nh, int kvh, int hd, int rot,
                           float theta, float eps, bool early) {
    msm_pdl_trigger();
    int heads = nh + 2 * kvh, C = heads * hd, lane = threadIdx.x & 31;
    int h = blockIdx.x * QKN_WARPS + threadIdx.x / 32, t = blockIdx.y;
    /* what needs no earlier kernel's output: the slot, the norm weights, the cosines and sines; with
     * early (decode, msm_cuda_tuning.small_early) before the PDL wait, as the step's inputs were
     * written before its first kernel */
    int sl = -1;
    float wv[8], cs[HJ], sn[HJ];
    auto prologue = [&]() {
        sl = slot[t];
        const uint16_t *w = h < nh ? wq : wk;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int d = lane + 32 * j;
            wv[j] = h < nh + kvh && d < hd ? msm_bf(w[d]) : 0.0f;
        }
#pragma unroll
        for (int j = 0; j < HJ; j++) {
            cs[j] = sn[j] = 0.0f;
            if (h < nh + kvh) msm_rope_cs(pos[t], lane + 32 * j, rot, theta, &cs[j], &sn[j]);
        }
    };
    if (h < heads && early) prologue();
    msm_pdl_wait();
    if (h >= heads) return;
    if (!early) prologue();
    size_t o = (size_t)t * C + (size_t)h * hd;
    float v[8];
    float ss = qkn_load(x + o, hd, lane, v);
    qkr_dst dst = {out + o, kc, vc, sl};
    qkr_head<HJ>(v, ss, wv, cs, sn, h, nh, kvh, hd, eps, lane, dst);
}

extern "C" bool msm_cuda_qk_norm_rope_kv_fits(int T, int hd, int rot) {
    return T <= 65535 && rope_shape_ok(hd, rot) && hd <= 256 && rot % 64 == 0;
}

extern "C" int msm_cuda_qk_norm_rope_kv(float *out, const float *x, const uint16_t *wq, const uint16_t *wk,
                                        const int32_t *pos, const int32_t *slot, uint16_t *kc, uint16_t *vc, int T,
                                        int nh, int kvh, int hd, int rot, float theta, float eps, msm_cuda_exec ex) {
    if (T < 0 || nh <= 0 || kvh <= 0 || hd <= 0 || !rope_shape_ok(hd, rot) || !slot || !kc || !vc) return -EINVAL;
    if (!msm_cuda_qk_norm_rope_kv_fits(T, hd, rot)) return -ENOTSUP;
    if (T == 0) return 0;
    dim3 grid((unsigned)((nh + 2 * kvh + QKN_WARPS - 1) / QKN_WARPS), (unsigned)T);
#define QKR(HJ_) msm_launch(qk_norm_rope_kv_kernel<HJ_>, grid, dim3(QKN_WARPS * 32), 0, ex, out, x, wq, wk, pos, slot, \
                            kc, vc, nh, kvh, hd, rot, theta, eps, ex.decode && ex.tune->small_early)
    switch (rot / 64) {
    case 1: CUDA_TRY(QKR(1)); break;
    case 2: CUDA_TRY(QKR(2)); break;
    case 3: CUDA_TRY(QKR(3)); break;
    default: CUDA_TRY(QKR(4)); break;
    }
#undef QKR
    return 0;
}

/* ---- kv_write from rows with a stride (k, v read in place from the qkv rows): one thread per
 * element, f32 -> bf16 (round to nearest even) ---- */
static __global__ void kv_write_ld_kernel(uint16_t *kc, uint16_t *vc, const float *k, const float *v,
                                   size_t ld, const int32_t *slot, int T, int row) {
    msm_pdl_trigger();
    msm_pdl_wait();
    size_t n = (size_t)T * row;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        int t = (int)(idx / row), j = (int)(idx % row);
        int s = slot[t];
        if (s < 0) continue;
        kc[(size_t)s * row + j] = msm_f2bf(k[(size_t)t * ld + j]);
        vc[(size_t)s * row + j] = msm_f2bf(v[(size_t)t * ld + j]);
    }
}

extern "C" int msm_cuda_kv_write_ld(uint16_t *kc, uint16_t *vc, const float *k, const float *v,
                                    size_t ld, const int32_t *slot, int T, int kvh, int hd,
                                    msm_cuda_exec ex) {
    if (T < 0 || kvh <= 0 || hd <= 0 || ld < (size_t)kvh * hd) return -EINVAL;
    if (T == 0) return 0;
    size_t n = (size_t)T * kvh * hd;
    CUDA_TRY(msm_launch(kv_write_ld_kernel, dim3(grid_for(n, 256)), dim3(256), 0, ex, kc, vc, k, v, ld, slot, T, kvh * hd));
    return 0;
}

/* ---- kv_write: contiguous k, v rows (ld = kvh * hd), f32 -> bf16 (round to nearest even) ---- */
extern "C" int msm_cuda_kv_write(uint16_t *kc, uint16_t *vc, const float *k, const float *v,
                                 const int32_t *slot, int T, int kvh, int hd,
                                 msm_cuda_exec ex) {
    if (kvh <= 0 || hd <= 0) return -EINVAL;
    return msm_cuda_kv_write_ld(kc, vc, k, v, (size_t)kvh * hd, slot, T, kvh, hd, ex);
}

/* ---- add / scale_rows / sigmoid / swiglu ---- */
static __global__ void add_kernel(float *y, const float *a, const float *b, size_t n) {
    msm_pdl_trigger();
    msm_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

static __global__ void add4_kernel(float4 *y, const float4 *a, const float4 *b, size_t n4) {
    msm_pdl_trigger();
    msm_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n4;
         i += (size_t)gridDim.x * blockDim.x) {
        float4 p = a[i], q = b[i];
        y[i] = make_float4(p.x + q.x, p.y + q.y, p.z + q.z, p.w + q.w);
    }
}

extern "C" int msm_cuda_add(float *y, const float *a, const float *b, size_t n,
                            msm_cuda_exec ex) {
    if (n == 0) return 0;
    if (((uintptr_t)y | (uintptr_t)a | (uintptr_t)b) % 16 == 0 && n % 4 == 0) {
        CUDA_TRY(msm_launch(add4_kernel, dim3(grid_for(n / 4, 256)), dim3(256), 0, ex, (float4 *)y, (const float4 *)a, (const float4 *)b, n / 4));
    } else {
        CUDA_TRY(msm_launch(add_kernel, dim3(grid_for(n, 256)), dim3(256), 0, ex, y, a, b, n));
    }
    return 0;
}

static __global__ void scale_rows_kernel(float *y, const float *x, const float *s, int T, int D) {
    msm_pdl_trigger();
    msm_pdl_wait();
    size_t n = (size_t)T * D;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = x[i] * s[i / D];
}

extern "C" int msm_cuda_scale_rows(float *y, const float *x, const float *s, int T, int D,
                                   msm_cuda_exec ex) {
    if (T < 0 || D <= 0) return -EINVAL;
    if (T == 0) return 0;
    size_t n = (size_t)T * D;
    CUDA_TRY(msm_launch(scale_rows_kernel, dim3(grid_for(n, 256)), dim3(256), 0, ex, y, x, s, T, D));
    return 0;
}

static __global__ void sigmoid_kernel(float *y, const float *x, size_t n) {
    msm_pdl_trigger();
    msm_pdl_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = 1.0f / (1.0f + expf(-x[i]));
}

extern "C" int msm_cuda_sigmoid(float *y, const float *x, size_t n, msm_cuda_exec ex) {
    if (n == 0) return 0;
    CUDA_TRY(msm_launch(sigmoid_kernel, dim3(grid_for(n, 256)), dim3(256), 0, ex, y, x, n));
    return 0;
}

static __global__ void swiglu_kernel(float *y, const float *gu, int T, int I) {
    msm_pdl_trigger();
    msm_pdl_wait();
    size_t n = (size_t)T * I;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        size_t t = idx / I, i = idx % I;
        float g = gu[t * 2 * I + i], u = gu[t * 2 * I + I + i];
        y[idx] = g / (1.0f + expf(-g)) * u;
    }
}

extern "C" int msm_cuda_swiglu(float *y, const float *gu, int T, int I, msm_cuda_exec ex) {
    if (T < 0 || I <= 0) return -EINVAL;
    if (T == 0) return 0;
    size_t n = (size_t)T * I;
    CUDA_TRY(msm_launch(swiglu_kernel, dim3(grid_for(n, 256)), dim3(256), 0, ex, y, gu, T, I));
    return 0;
}

/* ---- gather rows: one block per output row (GATHER_ROWS) ---- */
static __global__ void gather_rows_kernel(float *out, const float *x, const int32_t *rows, int C) {
    msm_pdl_trigger();
    msm_pdl_wait();
    const float *src = x + (size_t)rows[blockIdx.x] * C;
    float *dst = out + (size_t)blockIdx.x * C;
    for (int i = threadIdx.x; i < C; i += blockDim.x) dst[i] = src[i];
}

extern "C" int msm_cuda_gather_rows(float *out, const float *x, const int32_t *rows, int R, int C,
                                    msm_cuda_exec ex) {
    if (R == 0) return 0;
    CUDA_TRY(msm_launch(gather_rows_kernel, dim3(R), dim3(256), 0, ex, out, x, rows, C));
    return 0;
}

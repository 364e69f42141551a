/* qk_rope.h: one warp's (token, head) of qkv rows through the q/k head norm, RoPE and the K/V
 * cache write: the arithmetic that qk_norm_rope_kv_kernel (elementwise.cu) and the qkv norm-in
 * GEMV's head epilogue (linear.cu, msm_cuda_norm_linear_qk_rope) share, so the two give the same
 * bits (not a public header). Lane l owns dims l, l + 32, ... of the head (hd <= 256). */
#ifndef MSM_QK_ROPE_H
#define MSM_QK_ROPE_H

#include "msm_cuda.h"

/* The head's dims d = lane + 32 j into v (ld(d); zero past hd); returns this lane's sum of squares
 * in j order. */
template <typename Ld>
static __device__ __forceinline__ float qkn_load_f(int hd, int lane, float (&v)[8], Ld ld) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        v[j] = d < hd ? ld(d) : 0.0f;
        ss = fmaf(v[j], v[j], ss);
    }
    return ss;
}

/* The head at xh (hd <= 256 values) into v, as qkn_load_f. */
static __device__ __forceinline__ float qkn_load(const float *xh, int hd, int lane, float (&v)[8]) {
    return qkn_load_f(hd, lane, v, [&](int d) { return xh[d]; });
}

/* v = rmsnorm(head) * wv from qkn_load's v and sum of squares (the warp's lanes together); wv[j]:
 * the norm weight of dim lane + 32 j, as float. */
static __device__ __forceinline__ void qkn_norm_wv(float (&v)[8], float ss, const float (&wv)[8], int hd, float eps,
                                                   int lane) {
    ss = msm_warp_sum(ss);
    float inv = 1.0f / sqrtf(ss / (float)hd + eps);
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        if (d < hd) v[j] = wv[j] * (v[j] * inv);
    }
}

/* Where a (token, head) of qkv rows goes: its row in out (outh: the head's first dim) and, when the
 * token has a slot (sl >= 0), the layer's caches kc / vc (rows of kvh * hd) for a k or v head. */
struct qkr_dst {
    float *outh;
    uint16_t *kc, *vc;
    int sl;
};

/* Head h of nh q, kvh k and kvh v heads, loaded by qkn_load_f into v with its sum of squares ss:
 * a v head is copied (and cached); a q or k head is normed with wv (qkn_norm_wv), its dims
 * d < rot / 2 = 32 HJ paired with d + rot / 2 (v[j], v[j + HJ] of one lane) and rotated by
 * msm_rope_lo / _hi with the lane's cosines and sines cs[j], sn[j] of dims lane + 32 j, then
 * written (and a k head cached). */
template <int HJ>
static __device__ __forceinline__ void qkr_head(float (&v)[8], float ss, const float (&wv)[8], const float (&cs)[HJ],
                                                const float (&sn)[HJ], int h, int nh, int kvh, int hd, float eps,
                                                int lane, qkr_dst o) {
    size_t krow = (size_t)kvh * hd;
    if (h >= nh + kvh) { /* v head: copied, and cached */
        uint16_t *vr = o.sl >= 0 ? o.vc + (size_t)o.sl * krow + (size_t)(h - nh - kvh) * hd : NULL;
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int d = lane + 32 * j;
            if (d < hd) {
                o.outh[d] = v[j];
                if (vr) vr[d] = msm_f2bf(v[j]);
            }
        }
        return;
    }
    qkn_norm_wv(v, ss, wv, hd, eps, lane);
#pragma unroll
    for (int j = 0; j < HJ; j++) { /* dims d = lane + 32 j < rot / 2 */
        float a = v[j], b = v[j + HJ];
        v[j] = msm_rope_lo(a, b, cs[j], sn[j]);
        v[j + HJ] = msm_rope_hi(a, b, cs[j], sn[j]);
    }
    uint16_t *kr = h >= nh && o.sl >= 0 ? o.kc + (size_t)o.sl * krow + (size_t)(h - nh) * hd : NULL;
#pragma unroll
    for (int j = 0; j < 8; j++) {
        int d = lane + 32 * j;
        if (d < hd) {
            o.outh[d] = v[j];
            if (kr) kr[d] = msm_f2bf(v[j]);
        }
    }
}

#endif

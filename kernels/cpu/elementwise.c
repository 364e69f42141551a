/* elementwise.c: the CPU reference kernels of the small per-step ops, the twins of
 * kernels/cuda/elementwise.cu: embedding and row gathers, RMSNorm (plain, per q/k head, fused with
 * the residual add or the MoE combine), RoPE (in place, over qkv rows, and with the K/V-cache
 * write), the KV-cache write, residual add, row scaling, sigmoid and SwiGLU. Plain float32 loops;
 * the fused kernels call the unfused ones in the unfused order, so fusion never changes a bit. */
#include "msm_kernels.h"

#include <math.h>
#include <string.h>

#include "msm_dtype.h"

void msm_cpu_embed(float *out, const float *table, const int32_t *ids, int T, int H) {
    for (int t = 0; t < T; t++)
        memcpy(out + (size_t)t * H, table + (size_t)ids[t] * H, sizeof(float) * (size_t)H);
}

void msm_cpu_rmsnorm(float *out, const float *x, const float *w, int rows, int dim, float eps) {
    for (int r = 0; r < rows; r++) {
        const float *xr = x + (size_t)r * dim;
        float *yr = out + (size_t)r * dim;
        float ss = 0.0f;
        for (int i = 0; i < dim; i++) ss += xr[i] * xr[i];
        float inv = 1.0f / sqrtf(ss / (float)dim + eps);
        for (int i = 0; i < dim; i++) yr[i] = w[i] * (xr[i] * inv);
    }
}

void msm_cpu_gather_rows(float *out, const float *x, const int32_t *rows, int R, int C) {
    msm_cpu_embed(out, x, rows, R, C); /* the same row gather as the embedding lookup */
}

void msm_cpu_qk_norm(float *out, const float *x, const float *wq, const float *wk, int T, int C,
                     int nh, int kvh, int hd, float eps) {
    if (out != x) memcpy(out, x, sizeof(float) * (size_t)T * (size_t)C);
    for (int t = 0; t < T; t++) {
        float *row = out + (size_t)t * C, *k = row + (size_t)nh * hd;
        msm_cpu_rmsnorm(row, row, wq, nh, hd, eps); /* the q heads lead the row */
        msm_cpu_rmsnorm(k, k, wk, kvh, hd, eps);    /* then the k heads; v heads untouched */
    }
}

void msm_cpu_rope(float *x, const int32_t *pos, int T, int nheads, int hd, int rot, float theta) {
    int half = rot / 2; /* dims [rot, hd) of every head pass through */
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            /* as HF: inv_freq = 1 / theta^(2i/rot) in float32, angle = pos * inv_freq */
            float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)rot);
            float ang = (float)pos[t] * inv_freq;
            float c = cosf(ang), s = sinf(ang);
            for (int h = 0; h < nheads; h++) {
                float *v = x + ((size_t)t * nheads + h) * hd;
                float a = v[i], b = v[i + half];
                v[i] = a * c - b * s;
                v[i + half] = b * c + a * s;
            }
        }
    }
}

void msm_cpu_rope_copy(float *out, const float *x, const int32_t *pos, int T, int C, int nrot,
                       int hd, int rot, float theta) {
    if (out != x) memcpy(out, x, sizeof(float) * (size_t)T * (size_t)C);
    for (int t = 0; t < T; t++) msm_cpu_rope(out + (size_t)t * C, pos + t, 1, nrot, hd, rot, theta);
}

void msm_cpu_rope_kv(float *out, const float *x, const int32_t *pos, const int32_t *slot,
                     float *kc, float *vc, int T, int nh, int kvh, int hd, int rot, float theta,
                     bool bf16) {
    int C = (nh + 2 * kvh) * hd;
    msm_cpu_rope_copy(out, x, pos, T, C, nh + kvh, hd, rot, theta); /* q and k heads rotated */
    msm_cpu_kv_write_ld(kc, vc, out + (size_t)nh * hd, out + (size_t)(nh + kvh) * hd, (size_t)C, slot,
                        T, kvh, hd, bf16);
}

void msm_cpu_kv_write_ld(float *kc, float *vc, const float *k, const float *v, size_t ld,
                         const int32_t *slot, int T, int kvh, int hd, bool bf16) {
    size_t row = (size_t)kvh * hd;
    for (int t = 0; t < T; t++) {
        if (slot[t] < 0) continue; /* a padding row */
        float *kd = kc + (size_t)slot[t] * row, *vd = vc + (size_t)slot[t] * row;
        const float *ks = k + (size_t)t * ld, *vs = v + (size_t)t * ld;
        if (!bf16) {
            memcpy(kd, ks, row * sizeof(float));
            memcpy(vd, vs, row * sizeof(float));
            continue;
        }
        /* the CUDA cache stores bf16 (round to nearest even): keep exactly those values */
        for (size_t j = 0; j < row; j++) {
            kd[j] = msm_bf16_to_f32(msm_f32_to_bf16(ks[j]));
            vd[j] = msm_bf16_to_f32(msm_f32_to_bf16(vs[j]));
        }
    }
}

void msm_cpu_kv_write(float *kc, float *vc, const float *k, const float *v, const int32_t *slot,
                      int T, int kvh, int hd) {
    msm_cpu_kv_write_ld(kc, vc, k, v, (size_t)kvh * hd, slot, T, kvh, hd, false);
}

void msm_cpu_add(float *y, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void msm_cpu_add_rmsnorm(float *sum, float *out, const float *a, const float *b, const float *w,
                         int rows, int dim, float eps) {
    msm_cpu_add(sum, a, b, (size_t)rows * (size_t)dim);
    msm_cpu_rmsnorm(out, sum, w, rows, dim, eps);
}

void msm_cpu_moe_combine_rmsnorm(float *sum, float *out, const float *x, const float *routed,
                                 const float *shared, const float *h, const float *wg,
                                 const float *w, int rows, int dim, float eps) {
    for (int r = 0; r < rows; r++) {
        size_t o = (size_t)r * (size_t)dim;
        float g, s;
        msm_cpu_linear(&g, h + o, wg, NULL, 1, 1, dim);
        msm_cpu_sigmoid(&s, &g, 1);
        msm_cpu_scale_rows(sum + o, shared + o, &s, 1, dim); /* shared * gate */
        msm_cpu_add(sum + o, routed + o, sum + o, (size_t)dim); /* routed + that */
        msm_cpu_add_rmsnorm(sum + o, out + o, x + o, sum + o, w, 1, dim, eps);
    }
}

void msm_cpu_scale_rows(float *y, const float *x, const float *s, int T, int D) {
    for (int t = 0; t < T; t++)
        for (int i = 0; i < D; i++) y[(size_t)t * D + i] = x[(size_t)t * D + i] * s[t];
}

void msm_cpu_sigmoid(float *y, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = 1.0f / (1.0f + expf(-x[i]));
}

void msm_cpu_swiglu(float *y, const float *gu, int T, int I) {
    for (int t = 0; t < T; t++) {
        const float *g = gu + (size_t)t * 2 * I, *u = g + I;
        for (int i = 0; i < I; i++) y[(size_t)t * I + i] = g[i] / (1.0f + expf(-g[i])) * u[i];
    }
}

/* moe.c: the CPU reference routed experts of a MoE layer, the twin of kernels/cuda/moe.cu: per
 * token, the selected experts' gate/up, SwiGLU and down, accumulated in slot order; and the same
 * split in two (gate/up + SwiGLU, then the down with a gated shared expert's down combined in:
 * pass fuse_shared_down), bit for bit the unsplit ops' arithmetic. */
#include "msm_kernels.h"

#include <math.h>

#include "msm_cpu_internal.h"

void msm_cpu_moe_experts(float *y, const float *x, const int32_t *ids, const float *w,
                         const float *gate_up, const float *down, int T, int H, int I, int k,
                         float *scratch) {
    float *gu = scratch, *act = scratch + 2 * (size_t)I;
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * H;
        const float *xt = x + (size_t)t * H;
        for (int i = 0; i < H; i++) yt[i] = 0.0f;
        for (int j = 0; j < k; j++) {
            int e = ids[(size_t)t * k + j];
            float wt = w[(size_t)t * k + j];
            msm_cpu_linear(gu, xt, gate_up + (size_t)e * 2 * I * H, NULL, 1, 2 * I, H);
            msm_cpu_swiglu(act, gu, 1, I);
            const float *de = down + (size_t)e * H * I;
            for (int h = 0; h < H; h++) yt[h] += wt * msm__cpu_dot(de + (size_t)h * I, act, I);
        }
    }
}


void msm_cpu_moe_gateup(float *act, const float *x, const int32_t *ids, const float *gate_up, int T, int H,
                        int I, int k) {
    for (int t = 0; t < T; t++) {
        const float *xt = x + (size_t)t * H;
        for (int j = 0; j < k; j++) {
            const float *ge = gate_up + (size_t)ids[(size_t)t * k + j] * 2 * I * H;
            float *a = act + ((size_t)t * k + j) * I;
            for (int i = 0; i < I; i++) { /* msm_cpu_linear's products (+ 0.0f: its absent bias) */
                float g = msm__cpu_dot(xt, ge + (size_t)i * H, H) + 0.0f;
                float u = msm__cpu_dot(xt, ge + (size_t)(I + i) * H, H) + 0.0f;
                a[i] = g / (1.0f + expf(-g)) * u; /* msm_cpu_swiglu's */
            }
        }
    }
}

void msm_cpu_moe_down_shared(float *y, const float *act, const int32_t *ids, const float *w, const float *sact,
                             const float *h, const float *down, const float *sdown, const float *wg, int T, int H,
                             int I, int Is, int k) {
    for (int t = 0; t < T; t++) {
        float *yt = y + (size_t)t * H;
        for (int i = 0; i < H; i++) yt[i] = 0.0f;
        for (int j = 0; j < k; j++) { /* msm_cpu_moe_experts's sum, in slot order */
            const float *de = down + (size_t)ids[(size_t)t * k + j] * H * I, *a = act + ((size_t)t * k + j) * I;
            float wt = w[(size_t)t * k + j];
            for (int o = 0; o < H; o++) yt[o] += wt * msm__cpu_dot(de + (size_t)o * I, a, I);
        }
        /* msm_cpu_moe_combine's: the gate as a one-row linear, its sigmoid, shared * gate, routed + that */
        float g = msm__cpu_dot(h + (size_t)t * H, wg, H) + 0.0f, s;
        msm_cpu_sigmoid(&s, &g, 1);
        const float *st = sact + (size_t)t * Is;
        for (int o = 0; o < H; o++) {
            float sh = msm__cpu_dot(st, sdown + (size_t)o * Is, Is) + 0.0f;
            yt[o] = yt[o] + sh * s;
        }
    }
}

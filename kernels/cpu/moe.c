/* moe.c: the CPU reference routed experts of a MoE layer, the twin of kernels/cuda/moe.cu: per
 * token, the selected experts' gate/up, SwiGLU and down, accumulated in slot order. */
#include "msm_kernels.h"

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


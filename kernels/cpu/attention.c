/* attention.c: the CPU reference causal paged attention over the KV cache, the twin of
 * kernels/cuda/attention.cu. Softmax in float32 (online, one pass over the context). */
#include "msm_kernels.h"

#include <math.h>

#include "msm_cpu_internal.h"

void msm_cpu_attention(float *out, const float *q, const float *kc, const float *vc,
                       const int32_t *seq, const int32_t *pos, const int32_t *block_tables,
                       int max_blocks, int T, int nh, int kvh, int hd, float scale) {
    int group = nh / kvh;
    size_t row = (size_t)kvh * hd;
    for (int t = 0; t < T; t++) {
        const int32_t *bt = block_tables + (size_t)seq[t] * max_blocks;
        int n = pos[t] + 1;
        for (int h = 0; h < nh; h++) {
            const float *qh = q + ((size_t)t * nh + h) * hd;
            float *oh = out + ((size_t)t * nh + h) * hd;
            int kh = h / group;
            /* online softmax: one pass over the context */
            float mx = -INFINITY, den = 0.0f;
            for (int d = 0; d < hd; d++) oh[d] = 0.0f;
            for (int p = 0; p < n; p++) {
                size_t s = (size_t)bt[p / MSM_KV_BLOCK] * MSM_KV_BLOCK + (size_t)(p % MSM_KV_BLOCK);
                const float *kp = kc + s * row + (size_t)kh * hd;
                const float *vp = vc + s * row + (size_t)kh * hd;
                float sc = msm__cpu_dot(qh, kp, hd) * scale;
                float nm = sc > mx ? sc : mx;
                float corr = expf(mx - nm), e = expf(sc - nm);
                den = den * corr + e;
                for (int d = 0; d < hd; d++) oh[d] = oh[d] * corr + e * vp[d];
                mx = nm;
            }
            float inv = 1.0f / den;
            for (int d = 0; d < hd; d++) oh[d] *= inv;
        }
    }
}

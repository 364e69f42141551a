/* router.c: the CPU reference MoE router (softmax + top-k), the twin of kernels/cuda/router.cu. */
#include "msm_kernels.h"

#include <math.h>

void msm_cpu_router_topk(int32_t *ids, float *w, const float *logits, int T, int E, int k,
                         bool norm) {
    for (int t = 0; t < T; t++) {
        const float *l = logits + (size_t)t * E;
        float mx = -INFINITY;
        for (int e = 0; e < E; e++) mx = l[e] > mx ? l[e] : mx;
        float sum = 0.0f;
        for (int e = 0; e < E; e++) sum += expf(l[e] - mx);
        int32_t *id = ids + (size_t)t * k;
        float *wt = w + (size_t)t * k;
        /* selection by the logits (softmax is monotonic), k passes: k is small */
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int q = 0; q < j; q++) taken |= id[q] == e;
                if (!taken && (best < 0 || l[e] > l[best])) best = e;
            }
            id[j] = best;
            wt[j] = expf(l[best] - mx) / sum;
        }
        if (norm) {
            float s = 0.0f;
            for (int j = 0; j < k; j++) s += wt[j];
            for (int j = 0; j < k; j++) wt[j] /= s;
        }
    }
}

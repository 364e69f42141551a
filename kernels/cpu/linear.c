/* linear.c: the CPU reference linear layer, y = x . W^T (+ b), the twin of kernels/cuda/linear.cu.
 * Accumulation in float32, matching how HF transformers computes in float32. */
#include "msm_kernels.h"

#include "msm_cpu_internal.h"

void msm_cpu_linear(float *y, const float *x, const float *w, const float *bias, int T, int N,
                    int K) {
    /* Weight rows outer so each row is read once from memory for all tokens (decode is
     * bandwidth-bound on the weights). */
    for (int n = 0; n < N; n++) {
        const float *wr = w + (size_t)n * K;
        float b = bias ? bias[n] : 0.0f;
        for (int t = 0; t < T; t++) y[(size_t)t * N + n] = msm__cpu_dot(x + (size_t)t * K, wr, K) + b;
    }
}

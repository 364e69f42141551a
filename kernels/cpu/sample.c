/* sample.c: the CPU reference token sampler and the counter-based RNG it shares with the GPU, the
 * twin of kernels/cuda/sample.cu. */
#include "msm_kernels.h"

#include <math.h>
#include <string.h>

/* splitmix64-style mixing of (seed, counter): a stateless, counter-based generator. */
float msm_rng_uniform(uint64_t seed, uint64_t counter) {
    uint64_t z = seed * 0x9E3779B97F4A7C15ull + counter * 0xBF58476D1CE4E5B9ull + 0x94D049BB133111EBull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (float)(z >> 40) * (1.0f / 16777216.0f); /* 24 random bits */
}

static int argmax(const float *l, int V) {
    int best = 0;
    for (int v = 1; v < V; v++)
        if (l[v] > l[best]) best = v;
    return best;
}

static bool all_finite(const float *l, int V) {
    for (int v = 0; v < V; v++)
        if (!isfinite(l[v])) return false;
    return true;
}

void msm_cpu_sample(int32_t *out, const float *logits, const msm_sample_params *p, int R, int V,
                    float *scratch) {
    float *prob = scratch;
    for (int r = 0; r < R; r++) {
        const float *l = logits + (size_t)r * V;
        const msm_sample_params *sp = p + r;
        if (!all_finite(l, V)) {
            out[r] = MSM_SAMPLE_NONFINITE; /* nothing can be drawn from NaN or infinite logits */
            continue;
        }
        if (!(sp->temperature > 0.0f)) {
            out[r] = argmax(l, V);
            continue;
        }
        /* Probabilities at temperature; then keep the tokens whose probability is at least the
         * k-th largest (top-k) and whose higher-ranked mass is below top_p (top-p), found by
         * thresholds rather than a sort so the GPU twin can do the same with reductions. */
        float mx = l[argmax(l, V)];
        float sum = 0.0f;
        for (int v = 0; v < V; v++) sum += (prob[v] = expf((l[v] - mx) / sp->temperature));
        for (int v = 0; v < V; v++) prob[v] /= sum;
        float thr = 0.0f; /* keep prob >= thr */
        if (sp->top_k > 0 && sp->top_k < V) {
            /* k-th largest by repeated max: O(k V), k is small in practice; cap the work */
            float *tmp = scratch + V;
            memcpy(tmp, prob, sizeof(float) * (size_t)V);
            float kth = 0.0f;
            for (int j = 0; j < sp->top_k; j++) {
                int b = argmax(tmp, V);
                kth = tmp[b];
                tmp[b] = -1.0f;
            }
            thr = kth;
        }
        if (sp->top_p > 0.0f && sp->top_p < 1.0f) {
            /* smallest set of most-likely tokens whose mass reaches top_p: walk down distinct
             * probability levels */
            float *tmp = scratch + V;
            memcpy(tmp, prob, sizeof(float) * (size_t)V);
            float mass = 0.0f, level = 1.0f;
            while (mass < sp->top_p) {
                int b = argmax(tmp, V);
                if (tmp[b] < 0.0f) break;
                level = tmp[b];
                mass += tmp[b];
                tmp[b] = -1.0f;
            }
            if (level > thr) thr = level;
        }
        float kept = 0.0f;
        for (int v = 0; v < V; v++) kept += prob[v] >= thr ? prob[v] : 0.0f;
        float u = msm_rng_uniform(sp->seed, sp->counter) * kept, c = 0.0f;
        int pick = argmax(l, V);
        for (int v = 0; v < V; v++) {
            if (prob[v] < thr) continue;
            c += prob[v];
            if (u < c) {
                pick = v;
                break;
            }
        }
        out[r] = pick;
    }
}

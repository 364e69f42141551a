/* CPU reference kernels (see msm_kernels.h): plain, readable float32 loops. They are the oracle
 * for the CUDA kernels and the math of the CPU backend. Accumulation is in float32 except where a
 * comment says otherwise, matching how HF transformers computes in float32. */
#include "msm_kernels.h"

#include <float.h>
#include <math.h>
#include <string.h>

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

/* Dot product with 8 independent partial sums so the compiler can vectorise it. */
static float dot(const float *a, const float *b, int n) {
    float s[8] = {0};
    int i = 0;
    for (; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += a[i + j] * b[i + j];
    float r = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

void msm_cpu_linear(float *y, const float *x, const float *w, const float *bias, int T, int N,
                    int K) {
    /* Weight rows outer so each row is read once from memory for all tokens (decode is
     * bandwidth-bound on the weights). */
    for (int n = 0; n < N; n++) {
        const float *wr = w + (size_t)n * K;
        float b = bias ? bias[n] : 0.0f;
        for (int t = 0; t < T; t++) y[(size_t)t * N + n] = dot(x + (size_t)t * K, wr, K) + b;
    }
}

void msm_cpu_rope(float *x, const int32_t *pos, int T, int nheads, int hd, float theta) {
    int half = hd / 2;
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < half; i++) {
            /* as HF: inv_freq = 1 / theta^(2i/hd) in float32, angle = pos * inv_freq */
            float inv_freq = 1.0f / powf(theta, (float)(2 * i) / (float)hd);
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

void msm_cpu_kv_write(float *kc, float *vc, const float *k, const float *v, const int32_t *slot,
                      int T, int kvh, int hd) {
    size_t row = (size_t)kvh * hd;
    for (int t = 0; t < T; t++) {
        memcpy(kc + (size_t)slot[t] * row, k + (size_t)t * row, row * sizeof(float));
        memcpy(vc + (size_t)slot[t] * row, v + (size_t)t * row, row * sizeof(float));
    }
}

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
                float sc = dot(qh, kp, hd) * scale;
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
            for (int h = 0; h < H; h++) yt[h] += wt * dot(de + (size_t)h * I, act, I);
        }
    }
}

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

void msm_cpu_sample(int32_t *out, const float *logits, const msm_sample_params *p, int R, int V,
                    float *scratch) {
    float *prob = scratch;
    for (int r = 0; r < R; r++) {
        const float *l = logits + (size_t)r * V;
        const msm_sample_params *sp = p + r;
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

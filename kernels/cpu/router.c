/* router.c: the CPU reference MoE routers, the twins of kernels/cuda/router.cu: softmax + top-k
 * (Qwen2/3-MoE, Mixtral) and the group-limited sigmoid router with a selection bias (GLM-4.5). */
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

/* HF Glm4MoeTopkRouter.forward, step by step (transformers 5.17):
 *   scores = router_logits.sigmoid()
 *   scores_for_choice = scores + self.e_score_correction_bias
 *   group_scores = scores_for_choice.view(-1, n_group, E // n_group).topk(2, dim=-1)[0].sum(dim=-1)
 *   group_idx = torch.topk(group_scores, k=topk_group, dim=-1, sorted=False)[1]
 *   scores_for_choice = scores_for_choice.masked_fill(~score_mask.bool(), float("-inf"))
 *   topk_indices = torch.topk(scores_for_choice, k=top_k, dim=-1, sorted=False)[1]
 *   topk_weights = scores.gather(1, topk_indices)
 *   if norm_topk_prob: topk_weights /= topk_weights.sum(dim=-1, keepdim=True) + 1e-20
 *   topk_weights = topk_weights * routed_scaling_factor
 * Ties (which torch leaves unspecified) go to the lowest group / expert id; ids come out highest
 * choice score first (HF's order is unspecified and only changes the order experts are summed). */
void msm_cpu_router_group_topk(int32_t *ids, float *w, const float *logits, const float *bias,
                               int T, int E, int k, int n_group, int topk_group, bool norm,
                               float scale, float *scratch) {
    int per = E / n_group;
    float *s = scratch, *c = scratch + E, *gs = scratch + 2 * (size_t)E; /* [E], [E], [n_group] */
    for (int t = 0; t < T; t++) {
        const float *l = logits + (size_t)t * E;
        for (int e = 0; e < E; e++) {
            s[e] = 1.0f / (1.0f + expf(-l[e]));
            c[e] = s[e] + bias[e];
        }
        /* each group's score: its two highest choice scores added */
        for (int g = 0; g < n_group; g++) {
            float a1 = -INFINITY, a2 = -INFINITY;
            for (int e = g * per; e < (g + 1) * per; e++) {
                if (c[e] > a1) a2 = a1, a1 = c[e];
                else if (c[e] > a2) a2 = c[e];
            }
            gs[g] = a1 + a2;
        }
        /* group g is kept when fewer than topk_group groups rank before it; the experts of the
         * other groups drop out (-inf) */
        for (int g = 0; g < n_group && topk_group < n_group; g++) {
            int before = 0;
            for (int q = 0; q < n_group; q++) before += gs[q] > gs[g] || (gs[q] == gs[g] && q < g);
            if (before >= topk_group)
                for (int e = g * per; e < (g + 1) * per; e++) c[e] = -INFINITY;
        }
        int32_t *id = ids + (size_t)t * k;
        float *wt = w + (size_t)t * k;
        for (int j = 0; j < k; j++) { /* k passes, as the softmax router */
            int best = -1;
            for (int e = 0; e < E; e++) {
                bool taken = false;
                for (int q = 0; q < j; q++) taken |= id[q] == e;
                if (!taken && (best < 0 || c[e] > c[best])) best = e;
            }
            id[j] = best;
            wt[j] = s[best];
        }
        if (norm) {
            float sum = 0.0f;
            for (int j = 0; j < k; j++) sum += wt[j];
            float den = sum + 1e-20f;
            for (int j = 0; j < k; j++) wt[j] /= den;
        }
        for (int j = 0; j < k; j++) wt[j] *= scale;
    }
}

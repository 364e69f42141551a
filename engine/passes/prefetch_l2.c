/* Pass prefetch_l2: each layer pulls the big weights it reads after its attention into L2 while
 * the attention runs (a PREFETCH node on the AUX stream).
 *
 * Why: from the attention to the router a decode layer is a chain of small, latency-bound
 * kernels (attention, o_proj, the residual norm, the router) during which HBM mostly idles,
 * while the weights read next (o_proj, the shared expert's gate/up and down, a dense MLP's) are
 * known before the step runs. Brought to L2 meanwhile, they are read from there when their
 * GEMVs run, beside the routed experts' stream from HBM (the CUDA backend: msm_cuda_l2_prefetch;
 * the CPU backend ignores the node). Values are untouched, so results are the same bits.
 *
 * Rewrite, per layer: right before its ATTENTION, RECORD on MAIN (after the qkv projection and
 * RoPE, so the prefetch does not compete with the qkv GEMV's own stream), WAIT on AUX, PREFETCH
 * on AUX. The node takes the weights of the layer's nodes after the ATTENTION, in node order:
 * not the routed experts' (which of their rows are read depends on the router, and the router is
 * theirs) nor any under 1/PREFETCH_MIN_PART of the largest (norms, gates, biases: not worth the
 * lines), at most MSM_NODE_MAX_W of them. A layer's shared-expert nodes, which multi_stream_moe put on AUX after a
 * later fork, follow it in the AUX stream's order. One RECORD on AUX and its WAIT on MAIN at the
 * end of the graph join whatever no later join covers (the verifier's V3; a layer without a
 * shared expert has no other join). Only with multi_stream (the one-stream graph stays one
 * stream). A layer with no ATTENTION, no such weight, or a PREFETCH already is left alone, which
 * makes the pass idempotent. It touches no collective and no value, so it runs last. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "msm_pass.h"

/* A weight under 1/PREFETCH_MIN_PART of the layer's largest candidate is left out. */
#define PREFETCH_MIN_PART 64

static size_t weight_elems(const msm_graph *g, int wi) {
    const msm_weight *w = &g->weights[wi];
    return (size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols;
}

#define MAX_CANDIDATES 32

/* The distinct weights read after the ATTENTION at node a, in its layer, by nodes not of the routed
 * experts, in node order (the first MAX_CANDIDATES): into ids; returns their number. */
static int candidates(const msm_graph *g, int a, int *ids) {
    int n = 0;
    for (int i = a + 1; i < g->n_nodes; i++) {
        const msm_node *x = &g->nodes[i];
        if (x->layer != g->nodes[a].layer || x->role == MSM_ROLE_ROUTED || x->op == MSM_OP_PREFETCH) continue;
        for (int j = 0; j < MSM_NODE_MAX_W && n < MAX_CANDIDATES; j++) {
            int wi = x->w[j];
            bool dup = wi < 0 || wi >= g->n_weights;
            for (int m = 0; m < n && !dup; m++) dup = ids[m] == wi;
            if (!dup) ids[n++] = wi;
        }
    }
    return n;
}

/* The PREFETCH node for the ATTENTION at node a: the first MSM_NODE_MAX_W candidates of at least
 * 1/PREFETCH_MIN_PART of the largest one (which leaves out norms, gates and biases), in node order;
 * *n_w of them (0: none). */
static msm_node prefetch_for(const msm_graph *g, int a, int *n_w) {
    msm_node p = {.op = MSM_OP_PREFETCH, .stream = MSM_STREAM_AUX, .role = MSM_ROLE_ATTN, .layer = g->nodes[a].layer,
                  .w = {-1, -1, -1}};
    int ids[MAX_CANDIDATES], n = candidates(g, a, ids), k = 0;
    size_t most = 0;
    for (int i = 0; i < n; i++)
        if (weight_elems(g, ids[i]) > most) most = weight_elems(g, ids[i]);
    for (int i = 0; i < n && k < MSM_NODE_MAX_W; i++)
        if (weight_elems(g, ids[i]) * PREFETCH_MIN_PART >= most) p.w[k++] = ids[i];
    *n_w = k;
    return p;
}

/* Whether layer L of g has a PREFETCH already. */
static bool has_prefetch(const msm_graph *g, int L) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].layer == L && g->nodes[i].op == MSM_OP_PREFETCH) return true;
    return false;
}

int msm_pass_prefetch_l2(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err) {
    (void)o;
    msm_graph *g = msm_graph_clone(in);
    msm_node *old = g ? malloc(sizeof *old * (size_t)(in->n_nodes ? in->n_nodes : 1)) : NULL;
    bool *done = g ? calloc((size_t)(in->n_layers > 0 ? in->n_layers : 1), sizeof *done) : NULL;
    if (!g || !old || !done) {
        msm_graph_free(g);
        free(old);
        free(done);
        return msm_err_set(err, -ENOMEM, "out of memory in prefetch_l2");
    }
    int n = in->n_nodes, r = 0, added = 0;
    memcpy(old, in->nodes, sizeof *old * (size_t)n);
    g->n_nodes = 0;
    for (int i = 0; i < n && r >= 0; i++) {
        const msm_node *x = &old[i];
        int L = x->layer, n_w = 0;
        if (x->op == MSM_OP_ATTENTION && x->stream == MSM_STREAM_MAIN && L >= 0 && L < in->n_layers && !done[L] &&
            !has_prefetch(in, L)) {
            done[L] = true; /* one a layer: its first ATTENTION */
            msm_node p = prefetch_for(in, i, &n_w);
            if (n_w > 0) {
                int ev = g->n_events++;
                msm_node e = {.op = MSM_OP_EVENT_RECORD, .stream = MSM_STREAM_MAIN, .role = MSM_ROLE_ATTN, .layer = L,
                              .event = ev, .w = {-1, -1, -1}};
                r = msm_graph_add(g, &e);
                e.op = MSM_OP_EVENT_WAIT, e.stream = MSM_STREAM_AUX;
                if (r >= 0) r = msm_graph_add(g, &e);
                if (r >= 0) r = msm_graph_add(g, &p);
                added++;
            }
        }
        if (r >= 0) r = msm_graph_add(g, x);
    }
    if (r >= 0 && added > 0) { /* the final join */
        int ev = g->n_events++;
        msm_node e = {.op = MSM_OP_EVENT_RECORD, .stream = MSM_STREAM_AUX, .role = MSM_ROLE_NONE, .layer = -1,
                      .event = ev, .w = {-1, -1, -1}};
        r = msm_graph_add(g, &e);
        e.op = MSM_OP_EVENT_WAIT, e.stream = MSM_STREAM_MAIN;
        if (r >= 0) r = msm_graph_add(g, &e);
    }
    free(old);
    free(done);
    if (r < 0) {
        msm_graph_free(g);
        return msm_err_set(err, -ENOMEM, "out of memory in prefetch_l2");
    }
    *ret = g;
    return 0;
}

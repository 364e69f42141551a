/* Pass prefetch_weights: pull the weights a layer reads after its attention into L2 while the
 * attention runs.
 *
 * At small batches a layer's attention block (QK norm, RoPE, attention over a short KV cache)
 * reads little from HBM for several microseconds, and its MoE block then reads at the bandwidth
 * limit. A PREFETCH node on the AUX stream, forked right after the layer's qkv projection, pulls
 * the weights read next into L2 within a budget of o->prefetch_kb KiB a layer, in this order:
 * the o_proj, the router, then the head of the first projection of the layer's shared-expert (or
 * dense MLP) branch, so the MoE block has fewer bytes to stream from HBM.
 *
 *   L main LINEAR qkv            L main LINEAR qkv
 *   L main QK_NORM ...     →     L main EVENT_RECORD evF
 *                                L aux  EVENT_WAIT evF
 *                                L aux  PREFETCH o_proj [kb], router [kb], shared_gate_up [kb]
 *                                L main QK_NORM ...
 *
 * A hint only: the node reads and writes no value, so every value keeps its bits whatever the
 * prefetch does (the backends' results are the same with the pass on or off). The AUX stream
 * runs in issue order, so a later shared-expert branch's join (multi_stream_moe) joins the
 * prefetch too; where no aux work follows the last prefetch, one join (RECORD on aux, WAIT on
 * main) goes before the step's head. Runs last (the fused pairs it stands between are formed).
 * Idempotent: a layer with a PREFETCH is left alone. */
#include <errno.h>
#include <stdlib.h>

#include "msm_pass.h"

/* KiB of weight wi at 2 bytes an element (msm_attr_prefetch), capped at the budget left. */
static int take_kb(const msm_graph *g, int wi, int *left) {
    if (wi < 0 || *left <= 0) return 0;
    const msm_weight *w = &g->weights[wi];
    long long kb = ((long long)w->n_expert * w->rows * w->cols * 2 + 1023) / 1024;
    int k = kb < *left ? (int)kb : *left;
    *left -= k;
    return k;
}

/* Index of the first node of layer L on MAIN with the given role and op (-1: none); with `reads`
 * >= 0, only one whose first input is that value. */
static int find(const msm_graph *g, int L, msm_role role, msm_op op, msm_op op2, int reads) {
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *n = &g->nodes[i];
        if (n->layer == L && n->role == role && (n->op == op || n->op == op2) && n->n_in > 0 &&
            (reads < 0 || n->in[0] == reads))
            return i;
    }
    return -1;
}

/* The PREFETCH node of layer L (w and kb filled; no weight: n_w 0). */
static msm_node layer_prefetch(const msm_graph *g, int L, int budget_kb, int *n_w) {
    msm_node p = {.op = MSM_OP_PREFETCH, .stream = MSM_STREAM_AUX, .role = MSM_ROLE_ATTN, .layer = L,
                  .w = {-1, -1, -1}};
    int left = budget_kb, k = 0;
    int att = find(g, L, MSM_ROLE_ATTN, MSM_OP_ATTENTION, MSM_OP_ATTENTION, -1);
    int o = att < 0 ? -1 : find(g, L, MSM_ROLE_ATTN, MSM_OP_LINEAR, MSM_OP_LINEAR_ADD_RMSNORM, g->nodes[att].out[0]);
    int rt = find(g, L, MSM_ROLE_ROUTED, MSM_OP_ROUTER_LINEAR_TOPK, MSM_OP_LINEAR, -1);
    int sh = find(g, L, MSM_ROLE_SHARED, MSM_OP_LINEAR, MSM_OP_LINEAR, -1);
    if (sh < 0) sh = find(g, L, MSM_ROLE_MLP, MSM_OP_LINEAR, MSM_OP_LINEAR, -1);
    int cand[3] = {o, rt, sh};
    for (int c = 0; c < 3; c++) {
        if (cand[c] < 0) continue;
        int wi = g->nodes[cand[c]].w[0], kb = take_kb(g, wi, &left);
        if (kb <= 0) continue;
        p.w[k] = wi;
        p.attr.prefetch.kb[k] = kb;
        k++;
    }
    *n_w = k;
    return p;
}

/* Index of layer L's qkv projection (its first attention LINEAR on MAIN), or -1. */
static int qkv_of(const msm_graph *g, int L) {
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *n = &g->nodes[i];
        if (n->layer == L && n->role == MSM_ROLE_ATTN && n->op == MSM_OP_LINEAR && n->stream == MSM_STREAM_MAIN)
            return i;
    }
    return -1;
}

/* Inserts a fork (RECORD on MAIN, WAIT on AUX) and p on AUX before node `at`. */
static int fork_prefetch(msm_graph *g, int at, const msm_node *p) {
    int ev = g->n_events++;
    msm_node rec = {.op = MSM_OP_EVENT_RECORD, .stream = MSM_STREAM_MAIN, .role = p->role, .layer = p->layer,
                    .event = ev, .w = {-1, -1, -1}};
    msm_node wait = rec;
    wait.op = MSM_OP_EVENT_WAIT;
    wait.stream = MSM_STREAM_AUX;
    int r = msm_graph_insert(g, at, &rec);
    if (r >= 0) r = msm_graph_insert(g, at + 1, &wait);
    if (r >= 0) r = msm_graph_insert(g, at + 2, p);
    return r < 0 ? r : 0;
}

/* The experiment of o->prefetch_next_kb: in a layer without a shared expert (nothing else on AUX),
 * the next layer's qkv while the router runs, forked before the layer's first routed node. */
static int next_qkv(msm_graph *g, int L, int kb) {
    int q = qkv_of(g, L + 1), at = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *n = &g->nodes[i];
        if (n->layer == L && n->role == MSM_ROLE_SHARED) return 0;
        if (at < 0 && n->layer == L && n->role == MSM_ROLE_ROUTED) at = i;
    }
    if (q < 0 || at < 0) return 0;
    msm_node p = {.op = MSM_OP_PREFETCH, .stream = MSM_STREAM_AUX, .role = MSM_ROLE_ROUTED, .layer = L,
                  .w = {g->nodes[q].w[0], -1, -1}};
    int left = kb;
    p.attr.prefetch.kb[0] = take_kb(g, p.w[0], &left);
    return fork_prefetch(g, at, &p);
}

/* Rewrites layer L of g; returns 0 (done or nothing to do) or -ENOMEM. */
static int rewrite_layer(msm_graph *g, int L, int budget_kb, int next_kb) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].layer == L && g->nodes[i].op == MSM_OP_PREFETCH) return 0; /* already rewritten */
    int n_w = 0, qkv = qkv_of(g, L);
    msm_node p = layer_prefetch(g, L, budget_kb, &n_w);
    if (next_kb > 0) {
        int r = next_qkv(g, L, next_kb);
        if (r) return r;
    }
    if (qkv < 0 || n_w == 0) return 0;
    return fork_prefetch(g, qkv + 1, &p);
}

/* Where the aux stream's last node is not joined into main (V3 of the verifier), a join before
 * the first node after the layers (the head), or at the end. */
static int join_tail(msm_graph *g) {
    int last_aux = -1;
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].stream == MSM_STREAM_AUX) last_aux = i;
    if (last_aux < 0) return 0;
    const msm_node *t = &g->nodes[last_aux];
    if (t->op == MSM_OP_EVENT_RECORD)
        for (int i = last_aux + 1; i < g->n_nodes; i++)
            if (g->nodes[i].op == MSM_OP_EVENT_WAIT && g->nodes[i].stream == MSM_STREAM_MAIN &&
                g->nodes[i].event == t->event)
                return 0;
    int at = g->n_nodes;
    for (int i = last_aux + 1; i < g->n_nodes && at == g->n_nodes; i++)
        if (g->nodes[i].layer < 0) at = i;
    int ev = g->n_events++;
    msm_node rec = {.op = MSM_OP_EVENT_RECORD, .stream = MSM_STREAM_AUX, .role = MSM_ROLE_ATTN,
                    .layer = t->layer, .event = ev, .w = {-1, -1, -1}};
    msm_node wait = rec;
    wait.op = MSM_OP_EVENT_WAIT;
    wait.stream = MSM_STREAM_MAIN;
    int r = msm_graph_insert(g, at, &rec);
    if (r >= 0) r = msm_graph_insert(g, at + 1, &wait);
    return r < 0 ? r : 0;
}

int msm_pass_prefetch_weights(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err) {
    msm_graph *g = msm_graph_clone(in);
    if (!g) return msm_err_set(err, -ENOMEM, "out of memory in prefetch_weights");
    int r = 0;
    for (int L = 0; r == 0 && L < g->n_layers && o->prefetch_kb > 0; L++)
        r = rewrite_layer(g, L, o->prefetch_kb, o->prefetch_next_kb);
    if (r == 0) r = join_tail(g);
    if (r < 0) {
        msm_graph_free(g);
        return msm_err_set(err, r, "out of memory in prefetch_weights");
    }
    *ret = g;
    return 0;
}

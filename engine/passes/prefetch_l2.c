/* Pass prefetch_l2: each layer pulls what it reads next into L2 while latency-bound kernels run:
 * the big weights read after its attention (PREFETCH), with prefetch_l2_next the next layer's qkv
 * weight, with prefetch_kv its K/V cache rows (PREFETCH_KV); nodes on the AUX stream.
 *
 * Why: from the attention to the router a decode layer is a chain of small, latency-bound
 * kernels (attention, o_proj, the residual norm, the router) during which HBM mostly idles,
 * while the weights read next (o_proj, the shared expert's gate/up and down, a dense MLP's) are
 * known before the step runs. Brought to L2 meanwhile, they are read from there when their
 * GEMVs run, beside the routed experts' stream from HBM (the CUDA backend: msm_cuda_l2_prefetch;
 * the CPU backend ignores the node). Values are untouched, so results are the same bits.
 *
 * Rewrite, per layer (with prefetch_l2): right before its ATTENTION, RECORD on MAIN (after the qkv projection and
 * RoPE, so the prefetch does not compete with the qkv GEMV's own stream), WAIT on AUX, PREFETCH
 * on AUX. The node takes the weights of the layer's nodes after the ATTENTION, in node order:
 * not the routed experts' (which of their rows are read depends on the router, and the router is
 * theirs) nor any under 1/PREFETCH_MIN_PART of the largest (norms, gates, biases: not worth the
 * lines), at most MSM_NODE_MAX_W of them. A layer's shared-expert nodes, which multi_stream_moe
 * put on AUX after a later fork, follow it in the AUX stream's order. One RECORD on AUX and its WAIT on MAIN at the
 * end of the graph join whatever no later join covers (the verifier's V3; a layer without a
 * shared expert has no other join). Only with multi_stream (the one-stream graph stays one
 * stream).
 *
 * With prefetch_l2_next, a layer that computes nothing on AUX (no shared expert: Qwen3-MoE,
 * Mixtral) also forks, right before its first routed node (the router), a PREFETCH of the next
 * layer's weights read before that layer's ATTENTION (its qkv projection): the norm and the router
 * are another latency-bound stretch, and those weights are read as soon as the experts are done.
 * They must then outlast the experts' stream through L2 (~75 MB a layer of Qwen3-30B-A3B at one
 * token), which the evict_last policy (MSM_CUDA_L2_PREFETCH_LAST) is for. A layer with a shared
 * expert has it running there instead, and the next layer's weights would only delay it.
 *
 * With prefetch_kv (the engine's default), each layer that computes nothing on AUX also forks a
 * PREFETCH_KV of its K/V cache rows below each token's position (they are known when the step
 * starts, from the block tables) right before the norm its qkv projection reads, so they come into
 * L2 while the norm, the qkv GEMV and the RoPE run, and the attention reads them from there
 * (Qwen3-30B-A3B at 1-2 tokens -0.05 ms a step on an H100; bench/results/2026-12-07-h200-s35). The
 * fork goes before the norm, not between it and the projection, which the CUDA backend runs as one
 * kernel; the experts' combine inside that norm passes over it (msm_graph_moe_sum_reader, and
 * msm_graph_moe_sum_source from the norm's side). A layer
 * with a shared expert on AUX is left alone: the prefetch would queue ahead of it there (Qwen1.5-MoE
 * +0.03..+0.09 ms at 1-8 tokens).
 *
 * The forks sit among other nodes; the CUDA backend's aux_beside passes over them. A layer with no
 * ATTENTION, no such weight, or a PREFETCH or PREFETCH_KV already is left alone, which makes the pass
 * idempotent. It touches no collective and no value, so it runs last. */
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

/* The distinct weights read by nodes from..to - 1 of layer L not of the routed experts, in node
 * order (the first MAX_CANDIDATES): into ids; returns their number. */
static int candidates(const msm_graph *g, int from, int to, int L, int *ids) {
    int n = 0;
    for (int i = from; i < to; i++) {
        const msm_node *x = &g->nodes[i];
        if (x->layer != L || x->role == MSM_ROLE_ROUTED || msm_op_is_prefetch(x->op)) continue;
        for (int j = 0; j < MSM_NODE_MAX_W && n < MAX_CANDIDATES; j++) {
            int wi = x->w[j];
            bool dup = wi < 0 || wi >= g->n_weights;
            for (int m = 0; m < n && !dup; m++) dup = ids[m] == wi;
            if (!dup) ids[n++] = wi;
        }
    }
    return n;
}

/* A PREFETCH node of layer L for the candidates of nodes from..to - 1 of layer WL (candidates): the
 * first MSM_NODE_MAX_W of at least 1/PREFETCH_MIN_PART of the largest one (which leaves out norms,
 * gates and biases), in node order; *n_w of them (0: none). */
static msm_node prefetch_node(const msm_graph *g, int L, int from, int to, int WL, int *n_w) {
    msm_node p = {.op = MSM_OP_PREFETCH, .stream = MSM_STREAM_AUX, .role = MSM_ROLE_ATTN, .layer = L,
                  .w = {-1, -1, -1}};
    int ids[MAX_CANDIDATES], n = candidates(g, from, to, WL, ids), k = 0;
    size_t most = 0;
    for (int i = 0; i < n; i++)
        if (weight_elems(g, ids[i]) > most) most = weight_elems(g, ids[i]);
    for (int i = 0; i < n && k < MSM_NODE_MAX_W; i++)
        if (weight_elems(g, ids[i]) * PREFETCH_MIN_PART >= most) p.w[k++] = ids[i];
    *n_w = k;
    return p;
}

/* Where layer L's prefetches go in g (-1: none): att, its first ATTENTION on MAIN (with
 * o->prefetch_l2); next (with o->prefetch_l2_next, in a layer computing nothing on AUX, not the
 * last), its first routed node on MAIN, for layer L + 1's weights before that layer's first
 * ATTENTION (next_from..next_to); kv (with o->prefetch_kv, in a layer computing nothing on AUX), the
 * node producing the input of the layer's first LINEAR on MAIN (its qkv projection's norm, of the
 * layer before but for layer 0), so that the norm and a LINEAR reading it stay adjacent (the CUDA
 * backend's norm + GEMV kernel). */
typedef struct spots {
    int att, next, next_from, next_to, kv;
} spots;

static spots find_spots(const msm_graph *g, int L, const msm_pass_opts *o) {
    spots s = {-1, -1, -1, -1, -1};
    bool aux = false;
    int lin = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *x = &g->nodes[i];
        if (x->layer == L && x->stream == MSM_STREAM_AUX && x->op != MSM_OP_EVENT_WAIT && x->op != MSM_OP_EVENT_RECORD)
            aux = true;
        if (x->layer == L && x->stream == MSM_STREAM_MAIN && x->op == MSM_OP_ATTENTION && s.att < 0) s.att = i;
        if (x->layer == L && x->stream == MSM_STREAM_MAIN && x->role == MSM_ROLE_ROUTED && s.next < 0) s.next = i;
        if (x->layer == L && x->stream == MSM_STREAM_MAIN && x->op == MSM_OP_LINEAR && lin < 0) lin = i;
        if (x->layer == L + 1 && s.next_from < 0) s.next_from = i;
        if (x->layer == L + 1 && x->op == MSM_OP_ATTENTION && s.next_to < 0) s.next_to = i;
    }
    if (!o->prefetch_l2_next || aux || L + 1 >= g->n_layers || s.next_from < 0 || s.next_to < 0) s.next = -1;
    bool kv = o->prefetch_kv && !aux && s.att > lin;
    for (int i = lin - 1; kv && i >= 0 && s.kv < 0; i--)
        for (int j = 0; j < g->nodes[i].n_out; j++)
            if (g->nodes[i].out[j] == g->nodes[lin].in[0]) s.kv = i;
    if (kv && lin >= 0 && s.kv < 0) s.kv = lin; /* a step input: right before it */
    if (!o->prefetch_l2) s.att = -1;
    return s;
}

/* Whether layer L of g has a PREFETCH or PREFETCH_KV already. */
static bool has_prefetch(const msm_graph *g, int L) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].layer == L && msm_op_is_prefetch(g->nodes[i].op)) return true;
    return false;
}

/* Puts p in the first free one of node i's two places. */
static void place(msm_node *at, int i, const msm_node *p) {
    at[2 * i + msm_op_is_prefetch(at[2 * i].op)] = *p;
}

/* Layer L's first ATTENTION (find_spots found one). */
static int find_att(const msm_graph *g, int L) {
    for (int i = 0; i < g->n_nodes; i++)
        if (g->nodes[i].layer == L && g->nodes[i].op == MSM_OP_ATTENTION) return i;
    return -1;
}

/* Appends RECORD on MAIN, WAIT on AUX and p (layer p->layer) to g; the event count grows by one. */
static int add_fork(msm_graph *g, const msm_node *p) {
    msm_node e = {.op = MSM_OP_EVENT_RECORD, .stream = MSM_STREAM_MAIN, .role = MSM_ROLE_ATTN, .layer = p->layer,
                  .event = g->n_events++, .w = {-1, -1, -1}};
    int r = msm_graph_add(g, &e);
    e.op = MSM_OP_EVENT_WAIT, e.stream = MSM_STREAM_AUX;
    if (r >= 0) r = msm_graph_add(g, &e);
    return r < 0 ? r : msm_graph_add(g, p);
}

int msm_pass_prefetch_l2(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err) {
    msm_graph *g = msm_graph_clone(in);
    int nl = in->n_layers > 0 ? in->n_layers : 0;
    msm_node *old = g ? malloc(sizeof *old * (size_t)(in->n_nodes ? in->n_nodes : 1)) : NULL;
    /* at[2i], at[2i + 1]: the PREFETCH / PREFETCH_KV nodes to issue before node i of in (op 0: none) */
    msm_node *at = g ? calloc(2 * (size_t)(in->n_nodes ? in->n_nodes : 1), sizeof *at) : NULL;
    if (!g || !old || !at) {
        msm_graph_free(g);
        free(old);
        free(at);
        return msm_err_set(err, -ENOMEM, "out of memory in prefetch_l2");
    }
    int n = in->n_nodes, r = 0, added = 0;
    for (int L = 0; L < nl; L++) {
        if (has_prefetch(in, L)) continue;
        spots s = find_spots(in, L, o);
        int n_w = 0;
        if (s.att >= 0) {
            msm_node p = prefetch_node(in, L, s.att + 1, n, L, &n_w);
            if (n_w > 0) place(at, s.att, &p);
        }
        if (s.next >= 0) {
            msm_node p = prefetch_node(in, L, s.next_from, s.next_to, L + 1, &n_w);
            if (n_w > 0) place(at, s.next, &p);
        }
        if (s.kv >= 0) {
            const msm_node *a = &in->nodes[find_att(in, L)];
            msm_node p = {.op = MSM_OP_PREFETCH_KV, .stream = MSM_STREAM_AUX, .role = MSM_ROLE_ATTN, .layer = L,
                          .n_in = 3, .in = {in->v_seq, in->v_pos, in->v_btab}, .w = {-1, -1, -1}, .attr = a->attr};
            place(at, s.kv, &p);
        }
    }
    memcpy(old, in->nodes, sizeof *old * (size_t)n);
    g->n_nodes = 0;
    for (int i = 0; i < n && r >= 0; i++) {
        for (int k = 0; k < 2 && r >= 0; k++)
            if (msm_op_is_prefetch(at[2 * i + k].op)) {
                r = add_fork(g, &at[2 * i + k]);
                added++;
            }
        if (r >= 0) r = msm_graph_add(g, &old[i]);
    }
    if (r >= 0 && added > 0) { /* the final join */
        msm_node e = {.op = MSM_OP_EVENT_RECORD, .stream = MSM_STREAM_AUX, .role = MSM_ROLE_NONE, .layer = -1,
                      .event = g->n_events++, .w = {-1, -1, -1}};
        r = msm_graph_add(g, &e);
        e.op = MSM_OP_EVENT_WAIT, e.stream = MSM_STREAM_MAIN;
        if (r >= 0) r = msm_graph_add(g, &e);
    }
    free(old);
    free(at);
    if (r < 0) {
        msm_graph_free(g);
        return msm_err_set(err, -ENOMEM, "out of memory in prefetch_l2");
    }
    *ret = g;
    return 0;
}

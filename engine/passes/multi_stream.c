/* Pass multi_stream_moe: run each MoE layer's shared expert on the AUX stream.
 *
 * The shared expert and the routed experts read the same normalised hidden state and are
 * independent, so the shared branch can overlap the routed work. Collective-aware (the lesson of
 * the aux-stream all-reduce bug, docs BACKGROUND.md): only compute moves to AUX.
 *   head = shared-branch nodes that do not depend on a collective of the branch → AUX
 *   tail = the branch's collective and the elementwise nodes after it → stay on MAIN, after the
 *          join
 * A tail holding anything but one collective plus elementwise ops means a collective sits in the
 * middle of the branch; the layer is skipped with a warning. Issue order: fork (RECORD on main,
 * WAIT on aux) just before the layer's first routed node, then the head on aux, then RECORD on
 * aux; the join WAIT on main goes just before the first main node that reads a head value. With
 * router_first the router's nodes are issued between the fork's RECORD and WAIT: both branches
 * depend on the same nodes, but the router's kernel is launched (and, with programmatic launch,
 * made resident) before the shared expert's first GEMV fills the SMs with its blocks. With
 * router_alone the fork's RECORD goes after the router's nodes instead: the shared expert's branch
 * waits for the router, so the router streams its rows alone rather than sharing HBM with the
 * shared expert's GEMV while the routed experts wait for it.
 * A layer that already has aux nodes, or has no shared expert, is left alone (idempotence). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msm_pass.h"

static bool elementwise(msm_op op) {
    return op == MSM_OP_MUL || op == MSM_OP_ADD || op == MSM_OP_SIGMOID;
}

static void warn(const msm_pass_opts *o, const char *fmt, int layer, const char *name) {
    if (!o || !o->warn) return;
    char msg[256];
    snprintf(msg, sizeof msg, fmt, layer, name);
    o->warn(o->warn_ud, msg);
}

static bool router_op(msm_op op) {
    return op == MSM_OP_ROUTER_TOPK || op == MSM_OP_ROUTER_LINEAR_TOPK || op == MSM_OP_ROUTER_GROUP_TOPK;
}

/* The last node of layer L's router when nodes first..it are that layer's routed compute ending
 * at its first router op (the router's linear and top-k, or one fused node); else -1. */
static int router_span(const msm_node *x, int n, int first, int L) {
    for (int i = first; i < n; i++) {
        if (x[i].layer != L || x[i].role != MSM_ROLE_ROUTED || x[i].stream != MSM_STREAM_MAIN ||
            msm_op_is_collective(x[i].op))
            return -1;
        if (router_op(x[i].op)) return i;
    }
    return -1;
}

/* Rewrites layer L of g; returns 0 (done or skipped) or -ENOMEM. */
static int rewrite_layer(msm_graph *g, int L, const msm_pass_opts *o) {
    int n = g->n_nodes, first_routed = -1, n_shared = 0;
    for (int i = 0; i < n; i++) {
        const msm_node *x = &g->nodes[i];
        if (x->layer != L) continue;
        if (x->stream == MSM_STREAM_AUX) return 0; /* already rewritten */
        if (x->role == MSM_ROLE_SHARED) n_shared++;
        if (x->role == MSM_ROLE_ROUTED && first_routed < 0) first_routed = i;
    }
    if (n_shared == 0 || first_routed < 0) return 0;

    /* classify: tail = depends (transitively, within the branch) on a branch collective */
    bool *tail = calloc((size_t)n, sizeof *tail), *tainted = calloc((size_t)g->n_vals, sizeof *tainted);
    if (!tail || !tainted) {
        free(tail);
        free(tainted);
        return -ENOMEM;
    }
    int tail_collectives = 0, tail_compute = -1;
    for (int i = 0; i < n; i++) {
        const msm_node *x = &g->nodes[i];
        if (x->layer != L || x->role != MSM_ROLE_SHARED) continue;
        bool dep = msm_op_is_collective(x->op) && !o->test_buggy_placement;
        for (int j = 0; j < x->n_in && !dep; j++) dep = tainted[x->in[j]];
        if (!dep) continue;
        tail[i] = true;
        for (int j = 0; j < x->n_out; j++) tainted[x->out[j]] = true;
        if (msm_op_is_collective(x->op)) tail_collectives++;
        else if (!elementwise(x->op) && tail_compute < 0) tail_compute = i;
    }
    if (tail_collectives > 1 || tail_compute >= 0) {
        int c = -1;
        for (int i = 0; i < n && c < 0; i++)
            if (tail[i] && msm_op_is_collective(g->nodes[i].op)) c = i;
        warn(o, "multi_stream_moe: layer %d skipped: collective %s sits in the middle of the "
                "shared-expert branch (compute depends on it), so the branch cannot run on the aux "
                "stream without moving the collective", L, g->vals[g->nodes[c].out[0]].name);
        free(tail);
        free(tainted);
        return 0;
    }

    /* new order: nodes before first_routed, fork, head (aux), record, the rest minus head */
    int ev_fork = g->n_events++, ev_join = g->n_events++;
    msm_node *old = malloc(sizeof *old * (size_t)n);
    bool *head_val = calloc((size_t)g->n_vals, sizeof *head_val);
    if (!old || !head_val) {
        free(old);
        free(head_val);
        free(tail);
        free(tainted);
        return -ENOMEM;
    }
    memcpy(old, g->nodes, sizeof *old * (size_t)n);
    g->n_nodes = 0;
    msm_node ev = {.op = MSM_OP_EVENT_RECORD, .stream = MSM_STREAM_MAIN, .role = MSM_ROLE_SHARED,
                   .layer = L, .event = ev_fork, .w = {-1, -1, -1}};
    int r = 0;
    for (int i = 0; i < first_routed && r >= 0; i++) r = msm_graph_add(g, &old[i]);
    /* router_first: the router's nodes go out after the fork and before the aux head; the fork
     * still depends only on what precedes them (so does the head). router_alone: they go out
     * before the fork, which then also depends on them. */
    bool first = o->router_first || o->router_alone;
    int rest = first_routed, router_end = first ? router_span(old, n, first_routed, L) : -1;
    if (r >= 0 && !(o->router_alone && router_end >= 0)) r = msm_graph_add(g, &ev);
    for (int i = first_routed; i <= router_end && r >= 0; i++) r = msm_graph_add(g, &old[i]);
    if (r >= 0 && o->router_alone && router_end >= 0) r = msm_graph_add(g, &ev);
    if (router_end >= 0) rest = router_end + 1;
    ev.op = MSM_OP_EVENT_WAIT;
    ev.stream = MSM_STREAM_AUX;
    if (r >= 0) r = msm_graph_add(g, &ev);
    for (int i = first_routed; i < n && r >= 0; i++) {
        msm_node x = old[i];
        if (x.layer != L || x.role != MSM_ROLE_SHARED || tail[i]) continue;
        x.stream = MSM_STREAM_AUX;
        for (int j = 0; j < x.n_out; j++) head_val[x.out[j]] = true;
        r = msm_graph_add(g, &x);
    }
    ev.op = MSM_OP_EVENT_RECORD;
    ev.event = ev_join;
    if (r >= 0) r = msm_graph_add(g, &ev);
    bool joined = false;
    for (int i = rest; i < n && r >= 0; i++) {
        msm_node x = old[i];
        if (x.layer == L && x.role == MSM_ROLE_SHARED && !tail[i]) continue; /* moved */
        bool needs = false;
        for (int j = 0; j < x.n_in; j++) needs |= head_val[x.in[j]];
        if (needs && !joined) {
            msm_node w = {.op = MSM_OP_EVENT_WAIT, .stream = MSM_STREAM_MAIN, .role = MSM_ROLE_SHARED,
                          .layer = L, .event = ev_join, .w = {-1, -1, -1}};
            r = msm_graph_add(g, &w);
            joined = true;
        }
        if (r >= 0) r = msm_graph_add(g, &x);
    }
    if (!joined && r >= 0) { /* no reader: still join before the step ends */
        msm_node w = {.op = MSM_OP_EVENT_WAIT, .stream = MSM_STREAM_MAIN, .role = MSM_ROLE_SHARED,
                      .layer = L, .event = ev_join, .w = {-1, -1, -1}};
        r = msm_graph_add(g, &w);
    }
    free(old);
    free(head_val);
    free(tail);
    free(tainted);
    return r < 0 ? r : 0;
}

int msm_pass_multi_stream_moe(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                              msm_err *err) {
    msm_graph *g = msm_graph_clone(in);
    if (!g) return msm_err_set(err, -ENOMEM, "out of memory in multi_stream_moe");
    for (int L = 0; L < g->n_layers; L++) {
        int r = rewrite_layer(g, L, o);
        if (r < 0) {
            msm_graph_free(g);
            return msm_err_set(err, r, "out of memory in multi_stream_moe");
        }
    }
    *ret = g;
    return 0;
}

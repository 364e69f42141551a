/* Pass fork_before_norm: a shared expert forked before the norm it reads, which it then computes
 * itself.
 *
 * After multi_stream_moe (router_first) a layer with a shared expert issues on MAIN: the o_proj,
 * the residual ADD_RMSNORM, the fork's RECORD, the router; the AUX branch waits for that RECORD, so
 * the shared expert's first GEMV starts only once the norm is done. At one token on the H200 the
 * norm is a one-block kernel of ~3 us (Qwen1.5-MoE, bench/results/2026-12-05-h200-s17 run 1),
 * while the shared expert's weight stream is half the layer's bytes.
 *
 * Rewrite, per fork: where the node right before a RECORD on MAIN is a plain ADD_RMSNORM on MAIN
 * (not one fused into a collective) and the AUX branch of that RECORD's WAIT reads its outputs,
 * the RECORD moves before the ADD_RMSNORM, and the branch gets its own copy of the ADD_RMSNORM
 * (the same inputs, weight and attributes; fresh outputs) right after its WAIT; the branch's reads
 * of the norm's outputs become reads of the copy's. The inputs of the norm are produced before the
 * RECORD, so the copy may read them on AUX (the verifier's V2); the planner keeps every value the
 * branch touches live from the fork to the join. The copy computes the same op on the same inputs,
 * so its values are the same bits and results do not change (tests: every pass combination equals
 * passes-off). A backend that runs the copy with the GEMV after it as one kernel (the CUDA
 * backend's msm_cuda_norm_linear_swiglu, at one or two tokens) starts the shared expert's weight
 * stream as the o_proj ends, beside the main stream's norm and router; elsewhere the copy is one
 * more small kernel, on AUX.
 *
 * Runs after multi_stream_moe, fuse_add_rmsnorm and elide_tp1_collectives (at tp 1 the norm then
 * follows the o_proj directly) and before fuse_linear_add_rmsnorm, which would otherwise take that
 * norm into the o_proj: each rewrite leaves the RECORD after the norm's producer, not after the norm,
 * which also makes the pass idempotent. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "msm_pass.h"

/* The index of the WAIT on AUX of event ev after node f; -1 if none. */
static int find_wait(const msm_graph *g, int f, int ev) {
    for (int i = f + 1; i < g->n_nodes; i++) {
        const msm_node *x = &g->nodes[i];
        if (x->op == MSM_OP_EVENT_WAIT && x->stream == MSM_STREAM_AUX && x->event == ev) return i;
    }
    return -1;
}

/* The end (exclusive) of the AUX branch that starts after node w: its next RECORD on AUX, or the
 * graph's end. */
static int branch_end(const msm_graph *g, int w) {
    for (int i = w + 1; i < g->n_nodes; i++) {
        const msm_node *x = &g->nodes[i];
        if (x->stream == MSM_STREAM_AUX && (x->op == MSM_OP_EVENT_RECORD || x->op == MSM_OP_EVENT_WAIT)) return i;
    }
    return g->n_nodes;
}

/* Whether AUX nodes w + 1 .. end - 1 read value v. */
static bool branch_reads(const msm_graph *g, int w, int end, int v) {
    for (int i = w + 1; i < end; i++) {
        const msm_node *x = &g->nodes[i];
        if (x->stream != MSM_STREAM_AUX) continue;
        for (int j = 0; j < x->n_in; j++)
            if (x->in[j] == v) return true;
    }
    return false;
}

/* A value like v, named after it, for the copy's output; its id or -ENOMEM. */
static int copy_value(msm_graph *g, int v) {
    char name[sizeof g->vals[0].name];
    snprintf(name, sizeof name, "%.35s.aux", g->vals[v].name);
    msm_value old = g->vals[v];
    int id = msm_graph_value(g, name, old.dtype, old.rows, old.cols);
    if (id >= 0) g->vals[id].fixed_rows = old.fixed_rows;
    return id;
}

/* Rewrites the fork whose RECORD is node f (the node before it the ADD_RMSNORM); returns the index
 * to resume after, or -ENOMEM. */
static int rewrite_fork(msm_graph *g, int f, int w, int end) {
    msm_node norm = g->nodes[f - 1];
    int outs[2];
    for (int j = 0; j < norm.n_out; j++) {
        outs[j] = copy_value(g, norm.out[j]);
        if (outs[j] < 0) return outs[j];
    }
    for (int i = w + 1; i < end; i++) {
        msm_node *x = &g->nodes[i];
        if (x->stream != MSM_STREAM_AUX) continue;
        for (int k = 0; k < x->n_in; k++)
            for (int j = 0; j < norm.n_out; j++)
                if (x->in[k] == norm.out[j]) x->in[k] = outs[j];
    }
    g->nodes[f - 1] = g->nodes[f]; /* the RECORD, then the norm */
    g->nodes[f] = norm;
    msm_node copy = norm;
    copy.stream = MSM_STREAM_AUX;
    copy.role = MSM_ROLE_SHARED;
    for (int j = 0; j < norm.n_out; j++) copy.out[j] = outs[j];
    int r = msm_graph_insert(g, w + 1, &copy);
    return r < 0 ? r : w + 1;
}

int msm_pass_fork_before_norm(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err) {
    (void)o;
    msm_graph *g = msm_graph_clone(in);
    if (!g) return msm_err_set(err, -ENOMEM, "out of memory in fork_before_norm");
    for (int f = 1; f < g->n_nodes; f++) {
        const msm_node *rec = &g->nodes[f], *norm = &g->nodes[f - 1];
        if (rec->op != MSM_OP_EVENT_RECORD || rec->stream != MSM_STREAM_MAIN || norm->op != MSM_OP_ADD_RMSNORM ||
            norm->stream != MSM_STREAM_MAIN)
            continue;
        int w = find_wait(g, f, rec->event);
        if (w < 0) continue;
        int end = branch_end(g, w);
        bool reads = false;
        for (int j = 0; j < norm->n_out; j++) reads |= branch_reads(g, w, end, norm->out[j]);
        if (!reads) continue;
        int r = rewrite_fork(g, f, w, end);
        if (r < 0) {
            msm_graph_free(g);
            return msm_err_set(err, r, "out of memory in fork_before_norm");
        }
        f = r;
    }
    *ret = g;
    return 0;
}

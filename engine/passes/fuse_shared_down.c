/* Pass fuse_shared_down: a gated shared expert's down projection taken into the routed experts'
 * down, so a MoE layer's two down GEMVs and its combine are one kernel on the main stream.
 *
 *   routed    = MOE_EXPERTS(h, ids, w)                       (main)
 *   shared    = LINEAR(sact, shared_down)                    (the shared branch, aux or main)
 *   x', n     = MOE_COMBINE_NORM(x, routed, shared, h)       (main, after the join)
 * becomes
 *   act       = MOE_GATEUP(h, ids)                           (MOE_EXPERTS' place: its first half)
 *   y         = MOE_DOWN_SHARED(act, ids, w, sact, h)        (the combine's place, after the join)
 *   x', n     = ADD_RMSNORM(x, y)
 * The shared branch keeps its gate/up and SwiGLU (on the aux stream beside the routed gate/up when
 * multi_stream ran); its down and the gate's dot product move into MOE_DOWN_SHARED, which reads the
 * routed experts' activations and the shared one's together. At decode that removes the shared
 * down's kernel and the cross-stream join in front of the combine (a launch that cannot follow
 * its predecessor programmatically): the join now comes before the down, where the shorter aux
 * branch has long finished. The CPU twins repeat the unfused ops' arithmetic (msm_cpu_moe_gateup,
 * msm_cpu_moe_down_shared), so the CPU graph computes bitwise what it did.
 *
 * Runs after fuse_moe_combine (its MOE_COMBINE_NORM exists at tp 1 only, so at tp > 1 nothing
 * changes). The engine applies it in the graph of its small steps only (msm_engine_opts
 * fuse_shared_max_tokens): the CUDA kernels of the two new ops are the small-T GEMVs. Only matches
 * where routed and shared have that single reader, the experts read the combine's h, and the
 * shared down has no bias. Idempotent: a fused layer has no MOE_COMBINE_NORM left. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "msm_pass.h"

/* Node c's MOE_COMBINE_NORM, its experts m and shared down d, if they have the form above. */
static bool match(const msm_graph *g, int c, int *m, int *d) {
    const msm_node *cn = &g->nodes[c];
    if (cn->op != MSM_OP_MOE_COMBINE_NORM || cn->w[0] < 0 || cn->w[1] < 0) return false;
    int routed = cn->in[1], shared = cn->in[2], h = cn->in[3];
    int pm = msm_graph_producer(g, routed, c), pd = msm_graph_producer(g, shared, c);
    if (pm < 0 || pd < 0 || msm_graph_readers(g, routed) != 1 || msm_graph_readers(g, shared) != 1) return false;
    const msm_node *mn = &g->nodes[pm], *dn = &g->nodes[pd];
    const msm_attr_moe_experts *ma = &mn->attr.moe_experts;
    if (mn->op != MSM_OP_MOE_EXPERTS || mn->stream != cn->stream || mn->in[0] != h || mn->w[0] < 0 || mn->w[1] < 0)
        return false;
    if (dn->op != MSM_OP_LINEAR || dn->w[1] >= 0 || dn->attr.linear.N != ma->H) return false;
    const msm_value *sv = &g->vals[dn->in[0]], *hv = &g->vals[h];
    if (sv->dtype != MSM_F32 || sv->cols != dn->attr.linear.K || sv->rows != hv->rows || hv->dtype != MSM_F32 ||
        hv->cols != ma->H)
        return false;
    *m = pm;
    *d = pd;
    return true;
}

int msm_pass_fuse_shared_down(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err) {
    (void)o;
    msm_graph *g = msm_graph_clone(in);
    /* one node is inserted a fused layer, before its combine: drop[] covers the grown graph */
    bool *drop = g ? calloc((size_t)(2 * g->n_nodes + 1), sizeof *drop) : NULL;
    if (!g || !drop) {
        msm_graph_free(g);
        free(drop);
        return msm_err_set(err, -ENOMEM, "out of memory in fuse_shared_down");
    }
    int r = 0;
    for (int c = 0; r == 0 && c < g->n_nodes; c++) {
        int m, d;
        if (drop[c] || !match(g, c, &m, &d)) continue;
        msm_node *mn = &g->nodes[m];
        const msm_attr_moe_experts ma = mn->attr.moe_experts;
        int Is = g->nodes[d].attr.linear.K, sact = g->nodes[d].in[0], sdown = g->nodes[d].w[0];
        char an[40], yn[40];
        snprintf(an, sizeof an, "experts_act%d", mn->layer);
        snprintf(yn, sizeof yn, "moe_out%d", mn->layer);
        int act = msm_graph_value(g, an, MSM_F32, MSM_ROWS_T, ma.k * ma.I);
        int y = act < 0 ? act : msm_graph_value(g, yn, MSM_F32, MSM_ROWS_T, ma.H);
        if (y < 0) {
            r = msm_err_set(err, -ENOMEM, "out of memory in fuse_shared_down");
            break;
        }
        int ids = mn->in[1], tw = mn->in[2], wdown = mn->w[1];
        mn->op = MSM_OP_MOE_GATEUP; /* the experts' first half, at their place */
        mn->n_in = 2;
        mn->in[2] = -1;
        mn->out[0] = act;
        mn->w[1] = mn->w[2] = -1;
        msm_node *cn = &g->nodes[c];
        msm_node dn = *cn; /* the down with the shared expert's, at the combine's place */
        dn.op = MSM_OP_MOE_DOWN_SHARED;
        dn.n_in = 5;
        dn.in[0] = act, dn.in[1] = ids, dn.in[2] = tw, dn.in[3] = sact, dn.in[4] = cn->in[3];
        dn.n_out = 1;
        dn.out[0] = y, dn.out[1] = -1;
        dn.w[0] = wdown, dn.w[1] = sdown, dn.w[2] = cn->w[0];
        dn.attr = (msm_attr){0};
        dn.attr.moe_experts = ma;
        dn.attr.moe_experts.Is = Is;
        cn->op = MSM_OP_ADD_RMSNORM; /* then the residual add and the next norm */
        cn->n_in = 2;
        cn->in[1] = y;
        cn->in[2] = cn->in[3] = -1;
        cn->w[0] = cn->w[1], cn->w[1] = -1;
        drop[d] = true;
        if (msm_graph_insert(g, c, &dn) < 0) {
            r = msm_err_set(err, -ENOMEM, "out of memory in fuse_shared_down");
            break;
        }
        c++; /* past the inserted node: c is the ADD_RMSNORM now */
    }
    if (r) {
        msm_graph_free(g);
        free(drop);
        return r;
    }
    msm_graph_drop_nodes(g, drop);
    free(drop);
    *ret = g;
    return 0;
}

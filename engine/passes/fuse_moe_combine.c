/* Pass fuse_moe_combine: the end of a MoE layer with a gated shared expert in one node.
 *
 *   gl  = LINEAR(h, shared_expert_gate)  (N = 1, no bias; role SHARED)
 *   sig = SIGMOID(gl)                    (role SHARED)
 *   sc  = MUL(shared, sig)               (role SHARED)
 *   moe = ADD(routed, sc)                (role MOE_COMBINE)
 *   x', n = ADD_RMSNORM(x, moe)          (the residual add and the next norm)
 * becomes one MOE_COMBINE_NORM(x, routed, shared, h) -> x', n at the ADD_RMSNORM's place: five
 * launches (three of them small ones on the shared branch) become one, and the per-token gate is
 * a dot product computed inside the combine kernel. The CPU twin repeats the chain's arithmetic,
 * so the CPU graph computes bitwise what it did. Only matches when every intermediate value has
 * that single reader and moe feeds the ADD_RMSNORM directly, so at tp > 1 (an all-reduce sits
 * between the combine and the residual add) nothing changes; nor does a layer whose shared expert
 * has no gate (GLM-4.5: the combine ADD reads the shared output itself, no MUL). Runs after
 * elide_tp1_collectives and fuse_add_rmsnorm; the shared branch's remaining nodes (gate_up,
 * SwiGLU, down) keep their role and stream, and the join that ordered the MUL's (or the ADD's)
 * read of aux values precedes the fused node. Idempotent: a fused layer has no ADD_RMSNORM fed by a combine ADD left. */
#include <errno.h>
#include <stdlib.h>

#include "msm_pass.h"

/* The node writing value v among nodes [0, end), or -1. */
static int producer(const msm_graph *g, int v, int end) {
    for (int j = end - 1; j >= 0; j--)
        for (int k = 0; k < g->nodes[j].n_out; k++)
            if (g->nodes[j].out[k] == v) return j;
    return -1;
}

static int readers(const msm_graph *g, int v) {
    int c = 0;
    for (int j = 0; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_in; k++) c += g->nodes[j].in[k] == v;
    return c;
}

int msm_pass_fuse_moe_combine(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                              msm_err *err) {
    (void)o;
    msm_graph *g = msm_graph_clone(in);
    bool *drop = g ? calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *drop) : NULL;
    if (!g || !drop) {
        msm_graph_free(g);
        return msm_err_set(err, -ENOMEM, "out of memory in fuse_moe_combine");
    }
    for (int i = 0; i < g->n_nodes; i++) {
        msm_node *n = &g->nodes[i];
        if (n->op != MSM_OP_ADD_RMSNORM) continue;
        int C = n->attr.rmsnorm.dim;
        for (int side = 1; side >= 0; side--) {
            int moe = n->in[side], x = n->in[1 - side];
            int c = producer(g, moe, i);
            if (c < 0 || drop[c]) continue;
            const msm_node *cn = &g->nodes[c];
            if (cn->op != MSM_OP_ADD || cn->role != MSM_ROLE_MOE_COMBINE || cn->stream != n->stream ||
                readers(g, moe) != 1)
                continue;
            /* which ADD input is the gated shared output */
            int m = -1, routed = -1;
            for (int q = 0; q < 2 && m < 0; q++) {
                int pm = producer(g, cn->in[q], c);
                if (pm >= 0 && g->nodes[pm].op == MSM_OP_MUL && g->nodes[pm].role == MSM_ROLE_SHARED) {
                    m = pm;
                    routed = cn->in[1 - q];
                }
            }
            if (m < 0 || readers(g, g->nodes[m].out[0]) != 1) continue;
            const msm_node *mn = &g->nodes[m];
            int shared = mn->in[0], s = producer(g, mn->in[1], m);
            if (s < 0 || g->nodes[s].op != MSM_OP_SIGMOID || readers(g, mn->in[1]) != 1) continue;
            int l = producer(g, g->nodes[s].in[0], s);
            if (l < 0 || g->nodes[l].op != MSM_OP_LINEAR || g->nodes[l].attr.linear.N != 1 ||
                g->nodes[l].w[1] >= 0 || g->nodes[l].role != MSM_ROLE_SHARED ||
                readers(g, g->nodes[s].in[0]) != 1)
                continue;
            const msm_node *ln = &g->nodes[l];
            int h = ln->in[0];
            const msm_value *v[4] = {&g->vals[x], &g->vals[routed], &g->vals[shared], &g->vals[h]};
            bool ok = ln->attr.linear.K == C;
            for (int q = 0; q < 4; q++)
                ok &= v[q]->dtype == MSM_F32 && v[q]->cols == C && v[q]->rows == v[0]->rows &&
                      v[q]->fixed_rows == v[0]->fixed_rows;
            if (!ok) continue;
            msm_node f = *n;
            f.op = MSM_OP_MOE_COMBINE_NORM;
            f.role = MSM_ROLE_MOE_COMBINE;
            f.layer = cn->layer;
            f.n_in = 4;
            f.in[0] = x, f.in[1] = routed, f.in[2] = shared, f.in[3] = h;
            f.w[0] = ln->w[0], f.w[1] = n->w[0], f.w[2] = -1;
            *n = f;
            drop[c] = drop[m] = drop[s] = drop[l] = true;
            break;
        }
    }
    int w = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (!drop[i]) g->nodes[w++] = g->nodes[i];
    g->n_nodes = w;
    free(drop);
    *ret = g;
    return 0;
}

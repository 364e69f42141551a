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
 * read of aux values precedes the fused node. Idempotent: a fused layer has no ADD_RMSNORM fed by a combine ADD left.
 *
 * At tp > 1 the combine ADD feeds the layer's ALLREDUCE instead: there the gate LINEAR, SIGMOID,
 * MUL and ADD become one MOE_COMBINE(routed, shared, h) -> the same partial, at the ADD's place
 * (after the join, on MAIN), and the all-reduce (with the residual add and norm, after
 * fuse_allreduce_add_rmsnorm) follows it: four launches become one, three of them off the shared
 * branch, which is the longer one of a decode step. */
#include <errno.h>
#include <stdlib.h>

#include "msm_pass.h"

/* The gated combine ending at node c: moe = ADD(routed, MUL(shared, SIGMOID(LINEAR(h, wg)))), each
 * intermediate read once, every [rows, C] value float32 with the same rows. */
typedef struct chain {
    int routed, shared, h, wg; /* values, and the gate weight */
    int mul, sig, lin;         /* nodes */
} chain;

static bool match_chain(const msm_graph *g, int c, int C, chain *ch) {
    const msm_node *cn = &g->nodes[c];
    if (cn->op != MSM_OP_ADD || cn->role != MSM_ROLE_MOE_COMBINE || msm_graph_readers(g, cn->out[0]) != 1) return false;
    /* which ADD input is the gated shared output */
    int m = -1, routed = -1;
    for (int q = 0; q < 2 && m < 0; q++) {
        int pm = msm_graph_producer(g, cn->in[q], c);
        if (pm >= 0 && g->nodes[pm].op == MSM_OP_MUL && g->nodes[pm].role == MSM_ROLE_SHARED) {
            m = pm;
            routed = cn->in[1 - q];
        }
    }
    if (m < 0 || msm_graph_readers(g, g->nodes[m].out[0]) != 1) return false;
    const msm_node *mn = &g->nodes[m];
    int shared = mn->in[0], s = msm_graph_producer(g, mn->in[1], m);
    if (s < 0 || g->nodes[s].op != MSM_OP_SIGMOID || msm_graph_readers(g, mn->in[1]) != 1) return false;
    int l = msm_graph_producer(g, g->nodes[s].in[0], s);
    if (l < 0 || g->nodes[l].op != MSM_OP_LINEAR || g->nodes[l].attr.linear.N != 1 || g->nodes[l].w[1] >= 0 ||
        g->nodes[l].role != MSM_ROLE_SHARED || msm_graph_readers(g, g->nodes[s].in[0]) != 1)
        return false;
    const msm_node *ln = &g->nodes[l];
    int h = ln->in[0];
    const msm_value *v[3] = {&g->vals[routed], &g->vals[shared], &g->vals[h]};
    bool ok = ln->attr.linear.K == C;
    for (int q = 0; q < 3; q++)
        ok &= v[q]->dtype == MSM_F32 && v[q]->cols == C && v[q]->rows == v[0]->rows &&
              v[q]->fixed_rows == v[0]->fixed_rows;
    if (!ok) return false;
    *ch = (chain){.routed = routed, .shared = shared, .h = h, .wg = ln->w[0], .mul = m, .sig = s, .lin = l};
    return true;
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
        if (n->op == MSM_OP_ADD_RMSNORM) {
            for (int side = 1; side >= 0; side--) {
                int c = msm_graph_producer(g, n->in[side], i);
                chain ch;
                if (c < 0 || drop[c] || g->nodes[c].stream != n->stream || !match_chain(g, c, n->attr.rmsnorm.dim, &ch))
                    continue;
                int x = n->in[1 - side];
                const msm_value *xv = &g->vals[x], *rv = &g->vals[ch.routed];
                if (xv->dtype != MSM_F32 || xv->cols != rv->cols || xv->rows != rv->rows || xv->fixed_rows != rv->fixed_rows)
                    continue;
                msm_node f = *n;
                f.op = MSM_OP_MOE_COMBINE_NORM;
                f.role = MSM_ROLE_MOE_COMBINE;
                f.layer = g->nodes[c].layer;
                f.n_in = 4;
                f.in[0] = x, f.in[1] = ch.routed, f.in[2] = ch.shared, f.in[3] = ch.h;
                f.w[0] = ch.wg, f.w[1] = n->w[0], f.w[2] = -1;
                *n = f;
                drop[c] = drop[ch.mul] = drop[ch.sig] = drop[ch.lin] = true;
                break;
            }
        } else if (n->op == MSM_OP_ALLREDUCE && n->stream == MSM_STREAM_MAIN) {
            /* tp > 1: the combine feeding the all-reduce */
            int c = msm_graph_producer(g, n->in[0], i);
            chain ch;
            if (c < 0 || drop[c] || g->nodes[c].stream != MSM_STREAM_MAIN ||
                !match_chain(g, c, g->vals[n->in[0]].cols, &ch))
                continue;
            msm_node *cn = &g->nodes[c];
            int out = cn->out[0];
            msm_node f = *cn;
            f.op = MSM_OP_MOE_COMBINE;
            f.n_in = 3;
            f.in[0] = ch.routed, f.in[1] = ch.shared, f.in[2] = ch.h;
            f.n_out = 1;
            f.out[0] = out;
            f.w[0] = ch.wg, f.w[1] = f.w[2] = -1;
            f.attr = (msm_attr){0};
            *cn = f;
            drop[ch.mul] = drop[ch.sig] = drop[ch.lin] = true;
        }
    }
    msm_graph_drop_nodes(g, drop);
    free(drop);
    *ret = g;
    return 0;
}

/* Pass fuse_allreduce_add_rmsnorm: an all-reduce and the residual add + norm reading it → one
 * collective node.
 *
 *   a      = ALLREDUCE(p)          (MAIN)
 *   x', n  = ADD_RMSNORM(x, a)     (MAIN, the next node, a's only reader; a may be either input)
 * becomes ALLREDUCE_ADD_RMSNORM(p, x) -> x', n at the ALLREDUCE's place. At tp > 1 every layer
 * has two such pairs (attention output, MoE/MLP output). The fused node is a collective like the
 * ALLREDUCE it replaces: the verifier keeps it on MAIN and V4 counts it, in the same position of
 * the collective sequence. Backends compute exactly the pair's arithmetic (the add is x + a; a
 * float sum does not depend on its operands' order), so a rank's result is the pair's bit for
 * bit given the same all-reduce. p must have no reader but the ALLREDUCE (a backend may reduce it
 * in place). Idempotent: fused nodes are never re-matched. */

#include "msm_pass.h"

static bool allreduce_norm(const msm_graph *g, int i, msm_node *ret) {
    const msm_node *n = &g->nodes[i], *nx = &g->nodes[i + 1];
    if (n->op != MSM_OP_ALLREDUCE || n->stream != MSM_STREAM_MAIN) return false;
    int a = n->out[0], p = n->in[0];
    int side = nx->op == MSM_OP_ADD_RMSNORM ? (nx->in[1] == a ? 1 : nx->in[0] == a ? 0 : -1) : -1;
    const msm_value *pv = &g->vals[p], *av = &g->vals[a];
    if (!(side >= 0 && nx->stream == MSM_STREAM_MAIN && nx->in[1 - side] != a && msm_graph_readers(g, a) == 1 &&
          msm_graph_readers(g, p) == 1 && pv->dtype == MSM_F32 && av->dtype == MSM_F32 && !pv->io && !av->io &&
          pv->cols == nx->attr.rmsnorm.dim))
        return false;
    msm_node f = *nx;
    f.op = MSM_OP_ALLREDUCE_ADD_RMSNORM;
    f.role = n->role;
    f.n_in = 2;
    f.in[0] = p;
    f.in[1] = nx->in[1 - side];
    *ret = f;
    return true;
}

int msm_pass_fuse_allreduce_add_rmsnorm(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                                        msm_err *err) {
    (void)o;
    return msm_pass_fuse_pairs(in, allreduce_norm, "fuse_allreduce_add_rmsnorm", ret, err);
}

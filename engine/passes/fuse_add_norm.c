/* Pass fuse_add_rmsnorm: residual ADD + the RMSNORM of its sum → one ADD_RMSNORM node.
 *
 * Every layer has two such pairs (x + attention → post-attention norm; x + MLP/MoE → the next
 * layer's input norm, or the final norm). The fused node writes the same two values (the sum,
 * still needed as the next residual, and the normed value) with the same arithmetic, so the graph
 * computes bitwise what it did. Only an ADD immediately followed in issue order by an RMSNORM of
 * its output on the same stream is fused; ADD_RMSNORM nodes are never re-matched, so the pass is
 * idempotent. Runs after the role-based MoE passes (they look for plain ADD nodes). */

#include "msm_pass.h"

static bool add_norm(const msm_graph *g, int i, msm_node *ret) {
    const msm_node *n = &g->nodes[i], *nx = &g->nodes[i + 1];
    const msm_value *s = &g->vals[n->out[0]];
    if (n->op != MSM_OP_ADD || nx->op != MSM_OP_RMSNORM || nx->stream != n->stream || nx->in[0] != n->out[0] ||
        s->dtype != MSM_F32 || nx->attr.rmsnorm.dim != s->cols)
        return false;
    msm_node f = *n;
    f.op = MSM_OP_ADD_RMSNORM;
    f.n_out = 2;
    f.out[1] = nx->out[0];
    f.w[0] = nx->w[0];
    f.w[1] = f.w[2] = -1;
    f.attr.rmsnorm = nx->attr.rmsnorm; /* an ADD has no attributes to keep */
    *ret = f;
    return true;
}

int msm_pass_fuse_add_rmsnorm(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                              msm_err *err) {
    (void)o;
    return msm_pass_fuse_pairs(in, add_norm, "fuse_add_rmsnorm", ret, err);
}

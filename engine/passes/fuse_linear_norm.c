/* Pass fuse_linear_add_rmsnorm: a LINEAR and the residual ADD_RMSNORM of its output → one node.
 *
 *   y      = LINEAR(x, W, b)              (e.g. o_proj, a dense MLP's down projection; tp = 1)
 *   s, out = ADD_RMSNORM(r, y) or (y, r)  (the next node, same stream, y's only reader)
 * becomes LINEAR_ADD_RMSNORM(x, r) -> s, out with W, b and the norm weight. Both backends compute
 * the pair's arithmetic (y into s's bytes, then s = r + y and the norm, the add commutative), so the
 * fused graph is bitwise the pair's. On CUDA it lets the GEMV's last block do the add + norm
 * (a one-block ADD_RMSNORM cost a decode step 3.5-4 us on the H200, 2026-12-01); where that kernel
 * does not apply (FP8 weights, larger T, the switch off) the backend runs the two kernels.
 * Runs after elide_tp1_collectives (at tp > 1 an all-reduce sits between the two, and
 * fuse_allreduce_add_rmsnorm takes the ADD_RMSNORM) and after fuse_moe_combine. Idempotent. */
#include <string.h>

#include "msm_pass.h"

static bool linear_norm(const msm_graph *g, int i, msm_node *ret) {
    const msm_node *n = &g->nodes[i], *nx = &g->nodes[i + 1];
    if (n->op != MSM_OP_LINEAR || nx->op != MSM_OP_ADD_RMSNORM || nx->stream != n->stream) return false;
    int y = n->out[0], r = nx->in[1] == y ? nx->in[0] : nx->in[0] == y ? nx->in[1] : -1;
    if (r < 0 || r == y) return false;
    const msm_value *xv = &g->vals[n->in[0]], *yv = &g->vals[y], *rv = &g->vals[r];
    if (msm_graph_readers(g, y) != 1 || yv->io || xv->dtype != MSM_F32 || yv->dtype != MSM_F32 ||
        rv->dtype != MSM_F32 || rv->cols != n->attr.linear.N || nx->attr.rmsnorm.dim != n->attr.linear.N ||
        xv->cols != n->attr.linear.K)
        return false;
    msm_node f = *nx;
    f.op = MSM_OP_LINEAR_ADD_RMSNORM;
    f.n_in = 2;
    f.in[0] = n->in[0];
    f.in[1] = r;
    f.w[0] = n->w[0];
    f.w[1] = n->w[1];
    f.w[2] = nx->w[0];
    memset(&f.attr, 0, sizeof f.attr);
    f.attr.linear_norm = (msm_attr_linear_norm){.N = n->attr.linear.N, .K = n->attr.linear.K, .eps = nx->attr.rmsnorm.eps};
    *ret = f;
    return true;
}

int msm_pass_fuse_linear_add_rmsnorm(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err) {
    (void)o;
    return msm_pass_fuse_pairs(in, linear_norm, "fuse_linear_add_rmsnorm", ret, err);
}

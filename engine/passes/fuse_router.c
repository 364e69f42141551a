/* Pass fuse_router_topk: a MoE layer's router in one node.
 *
 *   logits   = LINEAR(h, router)     (N = E <= 256, no bias; role ROUTED)
 *   ids, w   = ROUTER_TOPK(logits)   (the next node, same stream, logits' only reader)
 * becomes ROUTER_LINEAR_TOPK(h) -> ids, w with the router weight and the ROUTER_TOPK's attributes.
 * Both backends compute exactly the pair's arithmetic (the CUDA kernel the router GEMV's dot
 * products and the top-k kernel's selection, handing the logits from its GEMV blocks to the last
 * one through L2), so the fused graph is bitwise the pair's; it saves a launch a MoE layer at
 * decode. GLM-4.5's ROUTER_GROUP_TOPK (a bias, float32 logits of its own) is left alone.
 * Idempotent. */

#include "msm_pass.h"

static bool router(const msm_graph *g, int i, msm_node *ret) {
    const msm_node *n = &g->nodes[i], *nx = &g->nodes[i + 1];
    if (n->op != MSM_OP_LINEAR) return false;
    const msm_value *x = &g->vals[n->in[0]], *l = &g->vals[n->out[0]];
    if (!(nx->op == MSM_OP_ROUTER_TOPK && nx->stream == n->stream && nx->in[0] == n->out[0] && n->w[1] < 0 &&
          n->attr.linear.N == nx->attr.router_topk.E && n->attr.linear.N <= 256 && msm_graph_readers(g, n->out[0]) == 1 &&
          x->dtype == MSM_F32 && l->dtype == MSM_F32 && x->cols == n->attr.linear.K && !l->io))
        return false;
    msm_node f = *nx;
    f.in[0] = n->in[0];
    f.op = MSM_OP_ROUTER_LINEAR_TOPK;
    f.w[0] = n->w[0];
    f.w[1] = f.w[2] = -1;
    *ret = f;
    return true;
}

int msm_pass_fuse_router_topk(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err) {
    (void)o;
    return msm_pass_fuse_pairs(in, router, "fuse_router_topk", ret, err);
}

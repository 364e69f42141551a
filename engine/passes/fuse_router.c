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
#include <errno.h>

#include "msm_pass.h"

int msm_pass_fuse_router_topk(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err) {
    (void)o;
    msm_graph *g = msm_graph_clone(in);
    if (!g) return msm_err_set(err, -ENOMEM, "out of memory in fuse_router_topk");
    int w = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        msm_node n = g->nodes[i];
        if (n.op == MSM_OP_LINEAR && i + 1 < g->n_nodes) {
            const msm_node *nx = &g->nodes[i + 1];
            const msm_value *x = &g->vals[n.in[0]], *l = &g->vals[n.out[0]];
            if (nx->op == MSM_OP_ROUTER_TOPK && nx->stream == n.stream && nx->in[0] == n.out[0] && n.w[1] < 0 &&
                n.attr.linear.N == nx->attr.router_topk.E && n.attr.linear.N <= 256 && msm_graph_readers(g, n.out[0]) == 1 &&
                x->dtype == MSM_F32 && l->dtype == MSM_F32 && x->cols == n.attr.linear.K && !l->io) {
                msm_node f = *nx;
                f.in[0] = n.in[0];
                f.op = MSM_OP_ROUTER_LINEAR_TOPK;
                f.w[0] = n.w[0];
                f.w[1] = f.w[2] = -1;
                g->nodes[w++] = f;
                i++; /* the ROUTER_TOPK is absorbed */
                continue;
            }
        }
        g->nodes[w++] = n;
    }
    g->n_nodes = w;
    *ret = g;
    return 0;
}

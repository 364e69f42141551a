/* The skeleton of the pair passes (fuse_add_rmsnorm, fuse_allreduce_add_rmsnorm, fuse_router_topk,
 * fuse_linear_add_rmsnorm): each looks at a node and the next one in issue order and may replace
 * the two with one fused node. */
#include <errno.h>

#include "msm_pass.h"

int msm_pass_fuse_pairs(const msm_graph *in, msm_pair_fn fuse, const char *name, msm_graph **ret, msm_err *err) {
    msm_graph *g = msm_graph_clone(in);
    if (!g) return msm_err_set(err, -ENOMEM, "out of memory in %s", name);
    int w = 0;
    for (int i = 0; i < in->n_nodes; i++) {
        msm_node f;
        if (i + 1 < in->n_nodes && fuse(in, i, &f)) {
            g->nodes[w++] = f;
            i++; /* the second node is absorbed */
        } else {
            g->nodes[w++] = in->nodes[i];
        }
    }
    g->n_nodes = w;
    *ret = g;
    return 0;
}

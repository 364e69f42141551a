/* Pass elide_tp1_collectives: at tp == 1 every ALLREDUCE and ALLGATHER is the identity.
 *
 * Each such node costs a launch (an NCCL kernel or a device copy) per layer. The rewrite makes the
 * node's producer write the collective's output value directly (every reader of the input is
 * re-pointed at the output, which has the same dtype and shape at tp 1), then drops the node.
 * Writing into the output rather than reading the input keeps step outputs (logits) where the
 * engine expects them. Producers on the aux stream stay where they are: the join that ordered the
 * collective's read still precedes every main-stream reader of the output. A graph with tp > 1,
 * or one without collectives, is returned unchanged, which makes the pass idempotent. Run last,
 * after the passes that find collectives by role. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "msm_pass.h"

int msm_pass_elide_tp1_collectives(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                                   msm_err *err) {
    (void)o;
    msm_graph *g = msm_graph_clone(in);
    if (!g) return msm_err_set(err, -ENOMEM, "out of memory in elide_tp1_collectives");
    if (g->tp != 1) {
        *ret = g;
        return 0;
    }
    int w = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        msm_node n = g->nodes[i];
        bool coll = n.op == MSM_OP_ALLREDUCE || n.op == MSM_OP_ALLGATHER;
        int src = coll ? n.in[0] : -1, dst = coll ? n.out[0] : -1;
        int prod = coll ? msm_graph_producer(g, src, w) : -1;
        /* keep the node when the input is a step input (no producer) or shapes differ */
        if (!coll || prod < 0 || g->vals[src].io || g->vals[src].dtype != g->vals[dst].dtype ||
            g->vals[src].rows != g->vals[dst].rows || g->vals[src].cols != g->vals[dst].cols ||
            g->vals[src].fixed_rows != g->vals[dst].fixed_rows) {
            g->nodes[w++] = n;
            continue;
        }
        msm_node *p = &g->nodes[prod];
        for (int k = 0; k < p->n_out; k++)
            if (p->out[k] == src) p->out[k] = dst;
        /* earlier readers of src (between the producer and here) now read dst */
        for (int j = prod + 1; j < w; j++)
            for (int k = 0; k < g->nodes[j].n_in; k++)
                if (g->nodes[j].in[k] == src) g->nodes[j].in[k] = dst;
        /* later readers */
        for (int j = i + 1; j < g->n_nodes; j++)
            for (int k = 0; k < g->nodes[j].n_in; k++)
                if (g->nodes[j].in[k] == src) g->nodes[j].in[k] = dst;
    }
    g->n_nodes = w;
    *ret = g;
    return 0;
}

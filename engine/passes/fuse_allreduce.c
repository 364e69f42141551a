/* Pass fuse_moe_allreduce: one all-reduce per MoE layer instead of two.
 *
 * Both MoE branches end in partial sums of the same vector, so
 *   allreduce(routed) + g * allreduce(shared) == allreduce(routed + g * shared)
 * where g = sigmoid(shared_expert_gate · h) is a per-token scalar computed from the replicated h
 * (Qwen2-MoE), identical on every rank; gating the partial is therefore exact. Without a gate
 * (GLM-4.5's shared experts) it is plain linearity: allreduce(routed) + allreduce(shared) ==
 * allreduce(routed + shared). The rewrite: drop both all-reduces, let the MUL (when there is one)
 * read the shared partial and the combine ADD read the partials into a new value, and all-reduce
 * that value into the ADD's old output (on MAIN). Layers already fused, or without a shared
 * expert, are left alone, which makes the pass idempotent. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "msm_pass.h"

typedef struct layer_nodes {
    int ar_routed, ar_shared, mul, combine;
} layer_nodes;

static void find(const msm_graph *g, int layer, layer_nodes *ln) {
    ln->ar_routed = ln->ar_shared = ln->mul = ln->combine = -1;
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *n = &g->nodes[i];
        if (n->layer != layer) continue;
        if (n->op == MSM_OP_ALLREDUCE && n->role == MSM_ROLE_ROUTED) ln->ar_routed = i;
        if (n->op == MSM_OP_ALLREDUCE && n->role == MSM_ROLE_SHARED) ln->ar_shared = i;
        if (n->op == MSM_OP_MUL && n->role == MSM_ROLE_SHARED) ln->mul = i;
        if (n->op == MSM_OP_ADD && n->role == MSM_ROLE_MOE_COMBINE && ln->combine < 0) ln->combine = i;
    }
}

static void remove_node(msm_graph *g, int i) {
    memmove(&g->nodes[i], &g->nodes[i + 1], sizeof g->nodes[0] * (size_t)(g->n_nodes - i - 1));
    g->n_nodes--;
}

int msm_pass_fuse_moe_allreduce(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                                msm_err *err) {
    (void)o;
    msm_graph *g = msm_graph_clone(in);
    if (!g) return msm_err_set(err, -ENOMEM, "out of memory in fuse_moe_allreduce");
    for (int L = 0; L < g->n_layers; L++) {
        layer_nodes ln;
        find(g, L, &ln);
        if (ln.ar_routed < 0 || ln.ar_shared < 0 || ln.combine < 0) continue;
        msm_node *ar_r = &g->nodes[ln.ar_routed], *ar_s = &g->nodes[ln.ar_shared];
        msm_node *mul = ln.mul >= 0 ? &g->nodes[ln.mul] : NULL, *comb = &g->nodes[ln.combine];
        /* the expected shapes: combine = ADD(routed_sum, MUL(shared_sum, gate)), or without a
         * gate combine = ADD(routed_sum, shared_sum) */
        if (comb->in[0] != ar_r->out[0]) continue;
        if (mul && (mul->in[0] != ar_s->out[0] || comb->in[1] != mul->out[0])) continue;
        if (!mul && comb->in[1] != ar_s->out[0]) continue;
        if (ar_r->stream != MSM_STREAM_MAIN || ar_s->stream != MSM_STREAM_MAIN) continue;
        int routed_part = ar_r->in[0], shared_part = ar_s->in[0], out = comb->out[0];
        char name[40];
        snprintf(name, sizeof name, "moe_partial%d", L);
        int part = msm_graph_value(g, name, MSM_F32, g->vals[out].rows, g->vals[out].cols);
        if (part < 0) {
            msm_graph_free(g);
            return msm_err_set(err, part, "out of memory in fuse_moe_allreduce");
        }
        if (mul) mul->in[0] = shared_part;
        else comb->in[1] = shared_part;
        comb->in[0] = routed_part;
        comb->out[0] = part;
        msm_node ar = *ar_r;
        ar.in[0] = part;
        ar.out[0] = out;
        ar.role = MSM_ROLE_MOE_COMBINE;
        ar.stream = MSM_STREAM_MAIN;
        int at = ln.combine + 1;
        if (msm_graph_insert(g, at, &ar) < 0) {
            msm_graph_free(g);
            return msm_err_set(err, -ENOMEM, "out of memory in fuse_moe_allreduce");
        }
        /* remove the later index first so the earlier one stays valid */
        int a = ln.ar_routed > ln.ar_shared ? ln.ar_routed : ln.ar_shared;
        int b = ln.ar_routed > ln.ar_shared ? ln.ar_shared : ln.ar_routed;
        remove_node(g, a);
        remove_node(g, b);
    }
    *ret = g;
    return 0;
}

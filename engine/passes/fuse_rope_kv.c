/* Pass fuse_rope_kv_write: the ROPE feeding a layer's ATTENTION also writes that layer's K/V cache.
 *
 * In the plain graph ROPE rotates the q and k heads of the qkv rows, then the ATTENTION writes
 * the rotated k heads and the v heads to the layer's KV cache before it attends. The rewrite
 * turns the ROPE into a ROPE_KV_WRITE (in: qkv, pos, slot) that writes the cache as it rotates and
 * marks the ATTENTION kv_written, so it skips its own write: on CUDA one launch less per layer
 * (msm_cuda_rope_kv instead of rope_copy + kv_write_ld). The cache receives the same values
 * from the same rows before the same ATTENTION reads it, so results are bitwise those of the
 * pair, and the ATTENTION still reads the ROPE_KV_WRITE's output, which orders the cache write
 * before it for the verifier's cross-stream rule too.
 *
 * Matched: a ROPE whose output is the qkv input of an ATTENTION of the same layer, on the same
 * stream, with the same heads and positions, over plain qkv rows [T, (nh + 2 kvh) hd] f32 (the
 * layout the fused kernels assume). A fused ATTENTION (kv_written) is never matched again, which
 * makes the pass idempotent. It touches no collective and no role, so it runs last. */
#include <errno.h>

#include "msm_pass.h"

/* The ATTENTION that reads ROPE node r's output as its qkv rows and can take over its K/V write,
 * or -1. */
static int fusable_attention(const msm_graph *g, int r) {
    const msm_node *rn = &g->nodes[r];
    const msm_attr_rope *ra = &rn->attr.rope;
    const msm_value *qkv = &g->vals[rn->in[0]];
    if (qkv->dtype != MSM_F32 || qkv->cols != (ra->nh + 2 * ra->kvh) * ra->hd) return -1;
    for (int j = r + 1; j < g->n_nodes; j++) {
        const msm_node *an = &g->nodes[j];
        if (an->op != MSM_OP_ATTENTION || an->in[0] != rn->out[0]) continue;
        const msm_attr_attention *aa = &an->attr.attention;
        bool ok = !aa->kv_written && an->layer == rn->layer && an->stream == rn->stream &&
                  aa->nh == ra->nh && aa->kvh == ra->kvh && aa->hd == ra->hd &&
                  an->in[2] == rn->in[1]; /* the positions it rotated at */
        return ok ? j : -1;
    }
    return -1;
}

int msm_pass_fuse_rope_kv_write(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret,
                                msm_err *err) {
    (void)o;
    msm_graph *g = msm_graph_clone(in);
    if (!g) return msm_err_set(err, -ENOMEM, "out of memory in fuse_rope_kv_write");
    for (int i = 0; i < g->n_nodes; i++) {
        if (g->nodes[i].op != MSM_OP_ROPE) continue;
        int j = fusable_attention(g, i);
        if (j < 0) continue;
        msm_node *rope = &g->nodes[i], *att = &g->nodes[j];
        rope->op = MSM_OP_ROPE_KV_WRITE; /* same attributes (msm_attr_rope) */
        rope->in[2] = att->in[3];        /* the KV slots of the step's tokens */
        rope->n_in = 3;
        att->attr.attention.kv_written = 1;
    }
    *ret = g;
    return 0;
}

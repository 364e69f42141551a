/* The verifier: proves, before a graph runs or is captured, that no two collectives can run on
 * different streams concurrently and that every cross-stream dependency is ordered.
 *
 * It simulates issue order with vector clocks, the way CUDA orders streams: each stream counts
 * its nodes; EVENT_RECORD snapshots the recording stream's clock; EVENT_WAIT merges the last
 * snapshot of its event into the waiting stream's clock (a wait issued before any record of the
 * event orders nothing, as in CUDA). A node may read a value produced on another stream only
 * when its stream's clock covers the producer. The KV cache is state outside the values: the
 * rule KV pairs every ROPE_KV_WRITE with the kv_written ATTENTION reading its output, so V2 on
 * that value also orders the cache write before the read. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "msm_pass.h"

/* Whether node p (-1: none) is a ROPE_KV_WRITE that writes the K/V cache ATTENTION node a reads:
 * the same layer and heads. */
static bool writes_kv_for(const msm_graph *g, int p, const msm_node *a) {
    if (p < 0 || g->nodes[p].op != MSM_OP_ROPE_KV_WRITE) return false;
    const msm_node *w = &g->nodes[p];
    const msm_attr_rope *wr = &w->attr.rope;
    const msm_attr_attention *at = &a->attr.attention;
    return w->layer == a->layer && wr->nh == at->nh && wr->kvh == at->kvh && wr->hd == at->hd;
}

static int fail(msm_err *err, const msm_graph *g, int i, const char *rule, const char *what) {
    const msm_node *n = &g->nodes[i];
    const char *v = n->n_out ? g->vals[n->out[0]].name : (n->n_in ? g->vals[n->in[0]].name : "-");
    return msm_err_set(err, -EINVAL, "graph verify %s (rank %d): node %d (layer %d, %s %s -> %s) %s",
                       rule, g->rank, i, n->layer, msm_stream_name(n->stream), msm_op_name(n->op), v,
                       what);
}

int msm_graph_verify(const msm_graph *g, msm_err *err) {
    int nv = g->n_vals, ne = g->n_events > 0 ? g->n_events : 1;
    int *prod_stream = malloc(sizeof(int) * (size_t)nv), *prod_pos = malloc(sizeof(int) * (size_t)nv);
    int *prod_node = malloc(sizeof(int) * (size_t)nv);
    int (*ev_clock)[MSM_N_STREAMS] = calloc((size_t)ne, sizeof *ev_clock);
    int *ev_records = calloc((size_t)ne, sizeof(int));
    bool *kv_read = calloc((size_t)(g->n_nodes ? g->n_nodes : 1), sizeof *kv_read);
    int r = 0;
    if (!prod_stream || !prod_pos || !prod_node || !ev_clock || !ev_records || !kv_read) {
        r = msm_err_set(err, -ENOMEM, "out of memory in the verifier");
        goto out;
    }
    for (int v = 0; v < nv; v++) {
        prod_stream[v] = g->vals[v].io ? -1 : -2; /* -2: not yet produced */
        prod_node[v] = -1;
    }
    int vc[MSM_N_STREAMS][MSM_N_STREAMS];
    memset(vc, 0, sizeof vc);
    for (int i = 0; i < g->n_nodes && r == 0; i++) {
        const msm_node *n = &g->nodes[i];
        int s = n->stream;
        if (s < 0 || s >= MSM_N_STREAMS) {
            r = fail(err, g, i, "stream", "has an invalid stream");
            break;
        }
        /* V1 */
        if (msm_op_is_collective(n->op) && s != MSM_STREAM_MAIN) {
            r = fail(err, g, i, "V1", "is a collective on the aux stream; every collective must run "
                                      "on the main stream (two collectives in flight on two streams "
                                      "can pair the wrong buffers across ranks)");
            break;
        }
        /* V2 + SSA: inputs produced earlier, cross-stream reads covered */
        for (int j = 0; j < n->n_in && r == 0; j++) {
            int v = n->in[j];
            if (v < 0 || v >= nv) {
                r = fail(err, g, i, "SSA", "reads an invalid value id");
            } else if (prod_stream[v] == -2) {
                r = fail(err, g, i, "SSA", "reads a value no earlier node produces");
            } else if (prod_stream[v] >= 0 && prod_stream[v] != s &&
                       vc[s][prod_stream[v]] < prod_pos[v]) {
                r = msm_err_set(err, -EINVAL,
                                "graph verify V2 (rank %d): node %d (layer %d, %s %s) reads %s "
                                "produced on the %s stream without an EVENT_RECORD after the "
                                "producer and an EVENT_WAIT before this node",
                                g->rank, i, n->layer, msm_stream_name(n->stream),
                                msm_op_name(n->op), g->vals[v].name,
                                msm_stream_name((msm_stream)prod_stream[v]));
            }
        }
        if (r) break;
        /* KV: an ATTENTION that skips its K/V write reads the rows whose writer filled the cache */
        if (n->op == MSM_OP_ATTENTION && n->attr.attention.kv_written) {
            int p = n->n_in > 0 ? prod_node[n->in[0]] : -1;
            if (!writes_kv_for(g, p, n)) {
                r = fail(err, g, i, "KV", "skips its K/V write (kv_written) but its qkv input is not "
                                          "the output of a ROPE_KV_WRITE of its layer with the same "
                                          "heads: nothing writes this layer's KV cache");
                break;
            }
            kv_read[p] = true;
        }
        vc[s][s]++;
        if (n->op == MSM_OP_EVENT_RECORD || n->op == MSM_OP_EVENT_WAIT) {
            if (n->event < 0 || n->event >= g->n_events) {
                r = fail(err, g, i, "events", "names an event the graph does not have");
                break;
            }
            if (n->op == MSM_OP_EVENT_RECORD) {
                if (ev_records[n->event]++) {
                    r = fail(err, g, i, "events", "records an event already recorded in this step");
                    break;
                }
                memcpy(ev_clock[n->event], vc[s], sizeof vc[s]);
            } else {
                if (!ev_records[n->event]) {
                    r = fail(err, g, i, "events", "waits on an event not yet recorded (the wait "
                                                  "would order nothing)");
                    break;
                }
                for (int k = 0; k < MSM_N_STREAMS; k++)
                    if (ev_clock[n->event][k] > vc[s][k]) vc[s][k] = ev_clock[n->event][k];
            }
        }
        for (int j = 0; j < n->n_out; j++) {
            int v = n->out[j];
            if (v < 0 || v >= nv) {
                r = fail(err, g, i, "SSA", "writes an invalid value id");
            } else if (prod_stream[v] >= 0 || (prod_stream[v] == -1 && v != g->v_logits && v != g->v_sampled)) {
                r = fail(err, g, i, "SSA", "writes a value that another node or the step input already defines");
            } else {
                prod_stream[v] = s;
                prod_pos[v] = vc[s][s];
                prod_node[v] = i;
            }
        }
    }
    /* KV: every K/V-cache writer feeds the ATTENTION of its layer (the backends size a layer's
     * cache from that ATTENTION, and an ATTENTION that writes K/V again would do it twice) */
    for (int i = 0; r == 0 && i < g->n_nodes; i++)
        if (g->nodes[i].op == MSM_OP_ROPE_KV_WRITE && !kv_read[i])
            r = fail(err, g, i, "KV", "writes its layer's KV cache but no ATTENTION of that layer "
                                      "with kv_written reads its output");
    /* V3: all aux work joined into main before the step ends */
    if (r == 0 && vc[MSM_STREAM_MAIN][MSM_STREAM_AUX] < vc[MSM_STREAM_AUX][MSM_STREAM_AUX]) {
        r = msm_err_set(err, -EINVAL,
                        "graph verify V3 (rank %d): the aux stream's last %d node(s) are never "
                        "joined into the main stream before the step ends (capture needs every "
                        "fork joined)", g->rank,
                        vc[MSM_STREAM_AUX][MSM_STREAM_AUX] - vc[MSM_STREAM_MAIN][MSM_STREAM_AUX]);
    }
out:
    free(prod_stream);
    free(prod_pos);
    free(prod_node);
    free(kv_read);
    free(ev_clock);
    free(ev_records);
    return r;
}

typedef int (*pass_fn)(const msm_graph *in, const msm_pass_opts *o, msm_graph **ret, msm_err *err);

int msm_passes_apply(const msm_graph *plain, const msm_pass_opts *o, msm_graph **ret,
                     msm_err *err) {
    /* The order matters: the MoE passes find branches by role and plain ADD / ALLREDUCE nodes,
     * elide_tp1_collectives runs after them, fuse_moe_combine needs its ADD_RMSNORM (and
     * fuse_allreduce_add_rmsnorm takes the ADD_RMSNORMs behind an all-reduce, after it;
     * fuse_linear_add_rmsnorm takes those right after a LINEAR, once the tp-1 all-reduces are
     * gone and the MoE combine has its own, but not the norm fork_before_norm gives a copy on AUX,
     * which runs before it); the RoPE fusion touches none of those, and
     * prefetch_l2 adds only a hint node and events around the attentions the others left. */
    const struct { bool on; pass_fn run; } passes[] = {
        {o->fuse_allreduce, msm_pass_fuse_moe_allreduce},
        {o->multi_stream || o->test_buggy_placement, msm_pass_multi_stream_moe},
        {o->fuse_add_norm, msm_pass_fuse_add_rmsnorm},
        {o->elide_collectives, msm_pass_elide_tp1_collectives},
        {o->fuse_moe_combine, msm_pass_fuse_moe_combine},
        {o->fuse_allreduce_norm, msm_pass_fuse_allreduce_add_rmsnorm},
        {o->fuse_router, msm_pass_fuse_router_topk},
        {o->fork_before_norm && o->multi_stream, msm_pass_fork_before_norm},
        {o->fuse_linear_norm, msm_pass_fuse_linear_add_rmsnorm},
        {o->fuse_rope_kv, msm_pass_fuse_rope_kv_write},
        {(o->prefetch_l2 || o->prefetch_kv) && o->multi_stream, msm_pass_prefetch_l2},
    };
    msm_graph *g = msm_graph_clone(plain), *next = NULL;
    if (!g) return msm_err_set(err, -ENOMEM, "out of memory applying passes");
    int r = 0;
    for (size_t i = 0; r == 0 && i < sizeof passes / sizeof passes[0]; i++) {
        if (!passes[i].on) continue;
        r = passes[i].run(g, o, &next, err);
        if (r == 0) {
            msm_graph_free(g);
            g = next;
        }
    }
    if (r == 0) r = msm_graph_plan(g, err);
    if (r == 0 && !o->test_skip_verify) r = msm_graph_verify(g, err);
    if (r < 0) {
        msm_graph_free(g);
        return r;
    }
    *ret = g;
    return 0;
}

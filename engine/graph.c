/* msm_graph: IR containers, structural equality, the arena planner and the schedule dump. */
#include "msm_graph.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static const char *op_names[] = {
#define MSM_OP_NAME(n) #n,
    MSM_OPS(MSM_OP_NAME)
#undef MSM_OP_NAME
};

const char *msm_op_name(msm_op op) { return (unsigned)op < MSM_OP_COUNT ? op_names[op] : "?"; }

const char *msm_stream_name(msm_stream s) { return s == MSM_STREAM_AUX ? "aux" : "main"; }

bool msm_op_is_collective(msm_op op) {
    return op == MSM_OP_ALLREDUCE || op == MSM_OP_ALLGATHER || op == MSM_OP_ALLREDUCE_ADD_RMSNORM;
}

bool msm_op_is_prefetch(msm_op op) { return op == MSM_OP_PREFETCH || op == MSM_OP_PREFETCH_KV; }

int msm_graph_readers(const msm_graph *g, int v) {
    int c = 0;
    for (int j = 0; j < g->n_nodes; j++)
        for (int k = 0; k < g->nodes[j].n_in; k++) c += g->nodes[j].in[k] == v;
    return c;
}

int msm_graph_producer(const msm_graph *g, int v, int end) {
    for (int j = end - 1; j >= 0; j--)
        for (int k = 0; k < g->nodes[j].n_out; k++)
            if (g->nodes[j].out[k] == v) return j;
    return -1;
}

void msm_graph_drop_nodes(msm_graph *g, const bool *drop) {
    int w = 0;
    for (int i = 0; i < g->n_nodes; i++)
        if (!drop[i]) g->nodes[w++] = g->nodes[i];
    g->n_nodes = w;
}

/* The nodes between an experts' node and the reader of its sum: events on either stream and L2 hints
 * (the pass prefetch_l2's fork of a PREFETCH_KV sits right before the norm); none of them touches a
 * workspace. */
static bool moe_sum_passes(const msm_node *x) {
    return x->op == MSM_OP_EVENT_WAIT || x->op == MSM_OP_EVENT_RECORD || msm_op_is_prefetch(x->op);
}

int msm_graph_moe_sum_reader(const msm_graph *g, int i) {
    if (i < 0 || i >= g->n_nodes || g->nodes[i].op != MSM_OP_MOE_EXPERTS) return -1;
    const msm_node *n = &g->nodes[i];
    int j = i + 1;
    while (j < g->n_nodes && moe_sum_passes(&g->nodes[j])) j++;
    const msm_node *r = j < g->n_nodes ? &g->nodes[j] : NULL;
    bool reads = r && r->stream == n->stream &&
                 ((r->op == MSM_OP_ADD_RMSNORM && (r->in[0] == n->out[0] || r->in[1] == n->out[0])) ||
                  (r->op == MSM_OP_MOE_COMBINE_NORM && r->in[1] == n->out[0]));
    return reads ? j : -1;
}

int msm_graph_moe_sum_source(const msm_graph *g, int j) {
    if (j <= 0 || j >= g->n_nodes) return -1;
    int i = j - 1;
    while (i > 0 && moe_sum_passes(&g->nodes[i])) i--;
    return msm_graph_moe_sum_reader(g, i) == j ? i : -1;
}

msm_graph *msm_graph_new(int rank, int tp) {
    msm_graph *g = calloc(1, sizeof *g);
    if (!g) return NULL;
    g->rank = rank;
    g->tp = tp;
    g->owns_weights = true;
    g->v_tokens = g->v_pos = g->v_seq = g->v_slot = g->v_btab = -1;
    g->v_out_rows = g->v_sparams = g->v_logits = g->v_sampled = -1;
    return g;
}

void msm_graph_free(msm_graph *g) {
    if (!g) return;
    if (g->owns_weights) {
        for (int i = 0; i < g->n_weights; i++) free(g->weights[i].parts);
        free(g->weights);
    }
    free(g->vals);
    free(g->nodes);
    free(g);
}

msm_graph *msm_graph_clone(const msm_graph *g) {
    msm_graph *c = malloc(sizeof *c);
    if (!c) return NULL;
    *c = *g;
    c->owns_weights = false;
    c->vals = malloc(sizeof *c->vals * (size_t)(g->cap_vals ? g->cap_vals : 1));
    c->nodes = malloc(sizeof *c->nodes * (size_t)(g->cap_nodes ? g->cap_nodes : 1));
    if (!c->vals || !c->nodes) {
        free(c->vals);
        free(c->nodes);
        free(c);
        return NULL;
    }
    memcpy(c->vals, g->vals, sizeof *c->vals * (size_t)g->n_vals);
    memcpy(c->nodes, g->nodes, sizeof *c->nodes * (size_t)g->n_nodes);
    return c;
}

int msm_graph_value(msm_graph *g, const char *name, msm_dtype dt, msm_rows rows, int cols) {
    if (g->n_vals == g->cap_vals) {
        int cap = g->cap_vals ? g->cap_vals * 2 : 64;
        msm_value *v = realloc(g->vals, sizeof *v * (size_t)cap);
        if (!v) return -ENOMEM;
        g->vals = v;
        g->cap_vals = cap;
    }
    msm_value *v = &g->vals[g->n_vals];
    memset(v, 0, sizeof *v);
    snprintf(v->name, sizeof v->name, "%s", name);
    v->dtype = dt;
    v->rows = rows;
    v->fixed_rows = 1;
    v->cols = cols;
    return g->n_vals++;
}

int msm_graph_insert(msm_graph *g, int at, const msm_node *n) {
    if (g->n_nodes == g->cap_nodes) {
        int cap = g->cap_nodes ? g->cap_nodes * 2 : 128;
        msm_node *nn = realloc(g->nodes, sizeof *nn * (size_t)cap);
        if (!nn) return -ENOMEM;
        g->nodes = nn;
        g->cap_nodes = cap;
    }
    memmove(&g->nodes[at + 1], &g->nodes[at], sizeof *n * (size_t)(g->n_nodes - at));
    g->nodes[at] = *n;
    g->n_nodes++;
    return at;
}

int msm_graph_add(msm_graph *g, const msm_node *n) { return msm_graph_insert(g, g->n_nodes, n); }

static bool node_equal(const msm_node *a, const msm_node *b) {
    if (a->op != b->op || a->stream != b->stream || a->role != b->role || a->layer != b->layer ||
        a->n_in != b->n_in || a->n_out != b->n_out || a->event != b->event)
        return false;
    for (int i = 0; i < a->n_in; i++)
        if (a->in[i] != b->in[i]) return false;
    for (int i = 0; i < a->n_out; i++)
        if (a->out[i] != b->out[i]) return false;
    return memcmp(a->w, b->w, sizeof a->w) == 0 && memcmp(&a->attr, &b->attr, sizeof a->attr) == 0;
}

bool msm_graph_equal(const msm_graph *a, const msm_graph *b) {
    if (a->n_nodes != b->n_nodes || a->n_vals != b->n_vals || a->n_events != b->n_events)
        return false;
    for (int i = 0; i < a->n_nodes; i++)
        if (!node_equal(&a->nodes[i], &b->nodes[i])) return false;
    for (int i = 0; i < a->n_vals; i++) {
        const msm_value *x = &a->vals[i], *y = &b->vals[i];
        if (x->dtype != y->dtype || x->rows != y->rows || x->cols != y->cols ||
            strcmp(x->name, y->name) != 0)
            return false;
    }
    return true;
}

size_t msm_value_rows(const msm_value *v, int T, int R, int S) {
    switch (v->rows) {
    case MSM_ROWS_T: return (size_t)T;
    case MSM_ROWS_R: return (size_t)R;
    case MSM_ROWS_S: return (size_t)S;
    default: return (size_t)v->fixed_rows;
    }
}

size_t msm_value_bytes_max(const msm_graph *g, const msm_value *v) {
    return msm_value_rows(v, g->max_T, g->max_R, g->max_S) * (size_t)v->cols *
           msm_dtype_size(v->dtype);
}

/* ---- planner ---------------------------------------------------------------------------- */

typedef struct interval {
    int v, start, end;
    size_t bytes;
} interval;

static int cmp_start(const void *a, const void *b) {
    const interval *x = a, *y = b;
    if (x->start != y->start) return x->start - y->start;
    return x->v - y->v;
}

#define ALIGN 256

int msm_graph_plan(msm_graph *g, msm_err *err) {
    int nv = g->n_vals, nn = g->n_nodes;
    interval *iv = calloc((size_t)nv, sizeof *iv);
    if (!iv) return -ENOMEM;
    for (int v = 0; v < nv; v++) {
        iv[v].v = v;
        iv[v].start = g->vals[v].io ? -1 : nn;
        iv[v].end = g->vals[v].io ? nn : -1;
        iv[v].bytes = (msm_value_bytes_max(g, &g->vals[v]) + ALIGN - 1) / ALIGN * ALIGN;
    }
    /* Index of the next EVENT_WAIT on MAIN at or after node i (the join of an aux region). */
    int *next_join = malloc(sizeof(int) * (size_t)(nn + 1));
    if (!next_join) {
        free(iv);
        return -ENOMEM;
    }
    int *prev_fork = malloc(sizeof(int) * (size_t)(nn + 1));
    if (!prev_fork) {
        free(iv);
        free(next_join);
        return -ENOMEM;
    }
    next_join[nn] = nn;
    for (int i = nn - 1; i >= 0; i--) {
        const msm_node *n = &g->nodes[i];
        next_join[i] = (n->op == MSM_OP_EVENT_WAIT && n->stream == MSM_STREAM_MAIN) ? i : next_join[i + 1];
    }
    for (int i = 0, last = 0; i < nn; i++) {
        const msm_node *n = &g->nodes[i];
        if (n->op == MSM_OP_EVENT_RECORD && n->stream == MSM_STREAM_MAIN) last = i;
        prev_fork[i] = last;
    }
    for (int i = 0; i < nn; i++) {
        const msm_node *n = &g->nodes[i];
        int ids[MSM_NODE_MAX_IN + 2], k = 0;
        for (int j = 0; j < n->n_in; j++) ids[k++] = n->in[j];
        for (int j = 0; j < n->n_out; j++) ids[k++] = n->out[j];
        /* An ADD_RMSNORM whose norm the next node, a LINEAR or a fused router on the same stream,
         * reads: a backend may run the two as one kernel (the CUDA backend's msm_cuda_norm_linear and
         * msm_cuda_norm_router_linear_topk: every block reads the norm's inputs while block 0 writes
         * its outputs and all write the next node's), so its inputs and outputs stay live through
         * that node and the next node's outputs take none of their bytes (a residual sum nothing
         * reads again, the last layer's, included). */
        bool pair = n->op == MSM_OP_ADD_RMSNORM && i + 1 < nn &&
                    (g->nodes[i + 1].op == MSM_OP_LINEAR || g->nodes[i + 1].op == MSM_OP_ROUTER_LINEAR_TOPK) &&
                    g->nodes[i + 1].stream == n->stream && g->nodes[i + 1].in[0] == n->out[1];
        /* ... and through the SWIGLU after that LINEAR, reading its product on the same stream (the
         * CUDA backend's msm_cuda_norm_linear_swiglu: every block reads the norm's inputs while
         * block 0 writes its outputs and all write the SWIGLU's) */
        bool triple = pair && i + 2 < nn && g->nodes[i + 1].op == MSM_OP_LINEAR && g->nodes[i + 2].op == MSM_OP_SWIGLU &&
                      g->nodes[i + 2].stream == n->stream && g->nodes[i + 2].in[0] == g->nodes[i + 1].out[0];
        /* ... or through the QK_NORM after that LINEAR, reading its product, and the ROPE_KV_WRITE
         * reading the QK_NORM's, all on the same stream (the CUDA backend's
         * msm_cuda_norm_linear_qk_rope: every block reads the norm's inputs while block 0 writes its
         * outputs and others the rotated rows) */
        bool quad = pair && i + 3 < nn && g->nodes[i + 1].op == MSM_OP_LINEAR && g->nodes[i + 2].op == MSM_OP_QK_NORM &&
                    g->nodes[i + 3].op == MSM_OP_ROPE_KV_WRITE && g->nodes[i + 2].stream == n->stream &&
                    g->nodes[i + 3].stream == n->stream && g->nodes[i + 2].in[0] == g->nodes[i + 1].out[0] &&
                    g->nodes[i + 3].in[0] == g->nodes[i + 2].out[0];
        /* Likewise a LINEAR whose product the next node, a ROPE_KV_WRITE on the same stream, reads
         * (msm_cuda_linear_rope_kv: every block reads the LINEAR's input while others write the
         * rotated rows). */
        pair |= n->op == MSM_OP_LINEAR && i + 1 < nn && g->nodes[i + 1].op == MSM_OP_ROPE_KV_WRITE &&
                g->nodes[i + 1].stream == n->stream && g->nodes[i + 1].in[0] == n->out[0];
        /* Likewise a ROPE_KV_WRITE whose rows the next node, an ATTENTION on the same stream, reads
         * (msm_cuda_attention_rope: the attention reads the ROPE_KV_WRITE's input while it writes its
         * output), and a QK_NORM, the ROPE_KV_WRITE reading its product and the ATTENTION reading
         * that one, on one stream (msm_cuda_attention_qk_rope: the attention reads the QK_NORM's
         * input), through the ATTENTION. */
        pair |= n->op == MSM_OP_ROPE_KV_WRITE && i + 1 < nn && g->nodes[i + 1].op == MSM_OP_ATTENTION &&
                g->nodes[i + 1].stream == n->stream && g->nodes[i + 1].in[0] == n->out[0];
        triple |= n->op == MSM_OP_QK_NORM && i + 2 < nn && g->nodes[i + 1].op == MSM_OP_ROPE_KV_WRITE &&
                  g->nodes[i + 2].op == MSM_OP_ATTENTION && g->nodes[i + 1].stream == n->stream &&
                  g->nodes[i + 2].stream == n->stream && g->nodes[i + 1].in[0] == n->out[0] &&
                  g->nodes[i + 2].in[0] == g->nodes[i + 1].out[0];
        /* A MOE_EXPERTS whose sum the next node past events on the same stream reads as a norm does
         * (msm_graph_moe_sum_reader): a backend may leave the experts' combine to that node (the
         * CUDA backend's msm_cuda_moe_add_rmsnorm and msm_cuda_moe_combine_rmsnorm_routed read the
         * routing's ids and weights while they write the norm's outputs), so the experts' values
         * stay live through it. */
        int reader = msm_graph_moe_sum_reader(g, i);
        for (int j = 0; j < k; j++) {
            interval *t = &iv[ids[j]];
            if (g->vals[ids[j]].io) continue;
            /* an aux node runs at some time between its region's fork and join */
            int start = n->stream == MSM_STREAM_AUX ? prev_fork[i] : i;
            int end = n->stream == MSM_STREAM_AUX ? next_join[i]
                      : reader >= 0              ? reader
                      : quad                     ? i + 3
                      : triple                   ? i + 2
                      : pair                     ? i + 1
                                                 : i;
            if (start < t->start) t->start = start;
            if (end > t->end) t->end = end;
        }
    }
    /* A value touched on the aux stream is live from its region's fork to its join, so no
     * main-stream value of that window can share its bytes. */
    free(next_join);
    free(prev_fork);

    qsort(iv, (size_t)nv, sizeof *iv, cmp_start);
    /* first-fit over the live set, in order of start */
    typedef struct { size_t off, bytes; int end; } live_t;
    live_t *live = malloc(sizeof *live * (size_t)(nv ? nv : 1));
    if (!live) {
        free(iv);
        return -ENOMEM;
    }
    int n_live = 0;
    size_t top = 0;
    for (int a = 0; a < nv; a++) {
        interval *t = &iv[a];
        if (t->end < t->start) { /* unused value: give it a private slot anyway */
            t->start = t->end = nn;
        }
        /* retire values dead before this one starts */
        int w = 0;
        for (int j = 0; j < n_live; j++)
            if (live[j].end >= t->start) live[w++] = live[j];
        n_live = w;
        /* sort live by offset (insertion sort: small sets) */
        for (int j = 1; j < n_live; j++) {
            live_t x = live[j];
            int q = j - 1;
            while (q >= 0 && live[q].off > x.off) {
                live[q + 1] = live[q];
                q--;
            }
            live[q + 1] = x;
        }
        size_t off = 0;
        for (int j = 0; j < n_live; j++) {
            if (off + t->bytes <= live[j].off) break;
            if (live[j].off + live[j].bytes > off) off = live[j].off + live[j].bytes;
        }
        g->vals[t->v].offset = off;
        live[n_live++] = (live_t){off, t->bytes, t->end};
        if (off + t->bytes > top) top = off + t->bytes;
    }
    free(live);
    free(iv);
    g->arena_bytes = top ? top : ALIGN;
    (void)err;
    return 0;
}

/* ---- dump ---------------------------------------------------------------------------------- */

/* Prints a node's attributes by name: " [N=64 K=32]"; nothing for ops without attributes. */
static void dump_attr(const msm_node *n, FILE *out) {
    const msm_attr *a = &n->attr;
    switch (n->op) {
    case MSM_OP_EMBED: fprintf(out, " [H=%d]", a->embed.H); break;
    case MSM_OP_RMSNORM:
    case MSM_OP_ADD_RMSNORM:
    case MSM_OP_MOE_COMBINE_NORM:
    case MSM_OP_ALLREDUCE_ADD_RMSNORM:
        fprintf(out, " [dim=%d eps=%g]", a->rmsnorm.dim, (double)a->rmsnorm.eps);
        break;
    case MSM_OP_QK_NORM:
        fprintf(out, " [nh=%d kvh=%d hd=%d eps=%g]", a->qk_norm.nh, a->qk_norm.kvh, a->qk_norm.hd,
                (double)a->qk_norm.eps);
        break;
    case MSM_OP_LINEAR: fprintf(out, " [N=%d K=%d]", a->linear.N, a->linear.K); break;
    case MSM_OP_LINEAR_ADD_RMSNORM:
        fprintf(out, " [N=%d K=%d eps=%g]", a->linear_norm.N, a->linear_norm.K, (double)a->linear_norm.eps);
        break;
    case MSM_OP_ROPE:
    case MSM_OP_ROPE_KV_WRITE:
        fprintf(out, " [nh=%d kvh=%d hd=%d theta=%g", a->rope.nh, a->rope.kvh, a->rope.hd,
                (double)a->rope.theta);
        if (a->rope.rot != a->rope.hd) fprintf(out, " rot=%d", a->rope.rot); /* partial RoPE only */
        fputc(']', out);
        break;
    case MSM_OP_ATTENTION:
        fprintf(out, " [nh=%d kvh=%d hd=%d scale=%g kv_written=%d]", a->attention.nh, a->attention.kvh,
                a->attention.hd, (double)a->attention.scale, a->attention.kv_written);
        break;
    case MSM_OP_PREFETCH_KV: fprintf(out, " [kvh=%d hd=%d]", a->attention.kvh, a->attention.hd); break;
    case MSM_OP_SWIGLU: fprintf(out, " [I=%d]", a->swiglu.I); break;
    case MSM_OP_ROUTER_TOPK:
    case MSM_OP_ROUTER_LINEAR_TOPK:
        fprintf(out, " [E=%d k=%d norm=%d]", a->router_topk.E, a->router_topk.k, a->router_topk.norm);
        break;
    case MSM_OP_ROUTER_GROUP_TOPK:
        fprintf(out, " [E=%d k=%d n_group=%d topk_group=%d norm=%d scale=%g]", a->router_group.E,
                a->router_group.k, a->router_group.n_group, a->router_group.topk_group,
                a->router_group.norm, (double)a->router_group.scale);
        break;
    case MSM_OP_MOE_EXPERTS:
        fprintf(out, " [H=%d I=%d k=%d E=%d]", a->moe_experts.H, a->moe_experts.I, a->moe_experts.k,
                a->moe_experts.E);
        break;
    case MSM_OP_SAMPLE: fprintf(out, " [V=%d V_pad=%d]", a->sample.V, a->sample.V_pad); break;
    default: break;
    }
}

void msm_graph_dump(const msm_graph *g, FILE *out) {
    fprintf(out, "# rank %d of %d: %d nodes, %d values, arena %zu bytes\n", g->rank, g->tp,
            g->n_nodes, g->n_vals, g->arena_bytes);
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *n = &g->nodes[i];
        char layer[16];
        if (n->layer >= 0) snprintf(layer, sizeof layer, "L%d", n->layer);
        else snprintf(layer, sizeof layer, "-");
        fprintf(out, "%-4s %-4s %-16s", layer, msm_stream_name(n->stream), msm_op_name(n->op));
        if (n->op == MSM_OP_EVENT_RECORD || n->op == MSM_OP_EVENT_WAIT) {
            fprintf(out, " ev%d\n", n->event);
            continue;
        }
        for (int j = 0; j < n->n_in; j++) fprintf(out, "%s%s", j ? ", " : " ", g->vals[n->in[j]].name);
        if (!msm_op_is_prefetch(n->op)) fprintf(out, " ->"); /* a prefetch has no outputs */
        for (int j = 0; j < n->n_out; j++) fprintf(out, "%s%s", j ? ", " : " ", g->vals[n->out[j]].name);
        dump_attr(n, out);
        if (n->op == MSM_OP_PREFETCH) { /* its weights are what it is about */
            const char *sep = " [";
            for (int j = 0; j < MSM_NODE_MAX_W; j++)
                if (n->w[j] >= 0 && n->w[j] < g->n_weights) {
                    fprintf(out, "%s%s", sep, g->weights[n->w[j]].name);
                    sep = ", ";
                }
            if (sep[0] == ',') fputc(']', out);
        }
        fputc('\n', out);
    }
}

uint64_t msm_graph_collective_hash(const msm_graph *g) {
    uint64_t h = 1469598103934665603ull; /* FNV-1a over (op, dtype, cols) */
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *n = &g->nodes[i];
        if (!msm_op_is_collective(n->op)) continue;
        const msm_value *v = &g->vals[n->in[0]];
        uint64_t fields[4] = {(uint64_t)n->op, (uint64_t)v->dtype, (uint64_t)v->cols, (uint64_t)v->rows};
        for (int k = 0; k < 4; k++)
            for (int b = 0; b < 8; b++) {
                h ^= (fields[k] >> (8 * b)) & 0xff;
                h *= 1099511628211ull;
            }
    }
    return h;
}

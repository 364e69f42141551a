/* Graph builders: the plain TP step graph of one rank for Qwen2-MoE, Qwen3-MoE, Mixtral and
 * GLM-4.5 (Glm4Moe).
 *
 * Column-parallel: q/k/v (heads split), gate/up (intermediate split, experts' too).
 * Row-parallel, each followed by its own ALLREDUCE: o_proj, down (dense, routed, shared). This
 * is the topology of the original engine; the passes (msm_pass.h) then fuse and overlap.
 * The router and the norms are replicated; the embedding is replicated; lm_head is split by
 * vocabulary rows and ALLGATHERed so every rank holds the full logits and samples the same token. */
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "msm_graph.h"
#include "msm_kernels.h"

typedef struct builder {
    msm_graph *g;
    const msm_model_config *c;
    int rank, tp, layer;
    msm_role role;
    int err;          /* the first failure (negative errno); after it the helpers do nothing */
    msm_err *err_msg; /* its message */
} builder;

/* Records the build's first failure and its message. */
static void fail(builder *b, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(builder *b, int code, const char *fmt, ...) {
    if (b->err) return;
    char msg[sizeof b->err_msg->msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    b->err = msm_err_set(b->err_msg, code, "building the graph: %s", msg);
}

static int weight_new(builder *b, int n_expert, int rows, int cols, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
static int weight_new(builder *b, int n_expert, int rows, int cols, const char *fmt, ...) {
    msm_graph *g = b->g;
    if (g->n_weights == g->cap_weights) {
        int cap = g->cap_weights ? g->cap_weights * 2 : 64;
        msm_weight *w = realloc(g->weights, sizeof *w * (size_t)cap);
        if (!w) {
            fail(b, -ENOMEM, "out of memory");
            return -1;
        }
        g->weights = w;
        g->cap_weights = cap;
    }
    msm_weight *w = &g->weights[g->n_weights];
    memset(w, 0, sizeof *w);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(w->name, sizeof w->name, fmt, ap);
    va_end(ap);
    w->n_expert = n_expert;
    w->rows = rows;
    w->cols = cols;
    return g->n_weights++;
}

/* Adds a part to weight wi: rows [row0, row0+n_rows) x cols [col0, col0+n_cols) of checkpoint
 * tensor src (full shape src_rows x src_cols, ndim 1 or 2) at expert e, destination row dst. */
static void part(builder *b, int wi, int e, int dst, const char *src, int ndim, int64_t src_rows,
                 int64_t src_cols, int64_t row0, int64_t n_rows, int64_t col0, int64_t n_cols) {
    if (wi < 0 || b->err) return;
    msm_weight *w = &b->g->weights[wi];
    msm_wpart *p = realloc(w->parts, sizeof *p * (size_t)(w->n_parts + 1));
    if (!p) {
        fail(b, -ENOMEM, "out of memory");
        return;
    }
    w->parts = p;
    msm_wpart *q = &p[w->n_parts];
    memset(q, 0, sizeof *q);
    int len = snprintf(q->src, sizeof q->src, "%s", src);
    if (len < 0 || (size_t)len >= sizeof q->src) {
        fail(b, -ENAMETOOLONG, "checkpoint tensor name '%s' is longer than %zu bytes", src,
             sizeof q->src - 1);
        return;
    }
    w->n_parts++;
    q->src_ndim = ndim;
    q->src_rows = src_rows;
    q->src_cols = src_cols;
    q->expert = e;
    q->dst_row = dst;
    q->row0 = row0;
    q->n_rows = n_rows;
    q->col0 = col0;
    q->n_cols = n_cols;
}

/* A whole vector / matrix, replicated. */
static int w_full(builder *b, const char *src, int64_t rows, int64_t cols, int ndim) {
    int wi = weight_new(b, 1, (int)rows, (int)cols, "%s", src);
    part(b, wi, 0, 0, src, ndim, rows, cols, 0, rows, 0, cols);
    return wi;
}

/* A new value named name + the layer number; on failure the build fails and value 0 stands in
 * (the graph is discarded, but the helpers reading its shape meanwhile stay in bounds). */
static int val(builder *b, const char *name, msm_dtype dt, msm_rows rows, int cols) {
    char full[sizeof b->g->vals[0].name];
    int len = b->layer >= 0 ? snprintf(full, sizeof full, "%s%d", name, b->layer)
                            : snprintf(full, sizeof full, "%s", name);
    if (len < 0 || (size_t)len >= sizeof full) {
        fail(b, -ENAMETOOLONG, "value name '%s' (layer %d) is longer than %zu bytes", name, b->layer,
             sizeof full - 1);
        return 0;
    }
    int v = msm_graph_value(b->g, full, dt, rows, cols);
    if (v < 0) {
        fail(b, v, "out of memory");
        return 0;
    }
    return v;
}

/* Appends a node; attr (attr_bytes bytes, from ATTR) fills the start of its zeroed attributes. */
static void node(builder *b, msm_op op, int n_in, const int *in, int n_out, const int *out,
                 const int *w, const void *attr, size_t attr_bytes) {
    if (b->err) return;
    msm_node n;
    memset(&n, 0, sizeof n);
    n.op = op;
    n.stream = MSM_STREAM_MAIN;
    n.role = b->role;
    n.layer = b->layer;
    n.n_in = n_in;
    n.n_out = n_out;
    for (int i = 0; i < n_in; i++) n.in[i] = in[i];
    for (int i = 0; i < n_out; i++) n.out[i] = out[i];
    for (int i = 0; i < MSM_NODE_MAX_W; i++) n.w[i] = w ? w[i] : -1;
    if (attr) memcpy(&n.attr, attr, attr_bytes);
    n.event = -1;
    int r = msm_graph_add(b->g, &n);
    if (r < 0) fail(b, r, "out of memory");
}

#define IN(...) (int[]){__VA_ARGS__}
/* A node's attributes: the msm_attr member m from its field values, ATTR(linear, N, K); NO_ATTR. */
#define ATTR(m, ...) (const msm_attr_##m[]){{__VA_ARGS__}}, sizeof(msm_attr_##m)
#define NO_ATTR NULL, 0
#define NIN(...) (int)(sizeof((int[]){__VA_ARGS__}) / sizeof(int)), (int[]){__VA_ARGS__}

static int linear(builder *b, const char *name, int x, int wi, int bias, int N, int K) {
    const msm_value *xv = &b->g->vals[x];
    int y = val(b, name, MSM_F32, xv->rows, N);
    node(b, MSM_OP_LINEAR, 1, IN(x), 1, IN(y), IN(wi, bias, -1), ATTR(linear, N, K));
    return y;
}

static int allreduce(builder *b, const char *name, int x) {
    const msm_value *xv = &b->g->vals[x];
    int y = val(b, name, MSM_F32, xv->rows, xv->cols);
    node(b, MSM_OP_ALLREDUCE, 1, IN(x), 1, IN(y), NULL, NO_ATTR);
    return y;
}

static int add(builder *b, const char *name, int x, int y) {
    int z = val(b, name, MSM_F32, b->g->vals[x].rows, b->g->vals[x].cols);
    node(b, MSM_OP_ADD, 2, IN(x, y), 1, IN(z), NULL, NO_ATTR);
    return z;
}

static int rmsnorm(builder *b, const char *name, int x, const char *wname) {
    const msm_model_config *c = b->c;
    int wi = w_full(b, wname, c->hidden, 1, 1);
    if (wi >= 0) b->g->weights[wi].is_norm = true;
    int y = val(b, name, MSM_F32, MSM_ROWS_T, c->hidden);
    node(b, MSM_OP_RMSNORM, 1, IN(x), 1, IN(y), IN(wi, -1, -1), ATTR(rmsnorm, c->hidden, c->rms_eps));
    return y;
}

/* Column-parallel split of `rows` output rows of a [rows, cols] checkpoint matrix. */
static void part_rows(builder *b, int wi, int e, int dst, const char *src, int64_t rows,
                      int64_t cols, int ndim) {
    int64_t n = rows / b->tp;
    part(b, wi, e, dst, src, ndim, rows, cols, n * b->rank, n, 0, cols);
}

/* Row-parallel split of the input columns of a [rows, cols] checkpoint matrix. */
static void part_cols(builder *b, int wi, int e, int dst, const char *src, int64_t rows,
                      int64_t cols) {
    int64_t n = cols / b->tp;
    part(b, wi, e, dst, src, 2, rows, cols, 0, rows, n * b->rank, n);
}

static int attention_block(builder *b, int x, int in_seq, int in_pos, int in_slot, int in_btab) {
    const msm_model_config *c = b->c;
    int L = b->layer, H = c->hidden, hd = c->head_dim, tp = b->tp;
    int nh = c->n_heads / tp, kvh = c->n_kv_heads / tp, qkv_n = (nh + 2 * kvh) * hd;
    char pre[64];
    snprintf(pre, sizeof pre, "model.layers.%d.self_attn.", L);
    char s[160];
    b->role = MSM_ROLE_ATTN;
    snprintf(s, sizeof s, "model.layers.%d.input_layernorm.weight", L);
    int h = rmsnorm(b, "attn_in", x, s);

    int wqkv = weight_new(b, 1, qkv_n, H, "layers.%d.qkv", L);
    const char *nm[3] = {"q_proj", "k_proj", "v_proj"};
    int heads[3] = {c->n_heads, c->n_kv_heads, c->n_kv_heads}, dst = 0;
    for (int i = 0; i < 3; i++) {
        snprintf(s, sizeof s, "%s%s.weight", pre, nm[i]);
        part_rows(b, wqkv, 0, dst, s, (int64_t)heads[i] * hd, H, 2);
        dst += heads[i] / tp * hd;
    }
    int bqkv = -1;
    if (c->qkv_bias) {
        bqkv = weight_new(b, 1, qkv_n, 1, "layers.%d.qkv_bias", L);
        dst = 0;
        for (int i = 0; i < 3; i++) {
            snprintf(s, sizeof s, "%s%s.bias", pre, nm[i]);
            part_rows(b, bqkv, 0, dst, s, (int64_t)heads[i] * hd, 1, 1);
            dst += heads[i] / tp * hd;
        }
    }
    int qkv = linear(b, "qkv", h, wqkv, bqkv, qkv_n, H);
    if (c->qk_norm) {
        snprintf(s, sizeof s, "%sq_norm.weight", pre);
        int wq = w_full(b, s, hd, 1, 1);
        snprintf(s, sizeof s, "%sk_norm.weight", pre);
        int wk = w_full(b, s, hd, 1, 1);
        if (wq >= 0) b->g->weights[wq].is_norm = true;
        if (wk >= 0) b->g->weights[wk].is_norm = true;
        int y = val(b, "qkv_norm", MSM_F32, MSM_ROWS_T, qkv_n);
        node(b, MSM_OP_QK_NORM, 1, IN(qkv), 1, IN(y), IN(wq, wk, -1), ATTR(qk_norm, nh, kvh, hd, c->rms_eps));
        qkv = y;
    }
    int rq = val(b, "qkv_rope", MSM_F32, MSM_ROWS_T, qkv_n);
    node(b, MSM_OP_ROPE, 2, IN(qkv, in_pos), 1, IN(rq), NULL, ATTR(rope, nh, kvh, hd, c->rope_theta, c->rope_dim));
    int att = val(b, "attn", MSM_F32, MSM_ROWS_T, nh * hd);
    node(b, MSM_OP_ATTENTION, 5, IN(rq, in_seq, in_pos, in_slot, in_btab), 1, IN(att), NULL,
         ATTR(attention, nh, kvh, hd, .kv_written = 0, .scale = 1.0f / sqrtf((float)hd)));
    int wo = weight_new(b, 1, H, nh * hd, "layers.%d.o_proj", L);
    snprintf(s, sizeof s, "%so_proj.weight", pre);
    part_cols(b, wo, 0, 0, s, H, (int64_t)c->n_heads * hd);
    int o = linear(b, "attn_out", att, wo, -1, H, nh * hd);
    o = allreduce(b, "attn_sum", o);
    return add(b, "x_attn", x, o);
}

/* gate_up weight [2I/tp, H] (gate rows then up rows) from two checkpoint matrices [I, H]. */
static int gate_up_weight(builder *b, int wi, int e, const char *gate, const char *up, int I) {
    part_rows(b, wi, e, 0, gate, I, b->c->hidden, 2);
    part_rows(b, wi, e, I / b->tp, up, I, b->c->hidden, 2);
    return wi;
}

/* Dense SwiGLU MLP (or the shared expert when role is SHARED): returns the partial sum. */
static int swiglu_mlp(builder *b, int h, const char *prefix, const char *gn, const char *un,
                      const char *dn, int I, const char *tag) {
    int H = b->c->hidden, Il = I / b->tp, L = b->layer;
    char g[160], u[160], d[160], vn[32];
    snprintf(g, sizeof g, "%s%s.weight", prefix, gn);
    snprintf(u, sizeof u, "%s%s.weight", prefix, un);
    snprintf(d, sizeof d, "%s%s.weight", prefix, dn);
    int wgu = gate_up_weight(b, weight_new(b, 1, 2 * Il, H, "layers.%d.%s_gate_up", L, tag), 0, g, u, I);
    int wd = weight_new(b, 1, H, Il, "layers.%d.%s_down", L, tag);
    part_cols(b, wd, 0, 0, d, H, I);
    snprintf(vn, sizeof vn, "%s_gu", tag);
    int gu = linear(b, vn, h, wgu, -1, 2 * Il, H);
    snprintf(vn, sizeof vn, "%s_act", tag);
    int act = val(b, vn, MSM_F32, MSM_ROWS_T, Il);
    node(b, MSM_OP_SWIGLU, 1, IN(gu), 1, IN(act), NULL, ATTR(swiglu, Il));
    snprintf(vn, sizeof vn, "%s_down", tag);
    return linear(b, vn, act, wd, -1, H, Il);
}

/* The router: logits = LINEAR(h, gate) [T,E] (replicated), then the family's top-k op writing
 * ids and tw [T,k]. */
static void router(builder *b, int h, const char *pre, int ids, int tw) {
    const msm_model_config *c = b->c;
    int H = c->hidden, E = c->n_experts, k = c->top_k;
    char s[160];
    snprintf(s, sizeof s, "%sgate.weight", pre);
    int wr = w_full(b, s, E, H, 2);
    int rl = linear(b, "router", h, wr, -1, E, H);
    if (c->router == MSM_ROUTER_SOFTMAX) {
        node(b, MSM_OP_ROUTER_TOPK, 1, IN(rl), 2, IN(ids, tw), NULL, ATTR(router_topk, E, k, c->norm_topk_prob));
        return;
    }
    /* GLM: the selection bias is a float32 buffer in HF (_keep_in_fp32_modules_strict) */
    snprintf(s, sizeof s, "%sgate.e_score_correction_bias", pre);
    int wb = w_full(b, s, E, 1, 1);
    if (wb >= 0) b->g->weights[wb].keep_f32 = true;
    node(b, MSM_OP_ROUTER_GROUP_TOPK, 1, IN(rl), 2, IN(ids, tw), IN(wb, -1, -1),
         ATTR(router_group, E, k, c->n_group, c->topk_group, c->norm_topk_prob, c->routed_scale));
}

static int moe_block(builder *b, int h) {
    const msm_model_config *c = b->c;
    int L = b->layer, H = c->hidden, E = c->n_experts, k = c->top_k, I = c->moe_intermediate;
    int Il = I / b->tp;
    bool mixtral = c->arch == MSM_ARCH_MIXTRAL;
    char pre[96], s[160], g[160], u[160];
    snprintf(pre, sizeof pre, mixtral ? "model.layers.%d.block_sparse_moe." : "model.layers.%d.mlp.", L);

    b->role = MSM_ROLE_ROUTED;
    int ids = val(b, "topk_ids", MSM_I32, MSM_ROWS_T, k);
    int tw = val(b, "topk_w", MSM_F32, MSM_ROWS_T, k);
    router(b, h, pre, ids, tw);
    int wgu = weight_new(b, E, 2 * Il, H, "layers.%d.experts_gate_up", L);
    int wd = weight_new(b, E, H, Il, "layers.%d.experts_down", L);
    for (int e = 0; e < E; e++) {
        snprintf(g, sizeof g, mixtral ? "%sexperts.%d.w1.weight" : "%sexperts.%d.gate_proj.weight", pre, e);
        snprintf(u, sizeof u, mixtral ? "%sexperts.%d.w3.weight" : "%sexperts.%d.up_proj.weight", pre, e);
        gate_up_weight(b, wgu, e, g, u, I);
        snprintf(s, sizeof s, mixtral ? "%sexperts.%d.w2.weight" : "%sexperts.%d.down_proj.weight", pre, e);
        part_cols(b, wd, e, 0, s, H, I);
    }
    int routed = val(b, "routed", MSM_F32, MSM_ROWS_T, H);
    node(b, MSM_OP_MOE_EXPERTS, 3, IN(h, ids, tw), 1, IN(routed), IN(wgu, wd, -1), ATTR(moe_experts, H, Il, k, E));
    routed = allreduce(b, "routed_sum", routed);
    if (!msm_model_config_has_shared(c, L)) return routed;

    b->role = MSM_ROLE_SHARED;
    snprintf(s, sizeof s, c->shared_gate ? "%sshared_expert." : "%sshared_experts.", pre);
    int sh = swiglu_mlp(b, h, s, "gate_proj", "up_proj", "down_proj", c->shared_intermediate, "shared");
    sh = allreduce(b, "shared_sum", sh);
    if (!c->shared_gate) { /* GLM: routed + shared, no gate */
        b->role = MSM_ROLE_MOE_COMBINE;
        return add(b, "moe_out", routed, sh);
    }
    snprintf(s, sizeof s, "%sshared_expert_gate.weight", pre);
    int wsg = w_full(b, s, 1, H, 2);
    int gl = linear(b, "shared_gate", h, wsg, -1, 1, H);
    int gs = val(b, "shared_gate_sig", MSM_F32, MSM_ROWS_T, 1);
    node(b, MSM_OP_SIGMOID, 1, IN(gl), 1, IN(gs), NULL, NO_ATTR);
    int scaled = val(b, "shared_out", MSM_F32, MSM_ROWS_T, H);
    node(b, MSM_OP_MUL, 2, IN(sh, gs), 1, IN(scaled), NULL, NO_ATTR);
    b->role = MSM_ROLE_MOE_COMBINE;
    return add(b, "moe_out", routed, scaled);
}

static int check_divisible(const msm_model_config *c, int tp, msm_err *err) {
    struct { const char *what; int n; } d[] = {
        {"num_attention_heads", c->n_heads},
        {"num_key_value_heads", c->n_kv_heads},
        {"moe_intermediate_size", c->moe_intermediate},
        {c->shared_gate ? "shared_expert_intermediate_size" : "moe_intermediate_size * n_shared_experts",
         c->shared_intermediate},
        {"intermediate_size", c->intermediate},
    };
    bool any_dense = false;
    for (int l = 0; l < c->n_layers; l++) any_dense |= !c->sparse[l];
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++) {
        if (i == 4 && !any_dense) continue;
        if (d[i].n % tp != 0)
            return msm_err_set(err, -EINVAL,
                               "tensor-parallel size %d does not divide %s = %d; choose a tp that "
                               "divides it", tp, d[i].what, d[i].n);
    }
    return 0;
}

int msm_graph_build(const msm_model_config *c, int rank, int tp, const msm_build_opts *o,
                    msm_graph **ret, msm_err *err) {
    if (tp < 1 || rank < 0 || rank >= tp)
        return msm_err_set(err, -EINVAL, "bad tensor-parallel rank %d of %d", rank, tp);
    int r = check_divisible(c, tp, err);
    if (r < 0) return r;
    msm_graph *g = msm_graph_new(rank, tp);
    if (!g) return msm_err_set(err, -ENOMEM, "out of memory building the graph");
    builder b = {.g = g, .c = c, .rank = rank, .tp = tp, .layer = -1, .role = MSM_ROLE_NONE, .err_msg = err};
    g->max_T = o->max_T;
    g->max_R = o->max_T;
    g->max_S = o->max_S;
    g->max_blocks = o->max_blocks;
    g->n_layers = c->n_layers;
    g->vocab = c->vocab;
    g->fp8_block = c->fp8_block;
    int Vl = (c->vocab + tp - 1) / tp;
    g->vocab_pad = Vl * tp;

    /* step inputs: written by the engine before every step */
    int tokens = g->v_tokens = val(&b, "tokens", MSM_I32, MSM_ROWS_T, 1);
    int pos = g->v_pos = val(&b, "pos", MSM_I32, MSM_ROWS_T, 1);
    int seq = g->v_seq = val(&b, "seq", MSM_I32, MSM_ROWS_T, 1);
    int slot = g->v_slot = val(&b, "slot", MSM_I32, MSM_ROWS_T, 1);
    int btab = g->v_btab = val(&b, "block_tables", MSM_I32, MSM_ROWS_S, o->max_blocks);
    int orows = g->v_out_rows = val(&b, "out_rows", MSM_I32, MSM_ROWS_R, 1);
    int sp = g->v_sparams = val(&b, "sample_params", MSM_I32, MSM_ROWS_R,
                                (int)(sizeof(msm_sample_params) / 4));
    for (int v = 0; v < g->n_vals; v++) g->vals[v].io = true;
    if (b.err) { /* from here on, value ids always index an existing value */
        msm_graph_free(g);
        return b.err;
    }

    int wemb = w_full(&b, "model.embed_tokens.weight", c->vocab, c->hidden, 2);
    int x = val(&b, "x", MSM_F32, MSM_ROWS_T, c->hidden);
    node(&b, MSM_OP_EMBED, 1, IN(tokens), 1, IN(x), IN(wemb, -1, -1), ATTR(embed, c->hidden));

    char s[160];
    for (int L = 0; L < c->n_layers && !b.err; L++) {
        b.layer = L;
        x = attention_block(&b, x, seq, pos, slot, btab);
        snprintf(s, sizeof s, "model.layers.%d.post_attention_layernorm.weight", L);
        b.role = MSM_ROLE_MLP; /* the norm feeds both MoE branches */
        int h = rmsnorm(&b, "mlp_in", x, s);
        int y;
        if (c->sparse[L]) {
            y = moe_block(&b, h);
        } else {
            b.role = MSM_ROLE_MLP;
            snprintf(s, sizeof s, "model.layers.%d.mlp.", L);
            y = swiglu_mlp(&b, h, s, "gate_proj", "up_proj", "down_proj", c->intermediate, "mlp");
            y = allreduce(&b, "mlp_sum", y);
        }
        b.role = c->sparse[L] ? MSM_ROLE_MOE_COMBINE : MSM_ROLE_MLP;
        x = add(&b, "x_mlp", x, y);
    }
    b.layer = -1;
    b.role = MSM_ROLE_HEAD;
    int hn = rmsnorm(&b, "final_norm", x, "model.norm.weight");
    int hr = val(&b, "final_rows", MSM_F32, MSM_ROWS_R, c->hidden);
    node(&b, MSM_OP_GATHER_ROWS, 2, IN(hn, orows), 1, IN(hr), NULL, NO_ATTR);
    const char *lm = c->tie_word_embeddings ? "model.embed_tokens.weight" : "lm_head.weight";
    int wlm = weight_new(&b, 1, Vl, c->hidden, "lm_head_shard");
    int64_t r0 = (int64_t)Vl * rank, n = c->vocab - r0 < Vl ? c->vocab - r0 : Vl;
    if (n > 0) part(&b, wlm, 0, 0, lm, 2, c->vocab, c->hidden, r0, n, 0, c->hidden);
    int lg = linear(&b, "logits_shard", hr, wlm, -1, Vl, c->hidden);
    int logits = val(&b, "logits", MSM_F32, MSM_ROWS_R, Vl * tp);
    node(&b, MSM_OP_ALLGATHER, 1, IN(lg), 1, IN(logits), NULL, NO_ATTR);
    int sampled = val(&b, "sampled", MSM_I32, MSM_ROWS_R, 1);
    node(&b, MSM_OP_SAMPLE, 2, IN(logits, sp), 1, IN(sampled), NULL, ATTR(sample, c->vocab, Vl * tp));
    g->v_logits = logits;
    g->v_sampled = sampled;
    g->vals[logits].io = g->vals[sampled].io = true;
    if (b.err) {
        msm_graph_free(g);
        return b.err; /* the message is in err */
    }
    *ret = g;
    return 0;
}

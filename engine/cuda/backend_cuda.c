/* CUDA backend (see msm_cuda_backend.h): one rank on one GPU.
 *
 * Weights bf16, activations float32 in one device arena at the planner's offsets, KV cache bf16.
 * Two streams (MAIN, AUX) and one cudaEvent per graph event, used exactly as the graph says.
 * Collectives are NCCL on the MAIN stream (the verifier guarantees every collective node is on
 * MAIN). Decode steps are captured per batch bucket into CUDA graphs (thread-local capture mode)
 * and replayed; the executor issues the same nodes for capture as for eager runs. Host waits poll
 * with a deadline instead of blocking. */
#include <errno.h>
#include <nccl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "msm_backend.h"
#include "msm_cuda.h"
#include "msm_cuda_backend.h"
#include "msm_cuda_kernels.h"
#include "msm_engine.h" /* MSM_TEST_FAULT_* */
#include "msm_weights.h"  /* msm_weights_fp8_resident */

#define MAX_GRAPHS 64

typedef struct cuda_backend {
    msm_backend b;
    msm_comm comm;               /* NCCL behind the msm_comm interface */
    int device, tp;
    ncclComm_t nccl;
    cudaStream_t st[MSM_N_STREAMS];
    cudaEvent_t *ev;
    int n_events;
    msm_cuda_ctx *ctx;
    msm_cuda_tuning tune;        /* this rank's kernel choices (defaults + environment) */
    msm_cuda_tuning tune_decode; /* the same for pure decode steps (see tuning_for_decode) */
    uint64_t skip_ops;           /* benchmark-only: ops not issued (MSM_CUDA_SKIP_OPS) */
    uint16_t **w;                /* [n_weights] bf16 (float32 for keep_f32 weights), carved from `wmem`;
                                    NULL for an FP8-resident one */
    uint8_t **w8;                /* [n_weights] FP8-resident: the e4m3 codes (else NULL) ... */
    float **wsc;                 /* ... and their block scales (msm_cuda_fp8_scales of them) */
    size_t *w_elems;             /* [n_weights] elements of each */
    int (*w_shape)[4];           /* [n_weights] n_expert, rows, cols, FP8 column phase */
    char (*w_name)[96];          /* [n_weights] msm_weight.name, for messages */
    bool *w_f32;                 /* [n_weights] stored as float32 (msm_weight.keep_f32) */
    void *deq[MSM_N_STREAMS];    /* per stream: bf16 scratch of the FP8 paths that dequantise */
    size_t deq_bytes;
    int n_weights;
    void *wmem;                  /* every weight, one allocation */
    void *pad;                   /* MSM_CUDA_PAD_MB: device memory taken before anything else (a
                                  * benchmark's probe of placement: every later buffer moves) */
    char *arena;
    size_t arena_bytes;
    uint16_t **kc, **vc;         /* [n_layers] bf16 caches */
    int n_layers, n_kv_blocks;   /* ... of n_kv_blocks blocks of MSM_KV_BLOCK slots */
    void *ws[MSM_N_STREAMS];     /* per-stream workspace (cuBLASLt input, MoE grouping) */
    size_t ws_bytes;
    float *q_tmp[MSM_N_STREAMS]; /* attention: split-context workspace */
    void *router_ws[MSM_N_STREAMS]; /* ROUTER_LINEAR_TOPK: logits + counters (zero between calls) */
    unsigned *ln_ctr[MSM_N_STREAMS]; /* LINEAR_ADD_RMSNORM's arrival counter (zero between calls) */
    size_t router_ws_bytes;
    size_t q_tmp_bytes;
    void *gather_tmp;            /* all-gather staging [tp, rows, cols] */
    size_t gather_bytes;
    /* one-shot all-reduce (kernels/cuda/allreduce.cu): on when every rank reaches every other's
     * memory (set up in cuda_prepare); `ar_fault` is host-mapped, set by a kernel whose peer never
     * arrived; `broken` after a collective failed: the group's state is unknown, no more steps */
    bool ar_on, broken;
    bool revoked;                /* the NCCL communicator was revoked (group_failed, tp > 1) */
    msm_cuda_ar_peers ar;
    uint32_t *ar_sig;
    uint32_t *ar_fault;
    cudaGraphExec_t graphs[MAX_GRAPHS];
    int graph_key[MAX_GRAPHS], n_graphs;
    cudaGraph_t capturing;
    /* pinned host staging of the steps' input writes and result reads (cuda_write, cuda_read):
     * a copy from pinned memory is queued without the driver's pageable bounce, and a small read
     * lands in one DMA. Bump-allocated, reset by every completed sync (its copies are done); a
     * transfer that does not fit goes straight from / to the caller's memory */
    char *stage;
    size_t stage_bytes, stage_used;
    int prio_hi;     /* the device's greatest stream priority (exec_on, tune.stream_prio) */
    bool wait_sleep; /* MSM_CUDA_HOST_WAIT=sleep: host waits sleep 20 us between polls (the
                        earlier behaviour) instead of yielding the CPU between them */
} cuda_backend;

#define STAGE_BYTES ((size_t)4 << 20)

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        cudaError_t e_ = (expr);                                                                   \
        if (e_ != cudaSuccess)                                                                     \
            return msm_err_set(err, msm_cuda_errno(e_), "rank %d (GPU %d): %s failed: %s",          \
                               cb->b.rank, cb->device, #expr, cudaGetErrorString(e_));              \
    } while (0)
#define KTRY(expr)                                                                                 \
    do {                                                                                           \
        int r_ = (expr);                                                                           \
        if (r_) return msm_err_set(err, r_, "rank %d (GPU %d): %s failed", cb->b.rank, cb->device, #expr); \
    } while (0)
#define NTRY(expr)                                                                                 \
    do {                                                                                           \
        ncclResult_t n_ = (expr);                                                                  \
        if (n_ != ncclSuccess)                                                                     \
            return msm_err_set(err, -EIO, "rank %d (GPU %d): %s failed: %s", cb->b.rank,           \
                               cb->device, #expr, ncclGetErrorString(n_));                          \
    } while (0)

/* ---- NCCL behind msm_comm ------------------------------------------------------------------ */

static cuda_backend *from_comm(msm_comm *c) {
    return (cuda_backend *)((char *)c - offsetof(cuda_backend, comm));
}

static int nccl_allreduce(msm_comm *c, const float *in, float *out, size_t n, msm_err *err) {
    cuda_backend *cb = from_comm(c);
    NTRY(ncclAllReduce(in, out, n, ncclFloat, ncclSum, cb->nccl, cb->st[MSM_STREAM_MAIN]));
    return 0;
}

static int nccl_allgather(msm_comm *c, const void *in, void *out, size_t rows, size_t row_bytes,
                          msm_err *err) {
    cuda_backend *cb = from_comm(c);
    size_t per = rows * row_bytes;
    if (per * (size_t)cb->tp > cb->gather_bytes)
        return msm_err_set(err, -EINVAL, "all-gather of %zu bytes exceeds the staging buffer", per);
    cudaStream_t s = cb->st[MSM_STREAM_MAIN];
    if (cb->tp == 1) {
        TRY(cudaMemcpyAsync(out, in, per, cudaMemcpyDeviceToDevice, s));
        return 0;
    }
    NTRY(ncclAllGather(in, cb->gather_tmp, per, ncclChar, cb->nccl, s));
    /* [tp, rows, cols] → [rows, tp*cols] */
    for (int r = 0; r < cb->tp; r++)
        TRY(cudaMemcpy2DAsync((char *)out + (size_t)r * row_bytes, row_bytes * (size_t)cb->tp,
                              (char *)cb->gather_tmp + (size_t)r * per, row_bytes, row_bytes, rows,
                              cudaMemcpyDeviceToDevice, s));
    return 0;
}

static const msm_comm_vt nccl_vt = {nccl_allreduce, nccl_allgather};

static bool overlaps(const void *a, const void *b, size_t bytes) {
    return (const char *)a < (const char *)b + bytes && (const char *)b < (const char *)a + bytes;
}

/* Whether the all-reduce of `bytes` at `in` takes the one-shot kernel: the group has it (same
 * bits on every rank; the verifier's rule, collectives on MAIN, holds for it as for NCCL), the
 * message is within the tuning's limit, the input lies in the arena (where every rank's graph put
 * it at the same offset: *ret_off) and no output (NULL: none) overlaps it (planned values never
 * do). */
static bool oneshot_takes(const cuda_backend *cb, const float *in, size_t bytes, const float *out1, const float *out2,
                          msm_cuda_exec ex, size_t *ret_off) {
    size_t off = (size_t)((const char *)in - cb->arena);
    *ret_off = off;
    return cb->ar_on && bytes <= ex.tune->ar_oneshot_max_bytes && (const char *)in >= cb->arena &&
           off + bytes <= cb->arena_bytes && !(out1 && overlaps(out1, in, bytes)) && !(out2 && overlaps(out2, in, bytes));
}

/* An ALLREDUCE node: the one-shot kernel when oneshot_takes, else NCCL. */
static int allreduce_node(cuda_backend *cb, const float *in, float *out, size_t n, msm_cuda_exec ex,
                          msm_err *err) {
    size_t off;
    if (oneshot_takes(cb, in, n * sizeof(float), out, NULL, ex, &off)) {
        KTRY(msm_cuda_allreduce_oneshot(out, off, n, &cb->ar, ex));
        return 0;
    }
    return nccl_allreduce(&cb->comm, in, out, n, err);
}

/* An ALLREDUCE_ADD_RMSNORM node: the one-shot kernel with the add and norm fused when
 * oneshot_takes; else NCCL in place on the partial (its only reader is this node) and the
 * add_rmsnorm kernel. Either way the pair's bits. */
static int allreduce_add_rmsnorm_node(cuda_backend *cb, float *p, const float *x, float *sum, float *out,
                                      const uint16_t *w, int rows, int dim, float eps, msm_cuda_exec ex,
                                      msm_err *err) {
    size_t n = (size_t)rows * dim, off;
    if (oneshot_takes(cb, p, n * sizeof(float), sum, out, ex, &off)) {
        KTRY(msm_cuda_allreduce_add_rmsnorm(sum, out, off, x, w, rows, dim, eps, &cb->ar, ex));
        return 0;
    }
    int r = nccl_allreduce(&cb->comm, p, p, n, err);
    if (r) return r;
    KTRY(msm_cuda_add_rmsnorm(sum, out, x, p, w, rows, dim, eps, ex));
    return 0;
}

/* ---- nodes ------------------------------------------------------------------------------- */

#define F(v) ((float *)(cb->arena + g->vals[v].offset))
#define I32(v) ((int32_t *)(cb->arena + g->vals[v].offset))
#define ROWS(v) ((int)msm_value_rows(&g->vals[v], d->T, d->R, d->S))

/* Where a node's kernels go: its stream, with this rank's tuning (the decode variant when every
 * sequence of the step has one token). */
static msm_cuda_exec exec_on(const cuda_backend *cb, msm_stream s, const msm_step_dims *d) {
    bool decode = d && d->T == d->S;
    /* the aux stream's kernels above the main stream's (msm_cuda_tuning.stream_prio) */
    bool prio = s == MSM_STREAM_AUX &&
                (cb->tune.stream_prio == MSM_CUDA_PRIO_AUX ||
                 (cb->tune.stream_prio == MSM_CUDA_PRIO_AUTO && decode && d->T >= MSM_CUDA_AUX_PRIO_MIN_T &&
                  d->T <= MSM_CUDA_AUX_PRIO_MAX_T));
    return (msm_cuda_exec){.stream = cb->st[s], .tune = decode ? &cb->tune_decode : &cb->tune, .decode = decode,
                           .priority = prio ? cb->prio_hi : 0, .on_aux = s == MSM_STREAM_AUX};
}

/* An FP8-resident weight as the kernels take it. */
static msm_cuda_fp8w fp8w(const cuda_backend *cb, int wi) {
    return (msm_cuda_fp8w){.q = cb->w8[wi], .scale = cb->wsc[wi], .phase = cb->w_shape[wi][3]};
}

/* Whether node i is a ROPE_KV_WRITE that the ATTENTION after it takes over at decode
 * (msm_cuda_attention_rope: one kernel rotates, writes the cache and attends): the next node is
 * its layer's kv_written ATTENTION on the same stream, reading its output (the only reader, so
 * the rotated rows need not exist) with its positions and slots. */
static bool rope_attention_pair(const msm_graph *g, int i, msm_cuda_exec ex) {
    if (!(ex.decode && ex.tune->att_rope) || i < 0 || i + 1 >= g->n_nodes) return false;
    const msm_node *r = &g->nodes[i], *a = &g->nodes[i + 1];
    return r->op == MSM_OP_ROPE_KV_WRITE && a->op == MSM_OP_ATTENTION && a->attr.attention.kv_written &&
           a->layer == r->layer && a->stream == r->stream && a->in[0] == r->out[0] && a->in[2] == r->in[1] &&
           a->in[3] == r->in[2] && a->attr.attention.nh == r->attr.rope.nh && a->attr.attention.kvh == r->attr.rope.kvh &&
           a->attr.attention.hd == r->attr.rope.hd && msm_graph_readers(g, r->out[0]) == 1;
}

/* Whether float32 values u and v of `rows` rows share arena bytes. */
static bool vals_overlap(const msm_graph *g, int u, int v, int rows) {
    const msm_value *a = &g->vals[u], *b = &g->vals[v];
    size_t ab = (size_t)rows * a->cols * 4, bb = (size_t)rows * b->cols * 4;
    return a->offset < b->offset + bb && b->offset < a->offset + ab;
}

/* The terms on which node i, a QK_NORM, and the ROPE_KV_WRITE after it run as one kernel: that node
 * reads its output alone, on the same stream and layer, for the same heads of qkv rows, with a
 * rotary width msm_cuda_qk_norm_rope_kv takes, and is not itself taken by its ATTENTION
 * (rope_attention_pair). */
static bool qk_rope_shape(const msm_graph *g, int i, int rows, msm_cuda_exec ex) {
    if (!ex.tune->qk_rope || i < 0 || i + 1 >= g->n_nodes) return false;
    const msm_node *q = &g->nodes[i], *r = &g->nodes[i + 1];
    const msm_attr_qk_norm *qa = &q->attr.qk_norm;
    const msm_attr_rope *ra = &r->attr.rope;
    return q->op == MSM_OP_QK_NORM && r->op == MSM_OP_ROPE_KV_WRITE && r->layer == q->layer &&
           r->stream == q->stream && r->in[0] == q->out[0] && msm_graph_readers(g, q->out[0]) == 1 &&
           qa->nh == ra->nh && qa->kvh == ra->kvh && qa->hd == ra->hd &&
           g->vals[q->in[0]].cols == (ra->nh + 2 * ra->kvh) * ra->hd &&
           msm_cuda_qk_norm_rope_kv_fits(rows, ra->hd, ra->rot) && !rope_attention_pair(g, i + 1, ex);
}

/* Whether node i is an ADD_RMSNORM that runs with the LINEAR, QK_NORM and ROPE_KV_WRITE after it in
 * one kernel (msm_cuda_norm_linear_qk_rope, one or two tokens): the LINEAR reads the norm (the
 * norm's width its K) and only the QK_NORM reads its product; the QK_NORM and the ROPE_KV_WRITE
 * pair up on those rows (qk_rope_shape); all four on one stream; the rotated rows share no byte with
 * the norm's inputs and outputs (the kernel reads a and b in every block while block 0 writes sum
 * and out and the heads' lead blocks write the rows; the planner keeps them apart, msm_graph_plan).
 * Taken before the norm + GEMV pair and the QK_NORM + ROPE_KV_WRITE pair. */
static bool norm_qk_rope_quad(const cuda_backend *cb, const msm_graph *g, int i, int rows, msm_cuda_exec ex) {
    if (!ex.tune->norm_qk_rope || i < 0 || i + 3 >= g->n_nodes) return false;
    const msm_node *n = &g->nodes[i], *l = &g->nodes[i + 1], *q = &g->nodes[i + 2], *r = &g->nodes[i + 3];
    if (n->op != MSM_OP_ADD_RMSNORM || l->op != MSM_OP_LINEAR || q->op != MSM_OP_QK_NORM || l->stream != n->stream ||
        q->stream != n->stream || l->in[0] != n->out[1] || l->attr.linear.K != n->attr.rmsnorm.dim ||
        q->in[0] != l->out[0] || msm_graph_readers(g, l->out[0]) != 1 || g->vals[l->out[0]].io ||
        !qk_rope_shape(g, i + 2, rows, ex) || !cb->kc[r->layer])
        return false;
    for (int j = 0; j < 4; j++)
        if (vals_overlap(g, j < 2 ? n->in[j] : n->out[j - 2], r->out[0], rows)) return false;
    const uint8_t *w8 = cb->w8[l->w[0]];
    const msm_attr_rope *ra = &r->attr.rope;
    return msm_cuda_norm_linear_qk_rope_fits(rows, l->attr.linear.K, ra->nh, ra->kvh, ra->hd, ra->rot, w8 != NULL,
                                             w8 ? cb->w_shape[l->w[0]][3] : 0, ex.tune);
}

/* Whether node i is a QK_NORM that runs with the ROPE_KV_WRITE after it in one kernel
 * (msm_cuda_qk_norm_rope_kv): qk_rope_shape, where the norm-in qkv GEMV does not take both
 * (norm_qk_rope_quad). */
static bool qk_rope_attention_triple(const cuda_backend *cb, const msm_graph *g, int i, int rows, msm_cuda_exec ex);
static bool qk_rope_pair(const cuda_backend *cb, const msm_graph *g, int i, int rows, msm_cuda_exec ex) {
    return qk_rope_shape(g, i, rows, ex) && !norm_qk_rope_quad(cb, g, i - 2, rows, ex) &&
           !qk_rope_attention_triple(cb, g, i, rows, ex);
}

/* Whether node i is a QK_NORM that the ATTENTION two nodes on takes over with the ROPE_KV_WRITE
 * between (msm_cuda_attention_qk_rope: the split tensor-core attention norms, rotates and caches the
 * token's q, k and v itself, decode steps): the QK_NORM + ROPE_KV_WRITE pair's terms
 * (qk_rope_shape), where the norm-in qkv GEMV does not take them (norm_qk_rope_quad); the ATTENTION
 * is the layer's kv_written one on the same stream, the only reader of the rotated rows, with the
 * pair's positions, slots and heads; and the kernel takes the shape. */
static bool qk_rope_attention_triple(const cuda_backend *cb, const msm_graph *g, int i, int rows, msm_cuda_exec ex) {
    if (!(ex.decode && ex.tune->att_qk_rope) || i < 0 || i + 2 >= g->n_nodes) return false;
    const msm_node *q = &g->nodes[i], *r = &g->nodes[i + 1], *a = &g->nodes[i + 2];
    /* att_qk_rope 1: not after an FP8-resident qkv projection (2, the default, after any: tuning.cu) */
    const msm_node *l = i > 0 ? &g->nodes[i - 1] : NULL;
    if (ex.tune->att_qk_rope == 1 && l && l->op == MSM_OP_LINEAR && l->out[0] == q->in[0] && l->w[0] >= 0 &&
        cb->w8[l->w[0]])
        return false;
    if (a->op != MSM_OP_ATTENTION || !a->attr.attention.kv_written || a->layer != r->layer || a->stream != r->stream ||
        a->in[0] != r->out[0] || a->in[2] != r->in[1] || a->in[3] != r->in[2] || msm_graph_readers(g, r->out[0]) != 1 ||
        !qk_rope_shape(g, i, rows, ex) || norm_qk_rope_quad(cb, g, i - 2, rows, ex) || !cb->kc[a->layer])
        return false;
    const msm_attr_attention *at = &a->attr.attention;
    if (at->nh != r->attr.rope.nh || at->kvh != r->attr.rope.kvh || at->hd != r->attr.rope.hd) return false;
    return msm_cuda_attention_qk_rope_fits(rows, at->nh, at->kvh, at->hd, r->attr.rope.rot,
                                           (const char *)cb->arena + g->vals[q->in[0]].offset, cb->kc[a->layer],
                                           cb->vc[a->layer], ex);
}

static bool norm_swiglu_triple(const cuda_backend *cb, const msm_graph *g, int i, int rows, msm_cuda_exec ex);

/* Whether node i is an ADD_RMSNORM that runs with the LINEAR after it in one kernel
 * (msm_cuda_norm_linear): that node reads its norm, on the same stream (so no event between the
 * two: a reader elsewhere waits on a record after both), with the norm's width as its K, where
 * the fused kernel takes the shapes. The planner keeps such a pair's values apart (msm_graph_plan:
 * the norm's inputs and outputs live through the linear), as the kernel needs. Not where the norm,
 * the GEMV and the q/k norm + RoPE after it run as one (norm_qk_rope_quad). */
static bool norm_linear_pair(const cuda_backend *cb, const msm_graph *g, int i, int rows, msm_cuda_exec ex) {
    if (!ex.tune->norm_linear || i < 0 || i + 1 >= g->n_nodes) return false;
    const msm_node *n = &g->nodes[i], *l = &g->nodes[i + 1];
    if (n->op != MSM_OP_ADD_RMSNORM || l->op != MSM_OP_LINEAR || l->stream != n->stream || l->in[0] != n->out[1] ||
        l->attr.linear.K != n->attr.rmsnorm.dim)
        return false;
    const uint8_t *w8 = cb->w8[l->w[0]];
    return msm_cuda_norm_linear_fits(rows, l->attr.linear.N, l->attr.linear.K, w8 != NULL,
                                     w8 ? cb->w_shape[l->w[0]][3] : 0, ex.tune) &&
           !norm_swiglu_triple(cb, g, i, rows, ex) && !norm_qk_rope_quad(cb, g, i, rows, ex);
}

/* Whether node i is a bf16 LINEAR that runs with the ROPE_KV_WRITE after it in one kernel
 * (msm_cuda_linear_rope_kv, one or two tokens): that node reads its output alone, on the same
 * stream and layer, as qkv rows of its heads; the LINEAR is not itself taken by a norm before it
 * (norm_linear_pair) nor the ROPE_KV_WRITE by its ATTENTION (rope_attention_pair). */
static bool linear_rope_pair(const cuda_backend *cb, const msm_graph *g, int i, int rows, msm_cuda_exec ex) {
    if (!ex.tune->linear_rope || i < 0 || i + 1 >= g->n_nodes) return false;
    const msm_node *l = &g->nodes[i], *r = &g->nodes[i + 1];
    if (l->op != MSM_OP_LINEAR || r->op != MSM_OP_ROPE_KV_WRITE || r->layer != l->layer || r->stream != l->stream ||
        r->in[0] != l->out[0] || msm_graph_readers(g, l->out[0]) != 1 || cb->w8[l->w[0]] || !cb->kc[r->layer])
        return false;
    const msm_attr_rope *ra = &r->attr.rope;
    return msm_cuda_linear_rope_kv_fits(rows, l->attr.linear.N, l->attr.linear.K, ra->nh, ra->kvh, ra->hd, ra->rot,
                                        cb->w[l->w[0]], cb->arena + g->vals[l->in[0]].offset, ex.tune) &&
           !norm_linear_pair(cb, g, i - 1, rows, ex) && !rope_attention_pair(g, i + 1, ex);
}

/* Whether node i is a bf16 LINEAR that runs with the SWIGLU after it in one kernel
 * (msm_cuda_linear_swiglu, one or two tokens): that node reads its output alone, on the same
 * stream, as [2I] gate/up rows, no bias; the LINEAR is not itself taken by a norm before it
 * (norm_linear_pair); and the activations do not overlap the input (the kernel reads x while it
 * writes them; the planner may reuse a value's bytes once its last reader ran). */
static bool linear_swiglu_pair(const cuda_backend *cb, const msm_graph *g, int i, int rows, msm_cuda_exec ex) {
    if (!ex.tune->linear_swiglu || i < 0 || i + 1 >= g->n_nodes) return false;
    const msm_node *l = &g->nodes[i], *sw = &g->nodes[i + 1];
    if (l->op != MSM_OP_LINEAR || sw->op != MSM_OP_SWIGLU || sw->stream != l->stream || sw->in[0] != l->out[0] ||
        msm_graph_readers(g, l->out[0]) != 1 || g->vals[l->out[0]].io || cb->w8[l->w[0]] || l->w[1] >= 0 ||
        l->attr.linear.N != 2 * sw->attr.swiglu.I)
        return false;
    const msm_value *xv = &g->vals[l->in[0]];
    if (vals_overlap(g, l->in[0], sw->out[0], rows)) return false;
    return msm_cuda_linear_swiglu_fits(rows, sw->attr.swiglu.I, l->attr.linear.K, cb->w[l->w[0]],
                                       cb->arena + xv->offset, ex.tune) &&
           !norm_linear_pair(cb, g, i - 1, rows, ex) && !norm_swiglu_triple(cb, g, i - 1, rows, ex);
}

/* Whether node i is an ADD_RMSNORM that runs with the LINEAR and the SWIGLU after it in one kernel
 * (msm_cuda_norm_linear_swiglu, one or two tokens): the LINEAR reads the norm, a bf16 [2I, K] gate/up
 * without bias whose output only that SWIGLU reads, all three on one stream; the SWIGLU's output
 * shares no byte with the norm's inputs and outputs (the kernel reads a and b in every block while
 * block 0 writes sum and out and all write act; the planner keeps them apart, msm_graph_plan). Taken
 * before the norm + GEMV pair and the GEMV + SwiGLU pair. */
static bool norm_swiglu_triple(const cuda_backend *cb, const msm_graph *g, int i, int rows, msm_cuda_exec ex) {
    if (!ex.tune->norm_linear_swiglu || i < 0 || i + 2 >= g->n_nodes) return false;
    const msm_node *n = &g->nodes[i], *l = &g->nodes[i + 1], *sw = &g->nodes[i + 2];
    if (n->op != MSM_OP_ADD_RMSNORM || l->op != MSM_OP_LINEAR || sw->op != MSM_OP_SWIGLU || l->stream != n->stream ||
        sw->stream != n->stream || l->in[0] != n->out[1] || l->attr.linear.K != n->attr.rmsnorm.dim ||
        sw->in[0] != l->out[0] || msm_graph_readers(g, l->out[0]) != 1 || g->vals[l->out[0]].io || cb->w8[l->w[0]] ||
        l->w[1] >= 0 || l->attr.linear.N != 2 * sw->attr.swiglu.I)
        return false;
    for (int j = 0; j < 4; j++)
        if (vals_overlap(g, j < 2 ? n->in[j] : n->out[j - 2], sw->out[0], rows)) return false;
    return msm_cuda_norm_linear_swiglu_fits(rows, sw->attr.swiglu.I, l->attr.linear.K, cb->w[l->w[0]], ex.tune);
}

/* Whether node i is an ADD_RMSNORM that runs with the ROUTER_LINEAR_TOPK after it in one kernel
 * (msm_cuda_norm_router_linear_topk), on the same terms as norm_linear_pair: the router reads the
 * norm, on the same stream, the norm's width as its K, where the fused kernel takes the shapes
 * (the planner keeps the pair's values apart as for norm_linear_pair). */
static bool norm_router_pair(const msm_graph *g, int i, int rows, msm_cuda_exec ex) {
    if (i < 0 || i + 1 >= g->n_nodes) return false;
    const msm_node *n = &g->nodes[i], *r = &g->nodes[i + 1];
    if (n->op != MSM_OP_ADD_RMSNORM || r->op != MSM_OP_ROUTER_LINEAR_TOPK || r->stream != n->stream ||
        r->in[0] != n->out[1] || g->vals[r->in[0]].cols != n->attr.rmsnorm.dim)
        return false;
    return msm_cuda_norm_router_fits(rows, r->attr.router_topk.E, n->attr.rmsnorm.dim, ex.tune);
}

/* An event or an L2 hint (PREFETCH, PREFETCH_KV: a few one-warp blocks that leave the SMs to the
 * main stream's kernels), which the pass prefetch_l2 may put among another layer's nodes. */
static bool hint_node(const msm_node *x) {
    return x->op == MSM_OP_EVENT_RECORD || x->op == MSM_OP_EVENT_WAIT || msm_op_is_prefetch(x->op);
}

/* Whether node i (on the main stream) has kernels of its layer on the aux stream beside it: a node
 * of the same layer computing on another stream before or after it (hint nodes passed over). */
static bool aux_beside(const msm_graph *g, int i) {
    const msm_node *n = &g->nodes[i];
    if (n->stream != MSM_STREAM_MAIN) return false;
    for (int dir = -1; dir <= 1; dir += 2)
        for (int j = i + dir; j >= 0 && j < g->n_nodes; j += dir) {
            const msm_node *x = &g->nodes[j];
            if (hint_node(x)) continue;
            if (x->layer != n->layer) break;
            if (x->stream != MSM_STREAM_MAIN) return true;
        }
    return false;
}

/* PREFETCH: its weights, in order, as stored (an FP8-resident one as its codes, then its scales), into
 * L2 (msm_cuda_l2_prefetch) at steps of up to l2_prefetch_max_t tokens; nothing past that. */
static int prefetch_node(const cuda_backend *cb, const msm_node *n, const msm_step_dims *d, msm_cuda_exec ex,
                         msm_err *err) {
    if (d->T > ex.tune->l2_prefetch_max_t) return 0;
    msm_cuda_span sp[MSM_CUDA_PREFETCH_MAX_SPANS];
    int ns = 0;
    for (int j = 0; j < MSM_NODE_MAX_W; j++) {
        int wi = n->w[j];
        if (wi < 0 || wi >= cb->n_weights) continue;
        if (cb->w8[wi]) {
            const int *sh = cb->w_shape[wi];
            sp[ns++] = (msm_cuda_span){cb->w8[wi], cb->w_elems[wi]};
            sp[ns++] = (msm_cuda_span){cb->wsc[wi], 4 * msm_cuda_fp8_scales(sh[0], sh[1], sh[2], sh[3])};
        } else if (cb->w[wi]) {
            sp[ns++] = (msm_cuda_span){cb->w[wi], (cb->w_f32[wi] ? 4 : 2) * cb->w_elems[wi]};
        }
    }
    KTRY(msm_cuda_l2_prefetch(sp, ns, ex));
    return 0;
}

/* MOE_EXPERTS node n's call as msm_cuda_moe_args (its stream's workspaces; FP8-resident weights as
 * pick_fp8 chose them: both or neither). */
static msm_cuda_moe_args moe_args(const cuda_backend *cb, const msm_graph *g, const msm_node *n,
                                  const msm_step_dims *d) {
    const msm_attr_moe_experts *ma = &n->attr.moe_experts;
    bool f8 = cb->w8[n->w[0]] != NULL;
    return (msm_cuda_moe_args){.x = F(n->in[0]),
                               .ids = I32(n->in[1]),
                               .w = F(n->in[2]),
                               .gate_up = f8 ? NULL : cb->w[n->w[0]],
                               .down = f8 ? NULL : cb->w[n->w[1]],
                               .gu = f8 ? fp8w(cb, n->w[0]) : (msm_cuda_fp8w){0},
                               .dn = f8 ? fp8w(cb, n->w[1]) : (msm_cuda_fp8w){0},
                               .T = ROWS(n->in[0]),
                               .H = ma->H,
                               .I = ma->I,
                               .k = ma->k,
                               .E = ma->E,
                               .ws = cb->ws[n->stream],
                               .deq = cb->deq[n->stream],
                               .ws_bytes = cb->ws_bytes,
                               .deq_bytes = cb->deq_bytes};
}

/* Where the MOE_EXPERTS node i leaves its combine to the node reading its sum (tuning
 * moe_fused_combine): that node's index, else -1. The reader (msm_graph_moe_sum_reader: on the
 * same stream with only event nodes and L2 hints between, so no kernel touches the stream's
 * workspace in between) is the sum's only one: an ADD_RMSNORM reading it once that no pairing with
 * the node after it takes, or a MOE_COMBINE_NORM reading it as its routed sum; its outputs share no
 * byte with the routing's ids and weights (msm_graph_plan keeps them apart); and the experts' path
 * ends with the combine (msm_cuda_moe_defers: 5 tokens and more). */
static int moe_combine_reader(const cuda_backend *cb, const msm_graph *g, int i, const msm_step_dims *d,
                              msm_cuda_exec ex) {
    int j = ex.tune->moe_fused_combine ? msm_graph_moe_sum_reader(g, i) : -1;
    if (j < 0) return -1;
    const msm_node *n = &g->nodes[i], *r = &g->nodes[j];
    if (msm_graph_readers(g, n->out[0]) != 1 || g->vals[n->out[0]].io) return -1;
    int rows = ROWS(n->in[0]);
    if (r->op != MSM_OP_ADD_RMSNORM && ex.tune->moe_fused_combine == 2) return -1; /* 2: only an ADD_RMSNORM */
    if (r->op == MSM_OP_ADD_RMSNORM &&
        (r->in[0] == r->in[1] || norm_qk_rope_quad(cb, g, j, rows, ex) || norm_swiglu_triple(cb, g, j, rows, ex) ||
         norm_linear_pair(cb, g, j, rows, ex) || norm_router_pair(g, j, rows, ex)))
        return -1;
    /* the reader writes its outputs while it reads the routing (the planner keeps them apart) */
    for (int o = 0; o < 2; o++)
        for (int q = 1; q <= 2; q++)
            if (vals_overlap(g, r->out[o], n->in[q], rows)) return -1;
    msm_cuda_moe_args m = moe_args(cb, g, n, d);
    return msm_cuda_moe_defers(&m, ex.tune) ? j : -1;
}

/* Where ROUTER_LINEAR_TOPK node i groups the pairs for the MOE_EXPERTS node reading its ids and
 * weights (tuning router_group: msm_cuda_router_groups): that node's index, with its call in *m; else
 * -1. The experts are the next node on the router's stream (only events between, so no kernel
 * touches the stream's workspace in between). */
static int router_group_target(const cuda_backend *cb, const msm_graph *g, int i, const msm_step_dims *d,
                               msm_cuda_exec ex, msm_cuda_moe_args *m) {
    const msm_node *r = &g->nodes[i];
    if (r->op != MSM_OP_ROUTER_LINEAR_TOPK || !ex.tune->router_group || cb->skip_ops >> r->op & 1) return -1;
    for (int j = i + 1; j < g->n_nodes; j++) {
        const msm_node *x = &g->nodes[j];
        if (x->stream != r->stream || x->op == MSM_OP_EVENT_WAIT || x->op == MSM_OP_EVENT_RECORD) continue;
        if (x->op != MSM_OP_MOE_EXPERTS || x->in[1] != r->out[0] || x->in[2] != r->out[1] || cb->skip_ops >> x->op & 1)
            return -1;
        *m = moe_args(cb, g, x, d);
        return msm_cuda_router_groups(m, ex.tune) ? j : -1;
    }
    return -1;
}

/* Whether MOE_EXPERTS node j's grouping is done by the router before it (router_group_target). */
static bool router_grouped(const cuda_backend *cb, const msm_graph *g, int j, const msm_step_dims *d,
                           msm_cuda_exec ex) {
    int i = j - 1;
    while (i >= 0 && (g->nodes[i].stream != g->nodes[j].stream || g->nodes[i].op == MSM_OP_EVENT_WAIT ||
                      g->nodes[i].op == MSM_OP_EVENT_RECORD))
        i--;
    msm_cuda_moe_args m;
    return i >= 0 && router_group_target(cb, g, i, d, ex, &m) == j;
}

/* The MOE_EXPERTS node whose combine node j takes over (moe_combine_reader), else -1. */
static int moe_combine_source(const cuda_backend *cb, const msm_graph *g, int j, const msm_step_dims *d,
                              msm_cuda_exec ex) {
    int i = msm_graph_moe_sum_source(g, j); /* past what moe_combine_reader's reader passes over */
    return i >= 0 && moe_combine_reader(cb, g, i, d, ex) == j ? i : -1;
}

static int cuda_run(msm_backend *b, const msm_graph *g, int idx, const msm_step_dims *d, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    const msm_node *n = &g->nodes[idx];
    if (cb->skip_ops >> n->op & 1) return 0;
    msm_cuda_exec s = exec_on(cb, n->stream, d);
    void *ws = cb->ws[n->stream];
    const msm_attr *a = &n->attr;
    int in0 = n->in[0], out0 = n->out[0];
    /* an FP8-resident weight reaches only the ops pick_fp8 chose it for (the bias slot of a LINEAR
     * is never one); anything else is a bug in that choice, reported rather than read as bf16 */
    for (int j = 0; j < MSM_NODE_MAX_W; j++)
        if (n->w[j] >= 0 && cb->w8[n->w[j]] &&
            !(((n->op == MSM_OP_LINEAR || n->op == MSM_OP_LINEAR_ADD_RMSNORM) && j == 0) ||
              (n->op == MSM_OP_MOE_EXPERTS && j < 2) || msm_op_is_prefetch(n->op)))
            return msm_err_set(err, -ENOTSUP, "rank %d (GPU %d): op %s has no kernel for the FP8 weight %d",
                               cb->b.rank, cb->device, msm_op_name(n->op), n->w[j]);
    switch (n->op) {
    case MSM_OP_PREFETCH: return prefetch_node(cb, n, d, s, err);
    case MSM_OP_PREFETCH_KV: /* decode steps of up to l2_prefetch_kv_max_t tokens, where the layer has a cache */
        if (d->T != d->S || d->T > s.tune->l2_prefetch_kv_max_t || n->layer < 0 || n->layer >= cb->n_layers ||
            !cb->kc[n->layer])
            break;
        KTRY(msm_cuda_kv_prefetch(cb->kc[n->layer], cb->vc[n->layer], I32(in0), I32(n->in[1]), I32(n->in[2]),
                                  g->max_blocks, cb->n_kv_blocks, d->T, a->attention.kvh, a->attention.hd, s));
        break;
    case MSM_OP_EMBED:
        KTRY(msm_cuda_embed(F(out0), cb->w[n->w[0]], I32(in0), d->T, a->embed.H, s));
        break;
    case MSM_OP_RMSNORM:
        KTRY(msm_cuda_rmsnorm(F(out0), F(in0), cb->w[n->w[0]], ROWS(in0), a->rmsnorm.dim, a->rmsnorm.eps, s));
        break;
    case MSM_OP_QK_NORM:
        if (norm_qk_rope_quad(cb, g, idx - 2, ROWS(in0), s)) break; /* the LINEAR before did it */
        if (qk_rope_attention_triple(cb, g, idx, ROWS(in0), s)) break; /* the ATTENTION two on does it */
        if (qk_rope_pair(cb, g, idx, ROWS(in0), s)) { /* with the ROPE_KV_WRITE after it, into that node's output */
            const msm_node *rn = &g->nodes[idx + 1];
            if (!cb->kc[rn->layer])
                return msm_err_set(err, -EINVAL, "rank %d (GPU %d): layer %d has no KV cache (no ATTENTION)",
                                   cb->b.rank, cb->device, rn->layer);
            KTRY(msm_cuda_qk_norm_rope_kv(F(rn->out[0]), F(in0), cb->w[n->w[0]], cb->w[n->w[1]], I32(rn->in[1]),
                                          I32(rn->in[2]), cb->kc[rn->layer], cb->vc[rn->layer], ROWS(in0),
                                          a->qk_norm.nh, a->qk_norm.kvh, a->qk_norm.hd, rn->attr.rope.rot,
                                          rn->attr.rope.theta, a->qk_norm.eps, s));
            break;
        }
        KTRY(msm_cuda_qk_norm(F(out0), F(in0), cb->w[n->w[0]], cb->w[n->w[1]], ROWS(in0), g->vals[in0].cols,
                              a->qk_norm.nh, a->qk_norm.kvh, a->qk_norm.hd, a->qk_norm.eps, s));
        break;
    case MSM_OP_LINEAR: {
        if (norm_qk_rope_quad(cb, g, idx - 1, ROWS(in0), s)) { /* the ADD_RMSNORM before, QK_NORM + ROPE_KV_WRITE after */
            const msm_node *nn = &g->nodes[idx - 1], *qn = &g->nodes[idx + 1], *rn = &g->nodes[idx + 2];
            const msm_attr_rope *ra = &rn->attr.rope;
            msm_cuda_qk_rope q = {cb->w[qn->w[0]], cb->w[qn->w[1]], qn->attr.qk_norm.eps, I32(rn->in[1]),
                                  I32(rn->in[2]), cb->kc[rn->layer], cb->vc[rn->layer], ra->nh, ra->kvh, ra->hd,
                                  ra->rot, ra->theta};
            KTRY(msm_cuda_norm_linear_qk_rope(F(rn->out[0]), F(nn->out[0]), F(nn->out[1]), F(nn->in[0]), F(nn->in[1]),
                                              cb->w[nn->w[0]], nn->attr.rmsnorm.eps,
                                              cb->w8[n->w[0]] ? NULL : cb->w[n->w[0]],
                                              cb->w8[n->w[0]] ? fp8w(cb, n->w[0]) : (msm_cuda_fp8w){0},
                                              n->w[1] >= 0 ? cb->w[n->w[1]] : NULL, q, ROWS(in0), a->linear.K, s));
            break;
        }
        bool triple = norm_swiglu_triple(cb, g, idx - 1, ROWS(in0), s), npair = norm_linear_pair(cb, g, idx - 1, ROWS(in0), s);
        /* a norm-in GEMV heading an AUX branch (pass fork_before_norm: the shared expert's copy of the
         * norm) launches once the main stream's work it waits for is done, not as its programmatic
         * dependent: its blocks, resident early, would hold the SMs that the main stream's router,
         * launched programmatically beside it, needs */
        if ((triple || npair) && idx >= 2 && g->nodes[idx - 1].stream == MSM_STREAM_AUX &&
            g->nodes[idx - 2].op == MSM_OP_EVENT_WAIT && g->nodes[idx - 2].stream == MSM_STREAM_AUX)
            s.no_pdl = true;
        if (triple) { /* the ADD_RMSNORM before, the SWIGLU after */
            const msm_node *nn = &g->nodes[idx - 1], *sn = &g->nodes[idx + 1];
            KTRY(msm_cuda_norm_linear_swiglu(F(sn->out[0]), F(nn->out[0]), F(nn->out[1]), F(nn->in[0]), F(nn->in[1]),
                                             cb->w[nn->w[0]], nn->attr.rmsnorm.eps, cb->w[n->w[0]], ROWS(in0),
                                             sn->attr.swiglu.I, a->linear.K, s));
            break;
        }
        if (npair) { /* with the ADD_RMSNORM before it, one launch */
            const msm_node *nn = &g->nodes[idx - 1];
            KTRY(msm_cuda_norm_linear(F(out0), F(nn->out[0]), F(nn->out[1]), F(nn->in[0]), F(nn->in[1]),
                                      cb->w[nn->w[0]], nn->attr.rmsnorm.eps, cb->w8[n->w[0]] ? NULL : cb->w[n->w[0]],
                                      cb->w8[n->w[0]] ? fp8w(cb, n->w[0]) : (msm_cuda_fp8w){0},
                                      n->w[1] >= 0 ? cb->w[n->w[1]] : NULL, ROWS(in0), a->linear.N, a->linear.K, s));
            break;
        }
        if (linear_rope_pair(cb, g, idx, ROWS(in0), s)) { /* with the ROPE_KV_WRITE after it, into its output */
            const msm_node *rn = &g->nodes[idx + 1];
            KTRY(msm_cuda_linear_rope_kv(F(rn->out[0]), F(in0), cb->w[n->w[0]], n->w[1] >= 0 ? cb->w[n->w[1]] : NULL,
                                         I32(rn->in[1]), I32(rn->in[2]), cb->kc[rn->layer], cb->vc[rn->layer],
                                         ROWS(in0), a->linear.K, rn->attr.rope.nh, rn->attr.rope.kvh,
                                         rn->attr.rope.hd, rn->attr.rope.rot, rn->attr.rope.theta, s));
            break;
        }
        if (linear_swiglu_pair(cb, g, idx, ROWS(in0), s)) { /* with the SWIGLU after it, into its output */
            const msm_node *sn = &g->nodes[idx + 1];
            KTRY(msm_cuda_linear_swiglu(F(sn->out[0]), F(in0), cb->w[n->w[0]], ROWS(in0), sn->attr.swiglu.I,
                                        a->linear.K, s));
            break;
        }
        if (cb->w8[n->w[0]])
            KTRY(msm_cuda_linear_fp8(F(out0), F(in0), fp8w(cb, n->w[0]), n->w[1] >= 0 ? cb->w[n->w[1]] : NULL,
                                     ROWS(in0), a->linear.N, a->linear.K, cb->ctx, ws, cb->ws_bytes,
                                     cb->deq[n->stream], cb->deq_bytes, s));
        else
            KTRY(msm_cuda_linear(F(out0), F(in0), cb->w[n->w[0]], n->w[1] >= 0 ? cb->w[n->w[1]] : NULL,
                                 ROWS(in0), a->linear.N, a->linear.K, cb->ctx, ws, cb->ws_bytes, s));
        break;
    }
    case MSM_OP_LINEAR_ADD_RMSNORM: { /* y into the sum's bytes (never an input's: the planner), then add + norm */
        const msm_attr_linear_norm *ln = &a->linear_norm;
        const uint16_t *bias = n->w[1] >= 0 ? cb->w[n->w[1]] : NULL;
        if (cb->w8[n->w[0]]) {
            KTRY(msm_cuda_linear_fp8(F(out0), F(in0), fp8w(cb, n->w[0]), bias, ROWS(in0), ln->N, ln->K, cb->ctx, ws,
                                     cb->ws_bytes, cb->deq[n->stream], cb->deq_bytes, s));
            KTRY(msm_cuda_add_rmsnorm(F(out0), F(n->out[1]), F(n->in[1]), F(out0), cb->w[n->w[2]], ROWS(in0), ln->N,
                                      ln->eps, s));
        } else {
            KTRY(msm_cuda_linear_add_rmsnorm(F(out0), F(n->out[1]), F(in0), cb->w[n->w[0]], bias, F(n->in[1]),
                                             cb->w[n->w[2]], ROWS(in0), ln->N, ln->K, ln->eps, cb->ln_ctr[n->stream],
                                             cb->ctx, ws, cb->ws_bytes, s));
        }
        break;
    }
    case MSM_OP_ROPE: /* q and k heads lead every row: rotate them and copy the v heads, one launch */
        KTRY(msm_cuda_rope_copy(F(out0), F(in0), I32(n->in[1]), ROWS(in0), g->vals[in0].cols,
                                a->rope.nh + a->rope.kvh, a->rope.hd, a->rope.rot, a->rope.theta, s));
        break;
    case MSM_OP_ROPE_KV_WRITE: /* the same, and the rotated K and the V rows into this layer's cache */
        if (!cb->kc[n->layer])
            return msm_err_set(err, -EINVAL, "rank %d (GPU %d): layer %d has no KV cache (no ATTENTION)",
                               cb->b.rank, cb->device, n->layer);
        if (rope_attention_pair(g, idx, s)) break; /* the ATTENTION next does it */
        if (qk_rope_attention_triple(cb, g, idx - 1, ROWS(in0), s)) break; /* the ATTENTION next does it */
        if (norm_qk_rope_quad(cb, g, idx - 3, ROWS(in0), s)) break; /* the LINEAR before did it */
        if (qk_rope_pair(cb, g, idx - 1, ROWS(in0), s)) break; /* the QK_NORM before did it */
        if (linear_rope_pair(cb, g, idx - 1, ROWS(in0), s)) break; /* the LINEAR before did it */
        KTRY(msm_cuda_rope_kv(F(out0), F(in0), I32(n->in[1]), I32(n->in[2]), cb->kc[n->layer], cb->vc[n->layer],
                              ROWS(in0), a->rope.nh, a->rope.kvh, a->rope.hd, a->rope.rot, a->rope.theta, s));
        break;
    case MSM_OP_ATTENTION: {
        int nh = a->attention.nh, kvh = a->attention.kvh, hd = a->attention.hd;
        int C = g->vals[in0].cols, T = ROWS(in0);
        const float *qkv = F(in0);
        /* k, v and q read in place from the qkv rows (row stride C); q_tmp is the split-context
         * workspace. The K/V write is skipped when the ROPE_KV_WRITE before wrote the cache. */
        if (qk_rope_attention_triple(cb, g, idx - 2, T, s)) { /* decode: the QK_NORM and ROPE_KV_WRITE before too */
            const msm_node *qn = &g->nodes[idx - 2], *rn = &g->nodes[idx - 1];
            KTRY(msm_cuda_attention_qk_rope(F(out0), F(qn->in[0]), cb->w[qn->w[0]], cb->w[qn->w[1]],
                                            qn->attr.qk_norm.eps, cb->kc[n->layer], cb->vc[n->layer], I32(n->in[1]),
                                            I32(n->in[2]), I32(n->in[3]), I32(n->in[4]), g->max_blocks, T, nh, kvh, hd,
                                            rn->attr.rope.rot, rn->attr.rope.theta, a->attention.scale, s));
            break;
        }
        if (rope_attention_pair(g, idx - 1, s)) { /* decode: the ROPE_KV_WRITE before in the same launch */
            const msm_node *rn = &g->nodes[idx - 1];
            KTRY(msm_cuda_attention_rope(F(out0), F(rn->out[0]), F(rn->in[0]), cb->kc[n->layer], cb->vc[n->layer],
                                         I32(n->in[1]), I32(n->in[2]), I32(n->in[3]), I32(n->in[4]), g->max_blocks, T,
                                         nh, kvh, hd, rn->attr.rope.rot, rn->attr.rope.theta, a->attention.scale,
                                         cb->q_tmp[n->stream], cb->q_tmp_bytes, s));
            break;
        }
        if (!a->attention.kv_written)
            KTRY(msm_cuda_kv_write_ld(cb->kc[n->layer], cb->vc[n->layer], qkv + (size_t)nh * hd,
                                      qkv + (size_t)(nh + kvh) * hd, (size_t)C, I32(n->in[3]), T, kvh, hd, s));
        KTRY(msm_cuda_attention_ex(F(out0), qkv, (size_t)C, cb->kc[n->layer], cb->vc[n->layer], I32(n->in[1]),
                                   I32(n->in[2]), I32(n->in[4]), g->max_blocks, T, nh, kvh, hd, a->attention.scale,
                                   cb->q_tmp[n->stream], cb->q_tmp_bytes, s));
        break;
    }
    case MSM_OP_ADD:
        KTRY(msm_cuda_add(F(out0), F(in0), F(n->in[1]), (size_t)ROWS(in0) * g->vals[in0].cols, s));
        break;
    case MSM_OP_ADD_RMSNORM: {
        int mi = moe_combine_source(cb, g, idx, d, s);
        if (mi >= 0) { /* with the routed experts' combine, left to it: a + their sum */
            msm_cuda_moe_args m = moe_args(cb, g, &g->nodes[mi], d);
            int ai = n->in[0] == g->nodes[mi].out[0] ? n->in[1] : n->in[0];
            KTRY(msm_cuda_moe_add_rmsnorm(F(out0), F(n->out[1]), F(ai), cb->w[n->w[0]], a->rmsnorm.eps, &m, s));
            break;
        }
        if (norm_qk_rope_quad(cb, g, idx, ROWS(in0), s)) break;  /* the LINEAR next does it */
        if (norm_swiglu_triple(cb, g, idx, ROWS(in0), s)) break; /* the LINEAR next does it */
        if (norm_linear_pair(cb, g, idx, ROWS(in0), s)) break; /* the LINEAR next does it */
        if (norm_router_pair(g, idx, ROWS(in0), s)) break;     /* the router next does it */
        KTRY(msm_cuda_add_rmsnorm(F(out0), F(n->out[1]), F(in0), F(n->in[1]), cb->w[n->w[0]], ROWS(in0),
                                  a->rmsnorm.dim, a->rmsnorm.eps, s));
        break;
    }
    case MSM_OP_MOE_COMBINE_NORM: {
        int mi = moe_combine_source(cb, g, idx, d, s);
        if (mi >= 0) { /* with the routed experts' combine, left to it */
            msm_cuda_moe_args m = moe_args(cb, g, &g->nodes[mi], d);
            KTRY(msm_cuda_moe_combine_rmsnorm_routed(F(out0), F(n->out[1]), F(in0), F(n->in[2]), F(n->in[3]),
                                                     cb->w[n->w[0]], cb->w[n->w[1]], a->rmsnorm.eps, &m, s));
            break;
        }
        KTRY(msm_cuda_moe_combine_rmsnorm(F(out0), F(n->out[1]), F(in0), F(n->in[1]), F(n->in[2]), F(n->in[3]),
                                          cb->w[n->w[0]], cb->w[n->w[1]], ROWS(in0), a->rmsnorm.dim,
                                          a->rmsnorm.eps, s));
        break;
    }
    case MSM_OP_MOE_COMBINE:
        KTRY(msm_cuda_moe_combine(F(out0), F(in0), F(n->in[1]), F(n->in[2]), cb->w[n->w[0]], ROWS(in0),
                                  g->vals[in0].cols, s));
        break;
    case MSM_OP_MUL:
        KTRY(msm_cuda_scale_rows(F(out0), F(in0), F(n->in[1]), ROWS(in0), g->vals[in0].cols, s));
        break;
    case MSM_OP_SIGMOID:
        KTRY(msm_cuda_sigmoid(F(out0), F(in0), (size_t)ROWS(in0) * g->vals[in0].cols, s));
        break;
    case MSM_OP_SWIGLU:
        if (norm_swiglu_triple(cb, g, idx - 2, ROWS(in0), s)) break; /* the LINEAR before did it */
        if (linear_swiglu_pair(cb, g, idx - 1, ROWS(in0), s)) break; /* the LINEAR before did it */
        KTRY(msm_cuda_swiglu(F(out0), F(in0), ROWS(in0), a->swiglu.I, s));
        break;
    case MSM_OP_ROUTER_TOPK:
        KTRY(msm_cuda_router_topk(I32(out0), F(n->out[1]), F(in0), ROWS(in0), a->router_topk.E, a->router_topk.k,
                                  a->router_topk.norm != 0, s));
        break;
    case MSM_OP_ROUTER_LINEAR_TOPK: {
        const msm_attr_router_topk *r = &a->router_topk;
        s.aux_beside = aux_beside(g, idx); /* the batched cluster router only alone (msm_cuda_exec) */
        msm_cuda_moe_args gm; /* the experts after it, whose grouping it does (router_group_target) */
        const msm_cuda_moe_args *grp = router_group_target(cb, g, idx, d, s, &gm) >= 0 ? &gm : NULL;
        if (norm_router_pair(g, idx - 1, ROWS(in0), s)) { /* with the ADD_RMSNORM before it, one launch */
            const msm_node *nn = &g->nodes[idx - 1];
            KTRY(msm_cuda_norm_router_linear_topk(I32(out0), F(n->out[1]), F(nn->out[0]), F(nn->out[1]),
                                                  F(nn->in[0]), F(nn->in[1]), cb->w[nn->w[0]], nn->attr.rmsnorm.eps,
                                                  cb->w[n->w[0]], ROWS(in0), r->E, g->vals[in0].cols, r->k,
                                                  r->norm != 0, grp, cb->router_ws[n->stream], cb->router_ws_bytes,
                                                  s));
            break;
        }
        KTRY(msm_cuda_router_linear_topk(I32(out0), F(n->out[1]), F(in0), cb->w[n->w[0]], ROWS(in0), r->E,
                                         g->vals[in0].cols, r->k, r->norm != 0, grp, cb->router_ws[n->stream],
                                         cb->router_ws_bytes, s));
        break;
    }
    case MSM_OP_ROUTER_GROUP_TOPK: { /* its bias is a keep_f32 weight: float32 on the device */
        const msm_attr_router_group *r = &a->router_group;
        KTRY(msm_cuda_router_group_topk(I32(out0), F(n->out[1]), F(in0), (const float *)cb->w[n->w[0]], ROWS(in0),
                                        r->E, r->k, r->n_group, r->topk_group, r->norm != 0, r->scale, s));
        break;
    }
    case MSM_OP_MOE_EXPERTS: {
        /* not a programmatic dependent of the router where the shared expert runs beside, at few
         * tokens (msm_cuda_tuning.moe_aux_serial_max_t); its later kernels are (the experts code
         * clears it) */
        s.aux_beside = aux_beside(g, idx);
        s.no_pdl = ROWS(in0) <= s.tune->moe_aux_serial_max_t && s.aux_beside;
        msm_cuda_moe_args m = moe_args(cb, g, n, d); /* FP8-resident weights as pick_fp8 chose them */
        m.grouped = router_grouped(cb, g, idx, d, s); /* the router before it grouped the pairs */
        if (moe_combine_reader(cb, g, idx, d, s) >= 0) { /* its combine left to the node reading the sum */
            KTRY(msm_cuda_moe_experts_deferred(&m, s));
            break;
        }
        KTRY(msm_cuda_moe_experts_args(F(out0), &m, s));
        break;
    }
    case MSM_OP_GATHER_ROWS: {
        /* the row indices are on the device: one gather launch, no host round trip */
        int R = ROWS(out0), C = g->vals[in0].cols;
        KTRY(msm_cuda_gather_rows(F(out0), F(in0), I32(n->in[1]), R, C, s));
        break;
    }
    case MSM_OP_ALLREDUCE:
        if (n->stream != MSM_STREAM_MAIN)
            return msm_err_set(err, -EINVAL, "collective on a non-main stream reached the CUDA backend");
        return allreduce_node(cb, F(in0), F(out0), (size_t)ROWS(in0) * g->vals[in0].cols, s, err);
    case MSM_OP_ALLREDUCE_ADD_RMSNORM:
        if (n->stream != MSM_STREAM_MAIN)
            return msm_err_set(err, -EINVAL, "collective on a non-main stream reached the CUDA backend");
        return allreduce_add_rmsnorm_node(cb, F(in0), F(n->in[1]), F(out0), F(n->out[1]), cb->w[n->w[0]], ROWS(in0),
                                          a->rmsnorm.dim, a->rmsnorm.eps, s, err);
    case MSM_OP_ALLGATHER:
        if (n->stream != MSM_STREAM_MAIN)
            return msm_err_set(err, -EINVAL, "collective on a non-main stream reached the CUDA backend");
        return nccl_allgather(&cb->comm, F(in0), F(out0), (size_t)ROWS(in0), sizeof(float) * g->vals[in0].cols, err);
    case MSM_OP_SAMPLE: {
        int R = ROWS(in0), V = a->sample.V, Vp = a->sample.V_pad;
        const msm_sample_params *p = (const msm_sample_params *)I32(n->in[1]);
        KTRY(msm_cuda_sample(I32(out0), F(in0), (size_t)Vp, p, R, V, ws, cb->ws_bytes, s));
        break;
    }
    default:
        return msm_err_set(err, -ENOTSUP, "cuda backend: op %s is not supported", msm_op_name(n->op));
    }
    return 0;
}

static int cuda_record(msm_backend *b, msm_stream s, int e, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    TRY(cudaEventRecord(cb->ev[e], cb->st[s]));
    return 0;
}

static int cuda_wait(msm_backend *b, msm_stream s, int e, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    TRY(cudaStreamWaitEvent(cb->st[s], cb->ev[e], 0));
    return 0;
}

static int cuda_begin(msm_backend *b, msm_err *err) {
    (void)b;
    (void)err;
    return 0;
}

/* The group failed (a step past its deadline, a one-shot peer that never arrived): no more
 * steps. At TP 1 the NCCL communicator is aborted at once (nothing of it runs on the device; the
 * hang check passes this way on the H200). At TP > 1 it is revoked instead: NCCL stops its
 * operations in flight and marks the communicator busy until it is quiescent, without the
 * teardown of ncclCommAbort, whose device-wide synchronisation can wait on a kernel that waits
 * on a peer (a two-GPU stalled-rank check hung the daemon that way: no reply within 100 s).
 * cuda_free aborts a revoked communicator once it is quiescent, within a deadline. */
#pragma weak ncclCommRevoke /* NCCL 2.28; with an older libnccl at run time: abort */

static void group_failed(cuda_backend *cb) {
    cb->broken = true;
    if (!cb->nccl || cb->revoked) return;
    if (cb->tp == 1 || !ncclCommRevoke) {
        ncclCommAbort(cb->nccl);
        cb->nccl = NULL;
    } else {
        ncclCommRevoke(cb->nccl, NCCL_REVOKE_DEFAULT);
        cb->revoked = true;
    }
}

/* Polls the main stream (the aux stream is always joined into it) until done or the deadline. */
static int cuda_sync(msm_backend *b, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->capturing) return 0;
    if (cb->broken)
        return msm_err_set(err, -EIO, "rank %d (GPU %d): a collective of this group failed earlier; the "
                                      "group cannot run more steps", cb->b.rank, cb->device);
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned spin = 0;; spin++) {
        cudaError_t e = cudaStreamQuery(cb->st[MSM_STREAM_MAIN]);
        if (e == cudaSuccess) break;
        if (e != cudaErrorNotReady) TRY(e);
        clock_gettime(CLOCK_MONOTONIC, &t);
        double ms = (double)(t.tv_sec - t0.tv_sec) * 1e3 + (double)(t.tv_nsec - t0.tv_nsec) * 1e-6;
        if (ms > cb->b.deadline_ms) {
            group_failed(cb);
            return msm_err_set(err, -ETIMEDOUT, "rank %d (GPU %d): the step did not finish within %d ms; "
                                                "NCCL communicator %s", cb->b.rank, cb->device, cb->b.deadline_ms,
                               cb->revoked ? "revoked" : "aborted");
        }
        /* a decode step ends within a few ms: poll on, yielding the core to anyone runnable (a
         * 20 us sleep woke 50-70 us late under the default timer slack, every step) */
        if (spin > 64) {
            if (cb->wait_sleep) usleep(20);
            else sched_yield();
        }
    }
    TRY(cudaStreamQuery(cb->st[MSM_STREAM_AUX]));
    cb->stage_used = 0; /* every queued copy is done */
    if (cb->ar_fault && *(volatile uint32_t *)cb->ar_fault) {
        group_failed(cb);
        return msm_err_set(err, -ETIMEDOUT, "rank %d (GPU %d): a peer of the one-shot all-reduce did not arrive "
                                            "within %d ms; NCCL communicator %s", cb->b.rank, cb->device,
                           cb->b.deadline_ms, cb->revoked ? "revoked" : "aborted");
    }
    return 0;
}

/* Which weights stay FP8 on the device: msm_weights_fp8_resident's rule (docs/adr/0006-fp8.md),
 * unless the tuning says no (MSM_CUDA_FP8_RESIDENT=0). */
static void pick_fp8(const cuda_backend *cb, const msm_graph *g, const msm_wsource *src, bool *fp8) {
    msm_weights_fp8_resident(g, cb->tune.fp8_resident ? src : NULL, fp8);
}

static size_t al256(size_t v) { return (v + 255) & ~(size_t)255; }

/* Every weight in one allocation, carved at 256-byte boundaries, zeroed before any load writes. */
static int cuda_alloc_weights(msm_backend *b, const msm_graph *g, const msm_wsource *src, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    if (cb->w) return msm_err_set(err, -EINVAL, "rank %d: weights are allocated already", cb->b.rank);
    size_t nw = (size_t)(g->n_weights ? g->n_weights : 1);
    cb->w = calloc(nw, sizeof *cb->w);
    cb->w8 = calloc(nw, sizeof *cb->w8);
    cb->wsc = calloc(nw, sizeof *cb->wsc);
    cb->w_elems = calloc(nw, sizeof *cb->w_elems);
    cb->w_f32 = calloc(nw, sizeof *cb->w_f32);
    cb->w_shape = calloc(nw, sizeof *cb->w_shape);
    cb->w_name = calloc(nw, sizeof *cb->w_name);
    bool *fp8 = calloc(nw, sizeof *fp8);
    if (!cb->w || !cb->w8 || !cb->wsc || !cb->w_elems || !cb->w_f32 || !cb->w_shape || !cb->w_name || !fp8) {
        free(fp8);
        return msm_err_set(err, -ENOMEM, "out of memory");
    }
    cb->n_weights = g->n_weights;
    pick_fp8(cb, g, src, fp8);
    size_t total = 0, total8 = 0;
    for (int i = 0; i < g->n_weights; i++) {
        const msm_weight *w = &g->weights[i];
        size_t before = total;
        cb->w_elems[i] = (size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols;
        cb->w_f32[i] = w->keep_f32;
        cb->w_shape[i][0] = w->n_expert, cb->w_shape[i][1] = w->rows, cb->w_shape[i][2] = w->cols;
        cb->w_shape[i][3] = fp8[i] ? src[i].fp8_phase : 0;
        snprintf(cb->w_name[i], sizeof cb->w_name[i], "%s", w->name);
        if (fp8[i])
            total += al256(cb->w_elems[i]) + al256(4 * msm_cuda_fp8_scales(w->n_expert, w->rows, w->cols,
                                                                               cb->w_shape[i][3]));
        else
            total += al256((w->keep_f32 ? 4 : 2) * cb->w_elems[i]);
        if (fp8[i]) total8 += total - before;
    }
    b->weight_bytes = total, b->weight_bytes_fp8 = total8;
    cudaError_t e = cudaMalloc(&cb->wmem, total ? total : 256);
    if (e != cudaSuccess) {
        free(fp8);
        return msm_err_set(err, msm_cuda_errno(e), "rank %d (GPU %d): cannot allocate %.2f GB for the weights: %s",
                           cb->b.rank, cb->device, (double)total / 1e9, cudaGetErrorString(e));
    }
    TRY(cudaMemsetAsync(cb->wmem, 0, total ? total : 256, cb->st[MSM_STREAM_MAIN]));
    size_t off = 0;
    for (int i = 0; i < g->n_weights; i++) {
        const msm_weight *w = &g->weights[i];
        if (fp8[i]) {
            cb->w8[i] = (uint8_t *)cb->wmem + off;
            off += al256(cb->w_elems[i]);
            cb->wsc[i] = (float *)((char *)cb->wmem + off);
            off += al256(4 * msm_cuda_fp8_scales(w->n_expert, w->rows, w->cols, cb->w_shape[i][3]));
        } else {
            cb->w[i] = (uint16_t *)((char *)cb->wmem + off);
            off += al256((cb->w_f32[i] ? 4 : 2) * cb->w_elems[i]);
        }
    }
    free(fp8);
    /* FP8 weights dequantised for T past fp8_native_max_t: a bf16 copy of the largest one (all of
     * a layer's experts for MOE_EXPERTS) per stream, as the aux stream's shared expert may run
     * beside the main stream's routed experts; none when every step stays within the FP8 GEMVs */
    size_t deq = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *n = &g->nodes[i];
        size_t dq = 0;
        /* dense linears dequantise past fp8_linear_max_t tokens (decode steps: MSM_CUDA_FP8_LINEAR_DECODE_MAX_T),
         * experts past fp8_native_max_t */
        int lmax = cb->tune.fp8_linear_max_t < cb->tune_decode.fp8_linear_max_t ? cb->tune.fp8_linear_max_t
                                                                                 : cb->tune_decode.fp8_linear_max_t;
        if (lmax > cb->tune.fp8_native_max_t) lmax = cb->tune.fp8_native_max_t;
        if (g->max_T <= (n->op == MSM_OP_MOE_EXPERTS ? cb->tune.fp8_native_max_t : lmax)) continue;
        if (n->op == MSM_OP_LINEAR && cb->w8[n->w[0]])
            dq = msm_cuda_linear_fp8_deq_bytes(n->attr.linear.N, n->attr.linear.K);
        else if (n->op == MSM_OP_LINEAR_ADD_RMSNORM && cb->w8[n->w[0]])
            dq = msm_cuda_linear_fp8_deq_bytes(n->attr.linear_norm.N, n->attr.linear_norm.K);
        else if (n->op == MSM_OP_MOE_EXPERTS && cb->w8[n->w[0]])
            dq = msm_cuda_moe_fp8_deq_bytes(n->attr.moe_experts.H, n->attr.moe_experts.I, n->attr.moe_experts.E);
        if (dq > deq) deq = dq;
    }
    cb->deq_bytes = deq;
    for (int s = 0; s < MSM_N_STREAMS && deq; s++) {
        e = cudaMalloc(&cb->deq[s], deq);
        if (e != cudaSuccess)
            return msm_err_set(err, msm_cuda_errno(e), "rank %d (GPU %d): cannot allocate %.2f GB of bf16 scratch for "
                               "the FP8 weights (steps of more than 8 tokens; MSM_CUDA_FP8_NATIVE_MAX_T, "
                               "MSM_CUDA_FP8_LINEAR_MAX_T): %s",
                               cb->b.rank, cb->device, (double)deq / 1e9,
                               cudaGetErrorString(e));
    }
    return cuda_sync(b, err); /* the loaders' streams write after the zeroing */
}

/* --dummy-weights: generated on the device. */
static int cuda_dummy_weight(msm_backend *b, int wi, const msm_weight *w, uint64_t seed, float scale,
                             msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    if (wi < 0 || wi >= cb->n_weights) return msm_err_set(err, -EINVAL, "rank %d: no weight %d", cb->b.rank, wi);
    msm_cuda_exec ex = exec_on(cb, MSM_STREAM_MAIN, NULL);
    if (cb->w8[wi]) /* FP8-resident: codes of the same uniform values, scale / 448 per block */
        KTRY(msm_cuda_fill_dummy_fp8(cb->w8[wi], cb->wsc[wi], cb->w_elems[wi],
                                     msm_cuda_fp8_scales(w->n_expert, w->rows, w->cols, cb->w_shape[wi][3]), seed,
                                     scale, ex));
    else if (cb->w_f32[wi]) /* float32 values, as the CPU backend's (not rounded to bf16) */
        KTRY(msm_cuda_fill_dummy_f32((float *)cb->w[wi], cb->w_elems[wi], seed, scale, w->is_norm, ex));
    else
        KTRY(msm_cuda_fill_dummy(cb->w[wi], cb->w_elems[wi], seed, scale, w->is_norm, ex));
    return 0;
}

/* ---- loading channels -----------------------------------------------------------------------
 * A reader thread's channel: its own stream, n_slots pinned staging slots each with the event of
 * the copy that last read it, and a device buffer for blocks the load kernel converts or
 * scatters. A bf16 block whose rows are back to back on both sides (every block at TP 1) is one
 * cudaMemcpyAsync from the slot into the weight; any other block is copied raw into the device
 * buffer and msm_cuda_load_rows converts and scatters it (the stream orders the next copy into
 * that buffer after the kernel). The reader reads its next chunk into the next slot while the
 * copies of the earlier ones run. An FP8 block goes the same way, with the scales of the blocks
 * it covers copied first into a second small device buffer (grown when a block needs more). */
typedef struct cuda_chan {
    cuda_backend *cb;
    cudaStream_t stream;
    int n_slots, cur;            /* cur: the slot chan_slot handed out last */
    size_t slot_bytes;
    void **slot;                 /* [n_slots] pinned host */
    cudaEvent_t *ev;             /* [n_slots] recorded after the copy out of the slot */
    bool *pending;               /* [n_slots] ev recorded and not yet waited for */
    void *dev;                   /* device staging, slot_bytes */
    float *dev_scale;            /* device staging for an FP8 block's scales, dev_scale_n floats */
    size_t dev_scale_n;
    uint32_t *dev_nan;           /* 1 + the first FP8-resident weight found holding a NaN code, or 0 */
} cuda_chan;

/* Polls ev until it completed, or the backend's deadline passes. */
static int poll_event(cuda_backend *cb, cudaEvent_t ev, msm_err *err) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (unsigned spin = 0;; spin++) {
        cudaError_t e = cudaEventQuery(ev);
        if (e == cudaSuccess) return 0;
        if (e != cudaErrorNotReady) TRY(e);
        clock_gettime(CLOCK_MONOTONIC, &t);
        double ms = (double)(t.tv_sec - t0.tv_sec) * 1e3 + (double)(t.tv_nsec - t0.tv_nsec) * 1e-6;
        if (ms > cb->b.deadline_ms)
            return msm_err_set(err, -ETIMEDOUT, "rank %d (GPU %d): a weight copy did not finish within %d ms",
                               cb->b.rank, cb->device, cb->b.deadline_ms);
        if (spin > 64) usleep(20);
    }
}

/* Waits for every copy in flight (when wait), then frees what the channel holds. */
static int chan_done(cuda_chan *c, bool wait, msm_err *err) {
    cuda_backend *cb = c->cb;
    int r = 0;
    for (int i = 0; wait && r == 0 && i < c->n_slots; i++)
        if (c->pending[i]) r = poll_event(cb, c->ev[i], err);
    uint32_t nan = 0;
    if (wait && r == 0 && c->dev_nan && cudaMemcpy(&nan, c->dev_nan, sizeof nan, cudaMemcpyDeviceToHost) == cudaSuccess &&
        nan)
        r = msm_err_set(err, -EINVAL, "rank %d (GPU %d): FP8 weight %s holds NaN codes (S.1111.111), which its FP8 "
                        "kernels cannot carry; MSM_CUDA_FP8_RESIDENT=0 loads it dequantised to bf16 instead",
                        cb->b.rank, cb->device, cb->w_name[nan - 1]);
    if (c->stream) cudaStreamSynchronize(c->stream); /* after a failure: nothing may still read a slot */
    for (int i = 0; i < c->n_slots; i++) {
        if (c->slot && c->slot[i]) cudaFreeHost(c->slot[i]);
        if (c->ev && c->ev[i]) cudaEventDestroy(c->ev[i]);
    }
    if (c->dev) cudaFree(c->dev);
    if (c->dev_scale) cudaFree(c->dev_scale);
    if (c->dev_nan) cudaFree(c->dev_nan);
    if (c->stream) cudaStreamDestroy(c->stream);
    free(c->slot);
    free(c->ev);
    free(c->pending);
    free(c);
    return r;
}

static int chan_init(cuda_chan *c, msm_err *err) {
    cuda_backend *cb = c->cb;
    TRY(cudaSetDevice(cb->device)); /* a reader thread's first CUDA call */
    TRY(cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking));
    for (int i = 0; i < c->n_slots; i++) {
        TRY(cudaHostAlloc(&c->slot[i], c->slot_bytes, cudaHostAllocDefault));
        TRY(cudaEventCreateWithFlags(&c->ev[i], cudaEventDisableTiming));
    }
    TRY(cudaMalloc(&c->dev, c->slot_bytes));
    TRY(cudaMalloc((void **)&c->dev_nan, sizeof *c->dev_nan));
    TRY(cudaMemset(c->dev_nan, 0, sizeof *c->dev_nan));
    return 0;
}

static int cuda_chan_open(msm_backend *b, size_t slot_bytes, int n_slots, msm_wchan **ret, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    cuda_chan *c = calloc(1, sizeof *c);
    if (!c) return msm_err_set(err, -ENOMEM, "out of memory");
    c->cb = cb;
    c->n_slots = n_slots < 1 ? 1 : n_slots;
    c->slot_bytes = slot_bytes;
    c->cur = -1;
    c->slot = calloc((size_t)c->n_slots, sizeof *c->slot);
    c->ev = calloc((size_t)c->n_slots, sizeof *c->ev);
    c->pending = calloc((size_t)c->n_slots, sizeof *c->pending);
    int r = c->slot && c->ev && c->pending ? chan_init(c, err) : msm_err_set(err, -ENOMEM, "out of memory");
    if (r) {
        chan_done(c, false, NULL);
        return r;
    }
    *ret = (msm_wchan *)c;
    return 0;
}

static int cuda_chan_slot(msm_wchan *wc, void **ret, msm_err *err) {
    cuda_chan *c = (cuda_chan *)wc;
    int i = (c->cur + 1) % c->n_slots;
    if (c->pending[i]) {
        int r = poll_event(c->cb, c->ev[i], err);
        if (r) return r;
        c->pending[i] = false;
    }
    c->cur = i;
    *ret = c->slot[i];
    return 0;
}

/* The nrb x ncb block scales an FP8 block covers (a sub-block of its tensor's scale_inv at
 * k->scale), packed into the channel's device scale buffer, which is allocated at the first FP8
 * block and grown (after the work in flight on this stream, which may still read it) when a block
 * covers more scales than it holds. *ret_ncb: ncb. */
static int chan_stage_scales(cuda_chan *c, const msm_wblock *k, size_t *ret_ncb, msm_err *err) {
    cuda_backend *cb = c->cb;
    size_t B = (size_t)k->scale_block, nrb = (k->scale_r0 + k->rows - 1) / B + 1,
           ncb = (k->scale_c0 + k->cols - 1) / B + 1;
    if (nrb * ncb > c->dev_scale_n) { /* 16 Ki scales: more than any chunk of a real model covers */
        size_t n = nrb * ncb > 16384 ? nrb * ncb : 16384;
        TRY(cudaStreamSynchronize(c->stream));
        if (c->dev_scale) TRY(cudaFree(c->dev_scale));
        c->dev_scale = NULL;
        c->dev_scale_n = 0;
        TRY(cudaMalloc((void **)&c->dev_scale, n * sizeof(float)));
        c->dev_scale_n = n;
    }
    /* the scales are the loader's (pageable) host memory: copied into staging before the call
     * returns, and they outlive the load anyway */
    TRY(cudaMemcpy2DAsync(c->dev_scale, ncb * sizeof(float), k->scale, k->scale_pitch * sizeof(float),
                          ncb * sizeof(float), nrb, cudaMemcpyHostToDevice, c->stream));
    *ret_ncb = ncb;
    return 0;
}

/* An FP8 block of a weight not kept FP8: its bytes and its block scales (chan_stage_scales) go to
 * the device, and one kernel dequantises it into the weight (bf16, or float32 for a keep_f32 one). */
static int chan_put_fp8(cuda_chan *c, const msm_wblock *k, size_t span, msm_err *err) {
    cuda_backend *cb = c->cb;
    if (!k->scale || k->scale_block <= 0)
        return msm_err_set(err, -EINVAL, "rank %d: an FP8 block of weight %d came without its scales", cb->b.rank, k->wi);
    size_t B = (size_t)k->scale_block, ncb;
    int r = chan_stage_scales(c, k, &ncb, err);
    if (r) return r;
    TRY(cudaMemcpyAsync(c->dev, k->src, span, cudaMemcpyHostToDevice, c->stream));
    msm_cuda_exec ex = {.stream = c->stream, .tune = &cb->tune};
    bool f32 = cb->w_f32[k->wi];
    void *dst = f32 ? (void *)((float *)cb->w[k->wi] + k->dst_off) : (void *)(cb->w[k->wi] + k->dst_off);
    KTRY(msm_cuda_load_rows_fp8(dst, f32, k->dst_pitch, c->dev, k->src_pitch, k->rows, k->cols, c->dev_scale, ncb,
                                k->scale_r0, k->scale_c0, (int)B, ex));
    TRY(cudaEventRecord(c->ev[c->cur], c->stream));
    c->pending[c->cur] = true;
    return 0;
}

/* An FP8 block of an FP8-resident weight: its codes copied as they are (one copy, or a 2D copy
 * when rows are not back to back), and the scales of its rows: the nrb x ncb checkpoint block
 * scales it covers go to the channel's scale staging, and load.cu writes each row's run of them
 * into the weight's per-row scales, from the row's scale column (dc + phase) / 128 on. A chunk
 * cut inside a block writes the scales it shares with the next one again, the same values. */
static int chan_put_fp8_resident(cuda_chan *c, const msm_wblock *k, msm_err *err) {
    cuda_backend *cb = c->cb;
    size_t rows = (size_t)cb->w_shape[k->wi][1], cols = (size_t)cb->w_shape[k->wi][2];
    size_t ph = (size_t)cb->w_shape[k->wi][3], B = MSM_CUDA_FP8_BLOCK, per = rows * cols;
    size_t e = k->dst_off / per, dr = k->dst_off % per / cols, dc = k->dst_off % cols;
    if (!k->scale || (size_t)k->scale_block != B || (dc + ph) % B != k->scale_c0 || k->dst_pitch != cols)
        return msm_err_set(err, -EINVAL, "rank %d: an FP8 block of weight %d does not line up with the weight's "
                                         "column phase %zu (column %zu; in its block %zu)", cb->b.rank, k->wi, ph, dc,
                           k->scale_c0);
    size_t ncb;
    int r = chan_stage_scales(c, k, &ncb, err);
    if (r) return r;
    size_t ncs = (cols + ph + B - 1) / B;
    float *dsc = cb->wsc[k->wi] + (e * rows + dr) * ncs + (dc + ph) / B;
    msm_cuda_exec ex = {.stream = c->stream, .tune = &cb->tune};
    KTRY(msm_cuda_load_fp8_row_scales(dsc, ncs, c->dev_scale, ncb, k->rows, k->scale_r0, (int)B, ex));
    uint8_t *dst = cb->w8[k->wi] + k->dst_off;
    if (k->rows == 1 || (k->src_pitch == k->cols && k->dst_pitch == k->cols))
        TRY(cudaMemcpyAsync(dst, k->src, k->rows * k->cols, cudaMemcpyHostToDevice, c->stream));
    else
        TRY(cudaMemcpy2DAsync(dst, k->dst_pitch, k->src, k->src_pitch, k->cols, k->rows, cudaMemcpyHostToDevice,
                              c->stream));
    KTRY(msm_cuda_fp8_find_nan(dst, k->dst_pitch, k->rows, k->cols, c->dev_nan, (uint32_t)k->wi + 1, ex));
    TRY(cudaEventRecord(c->ev[c->cur], c->stream));
    c->pending[c->cur] = true;
    return 0;
}

static int cuda_chan_put(msm_wchan *wc, const msm_wblock *k, msm_err *err) {
    cuda_chan *c = (cuda_chan *)wc;
    cuda_backend *cb = c->cb;
    size_t es = msm_dtype_size(k->src_dtype), span = (k->rows - 1) * k->src_pitch + k->cols * es;
    if (c->cur < 0 || k->src != c->slot[c->cur] || k->wi < 0 || k->wi >= cb->n_weights || !k->rows || !k->cols ||
        span > c->slot_bytes || k->dst_off + (k->rows - 1) * k->dst_pitch + k->cols > cb->w_elems[k->wi])
        return msm_err_set(err, -EINVAL, "rank %d: a weight block for weight %d does not fit its slot or weight",
                           cb->b.rank, k->wi);
    if (k->src_dtype == MSM_F8_E4M3 && cb->w8[k->wi]) return chan_put_fp8_resident(c, k, err);
    if (k->src_dtype == MSM_F8_E4M3) return chan_put_fp8(c, k, span, err);
    msm_cuda_exec ex = {.stream = c->stream, .tune = &cb->tune};
    if (cb->w_f32[k->wi]) { /* a keep_f32 weight: staged, converted to float32 on the device */
        TRY(cudaMemcpyAsync(c->dev, k->src, span, cudaMemcpyHostToDevice, c->stream));
        KTRY(msm_cuda_load_rows_f32((float *)cb->w[k->wi] + k->dst_off, k->dst_pitch, c->dev, k->src_pitch,
                                    (int)k->src_dtype, k->rows, k->cols, ex));
        TRY(cudaEventRecord(c->ev[c->cur], c->stream));
        c->pending[c->cur] = true;
        return 0;
    }
    uint16_t *dst = cb->w[k->wi] + k->dst_off;
    if (k->src_dtype == MSM_BF16 && (k->rows == 1 || (k->src_pitch == 2 * k->cols && k->dst_pitch == k->cols))) {
        TRY(cudaMemcpyAsync(dst, k->src, 2 * k->rows * k->cols, cudaMemcpyHostToDevice, c->stream));
    } else {
        TRY(cudaMemcpyAsync(c->dev, k->src, span, cudaMemcpyHostToDevice, c->stream));
        KTRY(msm_cuda_load_rows(dst, k->dst_pitch, c->dev, k->src_pitch, (int)k->src_dtype, k->rows, k->cols, ex));
    }
    TRY(cudaEventRecord(c->ev[c->cur], c->stream));
    c->pending[c->cur] = true;
    return 0;
}

static int cuda_chan_close(msm_wchan *wc, msm_err *err) {
    return wc ? chan_done((cuda_chan *)wc, true, err) : 0;
}

const uint16_t *msm_backend_cuda_weight(const msm_backend *b, int wi, size_t *ret_n) {
    const cuda_backend *cb = (const cuda_backend *)b;
    if (!b || wi < 0 || wi >= cb->n_weights) return NULL;
    if (ret_n) *ret_n = cb->w_elems[wi];
    return cb->w[wi];
}

const uint8_t *msm_backend_cuda_weight_fp8(const msm_backend *b, int wi, const float **ret_scale, int *ret_phase) {
    const cuda_backend *cb = (const cuda_backend *)b;
    if (!b || wi < 0 || wi >= cb->n_weights || !cb->w8[wi]) return NULL;
    *ret_scale = cb->wsc[wi];
    *ret_phase = cb->w_shape[wi][3];
    return cb->w8[wi];
}

/* What a rank tells its group at prepare time (through one NCCL all-gather). */
typedef struct ar_info {
    uint64_t arena, sig, arena_bytes;
    int32_t device, can_reach_all; /* can_reach_all: second round only */
} ar_info;

/* One all-gather of an ar_info per rank, eager on the main stream (so it is also the eager
 * collective NCCL wants before any capture). */
static int ar_exchange(cuda_backend *cb, const ar_info *mine, ar_info *all, msm_err *err) {
    ar_info *d = NULL;
    cudaStream_t s = cb->st[MSM_STREAM_MAIN];
    TRY(cudaMalloc((void **)&d, sizeof *d * (size_t)(cb->tp + 1)));
    cudaError_t e = cudaMemcpyAsync(d + cb->tp, mine, sizeof *mine, cudaMemcpyHostToDevice, s);
    ncclResult_t n = e == cudaSuccess ? ncclAllGather(d + cb->tp, d, sizeof *mine, ncclChar, cb->nccl, s) : ncclSuccess;
    if (e == cudaSuccess && n == ncclSuccess) e = cudaMemcpyAsync(all, d, sizeof *all * (size_t)cb->tp, cudaMemcpyDeviceToHost, s);
    int r = e == cudaSuccess && n == ncclSuccess ? cuda_sync(&cb->b, err) : 0;
    cudaFree(d);
    if (n != ncclSuccess)
        return msm_err_set(err, -EIO, "rank %d (GPU %d): all-gather of the peer table failed: %s", cb->b.rank,
                           cb->device, ncclGetErrorString(n));
    TRY(e);
    return r;
}

/* The one-shot all-reduce's setup: a signal area and a host-mapped fault word per rank, the
 * group's arena and signal pointers, peer access to every other rank's GPU. It stays off (NCCL
 * only) unless every rank reaches every other and all arenas have the same size; MSM_CUDA_AR=nccl
 * keeps it off (read with the tuning). */
static int ar_setup(cuda_backend *cb, msm_err *err) {
    if (cb->tp < 2 || cb->tp > MSM_CUDA_AR_MAX_RANKS) return 0;
    size_t sb = msm_cuda_ar_signal_bytes();
    TRY(cudaMalloc((void **)&cb->ar_sig, sb));
    TRY(cudaMemset(cb->ar_sig, 0, sb));
    TRY(cudaHostAlloc((void **)&cb->ar_fault, sizeof *cb->ar_fault, cudaHostAllocMapped));
    *cb->ar_fault = 0;
    ar_info mine = {.arena = (uint64_t)(uintptr_t)cb->arena, .sig = (uint64_t)(uintptr_t)cb->ar_sig,
                    .arena_bytes = cb->arena_bytes, .device = cb->device}, all[MSM_CUDA_AR_MAX_RANKS];
    KTRY(ar_exchange(cb, &mine, all, err));
    int reach = cb->tune.ar_oneshot_max_bytes > 0;
    for (int r = 0; r < cb->tp && reach; r++) {
        if (all[r].arena_bytes != cb->arena_bytes) reach = 0;
        if (all[r].device == cb->device) continue; /* ranks sharing a GPU (tests) */
        int can = 0;
        if (cudaDeviceCanAccessPeer(&can, cb->device, all[r].device) != cudaSuccess || !can) {
            reach = 0;
            break;
        }
        cudaError_t e = cudaDeviceEnablePeerAccess(all[r].device, 0);
        if (e == cudaErrorPeerAccessAlreadyEnabled) (void)cudaGetLastError();
        else if (e != cudaSuccess) {
            (void)cudaGetLastError();
            reach = 0;
        }
    }
    /* second round: on only if every rank can reach every other */
    ar_info vote = mine, votes[MSM_CUDA_AR_MAX_RANKS];
    vote.can_reach_all = reach;
    KTRY(ar_exchange(cb, &vote, votes, err));
    bool on = true;
    for (int r = 0; r < cb->tp; r++) on = on && votes[r].can_reach_all;
    cb->ar = (msm_cuda_ar_peers){.rank = cb->b.rank, .size = cb->tp, .fault = cb->ar_fault,
                                 .timeout_ns = (unsigned long long)cb->b.deadline_ms * 1000000ull};
    cudaError_t e = cudaHostGetDevicePointer((void **)&cb->ar.fault, cb->ar_fault, 0);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        on = false;
    }
    for (int r = 0; r < cb->tp; r++) {
        cb->ar.base[r] = (const char *)(uintptr_t)all[r].arena;
        cb->ar.sig[r] = (uint32_t *)(uintptr_t)all[r].sig;
    }
    cb->ar_on = on;
    return 0;
}

static int cuda_prepare(msm_backend *b, const msm_graph *g, int n_kv_blocks, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    cb->arena_bytes = g->arena_bytes;
    TRY(cudaMalloc((void **)&cb->arena, g->arena_bytes));
    TRY(cudaMemset(cb->arena, 0, g->arena_bytes));
    cb->n_layers = g->n_layers;
    cb->n_kv_blocks = n_kv_blocks;
    cb->kc = calloc((size_t)g->n_layers, sizeof *cb->kc);
    cb->vc = calloc((size_t)g->n_layers, sizeof *cb->vc);
    cb->n_events = g->n_events;
    cb->ev = calloc((size_t)(g->n_events ? g->n_events : 1), sizeof *cb->ev);
    if (!cb->kc || !cb->vc || !cb->ev) return msm_err_set(err, -ENOMEM, "out of memory");
    for (int e = 0; e < g->n_events; e++) TRY(cudaEventCreateWithFlags(&cb->ev[e], cudaEventDisableTiming));
    size_t ws = 0, qtmp = 0, gather = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *n = &g->nodes[i];
        size_t need = 0;
        if (n->op == MSM_OP_LINEAR || n->op == MSM_OP_LINEAR_ADD_RMSNORM) {
            int N = n->op == MSM_OP_LINEAR ? n->attr.linear.N : n->attr.linear_norm.N;
            int K = n->op == MSM_OP_LINEAR ? n->attr.linear.K : n->attr.linear_norm.K;
            need = msm_cuda_linear_ws_bytes(g->max_T, N, K);

            for (int t = MSM_CUDA_GEMV_MAX_T + 1; t <= g->max_T; t *= 2) msm_cuda_linear_prepare(cb->ctx, t, N, K);
        } else if (n->op == MSM_OP_MOE_EXPERTS) {
            const msm_attr_moe_experts *at = &n->attr.moe_experts;
            need = msm_cuda_moe_experts_ws_bytes(g->max_T, at->H, at->I, at->k, at->E);

        } else if (n->op == MSM_OP_ATTENTION) {
            const msm_attr_attention *at = &n->attr.attention;
            size_t kv = (size_t)n_kv_blocks * MSM_KV_BLOCK * at->kvh * at->hd;
            if (!cb->kc[n->layer]) {
                TRY(cudaMalloc((void **)&cb->kc[n->layer], 2 * kv));
                TRY(cudaMalloc((void **)&cb->vc[n->layer], 2 * kv));
                TRY(cudaMemset(cb->kc[n->layer], 0, 2 * kv));
                TRY(cudaMemset(cb->vc[n->layer], 0, 2 * kv));
            }
            size_t q = msm_cuda_attention_ws_bytes(g->max_T < 32 ? g->max_T : 32, at->nh, at->hd);
            if (q > qtmp) qtmp = q;
        } else if (n->op == MSM_OP_ROUTER_LINEAR_TOPK) {
            size_t rb = msm_cuda_router_ws_bytes(g->max_T, n->attr.router_topk.E);
            if (rb > cb->router_ws_bytes) cb->router_ws_bytes = rb;
        } else if (n->op == MSM_OP_SAMPLE) {
            need = msm_cuda_sample_ws_bytes(g->max_R, n->attr.sample.V);
        } else if (n->op == MSM_OP_ALLGATHER) {
            size_t gb = sizeof(float) * (size_t)g->max_R * g->vals[n->in[0]].cols * (size_t)cb->tp;
            if (gb > gather) gather = gb;
        }
        if (need > ws) ws = need;
    }
    cb->ws_bytes = ws;
    cb->q_tmp_bytes = qtmp;

    for (int s = 0; s < MSM_N_STREAMS; s++) {
        TRY(cudaMalloc(&cb->ws[s], ws ? ws : 256));
        TRY(cudaMalloc((void **)&cb->q_tmp[s], qtmp ? qtmp : 256));
        TRY(cudaMemset(cb->q_tmp[s], 0, qtmp ? qtmp : 256)); /* attention's counters start at 0 */
        TRY(cudaMalloc(&cb->router_ws[s], cb->router_ws_bytes ? cb->router_ws_bytes : 256));
        TRY(cudaMemset(cb->router_ws[s], 0, cb->router_ws_bytes ? cb->router_ws_bytes : 256)); /* counters */
        TRY(cudaMalloc((void **)&cb->ln_ctr[s], 256));
        TRY(cudaMemset(cb->ln_ctr[s], 0, 256));
    }
    cb->gather_bytes = gather;
    TRY(cudaMalloc(&cb->gather_tmp, gather ? gather : 256));
    TRY(cudaDeviceSynchronize());
    return ar_setup(cb, err);
}

/* n bytes of the pinned staging (NULL when they do not fit: the caller copies directly), 16-byte
 * aligned; valid until the next completed sync */
static char *stage_take(cuda_backend *cb, size_t n) {
    size_t at = (cb->stage_used + 15) & ~(size_t)15;
    if (!cb->stage || at + n > cb->stage_bytes) return NULL;
    cb->stage_used = at + n;
    return cb->stage + at;
}

static int cuda_write(msm_backend *b, size_t off, const void *src, size_t n, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    if (off + n > cb->arena_bytes) return msm_err_set(err, -EINVAL, "arena write out of range");
    char *h = cb->capturing ? NULL : stage_take(cb, n);
    if (h) src = memcpy(h, src, n);
    TRY(cudaMemcpyAsync(cb->arena + off, src, n, cudaMemcpyHostToDevice, cb->st[MSM_STREAM_MAIN]));
    return 0;
}

static int cuda_read(msm_backend *b, size_t off, void *dst, size_t n, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    if (off + n > cb->arena_bytes) return msm_err_set(err, -EINVAL, "arena read out of range");
    char *h = cb->capturing ? NULL : stage_take(cb, n);
    TRY(cudaMemcpyAsync(h ? h : dst, cb->arena + off, n, cudaMemcpyDeviceToHost, cb->st[MSM_STREAM_MAIN]));
    int r = cuda_sync(b, err);
    if (r == 0 && h) memcpy(dst, h, n);
    return r;
}

static int cuda_capture_begin(msm_backend *b, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    TRY(cudaStreamBeginCapture(cb->st[MSM_STREAM_MAIN], cudaStreamCaptureModeThreadLocal));
    cb->capturing = (cudaGraph_t)1;
    return 0;
}

static int cuda_capture_end(msm_backend *b, int key, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    cudaGraph_t graph = NULL;
    cb->capturing = NULL;
    TRY(cudaStreamEndCapture(cb->st[MSM_STREAM_MAIN], &graph));
    if (cb->n_graphs == MAX_GRAPHS) return msm_err_set(err, -ENOSPC, "too many captured graphs");
    cudaGraphExec_t exec;
    /* the kernel nodes' priorities (exec_on) hold only with UseNodePriority */
    cudaError_t e = cudaGraphInstantiate(&exec, graph, cb->tune.stream_prio ? cudaGraphInstantiateFlagUseNodePriority : 0);
    cudaGraphDestroy(graph);
    TRY(e);
    cb->graphs[cb->n_graphs] = exec;
    cb->graph_key[cb->n_graphs++] = key;
    return 0;
}

static int cuda_replay(msm_backend *b, int key, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    for (int i = 0; i < cb->n_graphs; i++)
        if (cb->graph_key[i] == key) {
            TRY(cudaGraphLaunch(cb->graphs[i], cb->st[MSM_STREAM_MAIN]));
            return 0; /* the caller's read or sync ends the step */
        }
    return -ENOENT;
}

/* A failed group's teardown: true when this rank's streams drained and its revoked communicator
 * (if any) went quiescent and was aborted, each within the deadline; false leaves the device
 * memory to the process's exit (a cudaFree would synchronise with work that may never end). */
static bool failed_teardown(cuda_backend *cb) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        bool idle = true;
        for (int s = 0; s < MSM_N_STREAMS; s++)
            if (cb->st[s] && cudaStreamQuery(cb->st[s]) == cudaErrorNotReady) idle = false;
        ncclResult_t st = ncclSuccess;
        if (cb->nccl && cb->revoked && ncclCommGetAsyncError(cb->nccl, &st) != ncclSuccess) st = ncclSuccess;
        if (idle && st != ncclInProgress) break;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) * 1e3 + (double)(t.tv_nsec - t0.tv_nsec) * 1e-6 > cb->b.deadline_ms)
            return false;
        usleep(1000);
    }
    if (cb->nccl) ncclCommAbort(cb->nccl);
    cb->nccl = NULL;
    return true;
}

static void cuda_free(msm_backend *b) {
    cuda_backend *cb = (cuda_backend *)b;
    cudaSetDevice(cb->device);
    if (cb->broken && !failed_teardown(cb)) {
        fprintf(stderr, "msmoe: rank %d (GPU %d): the failed group's work did not drain within %d ms; its device "
                        "memory is left to the process's exit\n", cb->b.rank, cb->device, cb->b.deadline_ms);
        free(cb->w), free(cb->w8), free(cb->wsc), free(cb->w_shape), free(cb->w_name), free(cb->w_elems);
        free(cb->w_f32);
        free(cb->kc), free(cb->vc), free(cb->ev);
        free(cb);
        return;
    }
    cudaDeviceSynchronize();
    for (int i = 0; i < cb->n_graphs; i++) cudaGraphExecDestroy(cb->graphs[i]);
    cudaFree(cb->wmem);
    cudaFree(cb->pad);
    free(cb->w);
    free(cb->w8);
    free(cb->wsc);
    free(cb->w_shape);
    free(cb->w_name);
    free(cb->w_elems);
    free(cb->w_f32);
    for (int l = 0; cb->kc && l < cb->n_layers; l++) {
        cudaFree(cb->kc[l]);
        cudaFree(cb->vc[l]);
    }
    free(cb->kc);
    free(cb->vc);
    for (int e = 0; cb->ev && e < cb->n_events; e++) cudaEventDestroy(cb->ev[e]);
    free(cb->ev);
    for (int s = 0; s < MSM_N_STREAMS; s++) {
        cudaFree(cb->ws[s]);
        cudaFree(cb->q_tmp[s]);
        cudaFree(cb->router_ws[s]);
        cudaFree(cb->ln_ctr[s]);
        cudaFree(cb->deq[s]);
        if (cb->st[s]) cudaStreamDestroy(cb->st[s]);
    }
    cudaFree(cb->gather_tmp);
    cudaFree(cb->arena);
    cudaFree(cb->ar_sig);
    if (cb->ar_fault) cudaFreeHost(cb->ar_fault);
    if (cb->stage) cudaFreeHost(cb->stage);
    msm_cuda_ctx_free(cb->ctx);
    if (cb->nccl) ncclCommDestroy(cb->nccl);
    free(cb);
}

/* Test-only (msm_engine_opts.test_fault): a launch that fails, or a kernel on the main stream that
 * spins for twice the deadline, so the step's sync times out and aborts the communicator. */
static int cuda_test_fault(msm_backend *b, int kind, msm_err *err) {
    cuda_backend *cb = (cuda_backend *)b;
    bool hang = kind == MSM_TEST_FAULT_HANG;
    KTRY(msm_cuda_test_fault(hang, 2 * cb->b.deadline_ms, exec_on(cb, MSM_STREAM_MAIN, NULL)));
    return 0;
}

static const msm_backend_vt cuda_vt = {
    .name = "cuda", .free = cuda_free, .alloc_weights = cuda_alloc_weights,
    .dummy_weight = cuda_dummy_weight, .chan_open = cuda_chan_open, .chan_slot = cuda_chan_slot,
    .chan_put = cuda_chan_put, .chan_close = cuda_chan_close, .prepare = cuda_prepare,
    .write = cuda_write, .read = cuda_read, .begin = cuda_begin, .run = cuda_run,
    .record = cuda_record, .wait = cuda_wait, .sync = cuda_sync, .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end, .replay = cuda_replay, .test_fault = cuda_test_fault,
};

/* ---- tuning from the environment ----
 * Benchmark and bisection switches (unset: the defaults of msm_cuda_tuning_init), read into the
 * rank's tuning once per rank when the backend is created (and by bench/cuda_kernels):
 *   MSM_CUDA_PDL=0                      programmatic dependent launch off
 *   MSM_CUDA_GEMV_PREFETCH=1            the GEMV pulls its weight rows towards L2 before its PDL wait
 *   MSM_CUDA_GEMV_MAX_T=N               raise the GEMV / cuBLASLt threshold (never lowered)
 *   MSM_CUDA_MMV_MIN_T / _MAX_T=N       the tensor-core GEMV range (max 0: off)
 *   MSM_CUDA_LINEAR_TILED_MIN_T=N       the tiled linear from N tokens on (> 64: off)
 *   MSM_CUDA_LT_SPLIT_MIN_T=N           cuBLASLt hi + lo split from N tokens on (prefill)
 *   MSM_CUDA_LT_SPLIT_DECODE=1          ... and for pure decode steps too (see tuning_for_decode)
 *   MSM_CUDA_MOE_PATH=pair|grouped_gemv|tiled|wmma   force a MoE path
 *   MSM_CUDA_MOE_TILED_MIN_T=N          the tiled MoE GEMMs from N tokens on
 *   MSM_CUDA_MOE_TILED_BM=16|32|64      tokens a pass of the tiled MoE GEMMs (else: by tokens an expert)
 *   MSM_CUDA_AR=nccl                    every all-reduce through NCCL (no one-shot kernel)
 *   MSM_CUDA_AR_ONESHOT_MAX_BYTES=N     the one-shot all-reduce up to N bytes (0: off)
 *   MSM_CUDA_MOE_KERNELS=simt,mma,no_prefetch,nt4,down_split,down_warp  MoE kernel variants
 *   MSM_CUDA_FP8_RESIDENT=0             FP8 checkpoint weights dequantised to bf16 at load
 *   MSM_CUDA_FP8_NATIVE_MAX_T=N         FP8-resident weights take the FP8 GEMVs up to N tokens
 *   MSM_CUDA_FP8_LINEAR=mma|simt|simt_hw the FP8 linear kernel (tensor cores; SIMT GEMV, integer or hardware decode)
 *   MSM_CUDA_FP8_MMA_MIN_T=N            ... mma: the SIMT GEMV below N tokens
 *   MSM_CUDA_FP8_LINEAR_MAX_T=N         FP8 dense linears of prefill chunks past N tokens dequantise (64)
 *   MSM_CUDA_FP8_LINEAR_DECODE_MAX_T=N  ... of pure decode steps (8)
 *   MSM_CUDA_FP8_LINEAR_TILED_MIN_T=N   FP8 dense linears of N..64 tokens take the tiled GEMM on the codes (9; 65: off)
 *   MSM_CUDA_FP8_MOE_TILED=0|1          FP8 experts past FP8_NATIVE_MAX_T take the FP8 tiled GEMMs (1, default)
 *                                       or are dequantised to bf16 for the bf16 paths (0)
 *   MSM_CUDA_MMV_SLOTS=N                the MMV and MMV8 grids fill at most N blocks an SM (K slices)
 *   MSM_CUDA_MMV_WARPS=4|8              the MMV's warps a block (default 4: 64 rows; 8: 128 rows)
 *   MSM_CUDA_MMV_BSLICE=0|1|4|8|16      one token tile: the MMV's K slices as warps of one block where
 *                                       its N / 16 blocks fit one wave (1, default), or clusters (0),
 *                                       or that many slices a block for every MMV (4, 8, 16)
 *   MSM_CUDA_MMV_NJ=0|2|4               the block-sliced MMV's rows a warp: 16 (2) or 32 at 2 chunks in
 *                                       flight (4), or 32 where that keeps the warps and on the aux stream
 *                                       up to 8 tokens (0, default); the same bits at the same K slices
 *                                       (the 32-row grid may take other slices: a numerics choice)
 *   MSM_CUDA_MMV_STREAM_MIN_N=N         linears of 2-8 tokens, K <= 2048, with N rows or more (the lm_head)
 *                                       stream on one block an SM (default 32768; 0: off)
 *   MSM_CUDA_MMV_STREAM_BS_MIN_N=N      ... and the block-sliced MMV's picks of 8 or 16 slices from N rows
 *                                       (Qwen3's qkv; the same bits; default 4096; 0: off)
 *   MSM_CUDA_MMV_STREAM_MIN_T=N         ... from N tokens (2..8)
 *   MSM_CUDA_MMV_STREAM_ST=0|2|3        ... its stages of shared memory (0: 2 where a block has at most
 *                                       3 tiles, else 3)
 *   MSM_CUDA_MMV_L2_REST=0|1            the MMVs prefetch their later rounds of weights into L2 before
 *                                       the PDL wait (0)
 *   MSM_CUDA_MOE_DOWN_HB=0|2|4          the pair path's split down GEMV: rows a warp (0, default: 4 for
 *                                       bf16, 2 for FP8); the same bits
 *   MSM_CUDA_MOE_PAIR_EARLY=0|1         the pair path's split down GEMV's ids and first weight loads before
 *                                       its PDL wait (0, default: not yet measured); the same bits
 *   MSM_CUDA_MOE_FUSED_COMBINE=0|1|2    the routed experts' combine (5+ tokens) inside the next ADD_RMSNORM or
 *                                       MOE_COMBINE_NORM (1), only an ADD_RMSNORM up to 64 tokens (2, default),
 *                                       never (0); the same bits
 *   MSM_CUDA_MOE_COMBINE_CLUSTER=0|1    ... inside an ADD_RMSNORM as a cluster a token (1, default) or one
 *                                       block a token; the same bits
 *   MSM_CUDA_MOE_COMBINE_EARLY=0|1      the combines read the routing before their PDL wait where the experts'
 *                                       gate/up triggers after its own (1, default); the same bits
 *   MSM_CUDA_MOE_GU_U2=0|1|2            the pair path's bf16 gate/up: 2 loads a row in flight at 12 blocks
 *                                       an SM never (0), always (1), or where it makes one wave and no
 *                                       shared expert runs beside (2, default); the same bits
 *   MSM_CUDA_FP8_MOE_LEAN=0|1|2         the FP8 pair-path gate/up and split down GEMVs in fewer registers
 *                                       (one wave at one token; 2: the gate/up's next codes early); the
 *                                       same bits (2, default)
 *   MSM_CUDA_ATT_MAX_SPLIT=N            attention splits a token's context at most N ways (1..16)
 *   MSM_CUDA_ATT_MMA_SPLIT_GQA_MAX=N    ... the split tensor-core GQA attention at most N ways (8; 0: no own cap)
 *   MSM_CUDA_LINEAR_NORM=1              LINEAR_ADD_RMSNORM in one kernel (the GEMV's last block norms)
 *   MSM_CUDA_ATT_GROUP=N                attention blocks take up to N query heads of a kv head (1..4) ...
 *   MSM_CUDA_ATT_GROUP_MIN=N            ... from N (token, query head) pairs on (0: one wave's blocks)
 *   MSM_CUDA_ATT_MMA=0|1|2              the tensor-core GQA attention never / by its rule / wherever it fits
 *   MSM_CUDA_ATT_MMA_SPLIT=0|1          ... its context split over a cluster where 4+ query heads share a kv head
 *                                       and the split keeps one wave (0, default: not yet measured)
 *   MSM_CUDA_ATT_MMA_MIN_BLOCKS=N       ... the rule: from N (token, kv head) blocks on (0: by heads a kv head)
 *   MSM_CUDA_ROUTER_CHUNK_PER_SM=N      routers over many tokens: token chunks while N blocks an SM remain
 *   MSM_CUDA_ROUTER_GROUP=0|1           the fused router's last block groups the pairs for the routed experts
 *                                       after it, no grouping kernel (0, default: measured slower)
 *   MSM_CUDA_ROUTER_TCLUSTER=N          the fused router at 2..N tokens as clusters of tokens, each block's
 *                                       weight rows read once for them (8, default; 0: the counter form)
 *   MSM_CUDA_ROUTER_TCLUSTER_TB=2|4|8   ... tokens a cluster (2, default)
 *   MSM_CUDA_ROUTER_ST_ASYNC=0|1        the cluster routers' logits by st.async into their ranking blocks'
 *                                       mbarriers, no cluster barrier after them (1, default)
 *   MSM_CUDA_ATT_CLUSTER=0|1            attention's context splits merged in a cluster (1, default) or by the last block
 *   MSM_CUDA_ATT_EARLY=0|1              decode attention loads its first K/V rows before its PDL wait (1, default)
 *   MSM_CUDA_ATT_ROPE=0|1               decode: ROPE_KV_WRITE + its ATTENTION in one kernel (0, default: slower)
 *   MSM_CUDA_ATT_QK_ROPE=0|1|2          decode: QK_NORM + ROPE_KV_WRITE + ATTENTION in the split tensor-core
 *                                       attention: 1 (default) after a bf16 qkv projection, 2 always
 *   MSM_CUDA_LINEAR_ROPE=0|1            1-2 tokens: the qkv LINEAR + ROPE_KV_WRITE in one kernel (1, default)
 *   MSM_CUDA_FP8_MOE_TILED_MIN_T=N      ... from N tokens on (default 5), the FP8 GEMVs below
 *   MSM_CUDA_FP8_TILED_KS=1|2           ... at 16 / 32 tokens a pass, 64-wide K steps a pipeline stage (1,
 *                                       default; 2: not yet measured); the same bits
 *   MSM_CUDA_FP8_GEMV_ROWS=1|2|4        rows a warp of the FP8 SIMT GEMV (default: 2 at one token, else 4)
 *   MSM_CUDA_FP8_GEMV_U8=0|1            ... at one token, 8 loads a lane a row in flight (1, default) or 4
 *   MSM_CUDA_FP8_GEMV_HW=0|1            ... with the hardware e4m3 decode (1, default) or the integer one (0)
 *   MSM_CUDA_FP8_GEMV_SPLIT=0|1|2|3     ... at one token split over K, 4 warps a block on 1 row (1; 3: 2 loads
 *                                       a lane in flight) or 2 rows (2, default); 0: unsplit
 *   MSM_CUDA_FP8_GEMV_SPLIT_MIN_K=N     ... for rows of N codes or more (default 4097)
 *   MSM_CUDA_QK_ROPE=0|1                a QK_NORM + the ROPE_KV_WRITE after it in one kernel (1, default)
 *   MSM_CUDA_NORM_LINEAR=0|1            decode: an ADD_RMSNORM + the LINEAR on its norm in one kernel (1, default)
 *   MSM_CUDA_GEMV_EARLY=0|1             the dense GEMVs / MMVs load their first weights before their PDL wait (1, default)
 *   MSM_CUDA_ATT_BT_CACHE=0|1           the SIMT attention's block-table entries in shared memory first (1, default)
 *   MSM_CUDA_GEMV_MINB=mask             kernels compiled for 12 blocks an SM: 1 the one-token qkv + RoPE kernel
 *                                       (default), 2 the one-token bf16 GEMV
 *   MSM_CUDA_MOE_GROUP_SCAN_MAX_T=N     the grouped SIMT expert GEMVs of up to N tokens find their pairs
 *                                       themselves, no grouping kernel (0, default: never)
 *   MSM_CUDA_MOE_GG_GATEUP_NT=2|4       tokens a pass of the grouped SIMT gate/up (4, default)
 *   MSM_CUDA_MOE_GG_DOWN_NT=2|4         ... of the grouped SIMT down (2, default)
 *   MSM_CUDA_MOE_GG_DOWN_U=2|3          K chunks in flight a lane a row in the grouped SIMT down (2, default)
 *   MSM_CUDA_MOE_GG_GATEUP_U=2|3|4      ... in the grouped SIMT gate/up (2, default)
 *   MSM_CUDA_MOE_GG_PERSIST=mask        the grouped SIMT gate/up (1) and down (2) on persistent grids, each block
 *                                       looping over (expert, row chunk) items (0, default: slower on the H100);
 *                                       the same bits
 *   MSM_CUDA_MOE_GG_EARLY=0|1           the grouped SIMT down loads its first weights before its PDL wait (1, default)
 *   MSM_CUDA_MOE_GG_COMPACT=0|1         the grouped SIMT GEMVs' grid: a row per selected expert (1, default) or per expert
 *   MSM_CUDA_LINEAR_SWIGLU=0|1          a gate/up LINEAR and its SWIGLU at 1-2 tokens in one kernel (1, default)
 *   MSM_CUDA_LINEAR_SWIGLU_ROWS=1|2|4   ... its gate and up rows a warp (2, default); the same bits
 *   MSM_CUDA_NORM_LINEAR_SWIGLU=0|1     an ADD_RMSNORM, the gate/up LINEAR on its norm and its SWIGLU at 1-2
 *                                       tokens in one kernel (0, default: not yet measured)
 *   MSM_CUDA_NORM_SWIGLU_ROWS=2|4       ... its gate and up rows a warp (2, default); the same bits
 *   MSM_CUDA_NORM_QK_ROPE=0|1           an ADD_RMSNORM, the qkv LINEAR on its norm, its QK_NORM and ROPE_KV_WRITE
 *                                       at 1-2 tokens in one kernel (0, default: not yet measured)
 *   MSM_CUDA_AUX_GEMV_ROWS=1|2          the 1-2-token bf16 GEMV's rows a warp on the aux stream (2, default)
 *   MSM_CUDA_LINEAR_ROPE_MMV=0|1        the qkv LINEAR + ROPE_KV_WRITE in one kernel on the MMV (3-8 tokens)
 *                                       too (1, default)
 *   MSM_CUDA_L2_PREFETCH_MAX_T=N        PREFETCH nodes (pass prefetch_l2) act at steps of up to N tokens
 *                                       (16, default; 0: never)
 *   MSM_CUDA_L2_PREFETCH_KV_MAX_T=N     PREFETCH_KV nodes act at decode steps of up to N tokens (2, default;
 *                                       0: never)
 *   MSM_CUDA_L2_PREFETCH_MB=N           ... at most N MiB of weights a PREFETCH (24, default)
 *   MSM_CUDA_L2_PREFETCH_KV_MB=N        ... at most N MiB of K/V cache a PREFETCH_KV (24, default)
 *   MSM_CUDA_L2_PREFETCH_LAST=0|1       ... with the L2::evict_last policy (0, default)
 *   MSM_CUDA_L2_PREFETCH_BLOCKS=N       ... one-warp blocks issuing a PREFETCH's chunks (32, default)
 *   MSM_CUDA_L2_PREFETCH_CHUNK_KB=N     ... KiB a prefetch instruction (16, default)
 *   MSM_CUDA_L2_PERSIST_MB=N            MiB of L2 set aside for persisting (evict_last) lines at start-up
 *                                       (0, default: the device's setting left alone)
 *   MSM_CUDA_STREAM_PRIO=off|aux|auto   the aux stream's kernels (the shared expert's) above the main
 *                                       stream's: never, every step, or decode steps of 3-11 tokens (auto,
 *                                       default)
 *   MSM_CUDA_HOST_WAIT=yield|sleep      host waits for a step: poll and yield the core (default), or
 *                                       sleep 20 us between polls (the earlier wait, 50-70 us late)
 *   MSM_CUDA_HOST_STAGE=0|1             step inputs and results through pinned staging (1, default)
 *   MSM_CUDA_PAD_MB=N                   take N MiB (up to 4096) of device memory before any other buffer:
 *                                       every weight, cache and arena address moves (a benchmark's probe
 *                                       of how much a step's time depends on where its buffers lie; 0, 2
 *                                       and 96 MiB within +-0.02 ms of each other, Qwen3-30B-A3B at 4-16
 *                                       tokens, H100: bench/results/2026-12-07-h200-s37 run 3)
 *   MSM_CUDA_SKIP_OPS=OP[,OP...]        skip those ops (op names as msm_op_name prints them) to
 *                                       time a step without them; results are then meaningless */

static bool env_int(const char *name, int *ret) {
    const char *s = getenv(name);
    if (!s || !*s) return false;
    *ret = atoi(s);
    return true;
}

/* v MiB in bytes, v clamped to 0..4096. */
static size_t mib_clamped(int v) { return (size_t)(v < 0 ? 0 : v > 4096 ? 4096 : v) << 20; }

void msm_cuda_tuning_from_env(msm_cuda_tuning *t) {
    int v;
    const char *s;
    if ((s = getenv("MSM_CUDA_PDL")) && s[0] == '0') t->pdl = false;
    if ((s = getenv("MSM_CUDA_GEMV_PREFETCH"))) t->gemv_prefetch = s[0] == '1';
    if ((s = getenv("MSM_CUDA_GEMV_EARLY"))) t->gemv_early = s[0] != '0';
    if ((s = getenv("MSM_CUDA_QK_ROPE"))) t->qk_rope = s[0] != '0';
    if ((s = getenv("MSM_CUDA_LINEAR_ROPE"))) t->linear_rope = s[0] != '0';
    if ((s = getenv("MSM_CUDA_NORM_LINEAR"))) t->norm_linear = s[0] != '0';
    if ((s = getenv("MSM_CUDA_FP8_GEMV_U8"))) t->fp8_gemv_u8 = s[0] != '0';
    if (env_int("MSM_CUDA_FP8_GEMV_ROWS", &v)) t->fp8_gemv_rows = v == 1 || v == 2 || v == 4 ? v : 0;
    if ((s = getenv("MSM_CUDA_FP8_GEMV_HW"))) t->fp8_gemv_hw = s[0] != '0';
    if (env_int("MSM_CUDA_FP8_GEMV_SPLIT", &v)) t->fp8_gemv_split = v < 0 ? 0 : v > 3 ? 3 : v;
    if (env_int("MSM_CUDA_FP8_GEMV_SPLIT_MIN_K", &v)) t->fp8_gemv_split_min_k = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_FP8_MOE_TILED_MIN_T", &v)) t->fp8_moe_tiled_min_t = v < 1 ? 1 : v;
    if (env_int("MSM_CUDA_GEMV_MAX_T", &v) && v > t->gemv_max_t) t->gemv_max_t = v > 64 ? 64 : v;
    if (env_int("MSM_CUDA_MMV_MIN_T", &v)) t->mmv_min_t = v < 1 ? 1 : v;
    if (env_int("MSM_CUDA_MMV_MAX_T", &v)) t->mmv_max_t = v < 0 ? 0 : v > 64 ? 64 : v;
    if (env_int("MSM_CUDA_LINEAR_TILED_MIN_T", &v)) t->linear_tiled_min_t = v < 1 ? 1 : v;
    if (env_int("MSM_CUDA_LT_SPLIT_MIN_T", &v)) t->lt_split_min_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_MOE_TILED_MIN_T", &v)) t->moe_tiled_min_t = v < 1 ? 1 : v;
    if ((s = getenv("MSM_CUDA_FP8_RESIDENT"))) t->fp8_resident = s[0] != '0';
    if (env_int("MSM_CUDA_FP8_NATIVE_MAX_T", &v)) t->fp8_native_max_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_FP8_MMA_MIN_T", &v)) t->fp8_mma_min_t = v < 1 ? 1 : v;
    if (env_int("MSM_CUDA_FP8_LINEAR_MAX_T", &v)) t->fp8_linear_max_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_FP8_LINEAR_TILED_MIN_T", &v)) t->fp8_linear_tiled_min_t = v < 1 ? 1 : v;
    if ((s = getenv("MSM_CUDA_FP8_MOE_TILED"))) t->fp8_moe_tiled = s[0] != '0';
    if (env_int("MSM_CUDA_MMV_SLOTS", &v)) t->mmv_slots = v < 1 ? 1 : v;
    if (env_int("MSM_CUDA_MMV_WARPS", &v)) t->mmv_warps = v == 4 ? 4 : 8;
    if (env_int("MSM_CUDA_MMV_BSLICE", &v)) t->mmv_bslice = v == 4 || v == 8 || v == 16 ? v : v > 0 ? 1 : 0;
    if (env_int("MSM_CUDA_MMV_NJ", &v)) t->mmv_nj = v == 4 ? 4 : v == 2 ? 2 : 0;
    if (env_int("MSM_CUDA_MOE_DOWN_HB", &v)) t->moe_down_hb = v == 2 || v == 4 ? v : 0;
    if (env_int("MSM_CUDA_MOE_PAIR_EARLY", &v))
        t->moe_pair_early = v <= 0 ? MSM_CUDA_MOE_PAIR_EARLY_OFF : v == 1 ? MSM_CUDA_MOE_PAIR_EARLY_ON
                                                                           : MSM_CUDA_MOE_PAIR_EARLY_AUTO;
    if ((s = getenv("MSM_CUDA_MOE_FUSED_COMBINE"))) t->moe_fused_combine = s[0] == '0' ? 0 : s[0] == '2' ? 2 : 1;
    if ((s = getenv("MSM_CUDA_MOE_COMBINE_CLUSTER"))) t->moe_combine_cluster = s[0] != '0';
    if ((s = getenv("MSM_CUDA_MOE_COMBINE_EARLY"))) t->moe_combine_early = s[0] != '0';
    if (env_int("MSM_CUDA_MOE_GU_U2", &v))
        t->moe_gu_u2 = v <= 0 ? MSM_CUDA_MOE_GU_U2_OFF : v == 1 ? MSM_CUDA_MOE_GU_U2_ON : MSM_CUDA_MOE_GU_U2_AUTO;
    if ((s = getenv("MSM_CUDA_MMV_FIT_CLUSTERS"))) t->mmv_fit_clusters = s[0] != '0';
    if (env_int("MSM_CUDA_MMV_U8_MAX_BLOCKS", &v)) t->mmv_u8_max_blocks = v < 0 ? 0 : v;
    if ((s = getenv("MSM_CUDA_MMV_L2_REST"))) t->mmv_l2_rest = s[0] != '0';
    if (env_int("MSM_CUDA_MMV_STREAM_MIN_N", &v)) t->mmv_stream_min_n = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_MMV_STREAM_MIN_T", &v)) t->mmv_stream_min_t = v < 2 ? 2 : v > 8 ? 8 : v;
    if (env_int("MSM_CUDA_MMV_STREAM_BS_MIN_N", &v)) t->mmv_stream_bs_min_n = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_MMV_STREAM_ST", &v)) t->mmv_stream_st = v == 2 || v == 3 ? v : 0;
    if (env_int("MSM_CUDA_ATT_MAX_SPLIT", &v)) t->att_max_split = v < 1 ? 1 : v > 16 ? 16 : v;
    if (env_int("MSM_CUDA_ATT_MMA_SPLIT_GQA_MAX", &v)) t->att_mma_split_gqa_max = v < 0 ? 0 : v > 16 ? 16 : v;
    if ((s = getenv("MSM_CUDA_LINEAR_NORM"))) t->linear_norm_fused = s[0] == '1';
    if (env_int("MSM_CUDA_ATT_GROUP", &v)) t->att_group = v < 1 ? 1 : v > 4 ? 4 : v;
    if (env_int("MSM_CUDA_ATT_GROUP_MIN", &v)) t->att_group_min = v < 0 ? 0 : v;
    if ((s = getenv("MSM_CUDA_ATT_MMA_SPLIT"))) t->att_mma_split = s[0] != '0';
    if (env_int("MSM_CUDA_ATT_MMA_SPLIT_MIN_T", &v)) t->att_mma_split_min_t = v < 1 ? 1 : v;
    if (env_int("MSM_CUDA_ATT_MMA_SPLIT_MAX_T", &v)) t->att_mma_split_max_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_ATT_MMA_SPLIT_MHA_MAX_T", &v)) t->att_mma_split_mha_max_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_ATT_MMA", &v)) t->att_mma = v <= 0 ? MSM_CUDA_ATT_MMA_OFF : v >= 2 ? MSM_CUDA_ATT_MMA_ON : MSM_CUDA_ATT_MMA_AUTO;
    if (env_int("MSM_CUDA_ATT_MMA_MIN_BLOCKS", &v)) t->att_mma_min_blocks = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_ROUTER_CHUNK_PER_SM", &v)) t->router_chunk_per_sm = v < 0 ? 0 : v;
    if ((s = getenv("MSM_CUDA_ATT_CLUSTER"))) t->att_cluster = s[0] != '0';
    if (env_int("MSM_CUDA_ATT_CLUSTER_SPARE", &v)) t->att_cluster_spare = v < 0 ? 0 : v;
    if ((s = getenv("MSM_CUDA_ATT_EARLY"))) t->att_early = s[0] != '0';
    if ((s = getenv("MSM_CUDA_ATT_BT_CACHE"))) t->att_bt_cache = s[0] != '0';
    if (env_int("MSM_CUDA_GEMV_MINB", &v)) t->gemv_minb = v & 3;
    if ((s = getenv("MSM_CUDA_ATT_ROPE"))) t->att_rope = s[0] != '0';
    if (env_int("MSM_CUDA_ATT_QK_ROPE", &v)) t->att_qk_rope = v < 0 ? 0 : v > 2 ? 2 : v;
    if ((s = getenv("MSM_CUDA_SMALL_EARLY"))) t->small_early = s[0] != '0';
    if (env_int("MSM_CUDA_MOE_AUX_SERIAL_MAX_T", &v)) t->moe_aux_serial_max_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_MOE_GROUP_SCAN_MAX_T", &v)) t->moe_group_scan_max_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_MOE_GG_GATEUP_NT", &v)) t->moe_gg_gateup_nt = v == 2 ? 2 : 4;
    if (env_int("MSM_CUDA_MOE_GG_DOWN_NT", &v)) t->moe_gg_down_nt = v == 2 ? 2 : 4;
    if (env_int("MSM_CUDA_MOE_GG_DOWN_U", &v)) t->moe_gg_down_u = v == 3 ? 3 : 2;
    if (env_int("MSM_CUDA_MOE_GG_GATEUP_U", &v)) t->moe_gg_gateup_u = v == 3 || v == 4 ? v : 2;
    if (env_int("MSM_CUDA_MOE_GG_PERSIST", &v)) t->moe_gg_persist = v < 0 ? 0 : v & 3;
    if ((s = getenv("MSM_CUDA_MOE_GG_EARLY"))) t->moe_gg_early = s[0] != '0';
    if ((s = getenv("MSM_CUDA_MOE_GG_COMPACT"))) t->moe_gg_compact = s[0] != '0';
    if ((s = getenv("MSM_CUDA_LINEAR_SWIGLU"))) t->linear_swiglu = s[0] != '0';
    if ((s = getenv("MSM_CUDA_NORM_LINEAR_SWIGLU"))) t->norm_linear_swiglu = s[0] != '0';
    if (env_int("MSM_CUDA_NORM_SWIGLU_ROWS", &v)) t->norm_swiglu_rows = v == 4 ? 4 : 2;
    if ((s = getenv("MSM_CUDA_NORM_QK_ROPE"))) t->norm_qk_rope = s[0] != '0';
    if ((s = getenv("MSM_CUDA_LINEAR_ROPE_MMV"))) t->linear_rope_mmv = s[0] != '0';
    if (env_int("MSM_CUDA_LINEAR_SWIGLU_ROWS", &v)) t->linear_swiglu_rows = v == 4 ? 4 : v == 2 ? 2 : 1;
    if (env_int("MSM_CUDA_AUX_GEMV_ROWS", &v)) t->aux_gemv_rows = v == 2 ? 2 : 1;
    if (env_int("MSM_CUDA_L2_PREFETCH_MAX_T", &v)) t->l2_prefetch_max_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_L2_PREFETCH_MB", &v)) t->l2_prefetch_bytes = mib_clamped(v);
    if (env_int("MSM_CUDA_L2_PREFETCH_KV_MAX_T", &v)) t->l2_prefetch_kv_max_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_L2_PREFETCH_KV_MB", &v)) t->l2_prefetch_kv_bytes = mib_clamped(v);
    if ((s = getenv("MSM_CUDA_L2_PREFETCH_LAST"))) t->l2_prefetch_last = s[0] == '1';
    if (env_int("MSM_CUDA_L2_PREFETCH_BLOCKS", &v)) t->l2_prefetch_blocks = v < 1 ? 1 : v > 1024 ? 1024 : v;
    if (env_int("MSM_CUDA_L2_PREFETCH_CHUNK_KB", &v)) t->l2_prefetch_chunk_kb = v < 1 ? 1 : v > 1024 ? 1024 : v;
    if (env_int("MSM_CUDA_L2_PERSIST_MB", &v)) t->l2_persist_mb = v < 0 ? 0 : v > 1024 ? 1024 : v;
    if ((s = getenv("MSM_CUDA_STREAM_PRIO")))
        t->stream_prio = !strcmp(s, "aux") ? MSM_CUDA_PRIO_AUX : !strcmp(s, "auto") ? MSM_CUDA_PRIO_AUTO : MSM_CUDA_PRIO_OFF;
    if ((s = getenv("MSM_CUDA_FP8_MOE_HW"))) t->fp8_moe_hw = s[0] != '0';
    if (env_int("MSM_CUDA_FP8_MOE_LEAN", &v)) t->fp8_moe_lean = v < 0 ? 0 : v > 2 ? 2 : v;
    if (env_int("MSM_CUDA_ROWS_PIPE", &v)) t->rows_pipe = v & 15;
    if ((s = getenv("MSM_CUDA_NORM_ROUTER"))) t->norm_router = s[0] != '0';
    if (env_int("MSM_CUDA_ROUTER_CLUSTER", &v)) t->router_cluster_max_t = v < 0 ? 0 : v > 64 ? 64 : v;
    if ((s = getenv("MSM_CUDA_ROUTER_GROUP"))) t->router_group = s[0] != '0';
    if (env_int("MSM_CUDA_ROUTER_TCLUSTER", &v)) t->router_tcluster_max_t = v < 0 ? 0 : v > 64 ? 64 : v;
    if (env_int("MSM_CUDA_ROUTER_TCLUSTER_TB", &v)) t->router_tcluster_tb = v >= 8 ? 8 : v >= 4 ? 4 : 2;
    if ((s = getenv("MSM_CUDA_ROUTER_ST_ASYNC"))) t->router_st_async = s[0] != '0';
    if ((s = getenv("MSM_CUDA_GEMV_U16"))) t->gemv_u16 = s[0] != '0';
    if ((s = getenv("MSM_CUDA_GEMV_U8"))) t->gemv_u8 = s[0] == '1';
    if (env_int("MSM_CUDA_NORM_ROUTER_MAX_T", &v)) t->norm_router_max_t = v < 0 ? 0 : v;
    if (env_int("MSM_CUDA_MOE_TILED_BM", &v)) t->moe_tiled_bm = v == 16 || v == 32 || v == 64 ? v : 0;
    if (env_int("MSM_CUDA_FP8_TILED_KS", &v)) t->fp8_tiled_ks = v == 2 ? 2 : 1;
    if ((s = getenv("MSM_CUDA_FP8_LINEAR")))
        t->fp8_linear = !strcmp(s, "simt") ? MSM_CUDA_FP8_LINEAR_SIMT
                        : !strcmp(s, "simt_hw") ? MSM_CUDA_FP8_LINEAR_SIMT_HW : MSM_CUDA_FP8_LINEAR_MMA;
    if (env_int("MSM_CUDA_AR_ONESHOT_MAX_BYTES", &v)) t->ar_oneshot_max_bytes = v < 0 ? 0 : (size_t)v;
    if ((s = getenv("MSM_CUDA_AR")) && !strcmp(s, "nccl")) t->ar_oneshot_max_bytes = 0;
    if ((s = getenv("MSM_CUDA_MOE_PATH")))
        t->moe_path = !strcmp(s, "pair")           ? MSM_CUDA_MOE_PATH_PAIR
                      : !strcmp(s, "grouped_gemv") ? MSM_CUDA_MOE_PATH_GROUPED_GEMV
                      : !strcmp(s, "wmma")         ? MSM_CUDA_MOE_PATH_WMMA
                      : !strcmp(s, "tiled")        ? MSM_CUDA_MOE_PATH_TILED
                                                   : MSM_CUDA_MOE_PATH_AUTO;
    if ((s = getenv("MSM_CUDA_MOE_KERNELS"))) {
        t->moe_kernels = 0;
        if (strstr(s, "simt")) t->moe_kernels |= MSM_CUDA_MOE_K_SIMT;
        if (strstr(s, "mma")) t->moe_kernels |= MSM_CUDA_MOE_K_MMA;
        if (strstr(s, "no_prefetch")) t->moe_kernels |= MSM_CUDA_MOE_K_NO_PREFETCH;
        if (strstr(s, "nt4")) t->moe_kernels |= MSM_CUDA_MOE_K_NT4;
        if (strstr(s, "down_split")) t->moe_kernels |= MSM_CUDA_MOE_K_DOWN_SPLIT;
        if (strstr(s, "down_warp")) t->moe_kernels |= MSM_CUDA_MOE_K_DOWN_WARP;
    }
}

static uint64_t parse_skip_ops(const char *s) {
    uint64_t mask = 0;
    for (int op = 0; s && op < MSM_OP_COUNT && op < 64; op++) {
        const char *nm = msm_op_name((msm_op)op), *p = s;
        size_t L = strlen(nm);
        while ((p = strstr(p, nm)) != NULL) {
            if ((p == s || p[-1] == ',') && (p[L] == ',' || p[L] == 0)) mask |= 1ull << op;
            p += L;
        }
    }
    return mask;
}

static void tuning_from_env(msm_cuda_tuning *t, uint64_t *skip_ops) {
    msm_cuda_tuning_from_env(t);
    *skip_ops = parse_skip_ops(getenv("MSM_CUDA_SKIP_OPS"));
}

/* Pure decode steps (one token a sequence: T == S) round x to bf16 for cuBLASLt at every batch
 * size: their dense linears are bound by the weights' memory traffic, which the hi + lo split
 * doubles (measured on the H200, 2026-11-30: batch 128 21.67 -> 20.62 ms, batch 256 26.57 ->
 * 25.29 ms without it). For the same reason they leave 9..64 tokens to cuBLASLt rather than the
 * near-fp32 tiled linear (2026-12-01: batch 16 6.65 -> 7.04 ms, batch 32 9.06 -> 10.38 ms with
 * it). Prefill chunks stay near-fp32 at every size: the tiled linear up to 64 tokens, the split
 * from lt_split_min_t on. MSM_CUDA_LT_SPLIT_DECODE=1 keeps both for decode too. */
static void tuning_for_decode(const msm_cuda_tuning *t, msm_cuda_tuning *ret) {
    *ret = *t;
    const char *s = getenv("MSM_CUDA_LT_SPLIT_DECODE");
    if (!(s && s[0] == '1')) ret->lt_split_min_t = 1 << 30, ret->linear_tiled_min_t = 1 << 30;
    /* FP8 dense linears past MSM_CUDA_FP8_LINEAR_DECODE_MAX_T tokens dequantise for cuBLASLt (there) */
    int v;
    ret->fp8_linear_max_t = env_int("MSM_CUDA_FP8_LINEAR_DECODE_MAX_T", &v) ? (v < 0 ? 0 : v)
                                                                             : MSM_CUDA_FP8_LINEAR_DECODE_MAX_T;
}

int msm_cuda_device_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
    return n;
}

/* The device-to-device copy rate of GPU `device` in GB/s, counting bytes read plus bytes written:
 * the best of 5 copies of `bytes` between two fresh buffers after one warm-up copy (the ceiling
 * msmoe-bench's %HBM divides by). Run before the weights take the memory. */
int msm_cuda_copy_gbps(int device, size_t bytes, char *name, size_t name_len, double *ret, msm_err *err) {
    struct cudaDeviceProp prop;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, device);
    if (e != cudaSuccess) return msm_err_set(err, -ENODEV, "cannot use GPU %d: %s", device, cudaGetErrorString(e));
    if (name && name_len) snprintf(name, name_len, "%s", prop.name);
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    float best = 0.0f;
    e = cudaMalloc(&a, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
    if (e == cudaSuccess) e = cudaMemset(a, 1, bytes);
    if (e == cudaSuccess) e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    for (int i = -1; i < 5 && e == cudaSuccess; i++) {
        float ms = 0.0f;
        e = cudaEventRecord(e0, 0);
        if (e == cudaSuccess) e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0);
        if (e == cudaSuccess) e = cudaEventRecord(e1, 0);
        if (e == cudaSuccess) e = cudaEventSynchronize(e1);
        if (e == cudaSuccess) e = cudaEventElapsedTime(&ms, e0, e1);
        if (e == cudaSuccess && i >= 0 && (best == 0.0f || ms < best)) best = ms;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a), cudaFree(b);
    if (e != cudaSuccess || best <= 0.0f)
        return msm_err_set(err, -EIO, "GPU %d: the copy measurement failed: %s", device,
                           e != cudaSuccess ? cudaGetErrorString(e) : "no time");
    *ret = 2.0 * (double)bytes / (best * 1e-3) / 1e9;
    return 0;
}

int msm_cuda_nccl_unique_id(void *id, msm_err *err) {
    ncclUniqueId u;
    ncclResult_t r = ncclGetUniqueId(&u);
    if (r != ncclSuccess) return msm_err_set(err, -EIO, "ncclGetUniqueId failed: %s", ncclGetErrorString(r));
    memcpy(id, &u, sizeof u);
    return 0;
}

int msm_backend_cuda_new(int device, int rank, int tp, const void *nccl_id, int deadline_ms,
                         msm_backend **ret, msm_err *err) {
    cuda_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return msm_err_set(err, -ENOMEM, "out of memory");
    cb->b = (msm_backend){.vt = &cuda_vt, .comm = &cb->comm, .rank = rank, .deadline_ms = deadline_ms};
    cb->comm = (msm_comm){.vt = &nccl_vt, .rank = rank, .size = tp};
    cb->device = device;
    cb->tp = tp;
    *ret = &cb->b; /* from here on, msm_backend_free cleans up a half-built backend */
    int r = 0;
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return msm_err_set(err, -ENODEV, "rank %d: cannot use GPU %d: %s", rank, device, cudaGetErrorString(e));
    const char *stage = getenv("MSM_CUDA_HOST_STAGE"), *wait = getenv("MSM_CUDA_HOST_WAIT");
    int pad_mb = 0;
    if (env_int("MSM_CUDA_PAD_MB", &pad_mb) && pad_mb > 0) TRY(cudaMalloc(&cb->pad, mib_clamped(pad_mb)));
    if (!stage || stage[0] != '0') {
        TRY(cudaHostAlloc((void **)&cb->stage, STAGE_BYTES, cudaHostAllocDefault));
        cb->stage_bytes = STAGE_BYTES;
    }
    cb->wait_sleep = wait && !strcmp(wait, "sleep");
    r = msm_cuda_tuning_init(&cb->tune, device);
    if (r) return msm_err_set(err, r, "rank %d: cannot read the properties of GPU %d", rank, device);
    tuning_from_env(&cb->tune, &cb->skip_ops);
    tuning_for_decode(&cb->tune, &cb->tune_decode);
    if (cb->tune.l2_persist_mb > 0) { /* the L2 set aside for evict_last lines (PREFETCH with l2_prefetch_last) */
        int most = 0;
        TRY(cudaDeviceGetAttribute(&most, cudaDevAttrMaxPersistingL2CacheSize, device));
        size_t want = (size_t)cb->tune.l2_persist_mb << 20;
        TRY(cudaDeviceSetLimit(cudaLimitPersistingL2CacheSize, want < (size_t)most ? want : (size_t)most));
    }
    int least = 0; /* unused: the aux priority goes above the default, which is the least */
    TRY(cudaDeviceGetStreamPriorityRange(&least, &cb->prio_hi));
    for (int s = 0; s < MSM_N_STREAMS; s++) TRY(cudaStreamCreateWithFlags(&cb->st[s], cudaStreamNonBlocking));
    r = msm_cuda_ctx_new(&cb->ctx);
    if (r) return msm_err_set(err, r, "rank %d: cannot create the cuBLASLt context", rank);
    ncclUniqueId id;
    memcpy(&id, nccl_id, sizeof id);
    NTRY(ncclCommInitRank(&cb->nccl, tp, id, rank));
    return 0;
}

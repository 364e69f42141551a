/* CPU backend: float32 weights and activations, the reference kernels, and real streams.
 * Two switches (msm_backend_cpu_opts) make it store what the CUDA backend stores, for like-for-like
 * comparisons: a bf16 KV cache, and FP8 weights rounded to bf16 as the CUDA loader rounds them.
 *
 * MAIN runs on the calling (rank) thread. AUX is a worker thread fed by a FIFO of items (run a
 * node, record an event, wait for an event), so aux work really runs concurrently with main work
 * and events really synchronise, as CUDA streams would. Every wait has a deadline. */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "msm_backend.h"
#include "msm_weights.h" /* msm_weights_fp8_resident */
#include "msm_dtype.h"
#include "msm_engine.h" /* MSM_TEST_FAULT_* */
#include "msm_file.h"
#include "msm_kernels.h"

typedef enum { ITEM_RUN, ITEM_RECORD, ITEM_WAIT, ITEM_SLEEP } item_kind;

typedef struct item {
    item_kind kind;
    int node, event;
    const msm_graph *g;
    msm_step_dims d;
} item;

typedef struct cpu_backend {
    msm_backend b;
    float **weights;          /* [n_weights] float32, carved from `wmem` */
    bool *fp8_round;          /* [n_weights] FP8 blocks are rounded to bf16 after dequantisation
                                 (fp8_as_bf16, and not a keep_f32 weight) */
    int n_weights;
    void *wmem;               /* every weight, one anonymous mapping */
    size_t wmem_bytes;
    char *arena;
    size_t arena_bytes;
    float **kc, **vc;         /* [n_layers] [n_blocks, MSM_KV_BLOCK, kvh, hd] */
    bool kv_bf16;             /* K/V rounded to bf16 when written (as the CUDA cache stores them) */
    bool fp8_as_bf16;         /* FP8 weights rounded to bf16 once dequantised (as CUDA stores them) */
    bool fp8_as_cuda;         /* ... only those the CUDA backend does not keep FP8 (msm_weights_fp8_resident) */
    int n_layers;
    float *scratch[MSM_N_STREAMS];
    size_t scratch_floats;
    /* events and the aux worker */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t epoch;           /* step counter */
    uint64_t *ev_epoch;       /* [n_events]: epoch of the last record */
    int n_events;
    item *q;                  /* ring buffer */
    int q_cap, q_head, q_len;
    int busy;                 /* worker is executing an item */
    int aux_err;
    msm_err aux_msg;
    bool quit, started;
    pthread_t worker;
} cpu_backend;


#define F(v) ((float *)(cb->arena + g->vals[v].offset))
#define I32(v) ((int32_t *)(cb->arena + g->vals[v].offset))
#define ROWS(v) ((int)msm_value_rows(&g->vals[v], d->T, d->R, d->S))

static int run_node(cpu_backend *cb, const msm_graph *g, int idx, const msm_step_dims *d,
                    msm_stream s, msm_err *err) {
    const msm_node *n = &g->nodes[idx];
    const msm_attr *a = &n->attr;
    float *scratch = cb->scratch[s];
    int in0 = n->in[0], out0 = n->out[0];
    switch (n->op) {
    case MSM_OP_EMBED:
        msm_cpu_embed(F(out0), cb->weights[n->w[0]], I32(in0), d->T, a->embed.H);
        break;
    case MSM_OP_PREFETCH: /* L2 hints: the CPU has nothing to pull ahead */
    case MSM_OP_PREFETCH_KV:
        break;
    case MSM_OP_RMSNORM:
        msm_cpu_rmsnorm(F(out0), F(in0), cb->weights[n->w[0]], ROWS(in0), a->rmsnorm.dim, a->rmsnorm.eps);
        break;
    case MSM_OP_QK_NORM:
        msm_cpu_qk_norm(F(out0), F(in0), cb->weights[n->w[0]], cb->weights[n->w[1]], ROWS(in0),
                        g->vals[in0].cols, a->qk_norm.nh, a->qk_norm.kvh, a->qk_norm.hd, a->qk_norm.eps);
        break;
    case MSM_OP_LINEAR:
        msm_cpu_linear(F(out0), F(in0), cb->weights[n->w[0]], n->w[1] >= 0 ? cb->weights[n->w[1]] : NULL,
                       ROWS(in0), a->linear.N, a->linear.K);
        break;
    case MSM_OP_ROPE: /* q and k heads lead every row: rotate them, copy the v heads */
        msm_cpu_rope_copy(F(out0), F(in0), I32(n->in[1]), ROWS(in0), g->vals[in0].cols,
                          a->rope.nh + a->rope.kvh, a->rope.hd, a->rope.rot, a->rope.theta);
        break;
    case MSM_OP_ROPE_KV_WRITE: /* ROPE, then the rotated k heads and the v heads to the cache */
        if (!cb->kc[n->layer])
            return msm_err_set(err, -EINVAL, "cpu backend: layer %d has no KV cache (no ATTENTION)", n->layer);
        msm_cpu_rope_kv(F(out0), F(in0), I32(n->in[1]), I32(n->in[2]), cb->kc[n->layer], cb->vc[n->layer],
                        ROWS(in0), a->rope.nh, a->rope.kvh, a->rope.hd, a->rope.rot, a->rope.theta,
                        cb->kv_bf16);
        break;
    case MSM_OP_ATTENTION: {
        int nh = a->attention.nh, kvh = a->attention.kvh, hd = a->attention.hd;
        int C = g->vals[in0].cols, T = ROWS(in0);
        const float *qkv = F(in0);
        const int32_t *seq = I32(n->in[1]), *pos = I32(n->in[2]), *slot = I32(n->in[3]);
        const int32_t *bt = I32(n->in[4]);
        float *kc = cb->kc[n->layer], *vc = cb->vc[n->layer];
        /* k and v read in place from the qkv rows (row stride C), unless the ROPE_KV_WRITE that
         * produced them wrote the cache already */
        if (!a->attention.kv_written)
            msm_cpu_kv_write_ld(kc, vc, qkv + (size_t)nh * hd, qkv + (size_t)(nh + kvh) * hd, (size_t)C,
                                slot, T, kvh, hd, cb->kv_bf16);
        float *q = scratch; /* gather q contiguous [T, nh*hd] */
        for (int t = 0; t < T; t++) memcpy(q + (size_t)t * nh * hd, qkv + (size_t)t * C, sizeof(float) * (size_t)nh * hd);
        msm_cpu_attention(F(out0), q, kc, vc, seq, pos, bt, g->max_blocks, T, nh, kvh, hd, a->attention.scale);
        break;
    }
    case MSM_OP_ADD:
        msm_cpu_add(F(out0), F(in0), F(n->in[1]), (size_t)ROWS(in0) * g->vals[in0].cols);
        break;
    case MSM_OP_ADD_RMSNORM:
        msm_cpu_add_rmsnorm(F(out0), F(n->out[1]), F(in0), F(n->in[1]), cb->weights[n->w[0]], ROWS(in0),
                            a->rmsnorm.dim, a->rmsnorm.eps);
        break;
    case MSM_OP_LINEAR_ADD_RMSNORM: /* the pair: y into s's bytes, then s = r + y and its norm */
        msm_cpu_linear(F(out0), F(in0), cb->weights[n->w[0]], n->w[1] >= 0 ? cb->weights[n->w[1]] : NULL,
                       ROWS(in0), a->linear_norm.N, a->linear_norm.K);
        msm_cpu_add_rmsnorm(F(out0), F(n->out[1]), F(n->in[1]), F(out0), cb->weights[n->w[2]], ROWS(in0),
                            a->linear_norm.N, a->linear_norm.eps);
        break;
    case MSM_OP_MOE_COMBINE_NORM:
        msm_cpu_moe_combine_rmsnorm(F(out0), F(n->out[1]), F(in0), F(n->in[1]), F(n->in[2]), F(n->in[3]),
                                    cb->weights[n->w[0]], cb->weights[n->w[1]], ROWS(in0), a->rmsnorm.dim,
                                    a->rmsnorm.eps);
        break;
    case MSM_OP_MOE_COMBINE:
        msm_cpu_moe_combine(F(out0), F(in0), F(n->in[1]), F(n->in[2]), cb->weights[n->w[0]], ROWS(in0),
                            g->vals[in0].cols);
        break;
    case MSM_OP_MUL:
        msm_cpu_scale_rows(F(out0), F(in0), F(n->in[1]), ROWS(in0), g->vals[in0].cols);
        break;
    case MSM_OP_SIGMOID:
        msm_cpu_sigmoid(F(out0), F(in0), (size_t)ROWS(in0) * g->vals[in0].cols);
        break;
    case MSM_OP_SWIGLU:
        msm_cpu_swiglu(F(out0), F(in0), ROWS(in0), a->swiglu.I);
        break;
    case MSM_OP_ROUTER_TOPK:
        msm_cpu_router_topk(I32(out0), F(n->out[1]), F(in0), ROWS(in0), a->router_topk.E, a->router_topk.k,
                            a->router_topk.norm != 0);
        break;
    case MSM_OP_ROUTER_LINEAR_TOPK: { /* the pair it fused, the logits in scratch */
        const msm_attr_router_topk *r = &a->router_topk;
        int T = ROWS(in0), K = g->vals[in0].cols;
        msm_cpu_linear(scratch, F(in0), cb->weights[n->w[0]], NULL, T, r->E, K);
        msm_cpu_router_topk(I32(out0), F(n->out[1]), scratch, T, r->E, r->k, r->norm != 0);
        break;
    }
    case MSM_OP_ROUTER_GROUP_TOPK: {
        const msm_attr_router_group *r = &a->router_group;
        msm_cpu_router_group_topk(I32(out0), F(n->out[1]), F(in0), cb->weights[n->w[0]], ROWS(in0), r->E, r->k,
                                  r->n_group, r->topk_group, r->norm != 0, r->scale, scratch);
        break;
    }
    case MSM_OP_MOE_EXPERTS:
        msm_cpu_moe_experts(F(out0), F(in0), I32(n->in[1]), F(n->in[2]), cb->weights[n->w[0]],
                            cb->weights[n->w[1]], ROWS(in0), a->moe_experts.H, a->moe_experts.I,
                            a->moe_experts.k, scratch);
        break;
    case MSM_OP_GATHER_ROWS:
        msm_cpu_gather_rows(F(out0), F(in0), I32(n->in[1]), ROWS(out0), g->vals[in0].cols);
        break;
    case MSM_OP_ALLREDUCE:
    case MSM_OP_ALLGATHER: {
        if (cb->b.skew_us > 0 && cb->b.skew_stream == s) usleep((useconds_t)cb->b.skew_us);
        size_t rows = (size_t)ROWS(in0), cols = (size_t)g->vals[in0].cols;
        if (n->op == MSM_OP_ALLREDUCE) return msm_comm_allreduce(cb->b.comm, F(in0), F(out0), rows * cols, err);
        return msm_comm_allgather(cb->b.comm, F(in0), F(out0), rows, cols * sizeof(float), err);
    }
    case MSM_OP_ALLREDUCE_ADD_RMSNORM: { /* the pair it fused: the partial (its only reader is this
                                            node) reduced in place, then the residual add + norm */
        if (cb->b.skew_us > 0 && cb->b.skew_stream == s) usleep((useconds_t)cb->b.skew_us);
        int r = msm_comm_allreduce(cb->b.comm, F(in0), F(in0), (size_t)ROWS(in0) * g->vals[in0].cols, err);
        if (r) return r;
        msm_cpu_add_rmsnorm(F(out0), F(n->out[1]), F(n->in[1]), F(in0), cb->weights[n->w[0]], ROWS(in0),
                            a->rmsnorm.dim, a->rmsnorm.eps);
        break;
    }
    case MSM_OP_SAMPLE: {
        int R = ROWS(in0), V = a->sample.V, Vp = a->sample.V_pad;
        const msm_sample_params *p = (const msm_sample_params *)I32(n->in[1]);
        for (int r = 0; r < R; r++) msm_cpu_sample(I32(out0) + r, F(in0) + (size_t)r * Vp, p + r, 1, V, scratch);
        break;
    }
    default:
        return msm_err_set(err, -ENOTSUP, "cpu backend: op %s is not supported", msm_op_name(n->op));
    }
    return 0;
}

/* Waits (mu held) for event ev of the current step. */
static int wait_event(cpu_backend *cb, int ev, msm_err *err) {
    struct timespec dl = msm_deadline_after_ms(cb->b.deadline_ms);
    while (cb->ev_epoch[ev] != cb->epoch) {
        if (pthread_cond_timedwait(&cb->cv, &cb->mu, &dl) == ETIMEDOUT && cb->ev_epoch[ev] != cb->epoch)
            return msm_err_set(err, -ETIMEDOUT, "rank %d: EVENT_WAIT on event %d timed out after %d ms",
                               cb->b.rank, ev, cb->b.deadline_ms);
    }
    return 0;
}

static void *aux_main(void *arg) {
    cpu_backend *cb = arg;
    pthread_mutex_lock(&cb->mu);
    for (;;) {
        while (!cb->quit && cb->q_len == 0) pthread_cond_wait(&cb->cv, &cb->mu);
        if (cb->quit) break;
        item it = cb->q[cb->q_head];
        cb->q_head = (cb->q_head + 1) % cb->q_cap;
        cb->q_len--;
        cb->busy = 1;
        int r = 0;
        if (cb->aux_err) {
            /* a failed stream skips the rest of its work (it still records nothing) */
        } else if (it.kind == ITEM_RECORD) {
            cb->ev_epoch[it.event] = cb->epoch;
            pthread_cond_broadcast(&cb->cv);
        } else if (it.kind == ITEM_WAIT) {
            r = wait_event(cb, it.event, &cb->aux_msg);
        } else if (it.kind == ITEM_SLEEP) {
            pthread_mutex_unlock(&cb->mu);
            usleep((useconds_t)it.event * 1000u); /* test-only: a stream stuck past the deadline */
            pthread_mutex_lock(&cb->mu);
        } else {
            pthread_mutex_unlock(&cb->mu);
            msm_err e;
            r = run_node(cb, it.g, it.node, &it.d, MSM_STREAM_AUX, &e);
            pthread_mutex_lock(&cb->mu);
            if (r) cb->aux_msg = e;
        }
        if (r && !cb->aux_err) cb->aux_err = r;
        cb->busy = 0;
        pthread_cond_broadcast(&cb->cv);
    }
    pthread_mutex_unlock(&cb->mu);
    return NULL;
}

static int push(cpu_backend *cb, item it, msm_err *err) {
    pthread_mutex_lock(&cb->mu);
    if (cb->q_len == cb->q_cap) {
        int cap = cb->q_cap ? cb->q_cap * 2 : 256;
        item *q = malloc(sizeof *q * (size_t)cap);
        if (!q) {
            pthread_mutex_unlock(&cb->mu);
            return msm_err_set(err, -ENOMEM, "out of memory queueing aux work");
        }
        for (int i = 0; i < cb->q_len; i++) q[i] = cb->q[(cb->q_head + i) % cb->q_cap];
        free(cb->q);
        cb->q = q;
        cb->q_cap = cap;
        cb->q_head = 0;
    }
    cb->q[(cb->q_head + cb->q_len) % cb->q_cap] = it;
    cb->q_len++;
    pthread_cond_broadcast(&cb->cv);
    pthread_mutex_unlock(&cb->mu);
    return 0;
}

static int cpu_run(msm_backend *b, const msm_graph *g, int node, const msm_step_dims *d, msm_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    if (g->nodes[node].stream == MSM_STREAM_AUX)
        return push(cb, (item){.kind = ITEM_RUN, .node = node, .g = g, .d = *d}, err);
    return run_node(cb, g, node, d, MSM_STREAM_MAIN, err);
}

static int cpu_record(msm_backend *b, msm_stream s, int ev, msm_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    if (ev < 0 || ev >= cb->n_events) return msm_err_set(err, -EINVAL, "bad event %d", ev);
    if (s == MSM_STREAM_AUX) return push(cb, (item){.kind = ITEM_RECORD, .event = ev}, err);
    pthread_mutex_lock(&cb->mu);
    cb->ev_epoch[ev] = cb->epoch;
    pthread_cond_broadcast(&cb->cv);
    pthread_mutex_unlock(&cb->mu);
    return 0;
}

static int cpu_wait(msm_backend *b, msm_stream s, int ev, msm_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    if (ev < 0 || ev >= cb->n_events) return msm_err_set(err, -EINVAL, "bad event %d", ev);
    if (s == MSM_STREAM_AUX) return push(cb, (item){.kind = ITEM_WAIT, .event = ev}, err);
    pthread_mutex_lock(&cb->mu);
    int r = wait_event(cb, ev, err);
    pthread_mutex_unlock(&cb->mu);
    return r;
}

static int cpu_begin(msm_backend *b, msm_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    pthread_mutex_lock(&cb->mu);
    cb->epoch++;
    cb->aux_err = 0;
    pthread_mutex_unlock(&cb->mu);
    (void)err;
    return 0;
}

static int cpu_sync(msm_backend *b, msm_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    struct timespec dl = msm_deadline_after_ms(cb->b.deadline_ms);
    int r = 0;
    pthread_mutex_lock(&cb->mu);
    while (cb->q_len > 0 || cb->busy) {
        if (pthread_cond_timedwait(&cb->cv, &cb->mu, &dl) == ETIMEDOUT && (cb->q_len > 0 || cb->busy)) {
            r = msm_err_set(err, -ETIMEDOUT, "rank %d: the aux stream did not finish within %d ms",
                            cb->b.rank, cb->b.deadline_ms);
            break;
        }
    }
    if (!r && cb->aux_err) {
        r = cb->aux_err;
        if (err) *err = cb->aux_msg;
    }
    pthread_mutex_unlock(&cb->mu);
    return r;
}

/* Weights: one anonymous mapping carved at 64-byte boundaries. Its pages arrive zeroed, lazily,
 * on the first write of whichever reader thread converts into them, so the page faults are spread
 * over the readers. (MADV_HUGEPAGE was tried: with the kernel's default `defrag = madvise` a fault
 * may compact memory first, and loads of 0.6 GB took 0.7 to 5.6 s instead of a steady 0.7 s on the
 * 2-core test machine.) */
static int cpu_alloc_weights(msm_backend *b, const msm_graph *g, const msm_wsource *src, msm_err *err) {
    /* float32 whatever the checkpoint holds: FP8 is dequantised as it is loaded (src only tells
     * fp8_as_cuda which weights the CUDA backend keeps FP8) */
    cpu_backend *cb = (cpu_backend *)b;
    if (cb->weights) return msm_err_set(err, -EINVAL, "cpu backend: weights are allocated already");
    size_t total = 0;
    for (int i = 0; i < g->n_weights; i++) {
        const msm_weight *w = &g->weights[i];
        total += ((size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols * sizeof(float) + 63) & ~(size_t)63;
    }
    cb->weights = calloc((size_t)(g->n_weights ? g->n_weights : 1), sizeof *cb->weights);
    cb->fp8_round = calloc((size_t)(g->n_weights ? g->n_weights : 1), sizeof *cb->fp8_round);
    if (!cb->weights || !cb->fp8_round) return msm_err_set(err, -ENOMEM, "out of memory for the weight table");
    /* the CUDA backend stores keep_f32 weights as float32 whatever their source, FP8 included
     * (load.cu's float32 path: the dequantised value, unrounded), the others as bf16 */
    bool *resident = calloc((size_t)(g->n_weights ? g->n_weights : 1), sizeof *resident);
    if (!resident) return msm_err_set(err, -ENOMEM, "out of memory for the weight table");
    if (cb->fp8_as_cuda) msm_weights_fp8_resident(g, src, resident);
    for (int i = 0; i < g->n_weights; i++)
        cb->fp8_round[i] = (cb->fp8_as_bf16 || (cb->fp8_as_cuda && !resident[i])) && !g->weights[i].keep_f32;
    free(resident);
    cb->n_weights = g->n_weights;
    void *p = mmap(NULL, total ? total : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        return msm_err_set(err, -ENOMEM, "out of memory for the weights (%.2f GB of float32)", (double)total / 1e9);
    cb->wmem = p;
    cb->wmem_bytes = total ? total : 1;
    b->weight_bytes = total;
    size_t off = 0;
    for (int i = 0; i < g->n_weights; i++) {
        const msm_weight *w = &g->weights[i];
        cb->weights[i] = (float *)((char *)p + off);
        off += ((size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols * sizeof(float) + 63) & ~(size_t)63;
    }
    return 0;
}

static int cpu_dummy_weight(msm_backend *b, int wi, const msm_weight *w, uint64_t seed, float scale,
                            msm_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    if (wi < 0 || wi >= cb->n_weights) return msm_err_set(err, -EINVAL, "cpu backend: no weight %d", wi);
    float *p = cb->weights[wi];
    size_t n = (size_t)w->n_expert * (size_t)w->rows * (size_t)w->cols;
    for (size_t i = 0; i < n; i++) p[i] = w->is_norm ? 1.0f : (2.0f * msm_rng_uniform(seed, i) - 1.0f) * scale;
    return 0;
}

/* A loading channel: one staging slot (a put converts before it returns, so one is enough). */
typedef struct cpu_chan {
    cpu_backend *cb;
    void *slot;
} cpu_chan;

static int cpu_chan_open(msm_backend *b, size_t slot_bytes, int n_slots, msm_wchan **ret, msm_err *err) {
    (void)n_slots;
    cpu_chan *c = calloc(1, sizeof *c);
    if (c) c->slot = aligned_alloc(64, (slot_bytes + 63) & ~(size_t)63);
    if (!c || !c->slot) {
        free(c);
        return msm_err_set(err, -ENOMEM, "out of memory for a %zu-byte staging buffer", slot_bytes);
    }
    c->cb = (cpu_backend *)b;
    *ret = (msm_wchan *)c;
    return 0;
}

static int cpu_chan_slot(msm_wchan *wc, void **ret, msm_err *err) {
    (void)err;
    *ret = ((cpu_chan *)wc)->slot;
    return 0;
}

/* n float32 values rounded to bf16 in place: msm_f32_to_bf16 (nearest even, NaN stays NaN) and
 * back, exactly what the CUDA loader's kernel stores and its kernels read back. */
static void round_to_bf16(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = msm_bf16_to_f32(msm_f32_to_bf16(x[i]));
}

/* Converts straight into the float32 weight, row by row (the slot is still in this core's cache);
 * FP8 rows are dequantised with the scales of their blocks (DeepSeek-V3's weight_dequant: one
 * float32 multiply an element, so the result does not depend on how the loader cut the chunks),
 * then rounded to bf16 with fp8_as_bf16 (after the multiply, as load.cu does: the CUDA weights). */
static int cpu_chan_put(msm_wchan *wc, const msm_wblock *k, msm_err *err) {
    cpu_backend *cb = ((cpu_chan *)wc)->cb;
    if (k->wi < 0 || k->wi >= cb->n_weights) return msm_err_set(err, -EINVAL, "cpu backend: no weight %d", k->wi);
    float *dst = cb->weights[k->wi] + k->dst_off;
    const char *src = k->src;
    if (k->src_dtype == MSM_F8_E4M3) {
        if (!k->scale || k->scale_block <= 0)
            return msm_err_set(err, -EINVAL, "cpu backend: an FP8 block of weight %d came without its scales", k->wi);
        size_t B = (size_t)k->scale_block;
        bool round = cb->fp8_round[k->wi];
        for (size_t r = 0; r < k->rows; r++) {
            float *d = dst + r * k->dst_pitch;
            msm_fp8_dequant_row(d, (const uint8_t *)src + r * k->src_pitch, k->cols,
                                k->scale + (k->scale_r0 + r) / B * k->scale_pitch, k->scale_c0, B);
            if (round) round_to_bf16(d, k->cols);
        }
        return 0;
    }
    for (size_t r = 0; r < k->rows; r++) msm_convert_to_f32(dst + r * k->dst_pitch, src + r * k->src_pitch, k->src_dtype, k->cols);
    return 0;
}

static int cpu_chan_close(msm_wchan *wc, msm_err *err) {
    (void)err;
    cpu_chan *c = (cpu_chan *)wc;
    if (c) free(c->slot);
    free(c);
    return 0;
}

const float *msm_backend_cpu_weight(const msm_backend *b, int wi) {
    const cpu_backend *cb = (const cpu_backend *)b;
    return b && wi >= 0 && wi < cb->n_weights ? cb->weights[wi] : NULL;
}

static int cpu_prepare(msm_backend *b, const msm_graph *g, int n_kv_blocks, msm_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    cb->arena_bytes = g->arena_bytes;
    cb->arena = aligned_alloc(256, (g->arena_bytes + 255) / 256 * 256);
    cb->n_layers = g->n_layers;
    cb->kc = calloc((size_t)g->n_layers, sizeof *cb->kc);
    cb->vc = calloc((size_t)g->n_layers, sizeof *cb->vc);
    cb->n_events = g->n_events;
    cb->ev_epoch = calloc((size_t)(g->n_events ? g->n_events : 1), sizeof *cb->ev_epoch);
    if (!cb->arena || !cb->kc || !cb->vc || !cb->ev_epoch)
        return msm_err_set(err, -ENOMEM, "out of memory for the arena (%zu bytes)", g->arena_bytes);
    memset(cb->arena, 0, cb->arena_bytes);
    size_t scratch = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        const msm_node *n = &g->nodes[i];
        size_t need = 0;
        if (n->op == MSM_OP_ATTENTION) {
            const msm_attr_attention *at = &n->attr.attention;
            size_t kv = (size_t)n_kv_blocks * MSM_KV_BLOCK * (size_t)at->kvh * (size_t)at->hd;
            if (!cb->kc[n->layer]) {
                cb->kc[n->layer] = calloc(kv ? kv : 1, sizeof(float));
                cb->vc[n->layer] = calloc(kv ? kv : 1, sizeof(float));
                if (!cb->kc[n->layer] || !cb->vc[n->layer])
                    return msm_err_set(err, -ENOMEM, "out of memory for the KV cache (%d blocks)", n_kv_blocks);
            }
            need = (size_t)g->max_T * (size_t)at->nh * (size_t)at->hd; /* q gathered [T, nh*hd] */
        } else if (n->op == MSM_OP_MOE_EXPERTS) {
            need = 3 * (size_t)n->attr.moe_experts.I;
        } else if (n->op == MSM_OP_ROUTER_LINEAR_TOPK) {
            need = (size_t)g->max_T * (size_t)n->attr.router_topk.E; /* the logits */
        } else if (n->op == MSM_OP_ROUTER_GROUP_TOPK) {
            need = 2 * (size_t)n->attr.router_group.E + (size_t)n->attr.router_group.n_group;
        } else if (n->op == MSM_OP_SAMPLE) {
            need = 2 * (size_t)n->attr.sample.V_pad;
        }
        if (need > scratch) scratch = need;
    }
    for (int s = 0; s < MSM_N_STREAMS; s++) {
        cb->scratch[s] = malloc(sizeof(float) * (scratch ? scratch : 1));
        if (!cb->scratch[s]) return msm_err_set(err, -ENOMEM, "out of memory for scratch");
    }
    if (!cb->started) {
        if (pthread_create(&cb->worker, NULL, aux_main, cb) != 0)
            return msm_err_set(err, -EAGAIN, "cannot start the aux stream thread");
        cb->started = true;
    }
    return 0;
}

static int cpu_write(msm_backend *b, size_t off, const void *src, size_t n, msm_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    if (off + n > cb->arena_bytes) return msm_err_set(err, -EINVAL, "arena write out of range");
    memcpy(cb->arena + off, src, n);
    return 0;
}

static int cpu_read(msm_backend *b, size_t off, void *dst, size_t n, msm_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    if (off + n > cb->arena_bytes) return msm_err_set(err, -EINVAL, "arena read out of range");
    memcpy(dst, cb->arena + off, n);
    return 0;
}

static void cpu_free(msm_backend *b) {
    cpu_backend *cb = (cpu_backend *)b;
    if (cb->started) {
        pthread_mutex_lock(&cb->mu);
        cb->quit = true;
        pthread_cond_broadcast(&cb->cv);
        pthread_mutex_unlock(&cb->mu);
        pthread_join(cb->worker, NULL);
    }
    if (cb->wmem) munmap(cb->wmem, cb->wmem_bytes);
    free(cb->weights);
    free(cb->fp8_round);
    for (int l = 0; cb->kc && l < cb->n_layers; l++) {
        free(cb->kc[l]);
        free(cb->vc[l]);
    }
    free(cb->kc);
    free(cb->vc);
    for (int s = 0; s < MSM_N_STREAMS; s++) free(cb->scratch[s]);
    free(cb->arena);
    free(cb->ev_epoch);
    free(cb->q);
    pthread_mutex_destroy(&cb->mu);
    pthread_cond_destroy(&cb->cv);
    free(cb);
}

/* Test-only (msm_engine_opts.test_fault): LAUNCH fails the step at once; HANG queues aux work that
 * sleeps past the deadline, so the step's waits on the aux stream time out, as a GPU kernel that
 * never finishes would make the CUDA backend's. */
static int cpu_test_fault(msm_backend *b, int kind, msm_err *err) {
    cpu_backend *cb = (cpu_backend *)b;
    if (kind != MSM_TEST_FAULT_HANG)
        return msm_err_set(err, -EIO, "rank %d: injected fault: a kernel launch failed (test-only)", cb->b.rank);
    return push(cb, (item){.kind = ITEM_SLEEP, .event = cb->b.deadline_ms + 200}, err);
}

static const msm_backend_vt cpu_vt = {
    .name = "cpu", .free = cpu_free, .alloc_weights = cpu_alloc_weights,
    .dummy_weight = cpu_dummy_weight, .chan_open = cpu_chan_open, .chan_slot = cpu_chan_slot,
    .chan_put = cpu_chan_put, .chan_close = cpu_chan_close, .prepare = cpu_prepare,
    .write = cpu_write, .read = cpu_read, .begin = cpu_begin, .run = cpu_run,
    .record = cpu_record, .wait = cpu_wait, .sync = cpu_sync, .test_fault = cpu_test_fault,
};

int msm_backend_cpu_new(msm_comm *comm, int rank, int deadline_ms, const msm_backend_cpu_opts *o,
                        msm_backend **ret, msm_err *err) {
    cpu_backend *cb = calloc(1, sizeof *cb);
    if (!cb) return msm_err_set(err, -ENOMEM, "out of memory for the cpu backend");
    if (o) {
        cb->kv_bf16 = o->kv_bf16;
        cb->fp8_as_bf16 = o->fp8_as_bf16;
        cb->fp8_as_cuda = o->fp8_as_cuda;
    }
    cb->b = (msm_backend){.vt = &cpu_vt, .comm = comm, .rank = rank, .deadline_ms = deadline_ms};
    pthread_mutex_init(&cb->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&cb->cv, &ca);
    pthread_condattr_destroy(&ca);
    *ret = &cb->b;
    return 0;
}

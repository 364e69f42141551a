/* msm_engine: one TP group. One thread per rank owns that rank's backend (its device, streams,
 * weights, arena); the caller's thread posts a step, every rank executes its verified graph, and
 * rank 0's outputs are returned. Start-up: each rank builds its plain graph, applies the passes,
 * plans and verifies, creates its backend and loads its weight shard, the ranks all-gather their
 * collective-sequence hashes (verifier rule V4) through the group's own communicator, and CUDA
 * ranks capture their decode graphs, all before serving. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "msm_backend.h"
#include "msm_comm.h"
#include "msm_engine.h"
#include "msm_graph.h"
#include "msm_pass.h"
#include "msm_safetensors.h"
#include "msm_weights.h"
#ifdef MSM_HAVE_CUDA
#include "msm_cuda_backend.h"

/* Decode batch sizes captured as CUDA graphs when the options name none (msm_engine_opts.buckets;
 * config/msmoed.conf lists the same). */
static const int default_buckets[] = {1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256};
#endif

typedef struct rank_ctx {
    struct msm_engine *e;
    int rank;
    pthread_t thread;
    bool started;
    msm_backend *be;
    msm_graph *plain, *graph;
    msm_graph *graph_1s; /* the same passes but one stream, for steps past multi_stream_max_tokens
                          * (NULL when there is no such limit); shares the arena with graph */
    int r;          /* result of the last command */
    msm_err err;
    msm_load_stats load;           /* this rank's weight load */
    uint64_t load_done, load_total; /* progress, under e->load_mu */
    bool load_planned;
} rank_ctx;

enum { CMD_NONE, CMD_INIT, CMD_STEP, CMD_QUIT };

struct msm_engine {
    msm_engine_opts o;
    msm_model_config cfg;
    msm_kv_pool *kv;
    msm_comm_group *comm;
    msm_safetensors *st;
    rank_ctx *ranks;
    int tp;
    /* command channel */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t cmd_gen; /* written under mu; also read without it by spin_wait */
    _Atomic int n_done;
    int cmd;
    msm_step_dims dims;
    /* host staging of step inputs (rank threads copy these into their arenas) */
    int32_t *tokens, *pos, *seq, *slot, *btab, *out_rows;
    msm_sample_params *sparams;
    int32_t *sampled, *seq_tokens;
    float *logits_dev;  /* [R, vocab_pad] read from rank 0 when read_logits */
    float *logits_out;  /* [rows, vocab] returned */
    size_t logits_dev_cap, logits_out_cap; /* floats; the buffers only grow (no per-step malloc) */
    bool read_logits;   /* this step returns logits */
    int *row_of_seq;    /* last output row of each seq */
    int max_blocks;
    unsigned char nccl_id[128];
    int buckets[MSM_MAX_BUCKETS], n_buckets; /* decode buckets captured as CUDA graphs */
    int replay_bucket;  /* this step replays the graph of this bucket (0: eager) */
    uint64_t n_steps;   /* steps posted (1 = the first after start-up) */
    bool faulted;       /* a step failed in execution: no step runs again */
    msm_err fault;      /* why */
    /* weight-load progress over every rank (opts.load_progress) */
    pthread_mutex_t load_mu;
    double load_t0, load_last_s;
    int load_last_permille;        /* of the last report; -1 before the first */
    bool load_reported_end;
    msm_load_summary summary;
};

void msm_engine_opts_default(msm_engine_opts *o) {
    memset(o, 0, sizeof *o);
    o->backend = MSM_BACKEND_CPU;
    o->tp = 1;
    o->multi_stream = true;
    o->multi_stream_max_tokens = MSM_MULTI_STREAM_MAX_TOKENS;
    o->fuse_allreduce = true;
    o->elide_collectives = true;
    o->fuse_add_norm = true;
    o->fuse_moe_combine = true;
    o->fuse_rope_kv = true;
    o->fuse_allreduce_norm = true;
    o->fuse_router = true;
    o->fuse_linear_norm = false; /* bitwise on the H200 but no faster (bench/results/2026-12-01-h200-attn) */
    o->router_first = true; /* bench/results/2026-12-03-h200-s6 run 2: Qwen1.5-MoE batch 1-16 -0.01..0.02 ms */
    o->prefetch_kv = true;  /* bench/results/2026-12-07-h200-s35 run 2: Qwen3-30B-A3B 1 / 2 tokens -0.06 / -0.05 ms */
    o->kv_blocks = 1024;
    o->max_step_tokens = 512;
    o->max_seqs = 64;
    o->deadline_ms = 30000;
    o->cuda_graphs = true;
    o->test_skew_rank = -1;
    o->test_diverge_rank = -1;
}

static int write_inputs(rank_ctx *rc, const msm_graph *g);

/* The graph a step of T tokens runs: the one-stream graph past the multi-stream token limit. */
static const msm_graph *graph_for(const rank_ctx *rc, int T) {
    int lim = rc->e->o.multi_stream_max_tokens;
    return rc->graph_1s && lim > 0 && T > lim ? rc->graph_1s : rc->graph;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A rank's loader reports (from its reader threads); the engine sums every rank and passes a
 * report on when the permille moved on and 0.1 s went by, and always the first and the last. */
static void rank_load_progress(void *ctx, uint64_t done, uint64_t total) {
    rank_ctx *rc = ctx;
    msm_engine *e = rc->e;
    pthread_mutex_lock(&e->load_mu);
    if (done > rc->load_done) rc->load_done = done;
    rc->load_total = total;
    rc->load_planned = true;
    msm_load_progress p = {0};
    bool complete = true;
    double frac = 0;
    for (int q = 0; q < e->tp; q++) {
        const rank_ctx *o = &e->ranks[q];
        p.done_bytes += o->load_done;
        p.total_bytes += o->load_total;
        frac += !o->load_planned ? 0.0 : o->load_total ? (double)o->load_done / (double)o->load_total : 1.0;
        complete &= o->load_planned && o->load_done == o->load_total;
    }
    double now = now_s();
    if (e->load_last_permille < 0) e->load_t0 = now;
    p.fraction = complete ? 1.0 : frac / e->tp;
    p.seconds = now - e->load_t0;
    int permille = (int)(p.fraction * 1000.0);
    bool due = e->load_last_permille < 0 || (complete && !e->load_reported_end) ||
               (permille > e->load_last_permille && now - e->load_last_s >= 0.1 && !complete);
    if (due && e->o.load_progress) {
        e->load_last_permille = permille;
        e->load_last_s = now;
        e->load_reported_end |= complete;
        e->o.load_progress(e->o.load_progress_ctx, &p);
    } else if (e->load_last_permille < 0) {
        e->load_last_permille = 0;
    }
    pthread_mutex_unlock(&e->load_mu);
}

int msm_load_progress_format(char *buf, size_t cap, const msm_load_progress *p, int bar_width) {
    char bar[128] = "";
    if (bar_width > 0) {
        int w = bar_width > 100 ? 100 : bar_width, fill = (int)(p->fraction * w + 1e-9);
        bar[0] = '[';
        for (int i = 0; i < w; i++) bar[1 + i] = i < fill ? '#' : '-';
        bar[w + 1] = ']';
        bar[w + 2] = ' ';
        bar[w + 3] = 0;
    }
    double gbps = p->seconds > 0 ? (double)p->done_bytes / 1e9 / p->seconds : 0.0;
    int prec = p->total_bytes < 10000000000ull ? 2 : 1; /* 0.63 GB, 27.1 GB */
    return snprintf(buf, cap, "%s%3d%%  %.*f of %.*f GB  %.1f GB/s", bar, (int)(p->fraction * 100.0 + 1e-9), prec,
                    (double)p->done_bytes / 1e9, prec, (double)p->total_bytes / 1e9, gbps);
}

/* Reader threads per rank when the options name none: the online CPUs shared by the ranks,
 * 1 to 8 each (past 8, reads from the page cache stop getting faster). */
static int load_threads(const msm_engine *e) {
    if (e->o.load_threads > 0) return e->o.load_threads;
    long n = sysconf(_SC_NPROCESSORS_ONLN) / e->tp;
    return n < 1 ? 1 : n > 8 ? 8 : (int)n;
}

/* Decode CUDA graphs: for each bucket B, one eager warm-up step of B padded rows (it also runs
 * NCCL's first collectives outside any capture), then a capture of the same issue sequence.
 * Padded rows read and write only the reserved KV block 0. */
static int rank_capture(rank_ctx *rc) {
    msm_engine *e = rc->e;
    msm_backend *b = rc->be;
    if (!b->vt->capture_begin || e->n_buckets == 0) return 0;
    for (int i = 0; i < e->n_buckets; i++) {
        int B = e->buckets[i];
        /* the inputs are written by whoever posts the command; here every rank writes the
         * same padding itself (the step channel is idle during init) */
        msm_step_dims d = {.T = B, .R = B, .S = B};
        const msm_graph *g = graph_for(rc, B);
        int r = write_inputs(rc, g);
        if (r == 0) r = msm_exec_step(b, g, &d, &rc->err);
        if (r == 0) r = b->vt->capture_begin(b, &rc->err);
        if (r == 0) {
            r = msm_exec_issue(b, g, &d, &rc->err);
            int r2 = b->vt->capture_end(b, B, r ? NULL : &rc->err);
            if (r == 0) r = r2;
        }
        if (r) return msm_err_wrap(&rc->err, r, "capturing the decode graph of batch bucket %d", B);
    }
    return 0;
}

/* Rank `rank`'s graphs: the plain one built, then the passes (and the verifier) applied; the
 * one-stream variant too when the options ask for it. Shared by the load and msm_engine_validate. */
static int rank_graphs(const msm_engine_opts *o, const msm_model_config *cfg, int max_blocks, int rank,
                       msm_graph **ret_plain, msm_graph **ret_graph, msm_graph **ret_graph_1s, msm_err *err) {
    msm_build_opts bo = {.max_T = o->max_step_tokens, .max_S = o->max_seqs, .max_blocks = max_blocks};
    int r = msm_graph_build(cfg, rank, o->tp, &bo, ret_plain, err);
    if (r) return r;
    msm_pass_opts po = {.fuse_allreduce = o->fuse_allreduce, .multi_stream = o->multi_stream,
                        .elide_collectives = o->elide_collectives,
                        .fuse_add_norm = o->fuse_add_norm,
                        .fuse_moe_combine = o->fuse_moe_combine,
                        .fuse_rope_kv = o->fuse_rope_kv,
                        .fuse_allreduce_norm = o->fuse_allreduce_norm,
                        .fuse_router = o->fuse_router,
                        .fuse_linear_norm = o->fuse_linear_norm,
                        .router_first = o->router_first,
                        .router_alone = o->router_alone,
                        .fork_before_norm = o->fork_before_norm,
                        .prefetch_l2 = o->prefetch_l2 || o->prefetch_l2_next,
                        .prefetch_l2_next = o->prefetch_l2_next,
                        .prefetch_kv = o->prefetch_kv,
                        .test_buggy_placement = o->test_buggy_placement,
                        .test_skip_verify = o->test_skip_verify};
    if (rank == o->test_diverge_rank) po.fuse_allreduce = !po.fuse_allreduce; /* test-only: V4 */
    r = msm_passes_apply(*ret_plain, &po, ret_graph, err);
    if (r) return r;
    if (o->multi_stream && o->multi_stream_max_tokens > 0 && o->multi_stream_max_tokens < o->max_step_tokens) {
        po.multi_stream = false;
        r = msm_passes_apply(*ret_plain, &po, ret_graph_1s, err);
        if (r) return r;
        /* one arena serves both: the backend allocates the larger plan (the step inputs sit at
         * each graph's own offsets, written before each step) */
        size_t a = (*ret_graph)->arena_bytes, b1 = (*ret_graph_1s)->arena_bytes;
        (*ret_graph)->arena_bytes = (*ret_graph_1s)->arena_bytes = a > b1 ? a : b1;
        if (msm_graph_collective_hash(*ret_graph) != msm_graph_collective_hash(*ret_graph_1s))
            return msm_err_set(err, -EPROTO, "graph verify: the one-stream graph's collective "
                                             "sequence differs from the multi-stream graph's");
    }
    return 0;
}

static int rank_init(rank_ctx *rc) {
    msm_engine *e = rc->e;
    msm_err *err = &rc->err;
    int r = rank_graphs(&e->o, &e->cfg, e->max_blocks, rc->rank, &rc->plain, &rc->graph, &rc->graph_1s, err);
    if (r) return r;
    if (e->o.backend == MSM_BACKEND_CUDA) {
#ifdef MSM_HAVE_CUDA
        r = msm_backend_cuda_new(e->o.first_device + rc->rank, rc->rank, e->tp, e->nccl_id,
                                 e->o.deadline_ms, &rc->be, err);
#else
        r = msm_err_set(err, -ENOTSUP, "this build has no CUDA backend (built with -Dcuda=disabled)");
#endif
    } else {
        msm_backend_cpu_opts co = {.kv_bf16 = e->o.kv_bf16, .fp8_as_bf16 = e->o.fp8_as_bf16,
                                   .fp8_as_cuda = e->o.fp8_as_cuda};
        r = msm_backend_cpu_new(msm_comm_group_rank(e->comm, rc->rank), rc->rank, e->o.deadline_ms, &co,
                                &rc->be, err);
    }
    if (r) return r;
    if (e->o.test_skew_us > 0) {
        /* test-only: alternate ranks delay different streams, so misplaced collectives are
         * issued in different orders on different ranks */
        rc->be->skew_us = e->o.test_skew_us;
        rc->be->skew_stream = rc->rank % 2 ? MSM_STREAM_MAIN : MSM_STREAM_AUX;
    }
    r = rc->be->vt->prepare(rc->be, rc->graph, e->o.kv_blocks, err);
    if (r) return r;
    /* CUDA: 3 pinned slots of 8 MiB per reader, so copies overlap reads; CPU: one slot of 1 MiB,
     * converted while it is still in the core's cache */
    bool cuda = e->o.backend == MSM_BACKEND_CUDA;
    size_t slot = e->o.load_slot_bytes ? e->o.load_slot_bytes : cuda ? 8u << 20 : 1u << 20;
    msm_load_opts lo = {.threads = load_threads(e), .slot_bytes = slot, .slots = cuda ? 3 : 1,
                        .progress = rank_load_progress, .ctx = rc};
    r = e->st ? msm_weights_load(rc->plain, e->st, rc->be, &lo, &rc->load, err)
              : msm_weights_dummy(rc->plain, e->o.dummy_seed, rc->be, err);
    if (r) return r;
    /* V4: every rank must issue the same collective sequence */
    uint64_t h = msm_graph_collective_hash(rc->graph), *all = calloc((size_t)e->tp, sizeof *all);
    if (!all) return msm_err_set(err, -ENOMEM, "out of memory");
    r = msm_comm_allgather(msm_comm_group_rank(e->comm, rc->rank), &h, all, 1, sizeof h, err);
    for (int q = 0; r == 0 && q < e->tp; q++)
        if (all[q] != h)
            r = msm_err_set(err, -EPROTO, "graph verify V4: rank %d's collective sequence hash "
                                          "%016llx differs from rank %d's %016llx; refusing to serve",
                            rc->rank, (unsigned long long)h, q, (unsigned long long)all[q]);
    free(all);
    if (r == 0) r = rank_capture(rc);
    return r;
}

static int write_inputs(rank_ctx *rc, const msm_graph *g) {
    msm_engine *e = rc->e;
    msm_backend *b = rc->be;
    msm_err *err = &rc->err;
    const msm_step_dims *d = &e->dims;
    struct { int v; const void *src; size_t bytes; } in[] = {
        {g->v_tokens, e->tokens, sizeof(int32_t) * (size_t)d->T},
        {g->v_pos, e->pos, sizeof(int32_t) * (size_t)d->T},
        {g->v_seq, e->seq, sizeof(int32_t) * (size_t)d->T},
        {g->v_slot, e->slot, sizeof(int32_t) * (size_t)d->T},
        {g->v_btab, e->btab, sizeof(int32_t) * (size_t)d->S * (size_t)e->max_blocks},
        {g->v_out_rows, e->out_rows, sizeof(int32_t) * (size_t)d->R},
        {g->v_sparams, e->sparams, sizeof(msm_sample_params) * (size_t)d->R},
    };
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        int r = b->vt->write(b, g->vals[in[i].v].offset, in[i].src, in[i].bytes, err);
        if (r) return r;
    }
    return 0;
}

static int rank_step(rank_ctx *rc) {
    msm_engine *e = rc->e;
    msm_backend *b = rc->be;
    msm_err *err = &rc->err;
    const msm_step_dims *d = &e->dims;
    const msm_graph *g = graph_for(rc, d->T);
    int r = write_inputs(rc, g);
    if (r) return r;
    if (e->o.test_fault && rc->rank == 0 && e->n_steps >= (uint64_t)e->o.test_fault_step) {
        /* test-only: a real failing launch, or a real kernel (CPU: aux work) that overruns the
         * deadline; the step's own work follows and its sync reports the overrun */
        r = b->vt->test_fault ? b->vt->test_fault(b, e->o.test_fault, err)
                              : msm_err_set(err, -ENOTSUP, "backend %s has no fault injection", b->vt->name);
        if (r) return r;
    }
    if (e->replay_bucket > 0) {
        r = b->vt->replay(b, e->replay_bucket, err); /* launched: rank 0's read below waits */
        if (r == 0 && rc->rank != 0) r = b->vt->sync(b, err);
    } else {
        r = msm_exec_step(b, g, d, err);
    }
    if (r || rc->rank != 0) return r;
    r = b->vt->read(b, g->vals[g->v_sampled].offset, e->sampled, sizeof(int32_t) * (size_t)d->R, err);
    if (r == 0 && e->read_logits)
        r = b->vt->read(b, g->vals[g->v_logits].offset, e->logits_dev,
                        sizeof(float) * (size_t)d->R * (size_t)g->vocab_pad, err);
    return r;
}

/* The command channel's hand-offs on a GPU: before blocking on the condition variable, a rank
 * thread polls for the next command for RANK_SPIN_NS after each one, and the poster polls for the
 * ranks' completion for POST_SPIN_NS (a decode step's length), yielding the core between polls: a
 * futex wake-up costs a decode step 5-20 us each way. The CPU backend's ranks compute on the
 * cores themselves and always block. */
#define RANK_SPIN_NS 2000000LL
#define POST_SPIN_NS 20000000LL

static long long now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* Polls until *gen != v (gen set) or n_done >= v (gen NULL), at most limit_ns; CUDA only. */
static void spin_wait(msm_engine *e, _Atomic uint64_t *gen, uint64_t v, long long limit_ns) {
    if (e->o.backend != MSM_BACKEND_CUDA) return;
    long long t0 = now_ns();
    for (unsigned i = 1;; i++) {
        if (gen ? atomic_load(gen) != v : (uint64_t)atomic_load(&e->n_done) >= v) return;
        if (i % 64 == 0 && now_ns() - t0 > limit_ns) return;
        sched_yield();
    }
}

static void *rank_main(void *arg) {
    rank_ctx *rc = arg;
    msm_engine *e = rc->e;
    uint64_t seen = 0;
    for (;;) {
        spin_wait(e, &e->cmd_gen, seen, RANK_SPIN_NS);
        pthread_mutex_lock(&e->mu);
        while (e->cmd_gen == seen) pthread_cond_wait(&e->cv, &e->mu);
        seen = e->cmd_gen;
        int cmd = e->cmd;
        pthread_mutex_unlock(&e->mu);
        if (cmd == CMD_QUIT) break;
        rc->r = cmd == CMD_INIT ? rank_init(rc) : rank_step(rc);
        pthread_mutex_lock(&e->mu);
        e->n_done++;
        pthread_cond_broadcast(&e->cv);
        pthread_mutex_unlock(&e->mu);
    }
    return NULL;
}

/* Posts a command to every rank and waits for all; returns the first failure. */
static int run_cmd(msm_engine *e, int cmd, msm_err *err) {
    pthread_mutex_lock(&e->mu);
    e->cmd = cmd;
    e->n_done = 0;
    e->cmd_gen++;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    spin_wait(e, NULL, (uint64_t)e->tp, POST_SPIN_NS);
    pthread_mutex_lock(&e->mu);
    while (e->n_done < e->tp) pthread_cond_wait(&e->cv, &e->mu);
    pthread_mutex_unlock(&e->mu);
    /* report the root cause: a rank's own failure before another rank's time-out */
    int r = 0, best = -1;
    for (int q = 0; q < e->tp; q++) {
        if (!e->ranks[q].r) continue;
        if (best < 0 || (e->ranks[best].r == -ETIMEDOUT && e->ranks[q].r != -ETIMEDOUT)) best = q;
    }
    if (best >= 0) {
        r = e->ranks[best].r;
        if (err) *err = e->ranks[best].err;
    }
    return r;
}

/* The model's config (and, for a checkpoint, its safetensors headers: *ret_st), the options
 * checked against it, and the context the engine serves: o->max_context, at most the model's
 * max_position_embeddings (0: that, at most 32768). Shared by the load and msm_engine_validate. */
static int open_model(const msm_engine_opts *o, msm_model_config *cfg, msm_safetensors **ret_st,
                      int *ret_max_context, msm_err *err) {
    int r;
    if (o->model_dir) {
        r = msm_model_config_load(o->model_dir, cfg, err);
        if (r == 0) r = msm_safetensors_open_dir(o->model_dir, ret_st, err);
    } else if (o->dummy_preset) {
        r = msm_model_config_load(o->dummy_preset, cfg, err);
    } else {
        r = msm_err_set(err, -EINVAL, "no model: give a model directory or a dummy-weights preset");
    }
    if (r) return r;
    if (o->tp < 1 || o->tp > 64) return msm_err_set(err, -EINVAL, "tp must be between 1 and 64, got %d", o->tp);
    if (o->max_step_tokens < 1 || o->max_seqs < 1 || o->kv_blocks < 2 || o->deadline_ms < 1)
        return msm_err_set(err, -EINVAL, "engine limits must be positive (max_step_tokens %d, max_seqs "
                                         "%d, kv_blocks %d)", o->max_step_tokens, o->max_seqs, o->kv_blocks);
    if (cfg->max_position < 2)
        return msm_err_set(err, -EINVAL, "%s%s: max_position_embeddings = %d: a sequence needs at least 2 "
                                         "positions (a prompt token and a generated one)",
                           o->model_dir ? o->model_dir : o->dummy_preset, o->model_dir ? "/config.json" : "",
                           cfg->max_position);
    int ctx = o->max_context;
    if (ctx <= 0 || ctx > cfg->max_position) ctx = cfg->max_position < 32768 ? cfg->max_position : 32768;
    if (ctx < 2)
        return msm_err_set(err, -EINVAL, "max_context = %d: a sequence needs at least 2 tokens", ctx);
    *ret_max_context = ctx;
    return 0;
}

int msm_engine_validate(const msm_engine_opts *o, msm_model_config *ret_cfg, int *ret_max_context, msm_err *err) {
    msm_model_config cfg;
    msm_safetensors *st = NULL;
    int ctx = 0, r = open_model(o, &cfg, &st, &ctx, err);
    for (int q = 0; r == 0 && q < o->tp; q++) {
        msm_graph *plain = NULL, *graph = NULL, *graph_1s = NULL;
        r = rank_graphs(o, &cfg, msm_kv_blocks_for(ctx), q, &plain, &graph, &graph_1s, err);
        if (r == 0 && st) r = msm_weights_check(plain, st, err);
        msm_graph_free(graph);
        msm_graph_free(graph_1s);
        msm_graph_free(plain);
    }
    msm_safetensors_free(st);
    if (r) return r;
    *ret_cfg = cfg;
    *ret_max_context = ctx;
    return 0;
}

int msm_engine_new(const msm_engine_opts *o, msm_engine **ret, msm_err *err) {
    msm_engine *e = calloc(1, sizeof *e);
    if (!e) return msm_err_set(err, -ENOMEM, "out of memory");
    double t0 = now_s();
    e->o = *o;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    pthread_mutex_init(&e->load_mu, NULL);
    e->load_last_permille = -1;
    int r = open_model(o, &e->cfg, &e->st, &e->o.max_context, err);
    if (r) goto fail;
    e->max_blocks = msm_kv_blocks_for(e->o.max_context);
    e->tp = o->tp;
    int T = e->o.max_step_tokens, S = e->o.max_seqs;
    e->tokens = calloc((size_t)T, sizeof(int32_t));
    e->pos = calloc((size_t)T, sizeof(int32_t));
    e->seq = calloc((size_t)T, sizeof(int32_t));
    e->slot = calloc((size_t)T, sizeof(int32_t));
    e->out_rows = calloc((size_t)T, sizeof(int32_t));
    e->sampled = calloc((size_t)T, sizeof(int32_t));
    e->row_of_seq = calloc((size_t)S, sizeof(int));
    e->seq_tokens = calloc((size_t)S, sizeof(int32_t));
    e->btab = calloc((size_t)S * (size_t)e->max_blocks, sizeof(int32_t));
    e->sparams = calloc((size_t)T, sizeof(msm_sample_params));
    e->ranks = calloc((size_t)e->tp, sizeof *e->ranks);
    if (!e->tokens || !e->pos || !e->seq || !e->slot || !e->out_rows || !e->sampled ||
        !e->row_of_seq || !e->seq_tokens || !e->btab || !e->sparams || !e->ranks) {
        r = msm_err_set(err, -ENOMEM, "out of memory");
        goto fail;
    }
    if (o->backend == MSM_BACKEND_CUDA) {
#ifdef MSM_HAVE_CUDA
        int ndev = msm_cuda_device_count();
        if (ndev < o->first_device + o->tp) {
            r = msm_err_set(err, -ENODEV, "the CUDA backend needs GPUs %d..%d but %d GPU(s) are visible",
                            o->first_device, o->first_device + o->tp - 1, ndev);
            goto fail;
        }
        r = msm_cuda_nccl_unique_id(e->nccl_id, err);
        if (r) goto fail;
        if (o->cuda_graphs) {
            const int *bl = o->n_buckets ? o->buckets : default_buckets;
            int nb = o->n_buckets ? o->n_buckets : (int)(sizeof default_buckets / sizeof default_buckets[0]);
            for (int i = 0; i < nb && e->n_buckets < MSM_MAX_BUCKETS; i++)
                if (bl[i] >= 1 && bl[i] <= o->max_seqs && bl[i] <= o->max_step_tokens &&
                    (e->n_buckets == 0 || bl[i] > e->buckets[e->n_buckets - 1]))
                    e->buckets[e->n_buckets++] = bl[i];
        }
#else
        r = msm_err_set(err, -ENOTSUP, "this build has no CUDA backend (built with -Dcuda=disabled)");
        goto fail;
#endif
    }
    r = msm_kv_pool_new(o->kv_blocks, &e->kv);
    if (r == 0) r = msm_comm_group_new(e->tp, o->deadline_ms, &e->comm);
    if (r) {
        msm_err_set(err, r, "cannot create the KV pool or the host communicator");
        goto fail;
    }
    for (int q = 0; q < e->tp; q++) {
        e->ranks[q].e = e;
        e->ranks[q].rank = q;
        if (pthread_create(&e->ranks[q].thread, NULL, rank_main, &e->ranks[q]) != 0) {
            r = msm_err_set(err, -EAGAIN, "cannot start rank thread %d", q);
            goto fail;
        }
        e->ranks[q].started = true;
    }
    /* padding inputs for the capture warm-ups: every row on the reserved block 0 */
    if (e->n_buckets) {
        int B = e->buckets[e->n_buckets - 1];
        for (int i = 0; i < B; i++) {
            e->tokens[i] = e->pos[i] = e->slot[i] = 0;
            e->seq[i] = e->out_rows[i] = i;
            memset(&e->sparams[i], 0, sizeof e->sparams[i]);
        }
        e->dims = (msm_step_dims){.T = B, .R = B, .S = B};
    }
    r = run_cmd(e, CMD_INIT, err);
    if (r) goto fail;
    msm_load_summary *sm = &e->summary;
    for (int q = 0; q < e->tp; q++) {
        const msm_load_stats *ls = &e->ranks[q].load;
        sm->bytes_read += ls->bytes_read;
        sm->staging_bytes += ls->staging_bytes;
        if (ls->seconds > sm->load_s) sm->load_s = ls->seconds;
        if (ls->threads > sm->threads) sm->threads = ls->threads;
        if (e->ranks[q].be) {
            sm->weight_bytes += e->ranks[q].be->weight_bytes;
            sm->weight_bytes_fp8 += e->ranks[q].be->weight_bytes_fp8;
        }
    }
    struct rusage ru;
    if (getrusage(RUSAGE_SELF, &ru) == 0) sm->peak_rss_bytes = (uint64_t)ru.ru_maxrss * 1024u;
    sm->start_s = now_s() - t0;
    *ret = e;
    return 0;
fail:
    msm_engine_free(e);
    return r;
}

void msm_engine_free(msm_engine *e) {
    if (!e) return;
    if (e->ranks) {
        bool any = false;
        for (int q = 0; q < e->tp; q++) any |= e->ranks[q].started;
        if (any) {
            pthread_mutex_lock(&e->mu);
            e->cmd = CMD_QUIT;
            e->cmd_gen++;
            pthread_cond_broadcast(&e->cv);
            pthread_mutex_unlock(&e->mu);
        }
        for (int q = 0; q < e->tp; q++) {
            rank_ctx *rc = &e->ranks[q];
            if (rc->started) pthread_join(rc->thread, NULL);
            msm_backend_free(rc->be);
            msm_graph_free(rc->graph);
            msm_graph_free(rc->graph_1s);
            msm_graph_free(rc->plain);
        }
    }
    free(e->ranks);
    msm_comm_group_free(e->comm);
    msm_kv_pool_free(e->kv);
    msm_safetensors_free(e->st);
    free(e->tokens);
    free(e->pos);
    free(e->seq);
    free(e->slot);
    free(e->out_rows);
    free(e->sampled);
    free(e->row_of_seq);
    free(e->seq_tokens);
    free(e->btab);
    free(e->sparams);
    free(e->logits_dev);
    free(e->logits_out);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    pthread_mutex_destroy(&e->load_mu);
    free(e);
}

const msm_model_config *msm_engine_model(const msm_engine *e) { return &e->cfg; }
const msm_load_summary *msm_engine_load_summary(const msm_engine *e) { return &e->summary; }
const msm_engine_opts *msm_engine_options(const msm_engine *e) { return &e->o; }
const char *msm_engine_backend_name(const msm_engine *e) {
    return e->o.backend == MSM_BACKEND_CUDA ? "cuda" : "cpu";
}
msm_kv_pool *msm_engine_kv(msm_engine *e) { return e->kv; }

/* ---- a step, in phases: check, flatten, pick a captured graph, reserve logits, run, collect - */

/* Output rows (sampled rows) a sequence takes in the step: its last sampled_rows(q) tokens. */
static int sampled_rows(const msm_step_seq *q) {
    return q->output == MSM_STEP_OUTPUT_ALL_LOGITS ? q->n_tokens : q->output == MSM_STEP_OUTPUT_SAMPLE ? 1 : 0;
}

/* Logits rows returned to the caller for a sequence: the last of its sampled rows. */
static int returned_rows(const msm_step_seq *q) {
    if (q->output == MSM_STEP_OUTPUT_ALL_LOGITS) return q->n_tokens;
    return q->output == MSM_STEP_OUTPUT_SAMPLE && q->want_logits ? 1 : 0;
}

/* Checks sequence s of a step against the model, the context limit and the block pool. */
static int check_seq(const msm_engine *e, const msm_step_seq *q, int s, msm_err *err) {
    int total_blocks = msm_kv_pool_total(e->kv) + 1;
    if (q->n_tokens < 1 || !q->tokens)
        return msm_err_set(err, -EINVAL, "sequence %d of the step has no tokens", s);
    if (q->pos0 < 0 || q->pos0 + q->n_tokens > e->o.max_context)
        return msm_err_set(err, -EINVAL, "sequence %d: positions %d..%d exceed the context limit %d",
                           s, q->pos0, q->pos0 + q->n_tokens - 1, e->o.max_context);
    if (q->output != MSM_STEP_OUTPUT_NONE && q->output != MSM_STEP_OUTPUT_SAMPLE &&
        q->output != MSM_STEP_OUTPUT_ALL_LOGITS)
        return msm_err_set(err, -EINVAL, "sequence %d: output %d is not NONE, SAMPLE or ALL_LOGITS",
                           s, (int)q->output);
    int need = msm_kv_blocks_for(q->pos0 + q->n_tokens);
    if (q->n_blocks < need || q->n_blocks > e->max_blocks || !q->blocks)
        return msm_err_set(err, -EINVAL, "sequence %d: needs %d KV blocks for %d tokens, got %d (max %d)",
                           s, need, q->pos0 + q->n_tokens, q->n_blocks, e->max_blocks);
    for (int b = 0; b < need; b++)
        if (q->blocks[b] < 1 || q->blocks[b] >= total_blocks)
            return msm_err_set(err, -EINVAL, "sequence %d: KV block id %d out of range 1..%d", s,
                               q->blocks[b], total_blocks - 1);
    for (int t = 0; t < q->n_tokens; t++)
        if (q->tokens[t] < 0 || q->tokens[t] >= e->cfg.vocab)
            return msm_err_set(err, -EINVAL, "sequence %d: token id %d at index %d is outside the "
                                             "vocabulary (0..%d)", s, q->tokens[t], t, e->cfg.vocab - 1);
    return 0;
}

/* Writes the step's inputs, token-major, into the host staging arrays: tokens, positions,
 * sequence ids, KV slots, block tables, and the output rows with their sampling parameters.
 * Returns R, the output rows: at least one (a dummy row when nothing is sampled, since the step
 * still runs to write the KV cache). */
static int flatten_inputs(msm_engine *e, const msm_step_seq *seqs, int n_seqs) {
    int t = 0, row = 0;
    for (int s = 0; s < n_seqs; s++) {
        const msm_step_seq *q = &seqs[s];
        memset(e->btab + (size_t)s * e->max_blocks, 0, sizeof(int32_t) * (size_t)e->max_blocks);
        memcpy(e->btab + (size_t)s * e->max_blocks, q->blocks,
               sizeof(int32_t) * (size_t)msm_kv_blocks_for(q->pos0 + q->n_tokens));
        e->row_of_seq[s] = -1;
        for (int i = 0; i < q->n_tokens; i++, t++) {
            int p = q->pos0 + i;
            e->tokens[t] = q->tokens[i];
            e->pos[t] = p;
            e->seq[t] = s;
            e->slot[t] = q->blocks[p / MSM_KV_BLOCK] * MSM_KV_BLOCK + p % MSM_KV_BLOCK;
            if (i >= q->n_tokens - sampled_rows(q)) {
                e->out_rows[row] = t;
                e->sparams[row] = q->sampling;
                e->row_of_seq[s] = row;
                row++;
            }
        }
    }
    if (row == 0) {
        e->out_rows[0] = 0;
        memset(&e->sparams[0], 0, sizeof e->sparams[0]);
        row = 1;
    }
    return row;
}

/* A decode-only step (one token sampled per sequence) within the captured buckets replays the
 * smallest bucket that holds it: rows n_seqs..B-1 are padding on the reserved KV block 0, and T
 * and R become B. Sets e->replay_bucket (0: run eagerly). */
static void pick_replay_bucket(msm_engine *e, const msm_step_seq *seqs, int n_seqs, int *T, int *R) {
    e->replay_bucket = 0;
    bool decode = true;
    for (int s = 0; s < n_seqs; s++)
        decode &= seqs[s].n_tokens == 1 && seqs[s].output == MSM_STEP_OUTPUT_SAMPLE;
    for (int i = 0; decode && i < e->n_buckets; i++)
        if (e->buckets[i] >= n_seqs) {
            int B = e->buckets[i];
            for (int p = n_seqs; p < B; p++) {
                e->tokens[p] = e->pos[p] = e->slot[p] = 0;
                e->seq[p] = e->out_rows[p] = p;
                memset(&e->sparams[p], 0, sizeof e->sparams[p]);
                memset(e->btab + (size_t)p * e->max_blocks, 0, sizeof(int32_t) * (size_t)e->max_blocks);
            }
            *T = *R = B;
            e->replay_bucket = B;
            return;
        }
}

/* Grows the logits buffers (they never shrink, so steady state allocates nothing): R rows of
 * vocab_pad read from rank 0, want_rows rows of vocab returned. */
static int reserve_logits(msm_engine *e, int R, int want_rows, int vpad, msm_err *err) {
    size_t need_dev = (size_t)R * (size_t)vpad, need_out = (size_t)(want_rows ? want_rows : 1) * (size_t)e->cfg.vocab;
    if (need_dev > e->logits_dev_cap) {
        float *d = realloc(e->logits_dev, sizeof(float) * need_dev);
        if (!d) return msm_err_set(err, -ENOMEM, "out of memory for logits");
        e->logits_dev = d;
        e->logits_dev_cap = need_dev;
    }
    if (need_out > e->logits_out_cap) {
        float *o = realloc(e->logits_out, sizeof(float) * need_out);
        if (!o) return msm_err_set(err, -ENOMEM, "out of memory for logits");
        e->logits_out = o;
        e->logits_out_cap = need_out;
    }
    return 0;
}

/* After the step: each sequence's sampled token (-1 for OUTPUT_NONE) and, when logits were read,
 * its returned rows, in sequence order, cut from vocab_pad to vocab columns. */
static void collect_outputs(msm_engine *e, const msm_step_seq *seqs, int n_seqs, bool logits, int vpad) {
    int vocab = e->cfg.vocab, orow = 0;
    for (int s = 0; s < n_seqs; s++) {
        const msm_step_seq *q = &seqs[s];
        e->seq_tokens[s] = q->output != MSM_STEP_OUTPUT_NONE ? e->sampled[e->row_of_seq[s]] : -1;
        if (!logits) continue;
        int n = returned_rows(q), first = e->row_of_seq[s] - n + 1; /* its last n output rows */
        for (int i = 0; i < n; i++, orow++)
            memcpy(e->logits_out + (size_t)orow * vocab, e->logits_dev + (size_t)(first + i) * vpad,
                   sizeof(float) * (size_t)vocab);
    }
}

int msm_engine_step(msm_engine *e, const msm_step_seq *seqs, int n_seqs, msm_step_out *ret,
                    msm_err *err) {
    if (e->faulted) {
        if (err) *err = e->fault;
        return -ENOTRECOVERABLE;
    }
    if (n_seqs < 1 || n_seqs > e->o.max_seqs)
        return msm_err_set(err, -EINVAL, "a step carries 1..%d sequences, got %d", e->o.max_seqs, n_seqs);
    int T = 0, want_rows = 0;
    for (int s = 0; s < n_seqs; s++) {
        int r = check_seq(e, &seqs[s], s, err);
        if (r) return r;
        T += seqs[s].n_tokens;
        want_rows += returned_rows(&seqs[s]);
    }
    if (T > e->o.max_step_tokens)
        return msm_err_set(err, -EINVAL, "the step carries %d tokens, more than max_step_tokens %d", T,
                           e->o.max_step_tokens);
    bool logits = want_rows > 0;
    int R = flatten_inputs(e, seqs, n_seqs);
    pick_replay_bucket(e, seqs, n_seqs, &T, &R);
    int vpad = e->ranks[0].graph->vocab_pad;
    e->read_logits = logits;
    if (logits) {
        int r = reserve_logits(e, R, want_rows, vpad, err);
        if (r) return r;
    }
    e->dims = (msm_step_dims){.T = T, .R = R, .S = e->replay_bucket ? e->replay_bucket : n_seqs};
    e->n_steps++;
    msm_err fault = {{0}};
    int r = run_cmd(e, CMD_STEP, &fault);
    if (r) {
        /* the inputs were checked: an execution failure is the device's (or a deadline's), and a
         * device context that faulted, or a communicator a deadline aborted, is not trusted again */
        e->faulted = true;
        msm_err_set(&e->fault, -ENOTRECOVERABLE, "%s (the engine cannot run another step)", fault.msg);
        if (err) *err = e->fault;
        return -ENOTRECOVERABLE;
    }
    collect_outputs(e, seqs, n_seqs, logits, vpad);
    ret->tokens = e->seq_tokens;
    ret->logits = logits ? e->logits_out : NULL;
    ret->n_rows = want_rows;
    return 0;
}

int msm_engine_dump_graph(msm_engine *e, int rank, FILE *out) {
    if (rank < 0 || rank >= e->tp) return -EINVAL;
    msm_graph_dump(e->ranks[rank].graph, out);
    return 0;
}

int msm_engine_device_count(void) {
#ifdef MSM_HAVE_CUDA
    int n = msm_cuda_device_count();
    return n > 0 ? n : 0;
#else
    return -ENOTSUP;
#endif
}

int msm_engine_device_copy_gbps(int device, char *name, size_t name_len, double *ret, msm_err *err) {
#ifdef MSM_HAVE_CUDA
    return msm_cuda_copy_gbps(device, (size_t)1 << 30, name, name_len, ret, err);
#else
    (void)device, (void)name, (void)name_len, (void)ret;
    return msm_err_set(err, -ENOTSUP, "this build has no CUDA backend");
#endif
}

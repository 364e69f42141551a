/* The real engine behind the scheduler's vtable, and config -> engine options. Kept apart from
 * sched.c and config.c so the unit tests link those without the engine. */
#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "msm_config.h"
#include "msm_engine.h"
#include "msm_sched.h"

static int eg_step(void *ctx, const msm_step_seq *seqs, int n_seqs, msm_step_out *ret, msm_err *err) {
    return msm_engine_step(ctx, seqs, n_seqs, ret, err);
}

static int eg_alloc(void *ctx, int n, int32_t *ret_ids) {
    return msm_kv_pool_alloc(msm_engine_kv(ctx), n, ret_ids);
}

static void eg_release(void *ctx, const int32_t *ids, int n) {
    msm_kv_pool_release(msm_engine_kv(ctx), ids, n);
}

static int eg_n_free(void *ctx) {
    return msm_kv_pool_n_free(msm_engine_kv(ctx));
}

static int eg_total(void *ctx) {
    return msm_kv_pool_total(msm_engine_kv(ctx));
}

void msm_sched_engine_from(msm_sched_engine *se, msm_engine *e) {
    const msm_model_config *mc = msm_engine_model(e);
    const msm_engine_opts *o = msm_engine_options(e);
    memset(se, 0, sizeof *se);
    se->ctx = e;
    se->step = eg_step;
    se->kv_alloc = eg_alloc;
    se->kv_release = eg_release;
    se->kv_n_free = eg_n_free;
    se->kv_total = eg_total;
    se->tok = NULL; /* main.c sets the tokenizer, loaded apart from the engine */
    se->vocab = mc->vocab;
    se->max_context = o->max_context > 0 ? o->max_context : mc->max_position;
    se->n_eos = mc->n_eos < MSM_MAX_EOS ? mc->n_eos : MSM_MAX_EOS;
    memcpy(se->eos_ids, mc->eos_ids, (size_t)se->n_eos * sizeof se->eos_ids[0]);
}

void msm_config_engine_opts(const msm_config *c, msm_engine_opts *o) {
    msm_engine_opts_default(o);
    o->dummy_preset = c->dummy_preset[0] ? c->dummy_preset : NULL;
    if (!strcmp(c->backend, "cuda"))
        o->backend = MSM_BACKEND_CUDA;
    else if (!strcmp(c->backend, "cpu"))
        o->backend = MSM_BACKEND_CPU;
    else {
#ifdef MSM_HAVE_CUDA
        o->backend = access("/dev/nvidia0", F_OK) == 0 ? MSM_BACKEND_CUDA : MSM_BACKEND_CPU;
#else
        o->backend = MSM_BACKEND_CPU;
#endif
    }
    o->tp = c->tp;
    o->first_device = 0;
    o->multi_stream = c->multi_stream;
    o->multi_stream_max_tokens = c->multi_stream_max_tokens;
    o->fuse_allreduce = c->fuse_allreduce;
    o->kv_blocks = c->kv_blocks;
    o->max_step_tokens = c->max_step_tokens;
    o->max_seqs = c->max_seqs;
    o->max_context = c->max_context;
    o->deadline_ms = c->deadline_ms;
    o->cuda_graphs = c->cuda_graphs;
    o->n_buckets = c->n_buckets;
    memcpy(o->buckets, c->buckets, sizeof o->buckets);
}

/* msm_generate: one sequence, prefill chunks then decode steps (see msm_generate.h). */
#include "msm_generate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static bool is_eos(const msm_model_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_ids[i] == id) return true;
    return false;
}

int msm_generate(msm_engine *e, const int32_t *prompt, int P, const msm_generate_opts *o,
                 msm_generation *ret, msm_err *err) {
    const msm_model_config *cfg = msm_engine_model(e);
    const msm_engine_opts *eo = msm_engine_options(e);
    memset(ret, 0, sizeof *ret);
    if (P < 1) return msm_err_set(err, -EINVAL, "the prompt is empty");
    if (o->max_new < 1) return msm_err_set(err, -EINVAL, "max_new must be at least 1");
    int ctx = P + o->max_new;
    if (ctx > eo->max_context)
        return msm_err_set(err, -EINVAL, "prompt (%d) + new tokens (%d) exceed the context limit %d",
                           P, o->max_new, eo->max_context);
    int nb = msm_kv_blocks_for(ctx);
    int32_t *blocks = malloc(sizeof(int32_t) * (size_t)nb);
    ret->ids = malloc(sizeof(int32_t) * (size_t)o->max_new);
    if (o->dump_logits) ret->logits = malloc(sizeof(float) * (size_t)ctx * (size_t)cfg->vocab);
    if (!blocks || !ret->ids || (o->dump_logits && !ret->logits)) {
        free(blocks);
        msm_generation_done(ret);
        return msm_err_set(err, -ENOMEM, "out of memory");
    }
    msm_kv_pool *kv = msm_engine_kv(e);
    int r = msm_kv_pool_alloc(kv, nb, blocks);
    if (r < 0) {
        free(blocks);
        msm_generation_done(ret);
        return msm_err_set(err, r, "not enough free KV blocks for %d tokens (%d needed, %d free)",
                           ctx, nb, msm_kv_pool_n_free(kv));
    }
    int chunk = eo->max_step_tokens;
    msm_step_out out;
    for (int p0 = 0; p0 < P && r == 0; p0 += chunk) {
        int n = P - p0 < chunk ? P - p0 : chunk;
        bool last = p0 + n == P;
        msm_step_seq s = {.tokens = prompt + p0, .n_tokens = n, .pos0 = p0, .blocks = blocks,
                          .n_blocks = nb,
                          .output = o->dump_logits ? MSM_STEP_OUTPUT_ALL_LOGITS
                                    : last         ? MSM_STEP_OUTPUT_SAMPLE
                                                   : MSM_STEP_OUTPUT_NONE,
                          .sampling = o->sampling};
        s.sampling.counter = 0;
        double t0 = now_s();
        r = msm_engine_step(e, &s, 1, &out, err);
        ret->prefill_s += now_s() - t0;
        if (r) break;
        if (o->dump_logits) {
            memcpy(ret->logits + (size_t)ret->n_rows * cfg->vocab, out.logits,
                   sizeof(float) * (size_t)out.n_rows * cfg->vocab);
            ret->n_rows += out.n_rows;
        }
        if (last) ret->ids[ret->n++] = out.tokens[0];
    }
    while (r == 0 && ret->n < o->max_new) {
        int32_t last = ret->ids[ret->n - 1];
        if (!o->ignore_eos && is_eos(cfg, last)) break;
        /* SAMPLE (+ logits) keeps decode steps eligible for CUDA-graph replay */
        msm_step_seq s = {.tokens = &last, .n_tokens = 1, .pos0 = P + ret->n - 1, .blocks = blocks,
                          .n_blocks = nb, .output = MSM_STEP_OUTPUT_SAMPLE, .want_logits = o->dump_logits,
                          .sampling = o->sampling};
        s.sampling.counter = (uint64_t)ret->n;
        double t0 = now_s();
        r = msm_engine_step(e, &s, 1, &out, err);
        ret->decode_s += now_s() - t0;
        if (r) break;
        if (o->dump_logits) {
            memcpy(ret->logits + (size_t)ret->n_rows * cfg->vocab, out.logits, sizeof(float) * (size_t)cfg->vocab);
            ret->n_rows++;
        }
        ret->ids[ret->n++] = out.tokens[0];
    }
    msm_kv_pool_release(kv, blocks, nb);
    free(blocks);
    if (r) msm_generation_done(ret);
    return r;
}

void msm_generation_done(msm_generation *g) {
    if (!g) return;
    free(g->ids);
    free(g->logits);
    g->ids = NULL;
    g->logits = NULL;
}

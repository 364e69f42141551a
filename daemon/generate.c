/* msm_generate: one sequence through the scheduler, in-process (see msm_generate.h).
 *
 * The request is an ordinary msm_gen_request; with dump_logits its logits sink is the caller's
 * buffer, so the scheduler feeds every prompt chunk with all its logits and copies each fed
 * token's row there by position. The scheduler's events come back on this thread, from inside
 * msm_sched_iterate, and fill the generation. */
#include "msm_generate.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "msm_sched.h"

/* What the events of the one request said. */
typedef struct collector {
    msm_generation *gen;
    int max_new;
    bool done;
    msm_finish finish;
    int error;                  /* with MSM_FINISH_ERROR: a negative errno ... */
    msm_err error_msg;          /* ... and the message */
} collector;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* msm_sched_emit_fn: called on this thread, inside msm_sched_iterate. */
static void collect(void *ctx, msm_sched_event *ev) {
    collector *c = ctx;
    if (ev->has_token && c->gen->n < c->max_new)
        c->gen->ids[c->gen->n++] = ev->token;
    if (ev->finish != MSM_FINISH_NONE) {
        c->done = true;
        c->finish = ev->finish;
        c->error = ev->error;
        c->error_msg = ev->error_msg;
    }
    free(ev);
}

/* The request: the prompt copied, and the logits sink when dumping. */
static msm_gen_request *request_for(const int32_t *prompt, int P, const msm_generate_opts *o, float *sink, int rows) {
    msm_gen_request *r = calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->prompt = malloc((size_t)P * sizeof *r->prompt);
    if (!r->prompt) {
        free(r);
        return NULL;
    }
    memcpy(r->prompt, prompt, (size_t)P * sizeof *r->prompt);
    r->n_prompt = P;
    r->sampling = o->sampling;
    r->max_tokens = o->max_new;
    r->ignore_eos = o->ignore_eos;
    r->logits_sink = sink;
    r->sink_rows = sink ? rows : 0;
    return r;
}

/* Submits r and iterates the scheduler until its sequence finishes; times the iterations. */
static int run(msm_sched *s, msm_gen_request *r, collector *c, msm_err *err) {
    int rc = msm_sched_submit(s, &r, err);
    if (rc < 0) {
        msm_gen_request_free(r);
        return rc;
    }
    while (!c->done) {
        bool prefill = c->gen->n == 0;
        double t0 = now_s();
        int stepped = msm_sched_iterate(s);
        double dt = now_s() - t0;
        if (prefill)
            c->gen->prefill_s += dt;
        else
            c->gen->decode_s += dt;
        if (stepped == 0 && !c->done)
            return msm_err_set(err, -EIO, "the scheduler went idle before the sequence finished");
    }
    if (c->finish == MSM_FINISH_ERROR)
        return msm_err_set(err, c->error, "%s", c->error_msg.msg);
    return 0;
}

int msm_generate(msm_engine *e, const int32_t *prompt, int P, const msm_generate_opts *o,
                 msm_generation *ret, msm_err *err) {
    const msm_model_config *cfg = msm_engine_model(e);
    const msm_engine_opts *eo = msm_engine_options(e);
    memset(ret, 0, sizeof *ret);
    if (P < 1)
        return msm_err_set(err, -EINVAL, "the prompt is empty");
    if (o->max_new < 1)
        return msm_err_set(err, -EINVAL, "max_new must be at least 1");
    int ctx = P + o->max_new;
    if (ctx > eo->max_context)
        return msm_err_set(err, -EINVAL, "prompt (%d) + new tokens (%d) exceed the context limit %d",
                           P, o->max_new, eo->max_context);
    msm_kv_pool *kv = msm_engine_kv(e);
    int nb = msm_kv_blocks_for(ctx);
    if (nb > msm_kv_pool_n_free(kv))
        return msm_err_set(err, -ENOSPC, "not enough free KV blocks for %d tokens (%d needed, %d free)",
                           ctx, nb, msm_kv_pool_n_free(kv));
    ret->ids = malloc(sizeof(int32_t) * (size_t)o->max_new);
    if (o->dump_logits)
        ret->logits = malloc(sizeof(float) * (size_t)ctx * (size_t)cfg->vocab);
    msm_gen_request *r = request_for(prompt, P, o, ret->logits, ctx);
    if (!ret->ids || (o->dump_logits && !ret->logits) || !r) {
        msm_gen_request_free(r);
        msm_generation_done(ret);
        return msm_err_set(err, -ENOMEM, "out of memory");
    }
    msm_sched_engine se;
    msm_sched_engine_from(&se, e);
    msm_sched_opts so = {.max_step_tokens = eo->max_step_tokens, .max_seqs = 1, .max_queue = 1};
    collector c = {.gen = ret, .max_new = o->max_new};
    msm_sched *s = NULL;
    int rc = msm_sched_new(&so, &se, collect, &c, &s, err);
    if (rc < 0)
        msm_gen_request_free(r);
    else
        rc = run(s, r, &c, err);
    msm_sched_free(s);
    if (rc < 0) {
        msm_generation_done(ret);
        return rc;
    }
    ret->n_rows = o->dump_logits ? P + ret->n - 1 : 0;
    return 0;
}

void msm_generation_done(msm_generation *g) {
    if (!g)
        return;
    free(g->ids);
    free(g->logits);
    g->ids = NULL;
    g->logits = NULL;
}

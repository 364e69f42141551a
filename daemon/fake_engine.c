/* msm_fake_engine: see msm_fake_engine.h. */
#include "msm_fake_engine.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BLOCK 16

static uint64_t mix(uint64_t h, uint64_t x) {
    h ^= x + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
}

/* The fake model: a hash of the history; sampling params other than temperature 0 add the seed
 * and the counter (as the counter-based RNG does on the real engine). */
static int32_t next_token(uint64_t hist_hash, const msm_sample_params *sp, int vocab) {
    uint64_t h = hist_hash;
    if (sp->temperature > 0)
        h = mix(mix(h, sp->seed), sp->counter);
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return (int32_t)(h % (uint64_t)vocab);
}

int32_t msm_fake_engine_expected(const int32_t *history, int n, const msm_sample_params *sp, int vocab) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++)
        h = mix(h, (uint64_t)(uint32_t)history[i] * 131 + (uint64_t)i);
    return next_token(h, sp, vocab);
}

int msm_fake_engine_new(const msm_fake_engine_opts *o, msm_fake_engine **ret) {
    msm_fake_engine *f = calloc(1, sizeof *f);
    if (!f)
        return -ENOMEM;
    f->o = *o;
    f->cache = calloc((size_t)o->kv_blocks * BLOCK, sizeof *f->cache);
    f->used = calloc((size_t)o->kv_blocks, 1);
    f->out_tokens = calloc((size_t)o->max_seqs, sizeof *f->out_tokens);
    f->out_logits = calloc((size_t)o->max_seqs * (size_t)o->vocab, sizeof *f->out_logits);
    if (!f->cache || !f->used || !f->out_tokens || !f->out_logits) {
        msm_fake_engine_free(f);
        return -ENOMEM;
    }
    f->used[0] = 1; /* reserved, as in msm_kv */
    f->n_free = o->kv_blocks - 1;
    *ret = f;
    return 0;
}

void msm_fake_engine_free(msm_fake_engine *f) {
    if (!f)
        return;
    free(f->cache);
    free(f->used);
    free(f->out_tokens);
    free(f->out_logits);
    free(f);
}

static int fk_alloc(void *ctx, int n, int32_t *ret_ids) {
    msm_fake_engine *f = ctx;
    if (n > f->n_free)
        return -ENOSPC;
    int k = 0;
    for (int b = 1; b < f->o.kv_blocks && k < n; b++)
        if (!f->used[b]) {
            f->used[b] = 1;
            ret_ids[k++] = b;
        }
    f->n_free -= n;
    return 0;
}

static void fk_release(void *ctx, const int32_t *ids, int n) {
    msm_fake_engine *f = ctx;
    for (int i = 0; i < n; i++) {
        if (ids[i] <= 0 || ids[i] >= f->o.kv_blocks || !f->used[ids[i]]) {
            f->double_frees++;
            continue;
        }
        f->used[ids[i]] = 0;
        f->n_free++;
    }
}

static int fk_n_free(void *ctx) {
    return ((msm_fake_engine *)ctx)->n_free;
}

static int fk_total(void *ctx) {
    return ((msm_fake_engine *)ctx)->o.kv_blocks - 1;
}

static int fk_step(void *ctx, const msm_step_seq *seqs, int n_seqs, msm_step_out *ret, msm_err *err) {
    msm_fake_engine *f = ctx;
    int total = 0;
    if (f->fail_steps > 0) {
        f->fail_steps--;
        return msm_err_set(err, -EIO, "fake engine: injected failure");
    }
    bool fault = f->o.fault_step > 0 && f->steps + 1 >= (uint64_t)f->o.fault_step;
    while (fault && f->o.fault_stall) /* test-only: the process exits around it */
        nanosleep(&(struct timespec){1, 0}, NULL);
    if (fault && !f->o.fault_nonfinite)
        return msm_err_set(err, -ENOTRECOVERABLE, "fake engine: injected device fault at step %llu",
                           (unsigned long long)f->steps + 1);
    if (n_seqs < 1 || n_seqs > f->o.max_seqs)
        return msm_err_set(err, -EINVAL, "fake engine: %d sequences in a step (max %d)", n_seqs, f->o.max_seqs);
    /* Validate everything first, as the real engine does. */
    for (int i = 0; i < n_seqs; i++) {
        const msm_step_seq *s = &seqs[i];
        total += s->n_tokens;
        if (s->n_tokens < 1 || s->pos0 < 0 || s->pos0 + s->n_tokens > f->o.max_context)
            return msm_err_set(err, -EINVAL, "fake engine: seq %d: tokens %d at pos %d exceed the context %d", i,
                               s->n_tokens, s->pos0, f->o.max_context);
        if (s->n_blocks * BLOCK < s->pos0 + s->n_tokens)
            return msm_err_set(err, -EINVAL, "fake engine: seq %d: %d blocks for %d positions", i, s->n_blocks,
                               s->pos0 + s->n_tokens);
        for (int b = 0; b < s->n_blocks; b++)
            if (s->blocks[b] <= 0 || s->blocks[b] >= f->o.kv_blocks || !f->used[s->blocks[b]])
                return msm_err_set(err, -EINVAL, "fake engine: seq %d: block %d is not allocated", i, s->blocks[b]);
        for (int t = 0; t < s->n_tokens; t++)
            if (s->tokens[t] < 0 || s->tokens[t] >= f->o.vocab)
                return msm_err_set(err, -EINVAL, "fake engine: seq %d: token %d out of range", i, s->tokens[t]);
    }
    if (total > f->o.max_step_tokens)
        return msm_err_set(err, -EINVAL, "fake engine: %d tokens in a step (max %d)", total, f->o.max_step_tokens);
    if (f->o.step_delay_us > 0) {
        struct timespec ts = {f->o.step_delay_us / 1000000, (f->o.step_delay_us % 1000000) * 1000L};
        nanosleep(&ts, NULL);
    }
    int rows = 0;
    for (int i = 0; i < n_seqs; i++) {
        const msm_step_seq *s = &seqs[i];
        for (int t = 0; t < s->n_tokens; t++) {
            int p = s->pos0 + t;
            f->cache[s->blocks[p / BLOCK] * BLOCK + p % BLOCK] = s->tokens[t];
        }
        f->out_tokens[i] = -1;
        if (!s->output)
            continue;
        /* Read the whole history back through the block table. */
        uint64_t h = 1469598103934665603ull;
        int n = s->pos0 + s->n_tokens;
        for (int p = 0; p < n; p++)
            h = mix(h, (uint64_t)(uint32_t)f->cache[s->blocks[p / BLOCK] * BLOCK + p % BLOCK] * 131 + (uint64_t)p);
        int32_t tok = next_token(h, &s->sampling, f->o.vocab);
        f->out_tokens[i] = fault ? MSM_SAMPLE_NONFINITE : tok;
        if (s->want_logits) {
            float *row = f->out_logits + (size_t)rows++ * (size_t)f->o.vocab;
            for (int v = 0; v < f->o.vocab; v++)
                row[v] = -0.01f * (float)((v - tok + f->o.vocab) % f->o.vocab);
            row[tok] = 1.0f;
        }
    }
    f->steps++;
    f->last_n_seqs = n_seqs;
    f->last_n_tokens = total;
    if (n_seqs > f->max_n_seqs_seen)
        f->max_n_seqs_seen = n_seqs;
    if (total > f->max_n_tokens_seen)
        f->max_n_tokens_seen = total;
    ret->tokens = f->out_tokens;
    ret->logits = rows ? f->out_logits : NULL;
    ret->n_rows = rows;
    return 0;
}

void msm_fake_engine_vtable(msm_fake_engine *f, msm_sched_engine *ret) {
    memset(ret, 0, sizeof *ret);
    ret->ctx = f;
    ret->step = fk_step;
    ret->kv_alloc = fk_alloc;
    ret->kv_release = fk_release;
    ret->kv_n_free = fk_n_free;
    ret->kv_total = fk_total;
    ret->vocab = f->o.vocab;
    ret->max_context = f->o.max_context;
    if (f->o.eos_id >= 0) {
        ret->eos_ids[0] = f->o.eos_id;
        ret->n_eos = 1;
    }
}

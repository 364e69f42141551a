/* Unit tests of the scheduler (daemon/sched.c) on the fake engine: continuous batching, chunked
 * prefill, admission and preemption by recompute, cancel, stop rules, logprobs, limits, and the
 * text side (deltas, stop strings) with the embedded model's tokenizer. The fake engine's output
 * hashes the whole history read back through the block tables, so every test that compares
 * against msm_fake_engine_expected also checks the KV bookkeeping. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <unistr.h>

#include "msm_code.h"
#include "msm_engine.h"
#include "msm_fake_engine.h"
#include "msm_metrics.h"
#include "msm_sched.h"
#include "testutil.h"

#define MAX_REQ 128
#define MAX_OUT 512

typedef struct result {
    int32_t tokens[MAX_OUT];
    int n;
    msm_finish finish;
    int prompt_tokens, completion_tokens;
    int error;                /* with MSM_FINISH_ERROR: the negative errno */
    bool has_logprob;
    float logprob[MAX_OUT];
    int n_top;
    int32_t top0[MAX_OUT];
    char text[16384];         /* concatenated text deltas */
    size_t text_len;
    int n_text_events;        /* events that carried a text field */
    int bad_deltas;           /* deltas that were not whole UTF-8 characters */
    int finish_order;         /* 1 for the first request to finish, 2 for the next, ... */
    char error_msg[512];
} result;

typedef struct harness {
    msm_fake_engine *fe;
    msm_sched *s;
    pthread_mutex_t mu;
    int n_finished;
    result r[MAX_REQ];
} harness;

static void on_event(void *ctx, msm_sched_event *ev) {
    harness *h = ctx;
    pthread_mutex_lock(&h->mu);
    cr_assert_lt(ev->request_id, MAX_REQ);
    result *r = &h->r[ev->request_id];
    cr_assert_eq(r->finish, MSM_FINISH_NONE, "event after the finish of request %llu",
                 (unsigned long long)ev->request_id);
    if (ev->has_token && r->n < MAX_OUT) {
        if (ev->has_logprob) {
            r->has_logprob = true;
            r->logprob[r->n] = ev->logprob;
            r->n_top = ev->n_top;
            r->top0[r->n] = ev->n_top ? ev->top_ids[0] : -1;
        }
        r->tokens[r->n++] = ev->token;
    }
    if (ev->text) {
        r->n_text_events++;
        if (strlen(ev->text) != ev->text_len || u8_check((const uint8_t *)ev->text, ev->text_len))
            r->bad_deltas++;
        if (r->text_len + ev->text_len < sizeof r->text) {
            memcpy(r->text + r->text_len, ev->text, ev->text_len);
            r->text_len += ev->text_len;
            r->text[r->text_len] = 0;
        }
    }
    if (ev->finish != MSM_FINISH_NONE) {
        r->finish = ev->finish;
        r->prompt_tokens = ev->prompt_tokens;
        r->completion_tokens = ev->completion_tokens;
        r->error = ev->error;
        r->finish_order = ++h->n_finished;
        snprintf(r->error_msg, sizeof r->error_msg, "%s", ev->error_msg.msg);
    }
    pthread_mutex_unlock(&h->mu);
    free(ev);
}

static harness *harness_new(int kv_blocks, int max_step_tokens, int max_seqs, int max_queue, int max_context) {
    harness *h = calloc(1, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    msm_fake_engine_opts fo = {.vocab = 97, .max_context = max_context, .kv_blocks = kv_blocks, .eos_id = -1,
                               .max_step_tokens = max_step_tokens, .max_seqs = max_seqs};
    cr_assert_eq(msm_fake_engine_new(&fo, &h->fe), 0);
    msm_sched_engine se;
    msm_fake_engine_vtable(h->fe, &se);
    msm_sched_opts so = {.max_step_tokens = max_step_tokens, .max_seqs = max_seqs, .max_queue = max_queue};
    msm_err err;
    cr_assert_eq(msm_sched_new(&so, &se, on_event, h, &h->s, &err), 0, "%s", err.msg);
    return h;
}

static void harness_free(harness *h) {
    msm_sched_free(h->s);
    cr_assert_eq(h->fe->double_frees, 0, "KV blocks released twice");
    msm_fake_engine_free(h->fe);
    free(h);
}

static msm_gen_request *req(uint64_t id, int n_prompt, int max_tokens, float temperature, uint64_t seed) {
    msm_gen_request *r = calloc(1, sizeof *r);
    r->conn_id = 1;
    r->request_id = id;
    r->n_prompt = n_prompt;
    r->prompt = malloc((size_t)n_prompt * sizeof *r->prompt);
    for (int i = 0; i < n_prompt; i++)
        r->prompt[i] = (int32_t)((id * 7 + (uint64_t)i * 3) % 97);
    r->max_tokens = max_tokens;
    r->sampling = (msm_sample_params){.temperature = temperature, .top_p = 1, .seed = seed};
    return r;
}

static void expected(const msm_gen_request *r, int n_out, int32_t *out) {
    int32_t hist[1024];
    memcpy(hist, r->prompt, (size_t)r->n_prompt * sizeof *hist);
    int n = r->n_prompt;
    for (int i = 0; i < n_out; i++) {
        msm_sample_params sp = r->sampling;
        sp.counter = (uint64_t)i;
        out[i] = msm_fake_engine_expected(hist, n, &sp, 97);
        hist[n++] = out[i];
    }
}

static void submit_ok(harness *h, msm_gen_request *r) {
    msm_err err = {{0}};
    msm_gen_request *rr = r;
    cr_assert_eq(msm_sched_submit(h->s, &rr, &err), 0, "%s", err.msg);
    cr_assert_null(rr);
}

static void run_until_idle(harness *h, int max_iters) {
    for (int i = 0; i < max_iters; i++) {
        int rc = msm_sched_iterate(h->s);
        if (rc == 0)
            return;
    }
    cr_assert_fail("scheduler still busy after %d iterations", max_iters);
}

static void check_output(harness *h, uint64_t id, const msm_gen_request *copy, int n_out) {
    int32_t want[MAX_OUT];
    expected(copy, n_out, want);
    result *r = &h->r[id];
    cr_assert_eq(r->n, n_out, "request %llu: %d tokens, want %d", (unsigned long long)id, r->n, n_out);
    for (int i = 0; i < n_out; i++)
        cr_assert_eq(r->tokens[i], want[i], "request %llu token %d: %d, want %d", (unsigned long long)id, i,
                     r->tokens[i], want[i]);
}

/* A copy of the request's prompt/sampling (the scheduler owns the submitted one). */
static msm_gen_request *dup_req(const msm_gen_request *r) {
    msm_gen_request *c = calloc(1, sizeof *c);
    *c = *r;
    c->prompt = malloc((size_t)r->n_prompt * sizeof *c->prompt);
    memcpy(c->prompt, r->prompt, (size_t)r->n_prompt * sizeof *c->prompt);
    c->stop_ids = NULL;
    c->n_stop_ids = 0;
    c->stop_strings = NULL;
    c->n_stop_strings = 0;
    return c;
}

static void stats(harness *h, msm_sched_stats *st) {
    msm_sched_get_stats(h->s, st);
}

Test(sched, single_greedy_request_matches_the_model) {
    harness *h = harness_new(64, 64, 8, 16, 256);
    msm_gen_request *r = req(1, 5, 12, 0, 0), *c = dup_req(r);
    submit_ok(h, r);
    run_until_idle(h, 100);
    check_output(h, 1, c, 12);
    cr_assert_eq(h->r[1].finish, MSM_FINISH_LENGTH);
    cr_assert_eq(h->r[1].prompt_tokens, 5);
    cr_assert_eq(h->r[1].completion_tokens, 12);
    msm_sched_stats st;
    stats(h, &st);
    cr_assert_eq(st.kv_used, 0, "blocks returned at the finish");
    msm_gen_request_free(c);
    harness_free(h);
}

Test(sched, requests_are_batched_into_one_step) {
    harness *h = harness_new(256, 256, 8, 64, 256);
    msm_gen_request *copies[8];
    for (int i = 0; i < 8; i++) {
        msm_gen_request *r = req((uint64_t)i + 1, 3 + i, 10, i % 2 ? 0.8f : 0, (uint64_t)i);
        copies[i] = dup_req(r);
        submit_ok(h, r);
    }
    run_until_idle(h, 100);
    for (int i = 0; i < 8; i++) {
        check_output(h, (uint64_t)i + 1, copies[i], 10);
        msm_gen_request_free(copies[i]);
    }
    cr_assert_eq(h->fe->max_n_seqs_seen, 8, "all eight decode in the same step");
    cr_assert_leq(h->fe->steps, 11, "one prefill step + 9 decode steps, not 8x that");
    harness_free(h);
}

Test(sched, new_requests_join_between_steps) {
    harness *h = harness_new(256, 256, 8, 64, 256);
    msm_gen_request *a = req(1, 4, 20, 0, 0), *ca = dup_req(a);
    msm_gen_request *b = req(2, 6, 5, 0, 0), *cb = dup_req(b);
    submit_ok(h, a);
    for (int i = 0; i < 5; i++)
        msm_sched_iterate(h->s);
    cr_assert_eq(h->r[1].n, 5);
    submit_ok(h, b);
    msm_sched_iterate(h->s);
    cr_assert_eq(h->fe->last_n_seqs, 2, "b's prefill rides with a's decode row");
    cr_assert_eq(h->fe->last_n_tokens, 1 + 6);
    run_until_idle(h, 100);
    check_output(h, 1, ca, 20);
    check_output(h, 2, cb, 5);
    msm_gen_request_free(ca);
    msm_gen_request_free(cb);
    harness_free(h);
}

Test(sched, long_prompt_is_prefilled_in_chunks_under_the_budget) {
    harness *h = harness_new(64, 16, 4, 8, 256);
    msm_gen_request *r = req(1, 50, 4, 0, 0), *c = dup_req(r);
    submit_ok(h, r);
    msm_sched_iterate(h->s);
    cr_assert_eq(h->fe->last_n_tokens, 16);
    cr_assert_eq(h->r[1].n, 0, "no token before the last chunk");
    run_until_idle(h, 100);
    cr_assert_leq(h->fe->max_n_tokens_seen, 16);
    check_output(h, 1, c, 4);
    /* 50 tokens = 16+16+16+2: the first token comes with the 4th step. */
    cr_assert_eq(h->fe->steps, 4 + 3);
    msm_gen_request_free(c);
    harness_free(h);
}

Test(sched, decode_rows_share_the_budget_with_a_prefill_chunk) {
    harness *h = harness_new(128, 16, 4, 8, 256);
    msm_gen_request *a = req(1, 3, 30, 0, 0), *ca = dup_req(a);
    msm_gen_request *b = req(2, 40, 3, 0, 0), *cb = dup_req(b);
    submit_ok(h, a);
    msm_sched_iterate(h->s);
    submit_ok(h, b);
    msm_sched_iterate(h->s);
    cr_assert_eq(h->fe->last_n_tokens, 16, "1 decode row + a 15-token chunk");
    run_until_idle(h, 200);
    check_output(h, 1, ca, 30);
    check_output(h, 2, cb, 3);
    msm_gen_request_free(ca);
    msm_gen_request_free(cb);
    harness_free(h);
}

Test(sched, preemption_by_recompute_when_blocks_run_out) {
    /* 12 usable blocks; three sequences growing to 20 + 60 = 80 tokens (5 blocks) each. */
    harness *h = harness_new(13, 64, 4, 8, 256);
    msm_gen_request *copies[3];
    for (int i = 0; i < 3; i++) {
        msm_gen_request *r = req((uint64_t)i + 1, 20, 60, i == 1 ? 0.7f : 0, 5);
        copies[i] = dup_req(r);
        submit_ok(h, r);
    }
    run_until_idle(h, 2000);
    msm_sched_stats st;
    stats(h, &st);
    cr_assert_gt(st.preemptions, 0, "the pool is too small for all three at once");
    for (int i = 0; i < 3; i++) {
        check_output(h, (uint64_t)i + 1, copies[i], 60);
        cr_assert_eq(h->r[i + 1].finish, MSM_FINISH_LENGTH);
        cr_assert_eq(h->r[i + 1].completion_tokens, 60);
        msm_gen_request_free(copies[i]);
    }
    cr_assert_eq(st.kv_used, 0);
    harness_free(h);
}

Test(sched, admission_waits_for_free_blocks) {
    harness *h = harness_new(5, 64, 4, 8, 256); /* 4 usable blocks */
    submit_ok(h, req(1, 40, 2, 0, 0));           /* 3 blocks */
    submit_ok(h, req(2, 40, 2, 0, 0));           /* 3 more: must wait */
    msm_sched_iterate(h->s);
    msm_sched_stats st;
    stats(h, &st);
    cr_assert_eq(st.running, 1);
    cr_assert_eq(st.waiting, 1);
    run_until_idle(h, 100);
    cr_assert_eq(h->r[1].n, 2);
    cr_assert_eq(h->r[2].n, 2);
    harness_free(h);
}

Test(sched, cancel_frees_blocks_within_one_step) {
    harness *h = harness_new(64, 64, 4, 8, 256);
    submit_ok(h, req(1, 30, 100, 0, 0));
    submit_ok(h, req(2, 30, 100, 0, 0));
    for (int i = 0; i < 3; i++)
        msm_sched_iterate(h->s);
    msm_sched_stats st;
    stats(h, &st);
    cr_assert_gt(st.kv_used, 0);
    msm_sched_cancel(h->s, 1, 1);
    msm_sched_iterate(h->s);
    cr_assert_eq(h->r[1].finish, MSM_FINISH_CANCELLED);
    cr_assert_eq(h->r[2].finish, MSM_FINISH_NONE, "the other request keeps going");
    stats(h, &st);
    cr_assert_eq(st.kv_used, 3, "only request 2's blocks remain (31..32 tokens = 2 blocks + 1)");
    msm_sched_cancel_conn(h->s, 1); /* disconnect */
    msm_sched_iterate(h->s);
    cr_assert_eq(h->r[2].finish, MSM_FINISH_CANCELLED);
    stats(h, &st);
    cr_assert_eq(st.kv_used, 0);
    cr_assert_eq(st.finished[MSM_FINISH_CANCELLED], 2);
    harness_free(h);
}

Test(sched, cancel_of_a_waiting_request) {
    harness *h = harness_new(64, 64, 1, 8, 256); /* max_seqs 1: the second waits */
    submit_ok(h, req(1, 4, 50, 0, 0));
    submit_ok(h, req(2, 4, 50, 0, 0));
    msm_sched_iterate(h->s);
    msm_sched_cancel(h->s, 1, 2);
    msm_sched_cancel_all(h->s);
    run_until_idle(h, 10);
    cr_assert_eq(h->r[1].finish, MSM_FINISH_CANCELLED);
    cr_assert_eq(h->r[2].finish, MSM_FINISH_CANCELLED);
    cr_assert_eq(h->r[2].completion_tokens, 0);
    msm_sched_stats st;
    stats(h, &st);
    cr_assert_eq(st.waiting, 0);
    cr_assert_eq(st.kv_used, 0);
    harness_free(h);
}

Test(sched, limits_answer_with_codes) {
    harness *h = harness_new(9, 64, 2, 2, 64); /* 8 usable blocks, context 64, queue 2 */
    msm_err err = {{0}};
    msm_gen_request *r = req(1, 64, 1, 0, 0);
    cr_assert_eq(msm_sched_submit(h->s, &r, &err), -EINVAL);
    cr_assert(strstr(err.msg, "max context is 64"), "%s", err.msg);
    msm_gen_request_free(r);
    msm_fake_engine_free(NULL);
    harness_free(h);

    h = harness_new(3, 64, 2, 2, 256); /* 2 usable blocks = 32 tokens */
    r = req(1, 10, 40, 0, 0);
    cr_assert_eq(msm_sched_submit(h->s, &r, &err), -ENOSPC);
    cr_assert(strstr(err.msg, "KV blocks"), "%s", err.msg);
    msm_gen_request_free(r);
    submit_ok(h, req(1, 4, 4, 0, 0));
    submit_ok(h, req(2, 4, 4, 0, 0));
    r = req(3, 4, 4, 0, 0);
    cr_assert_eq(msm_sched_submit(h->s, &r, &err), -EAGAIN);
    cr_assert(strstr(err.msg, "max_queue"), "%s", err.msg);
    msm_gen_request_free(r);
    run_until_idle(h, 100);
    harness_free(h);
}

Test(sched, stop_token_and_eos_and_ignore_eos) {
    msm_gen_request *probe = req(1, 6, 8, 0, 0);
    int32_t want[8];
    expected(probe, 8, want);
    msm_gen_request_free(probe);
    int k = 3; /* stop at the 4th token, if it did not appear earlier */
    for (int i = 0; i < 3; i++)
        if (want[i] == want[k])
            k = i;
    harness *h = harness_new(64, 64, 4, 8, 256);
    h->fe->o.eos_id = want[k];
    msm_sched_engine se; /* rebuild the scheduler with the eos id in its model limits */
    msm_sched_free(h->s);
    msm_fake_engine_vtable(h->fe, &se);
    msm_sched_opts so = {.max_step_tokens = 64, .max_seqs = 4, .max_queue = 8};
    msm_err err;
    cr_assert_eq(msm_sched_new(&so, &se, on_event, h, &h->s, &err), 0);

    submit_ok(h, req(1, 6, 8, 0, 0));                  /* eos */
    msm_gen_request *r2 = req(2, 6, 8, 0, 0);          /* ignore_eos: runs to length */
    for (int i = 0; i < 6; i++)
        r2->prompt[i] = (int32_t)((1 * 7 + i * 3) % 97); /* same prompt as request 1 */
    r2->ignore_eos = true;
    submit_ok(h, r2);
    msm_gen_request *r3 = req(3, 6, 8, 0, 0);          /* stop id = the 2nd token */
    for (int i = 0; i < 6; i++)
        r3->prompt[i] = (int32_t)((1 * 7 + i * 3) % 97);
    r3->stop_ids = malloc(sizeof *r3->stop_ids);
    r3->stop_ids[0] = want[1];
    r3->n_stop_ids = 1;
    r3->ignore_eos = true;
    submit_ok(h, r3);
    run_until_idle(h, 100);
    cr_assert_eq(h->r[1].finish, MSM_FINISH_EOS);
    cr_assert_eq(h->r[1].n, k + 1, "the eos token is the last one streamed");
    cr_assert_eq(h->r[2].finish, MSM_FINISH_LENGTH);
    cr_assert_eq(h->r[2].n, 8);
    cr_assert_eq(h->r[3].finish, MSM_FINISH_STOP);
    cr_assert_leq(h->r[3].n, 2);
    harness_free(h);
}

Test(sched, logprobs_from_the_logits_row) {
    harness *h = harness_new(64, 64, 4, 8, 256);
    msm_gen_request *r = req(1, 4, 5, 0, 0), *c = dup_req(r);
    r->top_logprobs = 3;
    r->want_logprob = true;
    submit_ok(h, r);
    run_until_idle(h, 100);
    check_output(h, 1, c, 5);
    cr_assert(h->r[1].has_logprob);
    cr_assert_eq(h->r[1].n_top, 3);
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(h->r[1].top0[i], h->r[1].tokens[i], "the greedy token is the most likely");
        cr_assert_lt(h->r[1].logprob[i], 0.0f);
    }
    msm_gen_request_free(c);
    harness_free(h);
}

Test(sched, log_softmax_top_n) {
    float logits[6] = {1.0f, 3.0f, -2.0f, 3.0f, 0.5f, 2.0f};
    int32_t ids[4];
    float lp[4], chosen;
    msm_sched_logprobs(logits, 6, 4, 4, &chosen, ids, lp);
    double z = 0;
    for (int i = 0; i < 6; i++)
        z += exp(logits[i]);
    cr_assert_float_eq(chosen, 0.5 - log(z), 1e-5);
    cr_assert_eq(ids[0], 1, "ties keep the lower id first");
    cr_assert_eq(ids[1], 3);
    cr_assert_eq(ids[2], 5);
    cr_assert_eq(ids[3], 0);
    cr_assert_float_eq(lp[2], 2.0 - log(z), 1e-5);
}

Test(sched, sampled_output_does_not_depend_on_the_batch) {
    msm_gen_request *alone_copy;
    harness *h = harness_new(256, 256, 8, 64, 256);
    msm_gen_request *r = req(1, 7, 16, 0.9f, 1234);
    alone_copy = dup_req(r);
    submit_ok(h, r);
    run_until_idle(h, 100);
    result alone = h->r[1];
    harness_free(h);
    h = harness_new(256, 256, 8, 64, 256);
    for (int i = 2; i < 8; i++)
        submit_ok(h, req((uint64_t)i, 3 + i, 16, 0.5f, (uint64_t)i));
    msm_sched_iterate(h->s);
    msm_sched_iterate(h->s);
    r = dup_req(alone_copy);
    r->request_id = 1;
    submit_ok(h, r);
    run_until_idle(h, 100);
    cr_assert_eq(h->r[1].n, alone.n);
    cr_assert_arr_eq(h->r[1].tokens, alone.tokens, sizeof(int32_t) * (size_t)alone.n);
    check_output(h, 1, alone_copy, 16);
    msm_gen_request_free(alone_copy);
    harness_free(h);
}

Test(sched, engine_failure_ends_the_step_with_an_error_and_keeps_serving) {
    harness *h = harness_new(64, 64, 4, 8, 256);
    submit_ok(h, req(1, 4, 5, 0, 0));
    h->fe->fail_steps = 1;
    cr_assert_lt(msm_sched_iterate(h->s), 0);
    cr_assert_eq(h->r[1].finish, MSM_FINISH_ERROR);
    cr_assert_eq(h->r[1].error, -EIO);
    cr_assert_eq(msm_code_from_errno(h->r[1].error), MSM_CODE_INTERNAL);
    msm_gen_request *r = req(2, 4, 5, 0, 0), *c = dup_req(r);
    submit_ok(h, r);
    run_until_idle(h, 100);
    check_output(h, 2, c, 5);
    msm_sched_stats st;
    stats(h, &st);
    cr_assert_eq(st.kv_used, 0);
    cr_assert_eq(st.engine_errors, 1);
    msm_gen_request_free(c);
    harness_free(h);
}

/* Issue 16, bug 3: a Cancel of request 1 that crosses its end, then a new request reusing id 1,
 * both in the inbox at once: the Cancel must not reach the new request. */
Test(sched, a_cancel_reaches_only_requests_submitted_before_it) {
    harness *h = harness_new(64, 64, 4, 8, 256);
    submit_ok(h, req(1, 4, 3, 0, 0));
    run_until_idle(h, 100);
    cr_assert_eq(h->r[1].finish, MSM_FINISH_LENGTH);
    memset(&h->r[1], 0, sizeof h->r[1]);
    msm_sched_cancel(h->s, 1, 1); /* stale: request 1 has finished */
    msm_gen_request *r = req(1, 4, 3, 0, 0), *c = dup_req(r);
    submit_ok(h, r);
    run_until_idle(h, 100);
    cr_assert_eq(h->r[1].finish, MSM_FINISH_LENGTH, "the new request 1 ended %s", msm_finish_name(h->r[1].finish));
    check_output(h, 1, c, 3);
    /* a Cancel after the submission still reaches it */
    memset(&h->r[1], 0, sizeof h->r[1]);
    submit_ok(h, req(1, 4, 3, 0, 0));
    msm_sched_cancel(h->s, 1, 1);
    run_until_idle(h, 100);
    cr_assert_eq(h->r[1].finish, MSM_FINISH_CANCELLED);
    msm_gen_request_free(c);
    harness_free(h);
}

/* One sequence at a time: connection 1 queues five requests, then connection 2 one; connection
 * 2's goes second, not sixth (round-robin over connections, msm_fairq.h). */
Test(sched, admission_is_round_robin_over_connections) {
    harness *h = harness_new(64, 64, 1, 16, 256);
    for (int i = 1; i <= 5; i++)
        submit_ok(h, req((uint64_t)i, 4, 2, 0, 0));
    msm_gen_request *r = req(10, 4, 2, 0, 0);
    r->conn_id = 2;
    submit_ok(h, r);
    run_until_idle(h, 200);
    cr_assert_eq(h->r[1].finish_order, 1);
    cr_assert_eq(h->r[10].finish_order, 2, "connection 2's request finished %d-th", h->r[10].finish_order);
    for (int i = 2; i <= 5; i++)
        cr_assert_eq(h->r[i].finish_order, i + 1, "connection 1's requests keep their order");
    harness_free(h);
}

/* The refusal of a full queue says how many wait, which (after a preemption puts a sequence back)
 * can be more than the limit. */
Test(sched, queue_full_names_the_count_and_the_limit) {
    harness *h = harness_new(9, 64, 2, 1, 256); /* 8 usable blocks, 2 sequences, a queue of 1 */
    submit_ok(h, req(1, 16, 100, 0, 0));
    msm_sched_iterate(h->s);
    submit_ok(h, req(2, 16, 100, 0, 0));
    msm_sched_iterate(h->s);                    /* both admitted: the queue is empty */
    submit_ok(h, req(3, 16, 100, 0, 0));        /* waits (max_seqs 2) */
    msm_sched_stats st;
    for (int i = 0; i < 200; i++) {             /* 1 and 2 grow until one is preempted */
        msm_sched_iterate(h->s);
        stats(h, &st);
        if (st.preemptions > 0)
            break;
    }
    cr_assert_gt(st.preemptions, 0);
    cr_assert_eq(st.waiting, 2);
    msm_err err = {{0}};
    msm_gen_request *r = req(4, 4, 2, 0, 0);
    cr_assert_eq(msm_sched_submit(h->s, &r, &err), -EAGAIN);
    cr_assert_str_eq(err.msg, "queue is full: 2 requests waiting (scheduler.max_queue = 1)");
    msm_gen_request_free(r);
    run_until_idle(h, 2000);
    harness_free(h);
}

/* An engine that cannot run another step (-ENOTRECOVERABLE, as after a device fault): every
 * request ends with that error, running or waiting; later ones are refused; no step runs again. */
Test(sched, an_unrecoverable_engine_failure_ends_every_request) {
    harness *h = harness_new(64, 64, 1, 8, 256);
    h->fe->o.fault_step = 3;
    for (int i = 1; i <= 3; i++)
        submit_ok(h, req((uint64_t)i, 4, 10, 0, 0));
    for (int i = 0; i < 10 && h->r[3].finish == MSM_FINISH_NONE; i++)
        msm_sched_iterate(h->s);
    for (int i = 1; i <= 3; i++) {
        cr_assert_eq(h->r[i].finish, MSM_FINISH_ERROR, "request %d", i);
        cr_assert_eq(h->r[i].error, -ENOTRECOVERABLE);
        cr_assert_eq(msm_code_from_errno(h->r[i].error), MSM_CODE_INTERNAL);
    }
    cr_assert_eq(h->r[1].n, 2, "tokens before the fault");
    msm_sched_stats st;
    stats(h, &st);
    cr_assert(st.engine_dead && st.engine_failed);
    cr_assert_eq(st.kv_used, 0);
    uint64_t steps = h->fe->steps;
    msm_err err = {{0}};
    msm_gen_request *r = req(4, 4, 2, 0, 0);
    cr_assert_eq(msm_sched_submit(h->s, &r, &err), -ESHUTDOWN);
    msm_gen_request_free(r);
    cr_assert_eq(msm_sched_iterate(h->s), 0);
    cr_assert_eq(h->fe->steps, steps, "a step ran on a dead engine");
    harness_free(h);
}

/* Non-finite logits (MSM_SAMPLE_NONFINITE from the sampler) end that request with INTERNAL and
 * count; the engine keeps serving. */
Test(sched, nonfinite_logits_end_the_request_with_an_error) {
    harness *h = harness_new(64, 64, 4, 8, 256);
    h->fe->o.fault_step = 2;
    h->fe->o.fault_nonfinite = true;
    submit_ok(h, req(1, 4, 10, 0, 0));
    run_until_idle(h, 100);
    cr_assert_eq(h->r[1].finish, MSM_FINISH_ERROR);
    cr_assert_eq(h->r[1].n, 1);
    cr_assert_eq(msm_code_from_errno(h->r[1].error), MSM_CODE_INTERNAL);
    cr_assert(strstr(h->r[1].error_msg, "not finite"), "%s", h->r[1].error_msg);
    msm_sched_stats st;
    stats(h, &st);
    cr_assert_eq(st.nonfinite_logits, 1);
    cr_assert(!st.engine_dead);
    cr_assert_eq(st.kv_used, 0);
    harness_free(h);
}

Test(sched, thread_serves_submissions_from_another_thread, .timeout = 30) {
    harness *h = harness_new(128, 64, 8, 64, 256);
    cr_assert_eq(msm_sched_start(h->s), 0);
    msm_gen_request *copies[16];
    for (int i = 0; i < 16; i++) {
        msm_gen_request *r = req((uint64_t)i + 1, 5, 12, 0, 0);
        copies[i] = dup_req(r);
        submit_ok(h, r);
    }
    for (;;) {
        int done = 0;
        pthread_mutex_lock(&h->mu);
        for (int i = 1; i <= 16; i++)
            done += h->r[i].finish != MSM_FINISH_NONE;
        pthread_mutex_unlock(&h->mu);
        if (done == 16)
            break;
        usleep(1000);
    }
    msm_sched_stop(h->s);
    for (int i = 0; i < 16; i++) {
        check_output(h, (uint64_t)i + 1, copies[i], 12);
        msm_gen_request_free(copies[i]);
    }
    harness_free(h);
}

/* ---- text: the scheduler's side of text deltas and stop strings (the embedded model's tokenizer,
 * vocab 512); the text logic itself is tested in test_textstream.c ---- */

/* The fake engine, with its sampled tokens replaced by a script (generated token i = script[i]),
 * so a test decides what text comes out. All requests of a scripted harness share n_prompt. */
typedef struct scripted {
    msm_sched_engine inner;
    const int32_t *script;
    int n_script, n_prompt;
} scripted;

static int scripted_step(void *ctx, const msm_step_seq *seqs, int n, msm_step_out *ret, msm_err *err) {
    scripted *sc = ctx;
    int rc = sc->inner.step(sc->inner.ctx, seqs, n, ret, err);
    if (rc < 0 || !sc->script)
        return rc;
    for (int i = 0; i < n; i++)
        if (seqs[i].output) {
            int g = seqs[i].pos0 + seqs[i].n_tokens - sc->n_prompt;
            ret->tokens[i] = sc->script[g < sc->n_script ? g : sc->n_script - 1];
        }
    return rc;
}
static int sc_alloc(void *ctx, int n, int32_t *ids) { scripted *sc = ctx; return sc->inner.kv_alloc(sc->inner.ctx, n, ids); }
static void sc_release(void *ctx, const int32_t *ids, int n) { scripted *sc = ctx; sc->inner.kv_release(sc->inner.ctx, ids, n); }
static int sc_n_free(void *ctx) { scripted *sc = ctx; return sc->inner.kv_n_free(sc->inner.ctx); }
static int sc_total(void *ctx) { scripted *sc = ctx; return sc->inner.kv_total(sc->inner.ctx); }

static scripted sc_state;

/* A harness with vocab 512 and the tokenizer; script may be NULL (the fake engine's own tokens). */
static harness *text_harness(int kv_blocks, int max_seqs, const int32_t *script, int n_script, int n_prompt) {
    harness *h = calloc(1, sizeof *h);
    pthread_mutex_init(&h->mu, NULL);
    msm_fake_engine_opts fo = {.vocab = 512, .max_context = 256, .kv_blocks = kv_blocks, .eos_id = -1,
                               .max_step_tokens = 256, .max_seqs = max_seqs};
    cr_assert_eq(msm_fake_engine_new(&fo, &h->fe), 0);
    memset(&sc_state, 0, sizeof sc_state);
    msm_fake_engine_vtable(h->fe, &sc_state.inner);
    sc_state.script = script;
    sc_state.n_script = n_script;
    sc_state.n_prompt = n_prompt;
    msm_sched_engine se = sc_state.inner;
    se.ctx = &sc_state;
    se.step = scripted_step;
    se.kv_alloc = sc_alloc;
    se.kv_release = sc_release;
    se.kv_n_free = sc_n_free;
    se.kv_total = sc_total;
    se.tok = test_stories_tokenizer();
    msm_sched_opts so = {.max_step_tokens = 256, .max_seqs = max_seqs, .max_queue = 64};
    msm_err err;
    cr_assert_eq(msm_sched_new(&so, &se, on_event, h, &h->s, &err), 0, "%s", err.msg);
    return h;
}

static msm_gen_request *text_req(uint64_t id, int n_prompt, int max_tokens, const char *const *stops, int n_stops) {
    msm_gen_request *r = req(id, n_prompt, max_tokens, 0, 0);
    for (int i = 0; i < n_prompt; i++)
        r->prompt[i] = (int32_t)(300 + (id * 7 + (uint64_t)i * 3) % 200); /* ordinary pieces */
    r->n_stop_strings = n_stops;
    r->stop_strings = n_stops ? calloc((size_t)n_stops, sizeof *r->stop_strings) : NULL;
    for (int i = 0; i < n_stops; i++)
        r->stop_strings[i] = strdup(stops[i]);
    return r;
}

Test(sched_text, deltas_add_up_to_the_decode_of_the_ids) {
    /* The fake engine's own tokens over the whole vocabulary: byte tokens included, so characters
     * are split over tokens and invalid sequences occur; several requests at once, one preempted. */
    harness *h = text_harness(10, 4, NULL, 0, 0);
    for (int i = 1; i <= 4; i++)
        submit_ok(h, text_req((uint64_t)i, 5 + i, 40, NULL, 0));
    run_until_idle(h, 500);
    for (int i = 1; i <= 4; i++) {
        result *r = &h->r[i];
        cr_assert_eq(r->finish, MSM_FINISH_LENGTH);
        cr_assert_eq(r->n, 40);
        cr_assert_eq(r->n_text_events, 40, "every event carries a text field");
        cr_assert_eq(r->bad_deltas, 0, "request %d: a delta split a character", i);
        char want[16384];
        test_streamed_text(r->tokens, r->n, want, sizeof want);
        cr_assert_str_eq(r->text, want, "request %d", i);
        /* The same as a one-shot decode, up to the leading space a stand-alone decode strips. */
        char *dec;
        size_t dl;
        cr_assert_eq(msm_tokenizer_decode(test_stories_tokenizer(), r->tokens, (size_t)r->n, true, &dec, &dl, NULL), 0);
        cr_assert(!strcmp(r->text, dec) || (r->text[0] == ' ' && !strcmp(r->text + 1, dec)), "'%s' vs '%s'",
                  r->text, dec);
        free(dec);
    }
    msm_sched_stats st;
    stats(h, &st);
    cr_assert_gt(st.preemptions, 0, "the pool was small enough to preempt");
    harness_free(h);
}

Test(sched_text, stop_string_stops_and_is_cut_from_the_text) {
    int32_t script[128];
    int n = test_script_of(" Tom ran home.\nQ: what next? Tom slept.", script, 128);
    static const char *const stops[] = {"Q:"};
    harness *h = text_harness(64, 2, script, n, 4);
    submit_ok(h, text_req(1, 4, 100, stops, 1));
    run_until_idle(h, 200);
    result *r = &h->r[1];
    cr_assert_eq(r->finish, MSM_FINISH_STOP);
    cr_assert_str_eq(r->text, " Tom ran home.\n", "the text ends before the stop string");
    cr_assert_eq(r->bad_deltas, 0);
    /* The ids run up to the token that completed "Q:". */
    char *dec;
    size_t dl;
    cr_assert_eq(msm_tokenizer_decode(test_stories_tokenizer(), r->tokens, (size_t)r->n, true, &dec, &dl, NULL), 0);
    cr_assert(strstr(dec, "Q:") && !strstr(dec, "what"), "ids decode to '%s'", dec);
    free(dec);
    cr_assert_eq(r->completion_tokens, r->n);
    cr_assert_eq(h->fe->n_free, 63, "blocks returned");
    harness_free(h);
}

Test(sched_text, cancel_flushes_the_held_text) {
    int32_t script[128];
    int n = test_script_of(" a b c d e f g h", script, 128);
    static const char *const stops[] = {"b x"};
    harness *h = text_harness(64, 2, script, n, 4);
    submit_ok(h, text_req(1, 4, n, stops, 1));
    for (int i = 0; i < 2; i++)
        msm_sched_iterate(h->s);
    cr_assert_eq(h->r[1].finish, MSM_FINISH_NONE);
    cr_assert_eq(h->r[1].n, 2);
    cr_assert_str_eq(h->r[1].text, " a ", "'b' could start 'b x': held back");
    msm_sched_cancel(h->s, 1, 1);
    run_until_idle(h, 50);
    result *r = &h->r[1];
    cr_assert_eq(r->finish, MSM_FINISH_CANCELLED);
    cr_assert_str_eq(r->text, " a b", "the held-back 'b' came out with the cancel");
    harness_free(h);
}

Test(sched_text, stop_strings_without_a_tokenizer_are_refused) {
    harness *h = harness_new(64, 64, 8, 16, 256);
    static const char *const stops[] = {"x"};
    msm_gen_request *r = text_req(1, 3, 5, stops, 1);
    for (int i = 0; i < 3; i++)
        r->prompt[i] = i;
    msm_err err = {{0}};
    cr_assert_eq(msm_sched_submit(h->s, &r, &err), -ENOTSUP);
    cr_assert(strstr(err.msg, "stop_strings"), "%s", err.msg);
    msm_gen_request_free(r);
    /* And events carry no text field. */
    submit_ok(h, req(2, 3, 4, 0, 0));
    run_until_idle(h, 50);
    cr_assert_eq(h->r[2].n, 4);
    cr_assert_eq(h->r[2].n_text_events, 0);
    harness_free(h);
}

/* ---- several TP groups: the spreading policy and the metrics over groups ---- */

typedef struct pick_case {
    int n;
    int load[8];
    bool use_mask;            /* false: healthy = NULL (every group healthy) */
    bool healthy[8];
    unsigned cursor;
    int want;
    unsigned want_cursor;
} pick_case;

ParameterizedTestParameters(sched_groups, pick_takes_the_least_loaded_ties_round_robin) {
    static pick_case cases[] = {
        {1, {5}, false, {0}, 0, 0, 1},                   /* one group: always it */
        {1, {5}, false, {0}, 7, 0, 1},
        {2, {0, 0}, false, {0}, 0, 0, 1},                /* a tie: from the cursor on */
        {2, {0, 0}, false, {0}, 1, 1, 2},
        {2, {0, 0}, false, {0}, 2, 0, 1},                /* the cursor wraps */
        {3, {3, 1, 1}, false, {0}, 0, 1, 2},             /* least loaded wins ... */
        {3, {3, 1, 1}, false, {0}, 2, 2, 3},             /* ... ties from the cursor */
        {3, {3, 1, 1}, false, {0}, 3, 1, 2},
        {4, {2, 9, 0, 4}, false, {0}, 3, 2, 3},          /* the cursor does not beat a lower load */
        {4, {7, 7, 7, 6}, false, {0}, 0, 3, 4},
        {2, {0, 5}, true, {false, true}, 0, 1, 2},       /* an unhealthy group is avoided ... */
        {3, {0, 5, 5}, true, {false, true, true}, 2, 2, 3},
        {2, {4, 1}, true, {false, false}, 0, 1, 2},      /* ... unless every group is unhealthy */
    };
    return cr_make_param_array(pick_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(pick_case *pc, sched_groups, pick_takes_the_least_loaded_ties_round_robin) {
    unsigned cursor = pc->cursor;
    int got = msm_sched_pick_group(pc->load, pc->use_mask ? pc->healthy : NULL, pc->n, &cursor);
    cr_assert_eq(got, pc->want, "loads %d,%d,%d,%d cursor %u: got %d, want %d", pc->load[0], pc->load[1], pc->load[2],
                 pc->load[3], pc->cursor, got, pc->want);
    cr_assert_eq(cursor, pc->want_cursor);
}

Test(sched_groups, equal_loads_alternate_and_a_burst_spreads_evenly) {
    int load[4] = {0};
    unsigned cursor = 0;
    /* A burst with nothing finishing: every group gets the same share, in turn. */
    for (int i = 0; i < 32; i++) {
        int g = msm_sched_pick_group(load, NULL, 4, &cursor);
        cr_assert_eq(g, i % 4, "request %d went to group %d", i, g);
        load[g]++;
    }
    /* Group 2 drains: it gets the next requests until it catches up. */
    load[2] = 5;
    for (int i = 0; i < 3; i++) {
        int g = msm_sched_pick_group(load, NULL, 4, &cursor);
        cr_assert_eq(g, 2);
        load[g]++;
    }
}

/* Two schedulers on two fake engines behind the pick, as the daemon runs two TP groups: every
 * request ends with the model's output whichever group ran it, and both groups serve. */
Test(sched_groups, requests_spread_over_two_schedulers_give_the_same_output) {
    harness *h[2] = {harness_new(64, 64, 8, 64, 256), harness_new(64, 64, 8, 64, 256)};
    msm_gen_request *copies[40];
    int owner[40], load[2] = {0, 0}, finished_seen[2] = {0, 0};
    unsigned cursor = 0;
    for (int id = 1; id < 40; id++) {
        msm_gen_request *r = req((uint64_t)id, 3 + id % 5, 6 + id % 4, id % 3 ? 0 : 0.8f, (uint64_t)id);
        copies[id] = dup_req(r);
        int g = msm_sched_pick_group(load, NULL, 2, &cursor);
        owner[id] = g;
        load[g]++;
        submit_ok(h[g], r);
        /* Both groups step between submissions; finished requests leave the loads. */
        if (id % 4 == 0)
            for (int k = 0; k < 2; k++) {
                msm_sched_iterate(h[k]->s);
                int fin = 0;
                for (int j = 1; j <= id; j++)
                    fin += owner[j] == k && h[k]->r[j].finish != MSM_FINISH_NONE;
                load[k] -= fin - finished_seen[k];
                finished_seen[k] = fin;
            }
    }
    run_until_idle(h[0], 1000);
    run_until_idle(h[1], 1000);
    int served[2] = {0, 0};
    for (int id = 1; id < 40; id++) {
        result *r = &h[owner[id]]->r[id];
        cr_assert_eq(r->finish, MSM_FINISH_LENGTH, "request %d", id);
        check_output(h[owner[id]], (uint64_t)id, copies[id], copies[id]->max_tokens);
        cr_assert_eq(h[!owner[id]]->r[id].n, 0, "request %d also ran on the other group", id);
        served[owner[id]]++;
        msm_gen_request_free(copies[id]);
    }
    cr_assert_gt(served[0], 10);
    cr_assert_gt(served[1], 10);
    harness_free(h[0]);
    harness_free(h[1]);
}

static double sample(const msm_metric_sample *s, int n, const char *name, const char *labels) {
    for (int i = 0; i < n; i++)
        if (!strcmp(s[i].name, name) && !strcmp(s[i].labels, labels))
            return s[i].value;
    return NAN;
}

Test(sched_groups, metrics_sum_the_groups_and_label_each) {
    msm_metrics m = {.requests_total = 9, .connections = 2};
    msm_sched_stats st[2] = {{.running = 2, .waiting = 1, .kv_used = 10, .kv_free = 90, .steps = 40,
                              .tokens_generated = 100},
                             {.running = 1, .waiting = 0, .kv_used = 4, .kv_free = 96, .steps = 30,
                              .tokens_generated = 50, .engine_failed = true}};
    st[0].finished[MSM_FINISH_LENGTH] = 3;
    st[1].finished[MSM_FINISH_LENGTH] = 2;
    st[1].finished[MSM_FINISH_CANCELLED] = 1;
    int cap = msm_metrics_capacity(2);
    msm_metric_sample *s = calloc((size_t)cap, sizeof *s);
    int n = msm_metrics_collect(&m, st, 2, s, cap);
    cr_assert_lt(n, cap, "capacity is an upper bound with room to spare");
    cr_assert_eq(sample(s, n, "msmoed_requests_total", ""), 9);
    cr_assert_eq(sample(s, n, "msmoed_requests_running", ""), 3);
    cr_assert_eq(sample(s, n, "msmoed_requests_running", "group=\"0\""), 2);
    cr_assert_eq(sample(s, n, "msmoed_requests_running", "group=\"1\""), 1);
    cr_assert_eq(sample(s, n, "msmoed_requests_active", ""), 4);
    cr_assert_eq(sample(s, n, "msmoed_kv_blocks_used", ""), 14);
    cr_assert_eq(sample(s, n, "msmoed_kv_blocks_free", "group=\"1\""), 96);
    cr_assert_eq(sample(s, n, "msmoed_tokens_generated_total", ""), 150);
    cr_assert_eq(sample(s, n, "msmoed_tokens_generated_total", "group=\"0\""), 100);
    cr_assert_eq(sample(s, n, "msmoed_steps_total", "group=\"1\""), 30);
    cr_assert_eq(sample(s, n, "msmoed_requests_finished_total", "reason=\"length\""), 5);
    cr_assert_eq(sample(s, n, "msmoed_requests_finished_total", "reason=\"length\",group=\"1\""), 2);
    cr_assert_eq(sample(s, n, "msmoed_requests_finished_total", "reason=\"cancelled\",group=\"0\""), 0);
    cr_assert_eq(sample(s, n, "msmoed_groups_healthy", ""), 1);
    cr_assert_eq(sample(s, n, "msmoed_groups_healthy", "group=\"1\""), 0);
    /* Prometheus text: one HELP/TYPE per name, the series of a name together. */
    size_t len = msm_metrics_render(s, n, NULL, 0);
    char *text = malloc(len + 1);
    msm_metrics_render(s, n, text, len + 1);
    cr_assert(strstr(text, "# TYPE msmoed_requests_running gauge\nmsmoed_requests_running 3\n"
                           "msmoed_requests_running{group=\"0\"} 2\nmsmoed_requests_running{group=\"1\"} 1\n"), "%s", text);
    const char *first = strstr(text, "# TYPE msmoed_steps_total");
    cr_assert_not_null(first);
    cr_assert_null(strstr(first + 1, "# TYPE msmoed_steps_total"), "one TYPE line per metric");
    free(text);
    free(s);
}

Test(sched_groups, metrics_of_one_group_keep_the_unlabeled_series) {
    msm_metrics m = {0};
    msm_sched_stats st = {.kv_free = 7};
    int cap = msm_metrics_capacity(1);
    msm_metric_sample *s = calloc((size_t)cap, sizeof *s);
    int n = msm_metrics_collect(&m, &st, 1, s, cap);
    cr_assert_eq(sample(s, n, "msmoed_kv_blocks_free", ""), 7);
    cr_assert_eq(sample(s, n, "msmoed_kv_blocks_free", "group=\"0\""), 7);
    free(s);
}

/* ---- prompt logprobs (the HTTP API's echo + logprobs) on the embedded model ---- */

typedef struct lp_capture {
    msm_token_logprob lp[64];
    int got[64];              /* times each position was reported */
    int n_tokens;
    msm_finish finish;
    bool token_before_prompt_done;
} lp_capture;

static void on_lp_event(void *ctx, msm_sched_event *ev) {
    lp_capture *c = ctx;
    for (int i = 0; i < ev->n_prompt_lp; i++) {
        int p = ev->prompt_lp_first + i;
        cr_assert(p >= 1 && p < 64);
        c->lp[p] = ev->prompt_lp[i];
        c->got[p]++;
        cr_assert_eq(c->n_tokens, 0, "prompt logprobs after a generated token");
    }
    if (ev->has_token)
        c->n_tokens++;
    if (ev->finish != MSM_FINISH_NONE)
        c->finish = ev->finish;
    free(ev);
}

/* Every prompt position's logprob and top-n equal the log-softmax of the logits row before it (the
 * logits sink of the same run), across prefill chunks; max_tokens 0 scores without generating. */
static void check_prompt_logprobs(int max_step_tokens, int max_tokens) {
    msm_engine_opts o = test_engine_opts("models/stories260k-moe", 1, true, true);
    o.max_step_tokens = max_step_tokens;
    msm_engine *e = NULL;
    msm_err err = {{0}};
    cr_assert_eq(msm_engine_new(&o, &e, &err), 0, "%s", err.msg);
    msm_sched_engine se;
    msm_sched_engine_from(&se, e);
    lp_capture cap = {0};
    msm_sched *s = NULL;
    msm_sched_opts so = {.max_step_tokens = max_step_tokens, .max_seqs = 4, .max_queue = 4};
    cr_assert_eq(msm_sched_new(&so, &se, on_lp_event, &cap, &s, &err), 0, "%s", err.msg);
    enum { P = 23 };
    float *sink = calloc((size_t)(P + 8) * (size_t)se.vocab, sizeof *sink);
    msm_gen_request *r = calloc(1, sizeof *r);
    r->conn_id = 1;
    r->request_id = 1;
    r->n_prompt = P;
    r->prompt = malloc(P * sizeof *r->prompt);
    for (int i = 0; i < P; i++)
        r->prompt[i] = i == 0 ? 1 : 3 + (i * 37) % 500;
    r->max_tokens = max_tokens;
    r->sampling = (msm_sample_params){.temperature = 0, .top_p = 1};
    r->want_prompt_logprobs = true;
    r->prompt_top_logprobs = 5;
    r->logits_sink = sink;
    r->sink_rows = P + 8;
    int32_t prompt[P];
    memcpy(prompt, r->prompt, sizeof prompt);
    cr_assert_eq(msm_sched_submit(s, &r, &err), 0, "%s", err.msg);
    for (int i = 0; i < 200 && msm_sched_iterate(s) > 0; i++)
        ;
    cr_assert_eq(cap.finish, MSM_FINISH_LENGTH);
    cr_assert_eq(cap.n_tokens, max_tokens);
    for (int p = 1; p < P; p++) {
        cr_assert_eq(cap.got[p], 1, "position %d reported %d times", p, cap.got[p]);
        float want;
        int32_t ids[5];
        float lps[5];
        msm_sched_logprobs(sink + (size_t)(p - 1) * (size_t)se.vocab, se.vocab, prompt[p], 5, &want, ids, lps);
        cr_assert_eq(cap.lp[p].token, prompt[p]);
        cr_assert_float_eq(cap.lp[p].logprob, want, 1e-6, "position %d", p);
        cr_assert_eq(cap.lp[p].n_top, 5);
        for (int k = 0; k < 5; k++)
            cr_assert_eq(cap.lp[p].top_ids[k], ids[k]);
    }
    cr_assert_eq(cap.got[0], 0, "the first prompt token has no logprob");
    msm_sched_free(s);
    msm_engine_free(e);
    free(sink);
}

Test(sched_prompt_logprobs, one_prefill_then_tokens) {
    check_prompt_logprobs(64, 3);
}

Test(sched_prompt_logprobs, chunked_prefill_and_score_only) {
    check_prompt_logprobs(8, 0);
}

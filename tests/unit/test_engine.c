/* The engine's edges: step validation (bad ids, blocks, sizes answer with a message), the KV
 * block pool, dummy weights from a config alone, and batched steps equal single-sequence runs. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "msm_engine.h"
#include "msm_generate.h"
#include "testutil.h"

static msm_engine *open_engine(const char *dir) {
    msm_engine_opts o = test_engine_opts(dir, 1, true, true);
    msm_engine *e;
    msm_err err = {{0}};
    cr_assert_eq(msm_engine_new(&o, &e, &err), 0, "%s", err.msg);
    return e;
}

Test(engine, step_rejects_bad_input_with_a_message) {
    msm_engine *e = open_engine("tests/data/mixtral");
    int32_t blocks[2], tok_bad[1] = {256}, tok_ok[3] = {1, 2, 3}, bad_blocks[1] = {9999};
    cr_assert_eq(msm_kv_pool_alloc(msm_engine_kv(e), 2, blocks), 0);
    msm_step_out out;
    msm_err err = {{0}};
    msm_step_seq s = {.tokens = tok_bad, .n_tokens = 1, .blocks = blocks, .n_blocks = 2, .output = MSM_STEP_OUTPUT_SAMPLE};
    cr_expect_eq(msm_engine_step(e, &s, 1, &out, &err), -EINVAL);
    cr_expect(strstr(err.msg, "token id 256") && strstr(err.msg, "vocabulary"), "%s", err.msg);
    s = (msm_step_seq){.tokens = tok_ok, .n_tokens = 3, .blocks = bad_blocks, .n_blocks = 1, .output = MSM_STEP_OUTPUT_SAMPLE};
    cr_expect_eq(msm_engine_step(e, &s, 1, &out, &err), -EINVAL);
    cr_expect(strstr(err.msg, "block id 9999"), "%s", err.msg);
    s = (msm_step_seq){.tokens = tok_ok, .n_tokens = 0, .blocks = blocks, .n_blocks = 2, .output = MSM_STEP_OUTPUT_SAMPLE};
    cr_expect_eq(msm_engine_step(e, &s, 1, &out, &err), -EINVAL);
    s = (msm_step_seq){.tokens = tok_ok, .n_tokens = 3, .pos0 = 510, .blocks = blocks, .n_blocks = 2, .output = MSM_STEP_OUTPUT_SAMPLE};
    cr_expect_eq(msm_engine_step(e, &s, 1, &out, &err), -EINVAL);
    cr_expect(strstr(err.msg, "context"), "%s", err.msg);
    /* and the engine still works */
    s = (msm_step_seq){.tokens = tok_ok, .n_tokens = 3, .blocks = blocks, .n_blocks = 2, .output = MSM_STEP_OUTPUT_SAMPLE};
    cr_expect_eq(msm_engine_step(e, &s, 1, &out, &err), 0, "%s", err.msg);
    msm_engine_free(e);
}

Test(engine, batched_step_equals_single_sequence_runs) {
    golden g;
    cr_assert_eq(golden_load("tests/data/qwen2moe-gqa", &g), 0);
    msm_engine *e = open_engine("tests/data/qwen2moe-gqa");
    msm_err err = {{0}};
    /* prefill all prompts in one step, then decode all together, greedy */
    int n = g.n, pos[GOLDEN_MAX_PROMPTS];
    int32_t blocks[GOLDEN_MAX_PROMPTS][4], last[GOLDEN_MAX_PROMPTS];
    msm_step_seq s[GOLDEN_MAX_PROMPTS];
    for (int i = 0; i < n; i++) {
        cr_assert_eq(msm_kv_pool_alloc(msm_engine_kv(e), 4, blocks[i]), 0);
        s[i] = (msm_step_seq){.tokens = g.prompt[i], .n_tokens = g.prompt_len[i], .blocks = blocks[i],
                              .n_blocks = 4, .output = MSM_STEP_OUTPUT_SAMPLE};
        pos[i] = g.prompt_len[i];
    }
    msm_step_out out;
    cr_assert_eq(msm_engine_step(e, s, n, &out, &err), 0, "%s", err.msg);
    for (int i = 0; i < n; i++) {
        cr_expect_eq(out.tokens[i], g.gen[i][0]);
        last[i] = out.tokens[i];
    }
    for (int t = 1; t < 12; t++) {
        for (int i = 0; i < n; i++)
            s[i] = (msm_step_seq){.tokens = &last[i], .n_tokens = 1, .pos0 = pos[i]++, .blocks = blocks[i],
                                  .n_blocks = 4, .output = MSM_STEP_OUTPUT_SAMPLE};
        cr_assert_eq(msm_engine_step(e, s, n, &out, &err), 0, "%s", err.msg);
        for (int i = 0; i < n; i++) {
            cr_expect_eq(out.tokens[i], g.gen[i][t], "prompt %d token %d", i, t);
            last[i] = out.tokens[i];
        }
    }
    msm_engine_free(e);
    golden_done(&g);
}

Test(engine, kv_pool_hands_out_and_takes_back_blocks) {
    msm_kv_pool *p;
    cr_assert_eq(msm_kv_pool_new(5, &p), 0);
    cr_expect_eq(msm_kv_pool_total(p), 4);
    int32_t ids[5];
    cr_expect_eq(msm_kv_pool_alloc(p, 5, ids), -ENOSPC);
    cr_expect_eq(msm_kv_pool_n_free(p), 4);
    cr_assert_eq(msm_kv_pool_alloc(p, 4, ids), 0);
    for (int i = 0; i < 4; i++) cr_expect(ids[i] >= 1 && ids[i] <= 4, "block 0 is reserved");
    msm_kv_pool_release(p, ids, 2);
    msm_kv_pool_release(p, ids, 2); /* double release is ignored */
    cr_expect_eq(msm_kv_pool_n_free(p), 2);
    msm_kv_pool_free(p);
}

Test(engine, dummy_weights_run_from_a_config_alone) {
    msm_engine_opts o = test_engine_opts(NULL, 2, true, true);
    o.dummy_preset = "tests/data/qwen2moe-gqa";
    msm_engine *e;
    msm_err err = {{0}};
    cr_assert_eq(msm_engine_new(&o, &e, &err), 0, "%s", err.msg);
    int32_t prompt[3] = {5, 6, 7};
    msm_generate_opts go = {.max_new = 4, .ignore_eos = true};
    msm_generation a, b;
    cr_assert_eq(msm_generate(e, prompt, 3, &go, &a, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_generate(e, prompt, 3, &go, &b, &err), 0, "%s", err.msg);
    cr_expect_eq(memcmp(a.ids, b.ids, sizeof(int32_t) * 4), 0, "dummy weights are deterministic");
    msm_generation_done(&a);
    msm_generation_done(&b);
    msm_engine_free(e);
}

Test(engine, load_errors_name_the_problem) {
    msm_engine_opts o = test_engine_opts("/nonexistent/model", 1, true, true);
    msm_engine *e;
    msm_err err = {{0}};
    cr_expect_neq(msm_engine_new(&o, &e, &err), 0);
    cr_expect(strstr(err.msg, "/nonexistent/model"), "%s", err.msg);
}

/* Logits of every row of one prefill step of prompt 0 of the golden qwen2moe-gqa model. */
static int prefill_logits(bool kv_bf16, float **ret, int *rows, int *vocab) {
    golden g;
    cr_assert_eq(golden_load("tests/data/qwen2moe-gqa", &g), 0);
    msm_engine_opts o = test_engine_opts("tests/data/qwen2moe-gqa", 1, true, true);
    o.kv_bf16 = kv_bf16;
    msm_engine *e;
    msm_err err = {{0}};
    cr_assert_eq(msm_engine_new(&o, &e, &err), 0, "%s", err.msg);
    int32_t blocks[4], toks[32];
    int P = 0;
    for (int i = 0; i < g.prompt_len[0]; i++) toks[P++] = g.prompt[0][i];
    for (int i = 0; i < 12; i++) toks[P++] = g.gen[0][i]; /* a longer context than the prompt */
    cr_assert_eq(msm_kv_pool_alloc(msm_engine_kv(e), 4, blocks), 0);
    msm_step_seq s = {.tokens = toks, .n_tokens = P, .blocks = blocks, .n_blocks = 4, .output = MSM_STEP_OUTPUT_ALL_LOGITS};
    msm_step_out out;
    cr_assert_eq(msm_engine_step(e, &s, 1, &out, &err), 0, "%s", err.msg);
    *vocab = msm_engine_model(e)->vocab;
    *rows = out.n_rows;
    *ret = malloc(sizeof(float) * (size_t)out.n_rows * (size_t)*vocab);
    memcpy(*ret, out.logits, sizeof(float) * (size_t)out.n_rows * (size_t)*vocab);
    msm_engine_free(e);
    golden_done(&g);
    return P;
}

/* kv_bf16 (the CUDA cache's format on the CPU, for like-for-like comparisons): every row after the
 * first attends to rounded K/V, so its logits move by bf16-sized amounts; row 0 attends only to its
 * own K/V (softmax weight 1, V rounded) and moves too; nothing is bitwise equal, nothing is far. */
Test(engine, kv_bf16_rounds_the_cache_like_the_cuda_backend) {
    float *a, *b;
    int ra, rb, va, vb;
    int P = prefill_logits(false, &a, &ra, &va);
    prefill_logits(true, &b, &rb, &vb);
    cr_assert_eq(ra, P);
    cr_assert_eq(rb, P);
    double num = 0, den = 0;
    int differ = 0;
    for (size_t i = 0; i < (size_t)P * (size_t)va; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)a[i] * a[i];
        differ += a[i] != b[i];
    }
    double rel = sqrt(num / den);
    cr_expect_gt(differ, 0, "the bf16 cache changed nothing");
    cr_expect_gt(rel, 1e-5, "rel %g: too small for bf16 rounding of K/V", rel);
    cr_expect_lt(rel, 1e-1, "rel %g: more than bf16 rounding of K/V", rel);
    free(a);
    free(b);
}

/* msm_engine_validate: what msm_engine_new checks before reading a weight byte, on every golden
 * model, and the errors of a model that cannot serve. */
Test(engine, validate_checks_without_loading) {
    static const char *dirs[] = {"tests/data/qwen2moe-gqa", "tests/data/qwen2moe-mha-tied", "tests/data/qwen3moe",
                                 "tests/data/mixtral"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        msm_engine_opts o = test_engine_opts(dirs[i], 2, true, true);
        msm_model_config mc;
        int ctx = 0;
        msm_err err = {{0}};
        cr_assert_eq(msm_engine_validate(&o, &mc, &ctx, &err), 0, "%s: %s", dirs[i], err.msg);
        cr_assert_gt(ctx, 1);
        cr_assert_leq(ctx, mc.max_position);
    }
    msm_engine_opts o = test_engine_opts("tests/data/qwen2moe-gqa", 3, true, true);
    msm_model_config mc;
    int ctx;
    msm_err err = {{0}};
    cr_assert_neq(msm_engine_validate(&o, &mc, &ctx, &err), 0, "tp 3 does not divide the heads");
    cr_assert(strstr(err.msg, "does not divide"), "%s", err.msg);
    o = test_engine_opts("/nonexistent", 1, true, true);
    cr_assert_neq(msm_engine_validate(&o, &mc, &ctx, &err), 0);
    cr_assert(strstr(err.msg, "/nonexistent"), "%s", err.msg);
}

/* After an execution failure (here the test switch's injected failure on the CPU backend) the
 * engine is not trusted again: that step and every later one return -ENOTRECOVERABLE. */
Test(engine, an_execution_failure_is_unrecoverable, .timeout = 60) {
    msm_engine_opts o = test_engine_opts("tests/data/qwen2moe-gqa", 1, true, true);
    o.test_fault = MSM_TEST_FAULT_LAUNCH;
    o.test_fault_step = 2;
    msm_engine *e;
    msm_err err = {{0}};
    cr_assert_eq(msm_engine_new(&o, &e, &err), 0, "%s", err.msg);
    int32_t blocks[2], tok[3] = {1, 2, 3};
    cr_assert_eq(msm_kv_pool_alloc(msm_engine_kv(e), 2, blocks), 0);
    msm_step_seq s = {.tokens = tok, .n_tokens = 3, .blocks = blocks, .n_blocks = 2, .output = MSM_STEP_OUTPUT_SAMPLE};
    msm_step_out out;
    cr_assert_eq(msm_engine_step(e, &s, 1, &out, &err), 0, "%s", err.msg);
    s.pos0 = 3;
    s.tokens = out.tokens;
    s.n_tokens = 1;
    cr_assert_eq(msm_engine_step(e, &s, 1, &out, &err), -ENOTRECOVERABLE);
    cr_assert(strstr(err.msg, "injected fault") && strstr(err.msg, "cannot run another step"), "%s", err.msg);
    cr_assert_eq(msm_engine_step(e, &s, 1, &out, &err), -ENOTRECOVERABLE);
    msm_engine_free(e);
    /* a step past the deadline (the aux stream stuck) */
    o.test_fault = MSM_TEST_FAULT_HANG;
    o.test_fault_step = 1;
    o.deadline_ms = 100;
    cr_assert_eq(msm_engine_new(&o, &e, &err), 0, "%s", err.msg);
    cr_assert_eq(msm_kv_pool_alloc(msm_engine_kv(e), 2, blocks), 0);
    s = (msm_step_seq){.tokens = tok, .n_tokens = 3, .blocks = blocks, .n_blocks = 2, .output = MSM_STEP_OUTPUT_SAMPLE};
    cr_assert_eq(msm_engine_step(e, &s, 1, &out, &err), -ENOTRECOVERABLE);
    cr_assert(strstr(err.msg, "timed out") || strstr(err.msg, "did not finish"), "%s", err.msg);
    msm_engine_free(e);
}

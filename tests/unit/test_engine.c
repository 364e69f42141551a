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

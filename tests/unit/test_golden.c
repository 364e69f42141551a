/* The CPU engine against HF transformers: logits of every golden prompt within 1e-3 of the
 * reference's largest magnitude, identical greedy tokens (FP8 checkpoints included); and the stories260K MoE reproduces
 * llama2.c's run.c greedy sample. Goldens: tests/golden/make_golden.py (committed outputs). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <json-c/json.h>

#include "msm_generate.h"
#include "testutil.h"

static void check_model(const char *dir) {
    golden g;
    cr_assert_eq(golden_load(dir, &g), 0, "cannot load goldens of %s", dir);
    msm_engine_opts o = test_engine_opts(dir, 1, false, false);
    msm_engine *e;
    msm_err err = {{0}};
    cr_assert_eq(msm_engine_new(&o, &e, &err), 0, "%s", err.msg);
    for (int i = 0; i < g.n; i++) {
        msm_generate_opts go = {.max_new = g.gen_len[i], .ignore_eos = true, .dump_logits = true};
        msm_generation out;
        cr_assert_eq(msm_generate(e, g.prompt[i], g.prompt_len[i], &go, &out, &err), 0, "%s", err.msg);
        cr_assert_eq(out.n, g.gen_len[i]);
        for (int t = 0; t < out.n; t++)
            cr_expect_eq(out.ids[t], g.gen[i][t], "%s prompt %d: token %d is %d, HF has %d", dir, i, t,
                         out.ids[t], g.gen[i][t]);
        cr_assert_eq(out.n_rows, g.rows[i]);
        cr_assert_eq(msm_engine_model(e)->vocab, g.cols[i]);
        double rel = rel_max_diff(out.logits, g.logits[i], (size_t)g.rows[i] * (size_t)g.cols[i]);
        cr_expect_leq(rel, 1e-3, "%s prompt %d: max|diff|/max|ref| = %g", dir, i, rel);
        msm_generation_done(&out);
    }
    msm_engine_free(e);
    golden_done(&g);
}

Test(golden, qwen2moe_gqa_dense_layer_matches_hf) { check_model("tests/data/qwen2moe-gqa"); }
Test(golden, qwen2moe_mha_tied_sharded_matches_hf) { check_model("tests/data/qwen2moe-mha-tied"); }
Test(golden, qwen3moe_qk_norm_matches_hf) { check_model("tests/data/qwen3moe"); }
Test(golden, mixtral_matches_hf) { check_model("tests/data/mixtral"); }
/* dense layer 0, sigmoid router with a random selection bias over 4 groups (2 kept), 2 shared
 * experts, partial RoPE (8 of 16 dims), qkv bias, q/k norm, MTP tensors left unused */
Test(golden, glm4moe_grouped_router_partial_rope_matches_hf) { check_model("tests/data/glm4moe"); }
/* FP8 block-scaled checkpoints against HF float32 on the same weights dequantised by the
 * generator (DeepSeek-V3's weight_dequant): qwen3moe-fp8 has hidden 192 (every projection has a
 * full and a partial 128-block along it) in 6 shards, scales apart from their weights; glm4moe-fp8
 * a dense layer of intermediate 192, a bf16 o_proj and a shared expert half FP8, half bf16 */
Test(golden, qwen3moe_fp8_block_scaled_matches_hf_on_the_dequantised_weights) { check_model("tests/data/qwen3moe-fp8"); }
Test(golden, glm4moe_fp8_block_scaled_matches_hf_on_the_dequantised_weights) { check_model("tests/data/glm4moe-fp8"); }

Test(golden, stories260k_moe_reproduces_llama2c_run_c) {
    json_object *root = json_object_from_file("tests/data/stories260k_dragon.json");
    cr_assert_not_null(root);
    json_object *p, *x;
    cr_assert(json_object_object_get_ex(root, "prompt_ids", &p));
    cr_assert(json_object_object_get_ex(root, "expected_ids", &x));
    int P = (int)json_object_array_length(p), N = (int)json_object_array_length(x);
    int32_t prompt[64];
    cr_assert_leq(P, 64);
    for (int i = 0; i < P; i++) prompt[i] = json_object_get_int(json_object_array_get_idx(p, (size_t)i));
    msm_engine_opts o = test_engine_opts("models/stories260k-moe", 1, true, true);
    o.max_step_tokens = 8; /* also exercises chunked prefill */
    msm_engine *e;
    msm_err err = {{0}};
    cr_assert_eq(msm_engine_new(&o, &e, &err), 0, "%s", err.msg);
    msm_generate_opts go = {.max_new = N};
    msm_generation out;
    cr_assert_eq(msm_generate(e, prompt, P, &go, &out, &err), 0, "%s", err.msg);
    cr_assert_eq(out.n, N, "generated %d tokens, run.c %d", out.n, N);
    for (int i = 0; i < N; i++)
        cr_assert_eq(out.ids[i], json_object_get_int(json_object_array_get_idx(x, (size_t)i)),
                     "token %d differs from llama2.c", i);
    msm_generation_done(&out);
    msm_engine_free(e);
    json_object_put(root);
}

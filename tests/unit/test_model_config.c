/* Tests of msm_model_config: each family in both config styles (Hub and transformers 5), the
 * sparse-layer rule, generation_config.json overrides, and one refused config per validation,
 * each checked for a message naming the file and the key. */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <ftw.h>
#include <json-c/json.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "msm_model_config.h"

#define assert_has(msg, s) cr_assert_not_null(strstr((msg), (s)), "'%s' not in: %s", (s), (msg))

/* Qwen1.5-MoE-A2.7B's config.json, as on the Hub. */
static const char *qwen2_hub =
    "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"bos_token_id\": 151643,"
    " \"decoder_sparse_step\": 1, \"eos_token_id\": 151643, \"hidden_act\": \"silu\","
    " \"hidden_size\": 2048, \"intermediate_size\": 5632, \"max_position_embeddings\": 8192,"
    " \"max_window_layers\": 21, \"model_type\": \"qwen2_moe\", \"moe_intermediate_size\": 1408,"
    " \"norm_topk_prob\": false, \"num_attention_heads\": 16, \"num_experts\": 60,"
    " \"num_experts_per_tok\": 4, \"num_hidden_layers\": 24, \"num_key_value_heads\": 16,"
    " \"output_router_logits\": false, \"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0,"
    " \"router_aux_loss_coef\": 0.001, \"shared_expert_intermediate_size\": 5632,"
    " \"sliding_window\": 32768, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.40.0.dev0\", \"use_cache\": true,"
    " \"use_sliding_window\": false, \"vocab_size\": 151936}";

/* Qwen3-30B-A3B's config.json, Hub style. */
static const char *qwen3_hub =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false,"
    " \"attention_dropout\": 0.0, \"bos_token_id\": 151643, \"decoder_sparse_step\": 1,"
    " \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
    " \"initializer_range\": 0.02, \"intermediate_size\": 6144, \"max_position_embeddings\": 40960,"
    " \"max_window_layers\": 48, \"mlp_only_layers\": [], \"model_type\": \"qwen3_moe\","
    " \"moe_intermediate_size\": 768, \"norm_topk_prob\": true, \"num_attention_heads\": 32,"
    " \"num_experts\": 128, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 48,"
    " \"num_key_value_heads\": 4, \"output_router_logits\": false, \"rms_norm_eps\": 1e-06,"
    " \"rope_scaling\": null, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.001,"
    " \"sliding_window\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"use_cache\": true, \"use_sliding_window\": false, \"vocab_size\": 151936}";

/* The same model as transformers 5 writes it: `dtype` and `rope_parameters`. */
static const char *qwen3_tf5 =
    "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"attention_bias\": false,"
    " \"bos_token_id\": 151643, \"decoder_sparse_step\": 1, \"dtype\": \"bfloat16\","
    " \"eos_token_id\": 151645, \"head_dim\": 128, \"hidden_act\": \"silu\", \"hidden_size\": 2048,"
    " \"intermediate_size\": 6144, \"max_position_embeddings\": 40960, \"mlp_only_layers\": [],"
    " \"model_type\": \"qwen3_moe\", \"moe_intermediate_size\": 768, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 32, \"num_experts\": 128, \"num_experts_per_tok\": 8,"
    " \"num_hidden_layers\": 48, \"num_key_value_heads\": 4, \"rms_norm_eps\": 1e-06,"
    " \"rope_parameters\": {\"rope_theta\": 1000000.0, \"rope_type\": \"default\"},"
    " \"sliding_window\": null, \"tie_word_embeddings\": false, \"use_sliding_window\": false,"
    " \"vocab_size\": 151936}";

/* Mixtral-8x7B, Hub style. */
static const char *mixtral_hub =
    "{\"architectures\": [\"MixtralForCausalLM\"], \"attention_dropout\": 0.0,"
    " \"bos_token_id\": 1, \"eos_token_id\": 2, \"hidden_act\": \"silu\", \"hidden_size\": 4096,"
    " \"intermediate_size\": 14336, \"max_position_embeddings\": 32768, \"model_type\": \"mixtral\","
    " \"num_attention_heads\": 32, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 32,"
    " \"num_key_value_heads\": 8, \"num_local_experts\": 8, \"output_router_logits\": false,"
    " \"rms_norm_eps\": 1e-05, \"rope_theta\": 1000000.0, \"router_aux_loss_coef\": 0.02,"
    " \"sliding_window\": null, \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"vocab_size\": 32000}";

/* GLM-4.5-Air's config.json, Hub style (transformers 4.54: top-level rope_theta and
 * partial_rotary_factor, torch_dtype). */
static const char *glm45_air_hub =
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"attention_bias\": true,"
    " \"attention_dropout\": 0.0, \"pad_token_id\": 151329,"
    " \"eos_token_id\": [151329, 151336, 151338], \"head_dim\": 128, \"hidden_act\": \"silu\","
    " \"hidden_size\": 4096, \"partial_rotary_factor\": 0.5, \"initializer_range\": 0.02,"
    " \"intermediate_size\": 10944, \"max_position_embeddings\": 131072, \"model_type\": \"glm4_moe\","
    " \"moe_intermediate_size\": 1408, \"norm_topk_prob\": true, \"num_attention_heads\": 96,"
    " \"n_group\": 1, \"topk_group\": 1, \"n_routed_experts\": 128, \"n_shared_experts\": 1,"
    " \"routed_scaling_factor\": 1.0, \"num_experts_per_tok\": 8, \"first_k_dense_replace\": 1,"
    " \"num_hidden_layers\": 46, \"num_key_value_heads\": 8, \"rms_norm_eps\": 1e-05,"
    " \"rope_scaling\": null, \"rope_theta\": 1000000, \"num_nextn_predict_layers\": 1,"
    " \"tie_word_embeddings\": false, \"torch_dtype\": \"bfloat16\","
    " \"transformers_version\": \"4.54.0\", \"use_cache\": true, \"use_qk_norm\": false,"
    " \"vocab_size\": 151552}";

/* The same model as transformers 5 writes it: `dtype`, `rope_parameters` holding the base and the
 * rotary fraction (a top-level copy of the fraction too), `num_nextn_predict_layers`. */
static const char *glm45_air_tf5 =
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"attention_bias\": true,"
    " \"dtype\": \"bfloat16\", \"eos_token_id\": [151329, 151336, 151338], \"head_dim\": 128,"
    " \"hidden_act\": \"silu\", \"hidden_size\": 4096, \"intermediate_size\": 10944,"
    " \"max_position_embeddings\": 131072, \"moe_intermediate_size\": 1408, \"n_group\": 1,"
    " \"n_routed_experts\": 128, \"n_shared_experts\": 1, \"norm_topk_prob\": true,"
    " \"num_attention_heads\": 96, \"num_experts_per_tok\": 8, \"num_hidden_layers\": 46,"
    " \"num_key_value_heads\": 8, \"num_nextn_predict_layers\": 1, \"first_k_dense_replace\": 1,"
    " \"pad_token_id\": 151329, \"partial_rotary_factor\": 0.5, \"rms_norm_eps\": 1e-05,"
    " \"rope_parameters\": {\"partial_rotary_factor\": 0.5, \"rope_theta\": 1000000,"
    " \"rope_type\": \"default\"}, \"routed_scaling_factor\": 1.0, \"tie_word_embeddings\": false,"
    " \"topk_group\": 1, \"use_qk_norm\": false, \"vocab_size\": 151552}";

static int parse(const char *json, msm_model_config *c, msm_err *err) {
    return msm_model_config_parse(json, strlen(json), "config.json", c, err);
}

static void parse_ok(const char *json, msm_model_config *c) {
    msm_err err = {0};
    int rc = parse(json, c, &err);
    cr_assert_eq(rc, 0, "rc %d: %s", rc, err.msg);
}

Test(model_config, qwen2_moe_hub_config_parses_every_field) {
    msm_model_config c;
    parse_ok(qwen2_hub, &c);
    cr_assert_eq(c.arch, MSM_ARCH_QWEN2_MOE);
    cr_assert_str_eq(c.arch_name, "Qwen2MoeForCausalLM");
    cr_assert_eq(c.hidden, 2048);
    cr_assert_eq(c.n_layers, 24);
    cr_assert_eq(c.n_heads, 16);
    cr_assert_eq(c.n_kv_heads, 16);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.vocab, 151936);
    cr_assert_eq(c.intermediate, 5632);
    cr_assert_eq(c.moe_intermediate, 1408);
    cr_assert_eq(c.shared_intermediate, 5632);
    cr_assert_eq(c.n_experts, 60);
    cr_assert_eq(c.top_k, 4);
    cr_assert_not(c.norm_topk_prob);
    cr_assert_not(c.tie_word_embeddings);
    cr_assert(c.qkv_bias);
    cr_assert_not(c.qk_norm);
    for (int l = 0; l < c.n_layers; l++) {
        cr_assert(c.sparse[l], "layer %d", l);
        cr_assert(msm_model_config_has_shared(&c, l));
    }
    cr_assert_float_eq(c.rms_eps, 1e-6f, 1e-12f);
    cr_assert_float_eq(c.rope_theta, 1e6f, 1e-3f);
    cr_assert_eq(c.max_position, 8192);
    cr_assert_eq(c.dtype, MSM_BF16);
    cr_assert_eq(c.bos_id, 151643);
    cr_assert_eq(c.n_eos, 1);
    cr_assert_eq(c.eos_ids[0], 151643);
}

static void check_qwen3_30b(const msm_model_config *c) {
    cr_assert_eq(c->arch, MSM_ARCH_QWEN3_MOE);
    cr_assert_eq(c->hidden, 2048);
    cr_assert_eq(c->n_layers, 48);
    cr_assert_eq(c->n_heads, 32);
    cr_assert_eq(c->n_kv_heads, 4);
    cr_assert_eq(c->head_dim, 128, "head_dim is its own key, not hidden / heads = 64");
    cr_assert_eq(c->n_experts, 128);
    cr_assert_eq(c->top_k, 8);
    cr_assert_eq(c->moe_intermediate, 768);
    cr_assert_eq(c->intermediate, 6144);
    cr_assert_eq(c->shared_intermediate, 0);
    cr_assert(c->norm_topk_prob);
    cr_assert(c->qk_norm);
    cr_assert_not(c->qkv_bias);
    for (int l = 0; l < c->n_layers; l++) {
        cr_assert(c->sparse[l]);
        cr_assert_not(msm_model_config_has_shared(c, l));
    }
    cr_assert_float_eq(c->rope_theta, 1e6f, 1e-3f);
    cr_assert_eq(c->dtype, MSM_BF16);
    cr_assert_eq(c->max_position, 40960);
    cr_assert_eq(c->n_eos, 1);
    cr_assert_eq(c->eos_ids[0], 151645);
}

Test(model_config, qwen3_moe_hub_and_transformers5_styles_agree) {
    msm_model_config hub, tf5;
    parse_ok(qwen3_hub, &hub);
    parse_ok(qwen3_tf5, &tf5);
    check_qwen3_30b(&hub);
    check_qwen3_30b(&tf5);
    cr_assert_eq(memcmp(&hub, &tf5, sizeof hub), 0);
}

Test(model_config, qwen3_attention_bias_turns_on_qkv_bias) {
    char *j = strdup(qwen3_hub);
    char *p = strstr(j, "\"attention_bias\": false");
    memcpy(p, "\"attention_bias\": true ", strlen("\"attention_bias\": true "));
    msm_model_config c;
    parse_ok(j, &c);
    cr_assert(c.qkv_bias);
    free(j);
}

Test(model_config, mixtral_uses_intermediate_size_for_experts_and_always_renormalises) {
    msm_model_config c;
    parse_ok(mixtral_hub, &c);
    cr_assert_eq(c.arch, MSM_ARCH_MIXTRAL);
    cr_assert_eq(c.n_experts, 8);
    cr_assert_eq(c.top_k, 2);
    cr_assert_eq(c.moe_intermediate, 14336);
    cr_assert_eq(c.intermediate, 14336);
    cr_assert_eq(c.shared_intermediate, 0);
    cr_assert(c.norm_topk_prob);
    cr_assert_not(c.qkv_bias);
    cr_assert_not(c.qk_norm);
    cr_assert_eq(c.n_kv_heads, 8);
    cr_assert_eq(c.head_dim, 128);
    cr_assert_eq(c.vocab, 32000);
    for (int l = 0; l < c.n_layers; l++) cr_assert(c.sparse[l]);
    cr_assert_eq(c.bos_id, 1);
    cr_assert_eq(c.eos_ids[0], 2);
}

Test(model_config, mixtral_in_transformers5_style_ignores_norm_topk_prob_false) {
    const char *j =
        "{\"architectures\": [\"MixtralForCausalLM\"], \"hidden_size\": 64,"
        " \"intermediate_size\": 96, \"num_attention_heads\": 4, \"num_experts_per_tok\": 2,"
        " \"num_hidden_layers\": 2, \"num_key_value_heads\": 2, \"num_local_experts\": 4,"
        " \"norm_topk_prob\": false, \"dtype\": \"float16\", \"head_dim\": null,"
        " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000},"
        " \"vocab_size\": 100}";
    msm_model_config c;
    parse_ok(j, &c);
    cr_assert(c.norm_topk_prob);
    cr_assert_eq(c.dtype, MSM_F16);
    cr_assert_eq(c.head_dim, 16);
    cr_assert_float_eq(c.rope_theta, 500000.0f, 1e-3f);
    cr_assert_float_eq(c.rms_eps, 1e-5f, 1e-12f);
}

/* A small Qwen2-MoE config with only the required keys. */
#define MINI_QWEN2(extra)                                                                     \
    "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"hidden_size\": 64,"                    \
    " \"num_hidden_layers\": 6, \"num_attention_heads\": 4, \"vocab_size\": 128,"             \
    " \"num_experts\": 8, \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32,"         \
    " \"shared_expert_intermediate_size\": 48" extra "}"

Test(model_config, absent_optional_keys_take_their_defaults) {
    msm_model_config c;
    parse_ok(MINI_QWEN2(""), &c);
    cr_assert_eq(c.n_kv_heads, 4);
    cr_assert_eq(c.head_dim, 16);
    cr_assert_float_eq(c.rope_theta, 10000.0f, 1e-3f);
    cr_assert_eq(c.dtype, MSM_BF16);
    cr_assert_not(c.tie_word_embeddings);
    cr_assert_not(c.norm_topk_prob);
    cr_assert_eq(c.bos_id, -1);
    cr_assert_eq(c.n_eos, 0);
    cr_assert_eq(c.intermediate, 0);
    cr_assert_gt(c.max_position, 0);
    cr_assert_gt(c.rms_eps, 0);
}

Test(model_config, eos_list_and_float32_dtype_and_tied_embeddings) {
    msm_model_config c;
    parse_ok(MINI_QWEN2(", \"eos_token_id\": [5, 7, 9], \"torch_dtype\": \"float32\","
                        " \"tie_word_embeddings\": true"), &c);
    cr_assert_eq(c.n_eos, 3);
    cr_assert_eq(c.eos_ids[2], 9);
    cr_assert_eq(c.dtype, MSM_F32);
    cr_assert(c.tie_word_embeddings);
}

Test(model_config, sparse_step_and_mlp_only_layers_choose_the_moe_layers) {
    msm_model_config c;
    parse_ok(MINI_QWEN2(", \"decoder_sparse_step\": 2, \"mlp_only_layers\": [3],"
                        " \"intermediate_size\": 80"), &c);
    /* (layer+1) % 2 == 0 gives 1, 3, 5; layer 3 is forced dense. */
    const bool want[6] = {false, true, false, false, false, true};
    for (int l = 0; l < 6; l++) {
        cr_assert_eq(c.sparse[l], want[l], "layer %d", l);
        cr_assert_eq(msm_model_config_has_shared(&c, l), want[l], "layer %d", l);
    }
    cr_assert_eq(c.intermediate, 80);
}

Test(model_config, dense_layers_without_intermediate_size_name_the_key) {
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(parse(MINI_QWEN2(", \"mlp_only_layers\": [0]"), &c, &err), -EINVAL);
    assert_has(err.msg, "config.json: key 'intermediate_size'");
    assert_has(err.msg, "layer 0");
}

Test(model_config, unknown_architecture_lists_the_supported_ones) {
    msm_model_config c;
    msm_err err = {0};
    const char *j = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 64}";
    cr_assert_eq(parse(j, &c, &err), -EINVAL);
    cr_assert_str_eq(err.msg, "config.json: architecture 'LlamaForCausalLM' is not supported "
                              "(supported: Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, "
                              "Glm4MoeForCausalLM)");
}

Test(model_config, scaled_rope_is_refused_in_either_style) {
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(parse(MINI_QWEN2(", \"rope_parameters\": {\"rope_type\": \"yarn\", \"factor\": 4}"),
                       &c, &err), -EINVAL);
    assert_has(err.msg, "config.json: rope_parameters.rope_type 'yarn' is not supported");
    cr_assert_eq(parse(MINI_QWEN2(", \"rope_scaling\": {\"type\": \"linear\", \"factor\": 2}"),
                       &c, &err), -EINVAL);
    assert_has(err.msg, "rope_scaling.type 'linear' is not supported");
}

Test(model_config, invalid_json_names_the_source) {
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(msm_model_config_parse("{\"a\": ", 6, "models/x/config.json", &c, &err), -EINVAL);
    assert_has(err.msg, "models/x/config.json: not valid JSON");
    cr_assert_eq(msm_model_config_parse("[1]", 3, "config.json", &c, &err), -EINVAL);
    assert_has(err.msg, "config.json: must be a JSON object");
    cr_assert_eq(msm_model_config_parse("{} {}", 5, "config.json", &c, &err), -EINVAL);
}

Test(model_config, parse_reads_only_len_bytes) {
    char buf[2048];
    int n = snprintf(buf, sizeof buf, "%s", MINI_QWEN2(""));
    memcpy(buf + n, "garbage", 8);
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(msm_model_config_parse(buf, (size_t)n, "config.json", &c, &err), 0, "%s", err.msg);
}

Test(model_config, transformers5_qwen3_with_num_local_experts_and_layer_types) {
    const char *fmt =
        "{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"dtype\": \"bfloat16\", \"head_dim\": 16,"
        " \"hidden_size\": 64, \"intermediate_size\": 96, \"moe_intermediate_size\": 32,"
        " \"num_attention_heads\": 8, \"num_experts_per_tok\": 2, \"num_hidden_layers\": 2,"
        " \"num_key_value_heads\": 4, \"num_local_experts\": 8, \"vocab_size\": 256,"
        " \"layer_types\": [\"full_attention\", \"%s\"], \"pad_token_id\": null,"
        " \"rope_parameters\": {\"rope_theta\": 10000.0, \"rope_type\": \"default\"}}";
    char j[1024];
    snprintf(j, sizeof j, fmt, "full_attention");
    msm_model_config c;
    parse_ok(j, &c);
    cr_assert_eq(c.n_experts, 8);
    cr_assert_eq(c.head_dim, 16);
    cr_assert_not(c.qkv_bias);

    msm_err err = {0};
    snprintf(j, sizeof j, fmt, "sliding_attention");
    cr_assert_eq(parse(j, &c, &err), -EINVAL);
    assert_has(err.msg, "key 'layer_types': layer 1");
}

Test(model_config, transformers5_qwen2_qkv_bias_key_is_read) {
    msm_model_config c;
    parse_ok(MINI_QWEN2(", \"qkv_bias\": false"), &c);
    cr_assert_not(c.qkv_bias);
    parse_ok(MINI_QWEN2(", \"qkv_bias\": true, \"sliding_window\": 0"), &c);
    cr_assert(c.qkv_bias);
}

Test(model_config, mixtral_sliding_window_shorter_than_context_is_refused) {
    char *j = strdup(mixtral_hub);
    char *p = strstr(j, "\"sliding_window\": null");
    memcpy(p, "\"sliding_window\": 4096", 22);
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(parse(j, &c, &err), -EINVAL);
    assert_has(err.msg, "sliding_window 4096");
    free(j);
}

/* ---- one refused config per check: start from qwen3_hub and change one key --------------- */

typedef struct bad_key {
    char key[40];
    char value[64];    /* JSON text; "" deletes the key */
    char want[120];    /* must appear in the message */
} bad_key;

static bad_key bad_keys[] = {
    {"hidden_size", "", "config.json: key 'hidden_size' must be a positive integer (missing)"},
    {"hidden_size", "\"2048\"", "config.json: key 'hidden_size' must be a positive integer (got a string)"},
    {"hidden_size", "-1", "config.json: key 'hidden_size' must be a positive integer (got -1)"},
    {"hidden_size", "2048.5", "key 'hidden_size' must be a positive integer (got a non-integer number)"},
    {"num_hidden_layers", "300", "key 'num_hidden_layers' must be at most 256 (got 300)"},
    {"num_hidden_layers", "0", "key 'num_hidden_layers' must be a positive integer (got 0)"},
    {"num_attention_heads", "", "key 'num_attention_heads'"},
    {"num_key_value_heads", "3", "key 'num_key_value_heads' (3) must divide num_attention_heads (32)"},
    {"num_key_value_heads", "0", "key 'num_key_value_heads'"},
    {"vocab_size", "0", "key 'vocab_size' must be a positive integer (got 0)"},
    {"num_experts", "", "key 'num_experts'"},
    {"num_experts_per_tok", "129", "key 'num_experts_per_tok' (129) must not exceed num_experts (128)"},
    {"moe_intermediate_size", "", "key 'moe_intermediate_size'"},
    {"head_dim", "127", "key 'head_dim' must be even"},
    {"head_dim", "[128]", "key 'head_dim' must be a positive integer (got a list)"},
    {"torch_dtype", "\"int8\"", "key 'torch_dtype' must be \"bfloat16\", \"float16\" or \"float32\""},
    {"torch_dtype", "16", "key 'torch_dtype' must be a string"},
    {"rms_norm_eps", "-1", "key 'rms_norm_eps' must be a positive number"},
    {"rms_norm_eps", "1e-106", "key 'rms_norm_eps' must be a positive number that fits a float"},
    {"rope_theta", "1e39", "key 'rope_theta' must be a positive number that fits a float"},
    {"rope_theta", "\"1e6\"", "key 'rope_theta' must be a positive number (got a string)"},
    {"rope_parameters", "[]", "key 'rope_parameters' must be an object"},
    {"rope_parameters", "{\"rope_theta\": 0}", "key 'rope_parameters.rope_theta' must be a positive number"},
    {"norm_topk_prob", "\"yes\"", "key 'norm_topk_prob' must be true or false"},
    {"tie_word_embeddings", "1", "key 'tie_word_embeddings' must be true or false"},
    {"attention_bias", "0", "key 'attention_bias'"},
    {"eos_token_id", "\"</s>\"", "key 'eos_token_id' must be a token id or a list"},
    {"eos_token_id", "151936", "key 'eos_token_id': token id 151936 is outside the vocabulary"},
    {"eos_token_id", "[1,2,3,4,5,6,7,8,9]", "key 'eos_token_id' lists 9 ids"},
    {"bos_token_id", "-5", "key 'bos_token_id'"},
    {"architectures", "", "key 'architectures' must be a non-empty list of strings"},
    {"architectures", "[]", "key 'architectures'"},
    {"architectures", "\"Qwen3MoeForCausalLM\"", "key 'architectures'"},
    {"mlp_only_layers", "[48]", "key 'mlp_only_layers': entry 0 must be a layer index in [0, 48)"},
    {"mlp_only_layers", "3", "key 'mlp_only_layers' must be a list"},
    {"decoder_sparse_step", "0", "key 'decoder_sparse_step' must be a positive integer (got 0)"},
    {"hidden_act", "\"gelu\"", "hidden_act 'gelu' is not supported"},
    {"use_sliding_window", "true", "use_sliding_window"},
    {"max_position_embeddings", "0", "key 'max_position_embeddings'"},
};

ParameterizedTestParameters(model_config, each_invalid_key_is_named_in_the_error) {
    return cr_make_param_array(bad_key, bad_keys, sizeof bad_keys / sizeof bad_keys[0]);
}

/* Parses `base` with key b->key set to b->value (deleted when empty): refused, naming it. */
static void expect_bad_key(const char *base, const bad_key *b) {
    struct json_object *root = json_tokener_parse(base);
    cr_assert_not_null(root);
    if (b->value[0]) json_object_object_add(root, b->key, json_tokener_parse(b->value));
    else json_object_object_del(root, b->key);
    const char *text = json_object_to_json_string(root);
    msm_model_config c;
    msm_err err = {0};
    int rc = parse(text, &c, &err);
    cr_assert_eq(rc, -EINVAL, "%s = %s: rc %d (%s)", b->key, b->value, rc, err.msg);
    assert_has(err.msg, b->want);
    json_object_put(root);
}

ParameterizedTest(bad_key *b, model_config, each_invalid_key_is_named_in_the_error) { expect_bad_key(qwen3_hub, b); }

/* ---- files: config.json + generation_config.json ---------------------------------------- */

static char dir[64];

static int rm_one(const char *p, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(p);
}

static void setup_dir(void) {
    strcpy(dir, "/tmp/msm-cfg-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
}

static void teardown_dir(void) { nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS); }

static void write_text(const char *name, const char *text) {
    char path[256];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
}

Test(model_config, generation_config_eos_ids_override_config, .init = setup_dir, .fini = teardown_dir) {
    write_text("config.json", qwen3_hub);
    write_text("generation_config.json",
               "{\"bos_token_id\": 151643, \"do_sample\": true, \"eos_token_id\": [151645, 151643],"
               " \"pad_token_id\": 151643, \"temperature\": 0.6, \"top_k\": 20, \"top_p\": 0.95}");
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(msm_model_config_load(dir, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 2);
    cr_assert_eq(c.eos_ids[0], 151645);
    cr_assert_eq(c.eos_ids[1], 151643);
    cr_assert_eq(c.n_experts, 128);

    write_text("generation_config.json", "{\"eos_token_id\": 7}");
    cr_assert_eq(msm_model_config_load(dir, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 1);
    cr_assert_eq(c.eos_ids[0], 7);

    write_text("generation_config.json", "{\"temperature\": 0.7}");
    cr_assert_eq(msm_model_config_load(dir, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 1);
    cr_assert_eq(c.eos_ids[0], 151645, "no eos in generation_config.json: config.json's stays");
}

Test(model_config, load_without_generation_config_uses_config_eos, .init = setup_dir, .fini = teardown_dir) {
    write_text("config.json", mixtral_hub);
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(msm_model_config_load(dir, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.n_eos, 1);
    cr_assert_eq(c.eos_ids[0], 2);
}

Test(model_config, bad_generation_config_is_named, .init = setup_dir, .fini = teardown_dir) {
    write_text("config.json", mixtral_hub);
    write_text("generation_config.json", "{\"eos_token_id\": \"2\"}");
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(msm_model_config_load(dir, &c, &err), -EINVAL);
    assert_has(err.msg, "generation_config.json: key 'eos_token_id'");
    write_text("generation_config.json", "{,");
    cr_assert_eq(msm_model_config_load(dir, &c, &err), -EINVAL);
    assert_has(err.msg, "generation_config.json: not valid JSON");
}

Test(model_config, missing_config_json_names_the_path, .init = setup_dir, .fini = teardown_dir) {
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(msm_model_config_load(dir, &c, &err), -ENOENT);
    assert_has(err.msg, dir);
    assert_has(err.msg, "config.json");
}

Test(model_config, load_errors_name_the_full_path, .init = setup_dir, .fini = teardown_dir) {
    write_text("config.json", "{\"architectures\": [\"Qwen3MoeForCausalLM\"]}");
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(msm_model_config_load(dir, &c, &err), -EINVAL);
    char want[128];
    snprintf(want, sizeof want, "%s/config.json: key 'hidden_size'", dir);
    assert_has(err.msg, want);
}

Test(model_config, load_of_a_file_reads_it_as_a_preset, .init = setup_dir, .fini = teardown_dir) {
    write_text("preset.json", mixtral_hub);
    write_text("generation_config.json", "{\"eos_token_id\": 9}");
    char path[128];
    snprintf(path, sizeof path, "%s/preset.json", dir);
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(msm_model_config_load(path, &c, &err), 0, "%s", err.msg);
    cr_assert_eq(c.arch, MSM_ARCH_MIXTRAL);
    cr_assert_eq(c.eos_ids[0], 2, "a preset is read alone");
}

/* ---- GLM-4.5 (Glm4MoeForCausalLM) ----------------------------------------------------- */

static void check_glm45_air(const msm_model_config *c) {
    cr_assert_eq(c->arch, MSM_ARCH_GLM4_MOE);
    cr_assert_str_eq(c->arch_name, "Glm4MoeForCausalLM");
    cr_assert_eq(c->hidden, 4096);
    cr_assert_eq(c->n_layers, 46);
    cr_assert_eq(c->n_heads, 96);
    cr_assert_eq(c->n_kv_heads, 8);
    cr_assert_eq(c->head_dim, 128, "head_dim is its own key (4096 / 96 is not an integer)");
    cr_assert_eq(c->rope_dim, 64, "partial_rotary_factor 0.5 of head_dim 128");
    cr_assert_eq(c->vocab, 151552);
    cr_assert_eq(c->intermediate, 10944);
    cr_assert_eq(c->moe_intermediate, 1408);
    cr_assert_eq(c->shared_intermediate, 1408, "1 shared expert of moe_intermediate_size");
    cr_assert_not(c->shared_gate);
    cr_assert_eq(c->n_experts, 128);
    cr_assert_eq(c->top_k, 8);
    cr_assert_eq(c->router, MSM_ROUTER_SIGMOID_GROUP);
    cr_assert_eq(c->n_group, 1);
    cr_assert_eq(c->topk_group, 1);
    cr_assert_float_eq(c->routed_scale, 1.0f, 0);
    cr_assert(c->norm_topk_prob);
    cr_assert(c->qkv_bias);
    cr_assert_not(c->qk_norm);
    cr_assert_not(c->tie_word_embeddings);
    cr_assert_not(c->sparse[0], "first_k_dense_replace 1: layer 0 is dense");
    for (int l = 1; l < c->n_layers; l++) {
        cr_assert(c->sparse[l], "layer %d", l);
        cr_assert(msm_model_config_has_shared(c, l), "layer %d", l);
    }
    cr_assert_not(msm_model_config_has_shared(c, 0));
    cr_assert_float_eq(c->rms_eps, 1e-5f, 1e-12f);
    cr_assert_float_eq(c->rope_theta, 1e6f, 1e-3f);
    cr_assert_eq(c->max_position, 131072);
    cr_assert_eq(c->dtype, MSM_BF16);
    cr_assert_eq(c->bos_id, -1);
    cr_assert_eq(c->n_eos, 3);
    cr_assert_eq(c->eos_ids[2], 151338);
    cr_assert_eq(c->n_mtp_layers, 1);
}

Test(model_config, glm45_air_hub_and_transformers5_styles_agree) {
    msm_model_config hub, tf5;
    parse_ok(glm45_air_hub, &hub);
    parse_ok(glm45_air_tf5, &tf5);
    check_glm45_air(&hub);
    check_glm45_air(&tf5);
    cr_assert_eq(memcmp(&hub, &tf5, sizeof hub), 0);
}

Test(model_config, other_families_rotate_the_whole_head_with_a_softmax_router) {
    msm_model_config c;
    const char *all[] = {qwen2_hub, qwen3_hub, qwen3_tf5, mixtral_hub};
    for (int i = 0; i < 4; i++) {
        parse_ok(all[i], &c);
        cr_assert_eq(c.rope_dim, c.head_dim, "config %d", i);
        cr_assert_eq(c.router, MSM_ROUTER_SOFTMAX, "config %d", i);
        cr_assert(c.n_group == 1 && c.topk_group == 1 && c.routed_scale == 1.0f && c.n_mtp_layers == 0);
        cr_assert_eq(c.shared_gate, c.shared_intermediate > 0, "config %d: Qwen2's shared expert is gated", i);
    }
}

/* A small GLM config with only the required keys, then `extra`. */
#define MINI_GLM(extra)                                                                        \
    "{\"architectures\": [\"Glm4MoeForCausalLM\"], \"hidden_size\": 64,"                      \
    " \"num_hidden_layers\": 5, \"num_attention_heads\": 4, \"vocab_size\": 128,"               \
    " \"n_routed_experts\": 16, \"num_experts_per_tok\": 4, \"moe_intermediate_size\": 32,"     \
    " \"intermediate_size\": 96" extra "}"

Test(model_config, glm_absent_keys_take_transformers_defaults) {
    msm_model_config c;
    parse_ok(MINI_GLM(""), &c);
    cr_assert_eq(c.head_dim, 16);
    cr_assert_eq(c.rope_dim, 8, "Glm4MoeConfig sets partial_rotary_factor 0.5 when absent");
    cr_assert_eq(c.shared_intermediate, 32, "n_shared_experts defaults to 1");
    cr_assert(c.norm_topk_prob, "norm_topk_prob defaults to true for GLM");
    cr_assert_not(c.qkv_bias);
    cr_assert_not(c.qk_norm);
    cr_assert(c.n_group == 1 && c.topk_group == 1 && c.routed_scale == 1.0f);
    cr_assert_not(c.sparse[0]);
    for (int l = 1; l < 5; l++) cr_assert(c.sparse[l], "layer %d", l);
    cr_assert_float_eq(c.rms_eps, 1e-5f, 1e-12f);
    cr_assert_eq(c.max_position, 131072);
    cr_assert_eq(c.n_mtp_layers, 0);
}

Test(model_config, glm_routing_groups_shared_experts_and_dense_layers_are_read) {
    msm_model_config c;
    parse_ok(MINI_GLM(", \"n_group\": 4, \"topk_group\": 2, \"routed_scaling_factor\": 2.5,"
                      " \"n_shared_experts\": 3, \"first_k_dense_replace\": 3, \"use_qk_norm\": true,"
                      " \"attention_bias\": true, \"norm_topk_prob\": false, \"num_experts_per_tok\": 8"), &c);
    cr_assert(c.n_group == 4 && c.topk_group == 2);
    cr_assert_float_eq(c.routed_scale, 2.5f, 0);
    cr_assert_eq(c.shared_intermediate, 96);
    cr_assert(c.qk_norm && c.qkv_bias);
    cr_assert_not(c.norm_topk_prob);
    const bool want[5] = {false, false, false, true, true};
    for (int l = 0; l < 5; l++) cr_assert_eq(c.sparse[l], want[l], "layer %d", l);
    /* no shared experts; every layer dense with first_k_dense_replace past the last layer */
    parse_ok(MINI_GLM(", \"n_shared_experts\": 0, \"first_k_dense_replace\": 0"), &c);
    cr_assert_eq(c.shared_intermediate, 0);
    for (int l = 0; l < 5; l++) cr_assert(c.sparse[l] && !msm_model_config_has_shared(&c, l));
    parse_ok(MINI_GLM(", \"first_k_dense_replace\": 9"), &c);
    for (int l = 0; l < 5; l++) cr_assert_not(c.sparse[l]);
}

Test(model_config, partial_rotary_factor_in_rope_parameters_wins_over_the_top_level) {
    msm_model_config c;
    parse_ok(MINI_GLM(", \"head_dim\": 32, \"partial_rotary_factor\": 0.25"), &c);
    cr_assert_eq(c.rope_dim, 8);
    parse_ok(MINI_GLM(", \"head_dim\": 32, \"partial_rotary_factor\": 0.25,"
                      " \"rope_parameters\": {\"rope_type\": \"default\", \"partial_rotary_factor\": 1.0,"
                      " \"rope_theta\": 500000}"), &c);
    cr_assert_eq(c.rope_dim, 32);
    cr_assert_float_eq(c.rope_theta, 500000.0f, 1e-3f);
    /* int(head_dim * factor), truncated as Python's int() does: 24 * 0.75 = 18 */
    parse_ok(MINI_GLM(", \"head_dim\": 24, \"partial_rotary_factor\": 0.75"), &c);
    cr_assert_eq(c.rope_dim, 18);
    /* any family may carry it (transformers 5's default RoPE reads it for all) */
    parse_ok(MINI_QWEN2(", \"rope_parameters\": {\"rope_theta\": 10000, \"partial_rotary_factor\": 0.5}"), &c);
    cr_assert_eq(c.rope_dim, 8);
}

/* One refused GLM config per check, starting from GLM-4.5-Air. */
static bad_key glm_bad_keys[] = {
    {"n_group", "3", "key 'n_group' (3) must divide n_routed_experts (128)"},
    {"n_group", "0", "key 'n_group' must be a positive integer (got 0)"},
    {"n_group", "128", "key 'n_group' (128) leaves 1 expert(s) a group"},
    {"topk_group", "2", "key 'topk_group' (2) must not exceed n_group (1)"},
    {"topk_group", "0", "key 'topk_group' must be a positive integer (got 0)"},
    {"routed_scaling_factor", "0", "key 'routed_scaling_factor' must be a positive number"},
    {"routed_scaling_factor", "\"2.5\"", "key 'routed_scaling_factor' must be a positive number (got a string)"},
    {"n_shared_experts", "-1", "key 'n_shared_experts' must be a non-negative integer (got -1)"},
    {"n_shared_experts", "4096", "key 'n_shared_experts' (4096) x moe_intermediate_size (1408) must be at most"},
    {"first_k_dense_replace", "-1", "key 'first_k_dense_replace' must be a non-negative integer (got -1)"},
    {"first_k_dense_replace", "true", "key 'first_k_dense_replace' must be a non-negative integer (got a boolean)"},
    {"num_nextn_predict_layers", "-2", "key 'num_nextn_predict_layers' must be a non-negative integer"},
    {"n_routed_experts", "", "key 'n_routed_experts' must be a positive integer (missing)"},
    {"partial_rotary_factor", "0", "key 'partial_rotary_factor' must be a number in (0, 1] (got 0)"},
    {"partial_rotary_factor", "1.5", "key 'partial_rotary_factor' must be a number in (0, 1] (got 1.5)"},
    {"partial_rotary_factor", "\"half\"", "key 'partial_rotary_factor' must be a number in (0, 1] (got a string)"},
    {"partial_rotary_factor", "0.0078125", "key 'partial_rotary_factor' (0.0078125) rotates 1 of head_dim 128"},
    {"partial_rotary_factor", "0.2", "key 'partial_rotary_factor' (0.2) rotates 25 of head_dim 128"},
    {"rope_parameters", "{\"partial_rotary_factor\": -1}", "key 'rope_parameters.partial_rotary_factor' must be"},
    {"use_qk_norm", "1", "key 'use_qk_norm' must be true or false"},
    {"attention_bias", "\"yes\"", "key 'attention_bias' must be true or false"},
};

ParameterizedTestParameters(model_config, each_invalid_glm_key_is_named_in_the_error) {
    return cr_make_param_array(bad_key, glm_bad_keys, sizeof glm_bad_keys / sizeof glm_bad_keys[0]);
}

ParameterizedTest(bad_key *b, model_config, each_invalid_glm_key_is_named_in_the_error) {
    expect_bad_key(glm45_air_hub, b);
}

Test(model_config, glm_top_k_beyond_the_kept_groups_is_refused) {
    msm_model_config c;
    msm_err err = {0};
    /* 16 experts in 4 groups of 4, 2 groups kept: 8 candidates for top-9 */
    cr_assert_eq(parse(MINI_GLM(", \"n_group\": 4, \"topk_group\": 2, \"num_experts_per_tok\": 9"), &c, &err),
                 -EINVAL);
    assert_has(err.msg, "key 'num_experts_per_tok' (9) must not exceed the 8 experts of the topk_group (2) groups");
}

Test(model_config, glm45_air_preset_parses) {
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(msm_model_config_load("config/models/glm-4.5-air.json", &c, &err), 0, "%s", err.msg);
    check_glm45_air(&c);
}

/* ---- quantization_config: FP8 block scales, and what else is refused --------------------- */

/* Sets key quantization_config of `base` to the JSON text q and parses it. */
static int parse_quant(const char *base, const char *q, msm_model_config *c, msm_err *err) {
    struct json_object *root = json_tokener_parse(base);
    cr_assert_not_null(root);
    json_object_object_add(root, "quantization_config", json_tokener_parse(q));
    int rc = parse(json_object_to_json_string(root), c, err);
    json_object_put(root);
    return rc;
}

Test(model_config, fp8_block_scaled_quantization_config_is_read) {
    msm_model_config c;
    msm_err err = {0};
    cr_assert_eq(parse_quant(qwen3_hub, "{\"activation_scheme\": \"dynamic\", \"fmt\": \"e4m3\", \"quant_method\": "
                             "\"fp8\", \"weight_block_size\": [128, 128], \"modules_to_not_convert\": [\"lm_head\", "
                             "\"model.layers.0.mlp.gate\"]}", &c, &err), 0, "%s", err.msg);
    cr_expect_eq(c.fp8_block, 128);
    cr_expect_eq(c.hidden, 2048);
    /* fmt and activation_scheme absent (transformers' FineGrainedFP8Config), ignored_layers, null lists */
    cr_assert_eq(parse_quant(glm45_air_hub, "{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], "
                             "\"ignored_layers\": [\"lm_head\"], \"modules_to_not_convert\": null}", &c, &err),
                 0, "%s", err.msg);
    cr_expect_eq(c.fp8_block, 128);
    parse_ok(qwen3_hub, &c);
    cr_expect_eq(c.fp8_block, 0, "no quantization_config: no FP8");
}

/* Every FP8 layout or quantization msmoed does not know is refused, naming what was found. */
typedef struct bad_quant_cfg {
    char value[160];   /* quantization_config's JSON text */
    char want[120];
} bad_quant_cfg;

static bad_quant_cfg bad_quant[] = {
    {"{\"quant_method\": \"fp8\", \"weight_block_size\": [64, 64]}", "weight_block_size [64, 64] is not supported (only [128, 128])"},
    {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 64]}", "weight_block_size [128, 64] is not supported"},
    {"{\"quant_method\": \"fp8\"}", "weight_block_size is missing: per-tensor or per-channel FP8 scales are not supported"},
    {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128]}", "'quantization_config.weight_block_size' must be a list of two integers"},
    {"{\"quant_method\": \"fp8\", \"weight_block_size\": 128}", "must be a list of two integers (got an integer)"},
    {"{\"quant_method\": \"fp8\", \"fmt\": \"e5m2\", \"weight_block_size\": [128, 128]}", "fmt \"e5m2\" is not supported (only \"e4m3\""},
    {"{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\", \"weight_block_size\": [128, 128]}", "activation_scheme \"static\" is not supported"},
    {"{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\"}", "quant_method \"compressed-tensors\" is not supported"},
    {"{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128}", "quant_method \"gptq\" is not supported"},
    {"{\"quant_method\": \"awq\", \"bits\": 4}", "quant_method \"awq\" is not supported"},
    {"{\"quant_method\": \"bitsandbytes\", \"load_in_4bit\": true}", "quant_method \"bitsandbytes\" is not supported"},
    {"{\"bits\": 4}", "quantization_config.quant_method' is missing"},
    {"{\"quant_method\": 8}", "key 'quantization_config.quant_method' must be a string (got an integer)"},
    {"[\"fp8\"]", "key 'quantization_config' must be an object (got a list)"},
    {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"modules_to_not_convert\": \"lm_head\"}", "'quantization_config.modules_to_not_convert' must be a list of module names"},
    {"{\"quant_method\": \"fp8\", \"weight_block_size\": [128, 128], \"ignored_layers\": [1]}", "'quantization_config.ignored_layers' must be a list of module names"},
};

ParameterizedTestParameters(model_config, unknown_quantization_is_refused_naming_what_was_found) {
    return cr_make_param_array(bad_quant_cfg, bad_quant, sizeof bad_quant / sizeof bad_quant[0]);
}

ParameterizedTest(bad_quant_cfg *b, model_config, unknown_quantization_is_refused_naming_what_was_found) {
    msm_model_config c;
    msm_err err = {0};
    int rc = parse_quant(qwen3_hub, b->value, &c, &err);
    cr_assert_eq(rc, -EINVAL, "%s: rc %d (%s)", b->value, rc, err.msg);
    assert_has(err.msg, "config.json");
    assert_has(err.msg, b->want);
}

Test(model_config, fp8_presets_are_the_bf16_presets_with_block_scales) {
    const char *pairs[][2] = {{"config/models/qwen3-30b-a3b-fp8.json", "config/models/qwen3-30b-a3b.json"},
                              {"config/models/glm-4.5-air-fp8.json", "config/models/glm-4.5-air.json"}};
    for (int i = 0; i < 2; i++) {
        msm_model_config q, b;
        msm_err err = {0};
        cr_assert_eq(msm_model_config_load(pairs[i][0], &q, &err), 0, "%s", err.msg);
        cr_assert_eq(msm_model_config_load(pairs[i][1], &b, &err), 0, "%s", err.msg);
        cr_expect_eq(q.fp8_block, 128, "%s", pairs[i][0]);
        cr_expect_eq(b.fp8_block, 0);
        cr_expect(q.arch == b.arch && q.hidden == b.hidden && q.n_layers == b.n_layers && q.n_heads == b.n_heads &&
                  q.n_kv_heads == b.n_kv_heads && q.head_dim == b.head_dim && q.vocab == b.vocab &&
                  q.n_experts == b.n_experts && q.top_k == b.top_k && q.moe_intermediate == b.moe_intermediate &&
                  q.intermediate == b.intermediate && q.shared_intermediate == b.shared_intermediate &&
                  q.rope_dim == b.rope_dim && q.n_group == b.n_group,
                  "%s has other shapes than %s", pairs[i][0], pairs[i][1]);
    }
}

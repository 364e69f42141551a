/* msm_model_config: the immutable description of a model, read from a Hugging Face
 * config.json (+ generation_config.json) or from a shape preset (config/models/\*.json, same keys).
 *
 * Families: Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, Glm4MoeForCausalLM. Both
 * config styles are accepted: Hub style (top-level `rope_theta`, `partial_rotary_factor`,
 * `torch_dtype`) and transformers-5 style (`rope_parameters: {rope_theta, partial_rotary_factor}`,
 * `dtype`). A `quantization_config` is understood for DeepSeek-V3-style FP8 block scales only
 * (docs/adr/0006-fp8.md); any other quantization is refused with what was found. */
#ifndef MSM_MODEL_CONFIG_H
#define MSM_MODEL_CONFIG_H

#include <stdbool.h>
#include <stddef.h>

#include "msm_dtype.h"
#include "msm_err.h"

#define MSM_MAX_LAYERS 256
#define MSM_MAX_EOS 8

typedef enum msm_arch {
    MSM_ARCH_QWEN2_MOE = 0, /* Qwen2MoeForCausalLM: qkv bias, sigmoid-gated shared expert */
    MSM_ARCH_QWEN3_MOE,     /* Qwen3MoeForCausalLM: q/k per-head RMSNorm, no shared expert */
    MSM_ARCH_MIXTRAL,       /* MixtralForCausalLM: w1/w3/w2 experts, always renormalised */
    MSM_ARCH_GLM4_MOE,      /* Glm4MoeForCausalLM: partial RoPE, sigmoid group-limited router with a
                               score-correction bias, ungated shared experts, first k layers dense */
} msm_arch;

/* How the router turns its logits [T, E] into k expert ids and weights. */
typedef enum msm_router_kind {
    MSM_ROUTER_SOFTMAX = 0,   /* softmax, top-k (optionally renormalised): Qwen2/3-MoE, Mixtral */
    MSM_ROUTER_SIGMOID_GROUP, /* sigmoid scores; experts chosen by score + e_score_correction_bias
                                 within the topk_group best of n_group groups; weights are the
                                 unbiased scores (optionally renormalised) * routed_scaling_factor
                                 (GLM-4.5, DeepSeek-V3 style) */
} msm_router_kind;

typedef struct msm_model_config {
    msm_arch arch;
    char arch_name[64];        /* the `architectures[0]` string */
    int hidden;                /* hidden_size */
    int n_layers;              /* num_hidden_layers */
    int n_heads;               /* num_attention_heads */
    int n_kv_heads;            /* num_key_value_heads (defaults to n_heads) */
    int head_dim;              /* head_dim, or hidden / n_heads when absent */
    int vocab;                 /* vocab_size */
    int intermediate;          /* intermediate_size: dense MLP layers (Mixtral: the expert size) */
    int moe_intermediate;      /* moe_intermediate_size (Mixtral: intermediate_size) */
    int shared_intermediate;   /* shared_expert_intermediate_size (GLM: moe_intermediate_size *
                                  n_shared_experts); 0 = no shared expert */
    bool shared_gate;          /* the shared expert's output is scaled by sigmoid(h . gate) (Qwen2) */
    int n_experts;             /* num_experts (Mixtral: num_local_experts; GLM: n_routed_experts) */
    int top_k;                 /* num_experts_per_tok */
    bool norm_topk_prob;       /* renormalise the top-k weights (Mixtral: always true) */
    msm_router_kind router;    /* softmax or sigmoid + bias + groups */
    int n_group, topk_group;   /* SIGMOID_GROUP: experts in n_group equal groups, chosen within the
                                  topk_group best groups (1, 1 elsewhere: no grouping) */
    float routed_scale;        /* routed_scaling_factor: scales the routed weights (1 elsewhere) */
    bool tie_word_embeddings;  /* lm_head shares the embedding; no lm_head.weight on disk */
    bool qkv_bias;             /* q/k/v projections have a bias (Qwen2-MoE; Qwen3 and GLM
                                  attention_bias) */
    bool qk_norm;              /* per-head RMSNorm of q and k before RoPE (Qwen3-MoE; GLM
                                  use_qk_norm) */
    bool sparse[MSM_MAX_LAYERS]; /* layer i uses the MoE block (else a dense SwiGLU MLP); GLM:
                                    i >= first_k_dense_replace */
    float rms_eps;             /* rms_norm_eps */
    float rope_theta;          /* rope_theta or rope_parameters.rope_theta (default 10000) */
    int rope_dim;              /* rotated dims at the start of every head: head_dim *
                                  partial_rotary_factor (head_dim for full RoPE), even */
    int max_position;          /* max_position_embeddings */
    msm_dtype dtype;           /* torch_dtype / dtype: the checkpoint's weight type */
    int fp8_block;             /* quantization_config of an FP8 block-scaled checkpoint (quant_method
                                  "fp8", fmt "e4m3", weight_block_size [128, 128]): the scale block,
                                  128; its F8_E4M3 weights come with float32 `weight_scale_inv`
                                  [ceil(N/128), ceil(K/128)]. 0: no quantization_config */
    int bos_id;                /* bos_token_id, -1 if none */
    int eos_ids[MSM_MAX_EOS];  /* eos_token_id(s), from generation_config.json when present */
    int n_eos;
    int n_mtp_layers;          /* num_nextn_predict_layers: GLM's multi-token-prediction layers
                                  (model.layers.<n_layers + i>.*); never loaded, only reported */
} msm_model_config;

/* Parses config.json text. `source` names the file in messages. Unknown architectures, missing
 * required keys, wrong JSON types and out-of-range values are errors that name the key. */
int msm_model_config_parse(const char *json, size_t len, const char *source,
                           msm_model_config *ret_cfg, msm_err *err);

/* Reads DIR/config.json, then DIR/generation_config.json when it exists (eos ids there win).
 * When DIR names a regular file instead (a shape preset), that file alone is the config. */
int msm_model_config_load(const char *dir, msm_model_config *ret_cfg, msm_err *err);

/* Whether layer i has a shared expert (sparse layer of a family with one). */
static inline bool msm_model_config_has_shared(const msm_model_config *c, int layer) {
    return c->sparse[layer] && c->shared_intermediate > 0;
}

#endif

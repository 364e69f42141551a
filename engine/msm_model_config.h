/* msm_model_config: the immutable description of a model, read from a Hugging Face
 * config.json (+ generation_config.json) or from a shape preset (config/models/\*.json, same keys).
 *
 * Families: Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM. Both config styles are
 * accepted: Hub style (top-level `rope_theta`, `torch_dtype`) and transformers-5 style
 * (`rope_parameters: {rope_theta}`, `dtype`). */
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
} msm_arch;

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
    int shared_intermediate;   /* shared_expert_intermediate_size; 0 = no shared expert */
    int n_experts;             /* num_experts (Mixtral: num_local_experts) */
    int top_k;                 /* num_experts_per_tok */
    bool norm_topk_prob;       /* renormalise the top-k weights (Mixtral: always true) */
    bool tie_word_embeddings;  /* lm_head shares the embedding; no lm_head.weight on disk */
    bool qkv_bias;             /* q/k/v projections have a bias (Qwen2-MoE; Qwen3 attention_bias) */
    bool qk_norm;              /* per-head RMSNorm of q and k before RoPE (Qwen3-MoE) */
    bool sparse[MSM_MAX_LAYERS]; /* layer i uses the MoE block (else a dense SwiGLU MLP) */
    float rms_eps;             /* rms_norm_eps */
    float rope_theta;          /* rope_theta or rope_parameters.rope_theta (default 10000) */
    int max_position;          /* max_position_embeddings */
    msm_dtype dtype;           /* torch_dtype / dtype: the checkpoint's weight type */
    int bos_id;                /* bos_token_id, -1 if none */
    int eos_ids[MSM_MAX_EOS];  /* eos_token_id(s), from generation_config.json when present */
    int n_eos;
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

/* msm_model_config: reads a Hugging Face config.json (+ generation_config.json) into the
 * immutable msm_model_config (see msm_model_config.h).
 *
 * Each family is a row of `families`: which keys name the expert count and sizes, whether it
 * has a shared expert (and how its size is given), q/k bias or q/k norm, its router, its default
 * rotary fraction, and how sparse layers are chosen. Keys are read through a handful of typed
 * getters that refuse a wrong JSON type or an out-of-range value with a message naming the file
 * and the key, so nothing downstream sees a half-checked config.
 * json-c's own getters coerce ("12" reads as 12), which is why every getter checks the type. */
#include "msm_model_config.h"
#include "msm_file.h"

#include <errno.h>
#include <fcntl.h>
#include <json-c/json.h>
#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CFG_MAX_FILE (16u << 20) /* config files are a few KB; refuse anything absurd */
#define S_ "%.200s"              /* a source (file) name in messages, cut to keep the reason */

/* Upper bounds on shapes: far above any real model, low enough that products of two of them
 * (hidden x vocab, experts x inter x hidden) cannot overflow int64 downstream. */
#define MAX_DIM (1 << 20)
#define MAX_VOCAB (1 << 24)
#define MAX_HEADS 4096
#define MAX_EXPERTS 4096

typedef enum sparse_rule {
    SPARSE_STEP,    /* layer ∉ mlp_only_layers and (layer+1) % decoder_sparse_step == 0 */
    SPARSE_ALL,     /* every layer is MoE */
    SPARSE_FIRST_K, /* layer >= first_k_dense_replace */
} sparse_rule;

typedef enum shared_rule {
    SHARED_NONE,  /* no shared expert */
    SHARED_GATED, /* shared_expert_intermediate_size (required), sigmoid-gated (Qwen2-MoE) */
    SHARED_COUNT, /* n_shared_experts x moe_intermediate_size, ungated (GLM-4.5) */
} shared_rule;

typedef struct family {
    const char *name;
    msm_arch arch;
    const char *experts_key;     /* key holding the number of routed experts ... */
    const char *experts_alt;     /* ... or this one (transformers 5 writes num_local_experts) */
    const char *expert_size_key; /* key holding one expert's intermediate size */
    shared_rule shared;
    const char *bias_key;        /* key switching q/k/v bias (NULL: never a bias) ... */
    bool bias_default;           /* ... and its value when absent */
    const char *qk_norm_key;     /* key switching q/k norm (NULL: always qk_norm) ... */
    bool qk_norm;                /* ... and its value when absent */
    bool norm_topk_always;       /* renormalise regardless of the config ... */
    bool norm_topk_default;      /* ... else norm_topk_prob's value when absent */
    msm_router_kind router;
    sparse_rule sparse;
    float rms_eps_default;       /* transformers' defaults, for presets that leave them out */
    int max_position_default;
    double partial_rotary_default; /* partial_rotary_factor when absent (transformers' Glm4MoeConfig
                                      sets 0.5 "for BC") */
} family;

static const family families[] = {
    {.name = "Qwen2MoeForCausalLM", .arch = MSM_ARCH_QWEN2_MOE, .experts_key = "num_experts",
     .experts_alt = "num_local_experts", .expert_size_key = "moe_intermediate_size",
     .shared = SHARED_GATED, .bias_key = "qkv_bias", .bias_default = true, .router = MSM_ROUTER_SOFTMAX,
     .sparse = SPARSE_STEP, .rms_eps_default = 1e-6f, .max_position_default = 8192,
     .partial_rotary_default = 1.0},
    {.name = "Qwen3MoeForCausalLM", .arch = MSM_ARCH_QWEN3_MOE, .experts_key = "num_experts",
     .experts_alt = "num_local_experts", .expert_size_key = "moe_intermediate_size",
     .shared = SHARED_NONE, .bias_key = "attention_bias", .qk_norm = true, .router = MSM_ROUTER_SOFTMAX,
     .sparse = SPARSE_STEP, .rms_eps_default = 1e-6f, .max_position_default = 32768,
     .partial_rotary_default = 1.0},
    {.name = "MixtralForCausalLM", .arch = MSM_ARCH_MIXTRAL, .experts_key = "num_local_experts",
     .experts_alt = "num_experts", .expert_size_key = "intermediate_size", .shared = SHARED_NONE,
     .norm_topk_always = true, .router = MSM_ROUTER_SOFTMAX, .sparse = SPARSE_ALL,
     .rms_eps_default = 1e-5f, .max_position_default = 4096 * 32, .partial_rotary_default = 1.0},
    {.name = "Glm4MoeForCausalLM", .arch = MSM_ARCH_GLM4_MOE, .experts_key = "n_routed_experts",
     .experts_alt = "num_local_experts", .expert_size_key = "moe_intermediate_size",
     .shared = SHARED_COUNT, .bias_key = "attention_bias", .qk_norm_key = "use_qk_norm",
     .norm_topk_default = true, .router = MSM_ROUTER_SIGMOID_GROUP, .sparse = SPARSE_FIRST_K,
     .rms_eps_default = 1e-5f, .max_position_default = 131072, .partial_rotary_default = 0.5},
};
#define N_FAMILIES (sizeof families / sizeof families[0])

/* ---- typed getters --------------------------------------------------------------------- */

/* A key counts as absent when missing or JSON null (transformers writes `"head_dim": null`). */
static struct json_object *get(struct json_object *o, const char *key) {
    struct json_object *v = NULL;
    if (!json_object_object_get_ex(o, key, &v) || json_object_is_type(v, json_type_null)) return NULL;
    return v;
}

static const char *json_kind(struct json_object *v) {
    switch (json_object_get_type(v)) {
    case json_type_null: return "null";
    case json_type_boolean: return "a boolean";
    case json_type_double: return "a non-integer number";
    case json_type_int: return "an integer";
    case json_type_object: return "an object";
    case json_type_array: return "a list";
    case json_type_string: return "a string";
    }
    return "?";
}

/* Every integer key is bounded below by 0 or 1. */
static const char *int_desc(int64_t lo) {
    return lo == 1 ? "a positive integer" : "a non-negative integer";
}

/* Reads integer `key` of `o` into *ret, within [lo, hi]. Absent: *ret = dflt when !required. */
static int get_int(const char *src, struct json_object *o, const char *key, bool required,
                   int64_t lo, int64_t hi, int dflt, int *ret, msm_err *err) {
    struct json_object *v = get(o, key);
    if (!v) {
        if (required)
            return msm_err_set(err, -EINVAL, S_ ": key '%s' must be %s (missing)", src, key,
                               int_desc(lo));
        *ret = dflt;
        return 0;
    }
    if (!json_object_is_type(v, json_type_int))
        return msm_err_set(err, -EINVAL, S_ ": key '%s' must be %s (got %s)", src, key,
                           int_desc(lo), json_kind(v));
    int64_t x = json_object_get_int64(v);
    if (x < lo)
        return msm_err_set(err, -EINVAL, S_ ": key '%s' must be %s (got %lld)", src, key,
                           int_desc(lo), (long long)x);
    if (x > hi)
        return msm_err_set(err, -EINVAL, S_ ": key '%s' must be at most %lld (got %lld)", src,
                           key, (long long)hi, (long long)x);
    *ret = (int)x;
    return 0;
}

/* Reads a number (int or float) that is positive and finite as a float into *ret; absent:
 * *ret = dflt. `prefix` names the enclosing object in messages ("rope_parameters."). */
static int get_pos_float(const char *src, struct json_object *o, const char *prefix,
                         const char *key, float dflt, float *ret, msm_err *err) {
    struct json_object *v = get(o, key);
    if (!v) {
        *ret = dflt;
        return 0;
    }
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return msm_err_set(err, -EINVAL, S_ ": key '%s%s' must be a positive number (got %s)",
                           src, prefix, key, json_kind(v));
    double x = json_object_get_double(v);
    float f = (float)x; /* 1e-100 is positive as a double and 0 as a float */
    if (!(f > 0) || !isfinite(f))
        return msm_err_set(err, -EINVAL, S_ ": key '%s%s' must be a positive number that fits "
                           "a float (got %g)", src, prefix, key, x);
    *ret = f;
    return 0;
}

static int get_bool(const char *src, struct json_object *o, const char *key, bool dflt,
                    bool *ret, msm_err *err) {
    struct json_object *v = get(o, key);
    if (!v) {
        *ret = dflt;
        return 0;
    }
    if (!json_object_is_type(v, json_type_boolean))
        return msm_err_set(err, -EINVAL, S_ ": key '%s' must be true or false (got %s)", src,
                           key, json_kind(v));
    *ret = json_object_get_boolean(v);
    return 0;
}

/* Reads a string key; absent: *ret = NULL. */
static int get_str(const char *src, struct json_object *o, const char *key, const char *prefix,
                   const char **ret, msm_err *err) {
    struct json_object *v = get(o, key);
    *ret = NULL;
    if (!v) return 0;
    if (!json_object_is_type(v, json_type_string))
        return msm_err_set(err, -EINVAL, S_ ": key '%s%s' must be a string (got %s)", src,
                           prefix, key, json_kind(v));
    *ret = json_object_get_string(v);
    return 0;
}

/* eos_token_id: an int or a list of ints, each in [0, vocab). Absent leaves *cfg alone. */
static int get_eos(const char *src, struct json_object *o, int vocab, msm_model_config *cfg,
                   msm_err *err) {
    struct json_object *v = get(o, "eos_token_id");
    if (!v) return 0;
    int ids[MSM_MAX_EOS] = {0}, n = 0;
    bool list = json_object_is_type(v, json_type_array);
    size_t len = list ? json_object_array_length(v) : 1;
    if (len > MSM_MAX_EOS)
        return msm_err_set(err, -EINVAL, S_ ": key 'eos_token_id' lists %zu ids, at most %d "
                           "are supported", src, len, MSM_MAX_EOS);
    for (size_t i = 0; i < len; i++) {
        struct json_object *e = list ? json_object_array_get_idx(v, i) : v;
        if (!json_object_is_type(e, json_type_int))
            return msm_err_set(err, -EINVAL, S_ ": key 'eos_token_id' must be a token id or a "
                               "list of token ids (got %s)", src, json_kind(e));
        int64_t id = json_object_get_int64(e);
        if (id < 0 || id >= vocab)
            return msm_err_set(err, -EINVAL, S_ ": key 'eos_token_id': token id %lld is outside "
                               "the vocabulary [0, %d)", src, (long long)id, vocab);
        ids[n++] = (int)id;
    }
    memcpy(cfg->eos_ids, ids, sizeof ids);
    cfg->n_eos = n;
    return 0;
}

/* ---- rope and dtype -------------------------------------------------------------------- */

/* Only plain RoPE is implemented; a scaled variant (yarn, linear, dynamic, llama3, ...) would
 * silently change the math, so it is refused. `obj` is rope_parameters or rope_scaling. */
static int check_rope_type(const char *src, struct json_object *obj, const char *objkey,
                           msm_err *err) {
    static const char *const type_keys[] = {"rope_type", "type"};
    for (int i = 0; i < 2; i++) {
        const char *t;
        char prefix[48];
        snprintf(prefix, sizeof prefix, "%s.", objkey);
        int rc = get_str(src, obj, type_keys[i], prefix, &t, err);
        if (rc < 0) return rc;
        if (t && strcmp(t, "default") != 0)
            return msm_err_set(err, -EINVAL, S_ ": %s.%s '%.40s' is not supported (only "
                               "'default' RoPE is)", src, objkey, type_keys[i], t);
    }
    return 0;
}

/* Reads partial_rotary_factor of `o` (a number in (0, 1]) into *ret; absent leaves *ret alone.
 * A double, as Python computes int(head_dim * factor) in double precision. */
static int get_rotary_factor(const char *src, struct json_object *o, const char *prefix,
                             double *ret, msm_err *err) {
    struct json_object *v = get(o, "partial_rotary_factor");
    if (!v) return 0;
    if (!json_object_is_type(v, json_type_int) && !json_object_is_type(v, json_type_double))
        return msm_err_set(err, -EINVAL, S_ ": key '%spartial_rotary_factor' must be a number in "
                           "(0, 1] (got %s)", src, prefix, json_kind(v));
    double x = json_object_get_double(v);
    if (!(x > 0 && x <= 1))
        return msm_err_set(err, -EINVAL, S_ ": key '%spartial_rotary_factor' must be a number in "
                           "(0, 1] (got %g)", src, prefix, x);
    *ret = x;
    return 0;
}

/* rope_theta and partial_rotary_factor: top level (Hub style) or in rope_parameters
 * (transformers 5), which wins; *factor starts at the family's default. */
static int parse_rope(const char *src, struct json_object *root, msm_model_config *c,
                      double *factor, msm_err *err) {
    int rc = get_pos_float(src, root, "", "rope_theta", 10000.0f, &c->rope_theta, err);
    if (rc < 0 || (rc = get_rotary_factor(src, root, "", factor, err)) < 0) return rc;
    static const char *const objs[] = {"rope_parameters", "rope_scaling"};
    for (int i = 0; i < 2; i++) {
        struct json_object *p = get(root, objs[i]);
        if (!p) continue;
        if (!json_object_is_type(p, json_type_object))
            return msm_err_set(err, -EINVAL, S_ ": key '%s' must be an object (got %s)", src,
                               objs[i], json_kind(p));
        if ((rc = check_rope_type(src, p, objs[i], err)) < 0) return rc;
        /* transformers 5 keeps the base here; it wins over a stale top-level copy. */
        char prefix[48];
        snprintf(prefix, sizeof prefix, "%s.", objs[i]);
        if ((rc = get_pos_float(src, p, prefix, "rope_theta", c->rope_theta, &c->rope_theta, err)) < 0 ||
            (rc = get_rotary_factor(src, p, prefix, factor, err)) < 0)
            return rc;
    }
    return 0;
}

static int parse_dtype(const char *src, struct json_object *root, msm_dtype *ret, msm_err *err) {
    static const struct {
        const char *name;
        msm_dtype t;
    } names[] = {{"bfloat16", MSM_BF16}, {"float16", MSM_F16}, {"float32", MSM_F32}};
    static const char *const keys[] = {"dtype", "torch_dtype"}; /* transformers 5 name first */
    for (int k = 0; k < 2; k++) {
        const char *s;
        int rc = get_str(src, root, keys[k], "", &s, err);
        if (rc < 0) return rc;
        if (!s) continue;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (strcmp(s, names[i].name) == 0) {
                *ret = names[i].t;
                return 0;
            }
        }
        return msm_err_set(err, -EINVAL, S_ ": key '%s' must be \"bfloat16\", \"float16\" or "
                           "\"float32\" (got \"%.40s\")", src, keys[k], s);
    }
    *ret = MSM_BF16;
    return 0;
}

/* ---- quantization_config ---------------------------------------------------------------- */

#define Q_ "quantization_config."

/* Optional list of module names (modules_to_not_convert, ignored_layers): a list of strings. */
static int check_name_list(const char *src, struct json_object *q, const char *key, msm_err *err) {
    struct json_object *v = get(q, key);
    if (!v) return 0;
    bool ok = json_object_is_type(v, json_type_array);
    for (size_t i = 0; ok && i < json_object_array_length(v); i++)
        ok = json_object_is_type(json_object_array_get_idx(v, i), json_type_string);
    if (!ok)
        return msm_err_set(err, -EINVAL, S_ ": key '" Q_ "%s' must be a list of module names (got %s)",
                           src, key, json_kind(v));
    return 0;
}

/* quantization_config: only DeepSeek-V3-style FP8 block scales are understood: quant_method
 * "fp8", fmt "e4m3" (the default: transformers' FineGrainedFP8Config writes none),
 * weight_block_size [128, 128], activation_scheme "dynamic" (activations stay float32 / bf16
 * here: only the weights are FP8). The modules the quantizer left alone (modules_to_not_convert,
 * ignored_layers) are stored in bf16 and the loader goes by each tensor's dtype, so the lists are
 * only checked for their type. Anything else is refused, naming what was found: GPTQ, AWQ,
 * compressed-tensors, bitsandbytes, per-tensor or per-channel FP8 (no weight_block_size), other
 * block sizes, e5m2, static activation scales. */
static int parse_quant(const char *src, struct json_object *root, msm_model_config *c, msm_err *err) {
    c->fp8_block = 0;
    struct json_object *q = get(root, "quantization_config");
    if (!q) return 0;
    if (!json_object_is_type(q, json_type_object))
        return msm_err_set(err, -EINVAL, S_ ": key 'quantization_config' must be an object (got %s)", src,
                           json_kind(q));
    const char *method, *fmt, *act;
    int rc;
    if ((rc = get_str(src, q, "quant_method", Q_, &method, err)) < 0 ||
        (rc = get_str(src, q, "fmt", Q_, &fmt, err)) < 0 ||
        (rc = get_str(src, q, "activation_scheme", Q_, &act, err)) < 0)
        return rc;
    if (!method)
        return msm_err_set(err, -EINVAL, S_ ": key '" Q_ "quant_method' is missing (only \"fp8\" with "
                           "[128, 128] block scales is supported)", src);
    if (strcmp(method, "fp8") != 0)
        return msm_err_set(err, -EINVAL, S_ ": " Q_ "quant_method \"%.40s\" is not supported (only "
                           "\"fp8\": float8_e4m3fn weights with [128, 128] block scales)", src, method);
    if (fmt && strcmp(fmt, "e4m3") != 0)
        return msm_err_set(err, -EINVAL, S_ ": " Q_ "fmt \"%.40s\" is not supported (only \"e4m3\", "
                           "float8_e4m3fn)", src, fmt);
    if (act && strcmp(act, "dynamic") != 0)
        return msm_err_set(err, -EINVAL, S_ ": " Q_ "activation_scheme \"%.40s\" is not supported "
                           "(only \"dynamic\": msmoed keeps activations in float32/bf16 and would ignore "
                           "static activation scales)", src, act);
    struct json_object *bs = get(q, "weight_block_size");
    if (!bs)
        return msm_err_set(err, -EINVAL, S_ ": " Q_ "weight_block_size is missing: per-tensor or "
                           "per-channel FP8 scales are not supported (only [128, 128] block scales)", src);
    int64_t b[2] = {0, 0};
    bool two = json_object_is_type(bs, json_type_array) && json_object_array_length(bs) == 2;
    for (size_t i = 0; two && i < 2; i++) {
        struct json_object *e = json_object_array_get_idx(bs, i);
        two = json_object_is_type(e, json_type_int);
        if (two) b[i] = json_object_get_int64(e);
    }
    if (!two)
        return msm_err_set(err, -EINVAL, S_ ": key '" Q_ "weight_block_size' must be a list of two "
                           "integers (got %s)", src, json_kind(bs));
    if (b[0] != 128 || b[1] != 128)
        return msm_err_set(err, -EINVAL, S_ ": " Q_ "weight_block_size [%lld, %lld] is not supported "
                           "(only [128, 128])", src, (long long)b[0], (long long)b[1]);
    if ((rc = check_name_list(src, q, "modules_to_not_convert", err)) < 0 ||
        (rc = check_name_list(src, q, "ignored_layers", err)) < 0)
        return rc;
    c->fp8_block = 128;
    return 0;
}

/* ---- sparse layers --------------------------------------------------------------------- */

static int parse_sparse(const char *src, struct json_object *root, const family *fam,
                        msm_model_config *c, msm_err *err) {
    if (fam->sparse == SPARSE_ALL) {
        for (int l = 0; l < c->n_layers; l++) c->sparse[l] = true;
        return 0;
    }
    if (fam->sparse == SPARSE_FIRST_K) { /* HF: layer_idx >= first_k_dense_replace is MoE */
        int k;
        int rc = get_int(src, root, "first_k_dense_replace", false, 0, INT_MAX, 1, &k, err);
        if (rc < 0) return rc;
        for (int l = 0; l < c->n_layers; l++) c->sparse[l] = l >= k;
        return 0;
    }
    int step;
    int rc = get_int(src, root, "decoder_sparse_step", false, 1, INT_MAX, 1, &step, err);
    if (rc < 0) return rc;
    for (int l = 0; l < c->n_layers; l++) c->sparse[l] = (l + 1) % step == 0;
    struct json_object *only = get(root, "mlp_only_layers");
    if (!only) return 0;
    if (!json_object_is_type(only, json_type_array))
        return msm_err_set(err, -EINVAL, S_ ": key 'mlp_only_layers' must be a list of layer "
                           "indices (got %s)", src, json_kind(only));
    for (size_t i = 0; i < json_object_array_length(only); i++) {
        struct json_object *e = json_object_array_get_idx(only, i);
        int64_t l = json_object_is_type(e, json_type_int) ? json_object_get_int64(e) : -1;
        if (l < 0 || l >= c->n_layers)
            return msm_err_set(err, -EINVAL, S_ ": key 'mlp_only_layers': entry %zu must be a "
                               "layer index in [0, %d)", src, i, c->n_layers);
        c->sparse[l] = false;
    }
    return 0;
}

/* ---- GLM-4.5: routing groups, shared experts, MTP layers -------------------------------- */

/* n_group / topk_group / routed_scaling_factor / n_shared_experts / num_nextn_predict_layers of
 * a SIGMOID_GROUP family (n_experts, top_k, moe_intermediate already read). HF's router views the
 * experts as [n_group, E / n_group], adds each group's top 2 and keeps topk_group groups, so
 * n_group must divide E with at least 2 experts a group; top-k then picks among the kept groups'
 * experts (the others are -inf), so there must be at least k of them. */
static int parse_group_router(const char *src, struct json_object *root, const char *ekey,
                              msm_model_config *c, msm_err *err) {
    int n_shared, rc;
    if ((rc = get_int(src, root, "n_group", false, 1, MAX_EXPERTS, 1, &c->n_group, err)) < 0 ||
        (rc = get_int(src, root, "topk_group", false, 1, MAX_EXPERTS, 1, &c->topk_group, err)) < 0 ||
        (rc = get_pos_float(src, root, "", "routed_scaling_factor", 1.0f, &c->routed_scale, err)) < 0 ||
        (rc = get_int(src, root, "n_shared_experts", false, 0, MAX_EXPERTS, 1, &n_shared, err)) < 0 ||
        (rc = get_int(src, root, "num_nextn_predict_layers", false, 0, MSM_MAX_LAYERS, 0,
                      &c->n_mtp_layers, err)) < 0)
        return rc;
    if (c->n_experts % c->n_group != 0)
        return msm_err_set(err, -EINVAL, S_ ": key 'n_group' (%d) must divide %s (%d)", src,
                           c->n_group, ekey, c->n_experts);
    int per = c->n_experts / c->n_group;
    if (per < 2)
        return msm_err_set(err, -EINVAL, S_ ": key 'n_group' (%d) leaves %d expert(s) a group; a "
                           "group's score adds its top 2, so each needs at least 2", src, c->n_group, per);
    if (c->topk_group > c->n_group)
        return msm_err_set(err, -EINVAL, S_ ": key 'topk_group' (%d) must not exceed n_group (%d)",
                           src, c->topk_group, c->n_group);
    if (c->top_k > c->topk_group * per)
        return msm_err_set(err, -EINVAL, S_ ": key 'num_experts_per_tok' (%d) must not exceed the "
                           "%d experts of the topk_group (%d) groups it chooses from", src, c->top_k,
                           c->topk_group * per, c->topk_group);
    if ((int64_t)n_shared * c->moe_intermediate > MAX_DIM)
        return msm_err_set(err, -EINVAL, S_ ": key 'n_shared_experts' (%d) x moe_intermediate_size "
                           "(%d) must be at most %d", src, n_shared, c->moe_intermediate, MAX_DIM);
    c->shared_intermediate = n_shared * c->moe_intermediate;
    c->shared_gate = false;
    return 0;
}

/* ---- the config ------------------------------------------------------------------------ */

/* Parses JSON text that must be one object; NUL bytes and trailing junk are errors. */
static int parse_json(const char *json, size_t len, const char *src, struct json_object **ret,
                      msm_err *err) {
    if (len > CFG_MAX_FILE)
        return msm_err_set(err, -EFBIG, S_ ": %zu bytes, more than the limit of %u", src, len,
                           CFG_MAX_FILE);
    struct json_object *root;
    int rc = msm_json_parse(json, len, src, &root, err);
    if (rc) return rc;
    if (!json_object_is_type(root, json_type_object)) {
        json_object_put(root);
        return msm_err_set(err, -EINVAL, S_ ": must be a JSON object", src);
    }
    *ret = root;
    return 0;
}

static int find_family(const char *src, struct json_object *root, const family **ret, msm_err *err) {
    struct json_object *a = get(root, "architectures"), *a0 = NULL;
    if (a && json_object_is_type(a, json_type_array) && json_object_array_length(a) > 0)
        a0 = json_object_array_get_idx(a, 0);
    if (!a0 || !json_object_is_type(a0, json_type_string))
        return msm_err_set(err, -EINVAL, S_ ": key 'architectures' must be a non-empty list of "
                           "strings", src);
    const char *name = json_object_get_string(a0);
    for (size_t i = 0; i < N_FAMILIES; i++) {
        if (strcmp(name, families[i].name) == 0) {
            *ret = &families[i];
            return 0;
        }
    }
    return msm_err_set(err, -EINVAL, S_ ": architecture '%.64s' is not supported (supported: "
                       "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, "
                       "Glm4MoeForCausalLM)", src, name);
}

/* Things the families' math leaves out: refuse them rather than compute something else. */
static int check_unsupported(const char *src, struct json_object *root, const msm_model_config *c,
                             msm_err *err) {
    const char *act;
    int rc = get_str(src, root, "hidden_act", "", &act, err);
    if (rc < 0) return rc;
    if (act && strcmp(act, "silu") != 0)
        return msm_err_set(err, -EINVAL, S_ ": hidden_act '%.40s' is not supported (only "
                           "'silu')", src, act);
    bool sw;
    if ((rc = get_bool(src, root, "use_sliding_window", false, &sw, err)) < 0) return rc;
    if (sw)
        return msm_err_set(err, -EINVAL, S_ ": use_sliding_window true is not supported", src);
    if (c->arch == MSM_ARCH_MIXTRAL) { /* Mixtral applies sliding_window whenever it is set */
        int win;
        if ((rc = get_int(src, root, "sliding_window", false, 0, INT_MAX, 0, &win, err)) < 0) return rc;
        if (win && win < c->max_position)
            return msm_err_set(err, -EINVAL, S_ ": sliding_window %d (< max_position_embeddings "
                               "%d) is not supported", src, win, c->max_position);
    }
    /* transformers 5 lists each layer's attention kind; only full attention is implemented. */
    struct json_object *lt = get(root, "layer_types");
    if (lt && !json_object_is_type(lt, json_type_array))
        return msm_err_set(err, -EINVAL, S_ ": key 'layer_types' must be a list (got %s)", src,
                           json_kind(lt));
    for (size_t i = 0; lt && i < json_object_array_length(lt); i++) {
        struct json_object *e = json_object_array_get_idx(lt, i);
        if (!json_object_is_type(e, json_type_string) ||
            strcmp(json_object_get_string(e), "full_attention") != 0)
            return msm_err_set(err, -EINVAL, S_ ": key 'layer_types': layer %zu is not "
                               "\"full_attention\" (only full attention is supported)", src, i);
    }
    return 0;
}

static int parse_root(const char *src, struct json_object *root, msm_model_config *c,
                      msm_err *err) {
    const family *fam = NULL;
    int rc = find_family(src, root, &fam, err);
    if (rc < 0) return rc;
    c->arch = fam->arch;
    snprintf(c->arch_name, sizeof c->arch_name, "%s", fam->name);

    /* Shapes. */
    const char *ekey = !get(root, fam->experts_key) && get(root, fam->experts_alt) ?
                       fam->experts_alt : fam->experts_key;
    if ((rc = get_int(src, root, "hidden_size", true, 1, MAX_DIM, 0, &c->hidden, err)) < 0 ||
        (rc = get_int(src, root, "num_hidden_layers", true, 1, MSM_MAX_LAYERS, 0, &c->n_layers, err)) < 0 ||
        (rc = get_int(src, root, "num_attention_heads", true, 1, MAX_HEADS, 0, &c->n_heads, err)) < 0 ||
        (rc = get_int(src, root, "num_key_value_heads", false, 1, MAX_HEADS, c->n_heads,
                      &c->n_kv_heads, err)) < 0 ||
        (rc = get_int(src, root, "vocab_size", true, 1, MAX_VOCAB, 0, &c->vocab, err)) < 0 ||
        (rc = get_int(src, root, ekey, true, 1, MAX_EXPERTS, 0, &c->n_experts, err)) < 0 ||
        (rc = get_int(src, root, "num_experts_per_tok", true, 1, MAX_EXPERTS, 0, &c->top_k, err)) < 0 ||
        (rc = get_int(src, root, fam->expert_size_key, true, 1, MAX_DIM, 0,
                      &c->moe_intermediate, err)) < 0 ||
        (rc = get_int(src, root, "intermediate_size", false, 1, MAX_DIM, 0, &c->intermediate, err)) < 0 ||
        (rc = get_int(src, root, "max_position_embeddings", false, 1, INT_MAX,
                      fam->max_position_default, &c->max_position, err)) < 0)
        return rc;
    if (fam->shared == SHARED_GATED) {
        if ((rc = get_int(src, root, "shared_expert_intermediate_size", true, 1, MAX_DIM, 0,
                          &c->shared_intermediate, err)) < 0)
            return rc;
        c->shared_gate = true;
    }

    if (c->n_heads % c->n_kv_heads != 0)
        return msm_err_set(err, -EINVAL, S_ ": key 'num_key_value_heads' (%d) must divide "
                           "num_attention_heads (%d)", src, c->n_kv_heads, c->n_heads);
    if (c->top_k > c->n_experts)
        return msm_err_set(err, -EINVAL, S_ ": key 'num_experts_per_tok' (%d) must not exceed "
                           "%s (%d)", src, c->top_k, ekey, c->n_experts);
    if (!get(root, "head_dim") && c->hidden % c->n_heads != 0)
        return msm_err_set(err, -EINVAL, S_ ": key 'head_dim' is missing and hidden_size (%d) is "
                           "not a multiple of num_attention_heads (%d)", src, c->hidden, c->n_heads);
    if ((rc = get_int(src, root, "head_dim", false, 1, 4096, c->hidden / c->n_heads,
                      &c->head_dim, err)) < 0)
        return rc;

    /* Attention and routing flags. */
    c->qkv_bias = fam->bias_default;
    if (fam->bias_key && (rc = get_bool(src, root, fam->bias_key, fam->bias_default, &c->qkv_bias, err)) < 0)
        return rc;
    c->qk_norm = fam->qk_norm;
    if (fam->qk_norm_key && (rc = get_bool(src, root, fam->qk_norm_key, fam->qk_norm, &c->qk_norm, err)) < 0)
        return rc;
    if (fam->norm_topk_always) c->norm_topk_prob = true;
    else if ((rc = get_bool(src, root, "norm_topk_prob", fam->norm_topk_default, &c->norm_topk_prob, err)) < 0)
        return rc;
    double rot_factor = fam->partial_rotary_default;
    if ((rc = get_bool(src, root, "tie_word_embeddings", false, &c->tie_word_embeddings, err)) < 0 ||
        (rc = get_pos_float(src, root, "", "rms_norm_eps", fam->rms_eps_default, &c->rms_eps, err)) < 0 ||
        (rc = parse_rope(src, root, c, &rot_factor, err)) < 0 || (rc = parse_dtype(src, root, &c->dtype, err)) < 0)
        return rc;
    /* HF: dim = int(head_dim * partial_rotary_factor) dims rotated, as rotate-half pairs i with
     * i + dim/2, so dim must be even; the rest of each head passes through. The kernels also
     * keep head_dim even (every real model's is), so an odd one is refused even when a partial
     * rotation would be even. */
    if (c->head_dim % 2 != 0)
        return msm_err_set(err, -EINVAL, S_ ": key 'head_dim' must be even for RoPE (got %d)",
                           src, c->head_dim);
    c->rope_dim = (int)((double)c->head_dim * rot_factor);
    if (c->rope_dim < 2 || c->rope_dim % 2 != 0)
        return msm_err_set(err, -EINVAL, S_ ": key 'partial_rotary_factor' (%g) rotates %d of "
                           "head_dim %d dimensions; RoPE needs a positive even number", src,
                           rot_factor, c->rope_dim, c->head_dim);
    c->router = fam->router;
    c->n_group = c->topk_group = 1;
    c->routed_scale = 1.0f;
    if (fam->router == MSM_ROUTER_SIGMOID_GROUP && (rc = parse_group_router(src, root, ekey, c, err)) < 0)
        return rc;

    /* Which layers are MoE; the others need a dense intermediate size. */
    if ((rc = parse_sparse(src, root, fam, c, err)) < 0) return rc;
    if (fam->arch == MSM_ARCH_MIXTRAL) c->intermediate = c->moe_intermediate;
    for (int l = 0; l < c->n_layers; l++)
        if (!c->sparse[l] && c->intermediate == 0)
            return msm_err_set(err, -EINVAL, S_ ": key 'intermediate_size' must be a positive "
                               "integer (missing; layer %d is a dense MLP layer)", src, l);

    /* Special tokens. */
    if ((rc = get_int(src, root, "bos_token_id", false, 0, c->vocab - 1, -1, &c->bos_id, err)) < 0 ||
        (rc = get_eos(src, root, c->vocab, c, err)) < 0)
        return rc;
    if ((rc = parse_quant(src, root, c, err)) < 0) return rc;
    return check_unsupported(src, root, c, err);
}

int msm_model_config_parse(const char *json, size_t len, const char *source,
                           msm_model_config *ret_cfg, msm_err *err) {
    const char *src = source ? source : "config.json";
    struct json_object *root = NULL; /* set when rc is 0 (-O3 cannot see that it is then) */
    int rc = parse_json(json, len, src, &root, err);
    if (rc < 0) return rc;
    msm_model_config *c = calloc(1, sizeof *c);
    if (!c) {
        json_object_put(root);
        return msm_err_set(err, -ENOMEM, S_ ": out of memory", src);
    }
    rc = parse_root(src, root, c, err);
    if (rc == 0) *ret_cfg = *c;
    free(c);
    json_object_put(root);
    return rc;
}

/* ---- files ----------------------------------------------------------------------------- */


int msm_model_config_load(const char *dir, msm_model_config *ret_cfg, msm_err *err) {
    /* A shape preset (config/models/x.json) is a config.json on its own. */
    struct stat sb;
    if (stat(dir, &sb) == 0 && S_ISREG(sb.st_mode)) {
        char *text = NULL;
        size_t n = 0;
        int rc = msm_read_file(dir, CFG_MAX_FILE, &text, &n, err);
        if (rc == 0) rc = msm_model_config_parse(text, n, dir, ret_cfg, err);
        free(text);
        return rc;
    }
    size_t dl = strlen(dir);
    char *path = malloc(dl + 32);
    if (!path) return msm_err_set(err, -ENOMEM, S_ ": out of memory", dir);
    const char *sep = dl && dir[dl - 1] == '/' ? "" : "/";
    char *json = NULL;
    size_t len = 0;
    msm_model_config cfg;
    struct json_object *gen = NULL;

    snprintf(path, dl + 32, "%s%sconfig.json", dir, sep);
    int rc = msm_read_file(path, CFG_MAX_FILE, &json, &len, err);
    if (rc < 0 || (rc = msm_model_config_parse(json, len, path, &cfg, err)) < 0) goto out;
    free(json);
    json = NULL;

    /* generation_config.json is optional; its eos ids are the ones generate() stops on. */
    snprintf(path, dl + 32, "%s%sgeneration_config.json", dir, sep);
    rc = msm_read_file(path, CFG_MAX_FILE, &json, &len, err);
    if (rc == -ENOENT) {
        rc = 0;
    } else if (rc == 0 && (rc = parse_json(json, len, path, &gen, err)) == 0) {
        rc = get_eos(path, gen, cfg.vocab, &cfg, err);
    }
    if (rc == 0) *ret_cfg = cfg;
out:
    json_object_put(gen);
    free(json);
    free(path);
    return rc;
}

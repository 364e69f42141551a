/* libFuzzer target: the config.json parser. The input is not NUL-terminated on purpose: the
 * parser must read exactly `size` bytes. An accepted config must satisfy the invariants the
 * rest of the engine relies on without re-checking them. */
#include <stddef.h>
#include <stdint.h>

#include "msm_model_config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    msm_model_config c;
    msm_err err;
    if (msm_model_config_parse((const char *)data, size, "config.json", &c, &err) < 0) return 0;
    if (c.n_layers < 1 || c.n_layers > MSM_MAX_LAYERS || c.hidden < 1 || c.vocab < 1 ||
        c.n_heads < 1 || c.n_kv_heads < 1 || c.n_heads % c.n_kv_heads != 0 ||
        c.head_dim < 2 || c.head_dim % 2 != 0 || c.top_k < 1 || c.top_k > c.n_experts ||
        c.moe_intermediate < 1 || c.n_eos < 0 || c.n_eos > MSM_MAX_EOS || !(c.rms_eps > 0) ||
        !(c.rope_theta > 0) || c.bos_id < -1 || c.bos_id >= c.vocab)
        __builtin_trap();
    /* RoPE over the first rope_dim dims; the routing groups (GLM-4.5) */
    if (c.rope_dim < 2 || c.rope_dim % 2 != 0 || c.rope_dim > c.head_dim || c.n_group < 1 ||
        c.n_experts % c.n_group != 0 || c.topk_group < 1 || c.topk_group > c.n_group ||
        !(c.routed_scale > 0) || c.shared_intermediate < 0 || c.n_mtp_layers < 0)
        __builtin_trap();
    if (c.router == MSM_ROUTER_SIGMOID_GROUP &&
        (c.n_experts / c.n_group < 2 || c.top_k > c.topk_group * (c.n_experts / c.n_group)))
        __builtin_trap();
    for (int l = 0; l < c.n_layers; l++)
        if (!c.sparse[l] && c.intermediate < 1) __builtin_trap();
    for (int i = 0; i < c.n_eos; i++)
        if (c.eos_ids[i] < 0 || c.eos_ids[i] >= c.vocab) __builtin_trap();
    return 0;
}

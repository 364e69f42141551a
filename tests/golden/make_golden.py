#!/usr/bin/env python3
"""Build tiny random-weight MoE checkpoints and record HF transformers float32 golden logits.

CI never runs this script; its outputs under tests/data/<variant>/ are committed.
Run:  /root/venv/bin/python tests/golden/make_golden.py [--out tests/data] [--only NAME ...]
      (NAME: a variant below, or fp8_e4m3fn for the FP8 decoding table)

Per variant directory:
  config.json               transformers-5 style (rope_parameters, dtype) or Hub style
                            (top-level rope_theta, torch_dtype) -- both are covered
  generation_config.json    bos/eos ids
  model.safetensors         bf16, per-expert Hub tensor names
    or model.safetensors.index.json + model-0000K-of-0000N.safetensors (sharded variant)
  golden.json               {"prompts": [[ids]], "generated": [[ids]], "files": ["logits_0.npy", ...], ...}
  logits_K.npy              float32 [P+N-1, vocab] = HF logits of ONE forward over prompt + generated[:-1]

Golden model = the bf16 checkpoint loaded back with dtype=float32 (weights are exactly the bf16
values upcast), eval(), attn_implementation="eager", experts_implementation="eager".
Greedy decoding is plain argmax over full (uncached) forwards.

GLM-4.5 (glm4moe): the router's e_score_correction_bias is random (HF initialises it to zero)
and stays float32 on disk, as in the real checkpoints (HF keeps it fp32:
_keep_in_fp32_modules_strict); the checkpoint also carries a few tensors of a multi-token-
prediction layer (model.layers.<num_hidden_layers>.*, num_nextn_predict_layers = 1) that neither
HF nor msmoed uses, so a loader that refused unknown tensors would fail on it.

FP8 variants (qwen3moe-fp8, glm4moe-fp8; spec key "fp8"): block-scaled checkpoints in the format
DeepSeek-V3, Qwen3-FP8 and GLM-4.5-FP8 publish. Every projection matrix (q/k/v/o, gate/up/down of
dense MLPs, experts and shared experts, GLM's MTP eh_proj) not listed in modules_to_not_convert
is quantised from its bf16 values per 128 x 128 block (partial last blocks): scale_inv = amax / 448
(float32), q = float8_e4m3fn(w / scale_inv), stored as X.weight (F8_E4M3) + X.weight_scale_inv
(F32 [ceil(N/128), ceil(K/128)]); embeddings, lm_head, norms, router gates and biases stay bf16
(the router bias f32); config.json gains quantization_config. The golden model is HF float32 on
the weights dequantised by dequant_fp8 below (DeepSeek-V3's weight_dequant: w = q * scale_inv of
q's block, one float32 multiply), never HF's own FP8 loading: transformers 5.24 takes the block as
dim / number of scales, reading a 192-wide dim as two 96-wide blocks instead of 128 + 64. Each
variant has a 192-wide dimension so partial blocks and mid-block TP slices are exercised. The
sharded one stores every other weight's scales in another shard than the weight.
Also writes fp8_e4m3fn.json: torch's float8_e4m3fn -> float32 of all 256 codes (tests/unit/test_dtype.c).
"""
import argparse
import json
import os
import re
import shutil
import sys

import numpy as np
import torch
import transformers as T
from safetensors import safe_open
from safetensors.torch import save_file

N_NEW = 16
PROMPT_LENS = (1, 7, 19)

VARIANTS = {
    "qwen2moe-gqa": dict(
        cls="Qwen2MoeForCausalLM", cfg="Qwen2MoeConfig", style="hf5", shard=None, seed=1, init=0.2,
        kw=dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=4, head_dim=8, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32, shared_expert_intermediate_size=64, intermediate_size=96,
                decoder_sparse_step=1, mlp_only_layers=[1], norm_topk_prob=False,
                tie_word_embeddings=False, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "qwen2moe-mha-tied": dict(
        cls="Qwen2MoeForCausalLM", cfg="Qwen2MoeConfig", style="hub", shard="250KB", seed=2, init=0.2,
        kw=dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=4, head_dim=16, num_experts=8, num_experts_per_tok=4,
                moe_intermediate_size=32, shared_expert_intermediate_size=64, intermediate_size=96,
                decoder_sparse_step=2, mlp_only_layers=[], norm_topk_prob=True,
                tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "qwen3moe": dict(
        cls="Qwen3MoeForCausalLM", cfg="Qwen3MoeConfig", style="hf5", shard=None, seed=7, init=0.2,
        kw=dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=4, head_dim=16, num_experts=8, num_experts_per_tok=2,
                moe_intermediate_size=32, intermediate_size=96, decoder_sparse_step=1, mlp_only_layers=[],
                norm_topk_prob=True, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),
    "mixtral": dict(
        cls="MixtralForCausalLM", cfg="MixtralConfig", style="hub", shard=None, seed=4, init=0.2,
        kw=dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=4, head_dim=8, num_local_experts=4, num_experts_per_tok=2,
                intermediate_size=32, tie_word_embeddings=False, sliding_window=None,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})),
    "glm4moe": dict(
        cls="Glm4MoeForCausalLM", cfg="Glm4MoeConfig", style="hf5", shard=None, seed=11, init=0.2,
        kw=dict(vocab_size=256, hidden_size=64, num_hidden_layers=4, num_attention_heads=8,
                num_key_value_heads=4, head_dim=16, n_routed_experts=16, num_experts_per_tok=4,
                n_group=4, topk_group=2, moe_intermediate_size=32, n_shared_experts=2,
                intermediate_size=96, first_k_dense_replace=1, norm_topk_prob=True,
                routed_scaling_factor=2.5, attention_bias=True, use_qk_norm=True,
                num_nextn_predict_layers=1, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "partial_rotary_factor": 0.5})),
}
# FP8 variants: their bf16 twin's shapes with one dimension 192 wide (one full and one partial
# 128-block), quantised as described above.
VARIANTS["qwen3moe-fp8"] = dict(VARIANTS["qwen3moe"], shard="400KB", seed=17,
                                kw=dict(VARIANTS["qwen3moe"]["kw"], hidden_size=192),
                                fp8=dict(not_convert=["lm_head", "model.layers.0.mlp.gate"]))
VARIANTS["glm4moe-fp8"] = dict(VARIANTS["glm4moe"], seed=21,
                               kw=dict(VARIANTS["glm4moe"]["kw"], intermediate_size=192),
                               # a bf16 o_proj, and a shared expert whose gate is FP8 but up is not
                               fp8=dict(not_convert=["lm_head", "model.layers.1.self_attn.o_proj",
                                                     "model.layers.2.mlp.shared_experts.up_proj"]))
COMMON = dict(rms_norm_eps=1e-6, max_position_embeddings=512, hidden_act="silu")
FP8_BLOCK = 128
FP8_MAX = 448.0  # torch.finfo(torch.float8_e4m3fn).max
FP8_RE = re.compile(r"\.(q|k|v|o|gate|up|down|eh)_proj\.weight$")
BIAS_STD = 0.3  # GLM's e_score_correction_bias: large enough to change which experts are chosen

# Per-expert Hub names (what real checkpoints hold) and the fused names transformers 5 uses in memory.
HUB_EXPERT_RE = re.compile(r"\.(mlp|block_sparse_moe)\.experts\.\d+\.(gate_proj|up_proj|down_proj|w1|w2|w3)\.weight$")
FUSED_RE = re.compile(r"\.(mlp|block_sparse_moe)\.experts\.(gate_up_proj|down_proj)$")


def randomize(model, gen, init):
    """Non-trivial norms and biases so the engine must use them (HF init leaves them at 1 / 0)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            elif p.dim() >= 2:
                p.copy_(init * torch.randn(p.shape, generator=gen))


def st_files(d):
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        return sorted(set(json.load(open(idx))["weight_map"].values()))
    return ["model.safetensors"]


def tensor_names(d):
    out = {}
    for fn in st_files(d):
        with safe_open(os.path.join(d, fn), "pt") as f:
            for k in f.keys():
                sl = f.get_slice(k)
                out[k] = (fn, sl.get_shape(), sl.get_dtype())
    return out


def unfuse_to_hub(d, family):
    """Fallback: rewrite fused expert tensors into per-expert Hub names (bf16). Not needed with 5.24,
    whose save_pretrained already writes the Hub layout, but kept in case a later version stops doing so."""
    g, u, dn = ("w1", "w3", "w2") if family == "mixtral" else ("gate_proj", "up_proj", "down_proj")
    for fn in st_files(d):
        p = os.path.join(d, fn)
        with safe_open(p, "pt") as f:
            meta = f.metadata()
            ts = {k: f.get_tensor(k) for k in f.keys()}
        new = {}
        for k, t in ts.items():
            m = FUSED_RE.search(k)
            if not m:
                new[k] = t
                continue
            pre = k[: m.start()] + (".block_sparse_moe" if family == "mixtral" else ".mlp") + ".experts"
            for e in range(t.shape[0]):
                if m.group(2) == "gate_up_proj":
                    gt, ut = t[e].chunk(2, dim=0)
                    new[f"{pre}.{e}.{g}.weight"] = gt.contiguous().to(torch.bfloat16)
                    new[f"{pre}.{e}.{u}.weight"] = ut.contiguous().to(torch.bfloat16)
                else:
                    new[f"{pre}.{e}.{dn}.weight"] = t[e].contiguous().to(torch.bfloat16)
        save_file(new, p, metadata=meta or {"format": "pt"})
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        j = json.load(open(idx))
        wm = {}
        for fn in st_files(d):
            with safe_open(os.path.join(d, fn), "pt") as f:
                for k in f.keys():
                    wm[k] = fn
        j["weight_map"] = dict(sorted(wm.items()))
        json.dump(j, open(idx, "w"), indent=2)


def add_mtp_tensors(d, kw, gen):
    """A few tensors of GLM's multi-token-prediction layer (named as in GLM-4.5 checkpoints:
    model.layers.<num_hidden_layers>.*), which the causal LM does not use."""
    p = os.path.join(d, "model.safetensors")
    with safe_open(p, "pt") as f:
        meta = f.metadata()
        ts = {k: f.get_tensor(k) for k in f.keys()}
    L, H = kw["num_hidden_layers"], kw["hidden_size"]
    ts[f"model.layers.{L}.eh_proj.weight"] = torch.randn(H, 2 * H, generator=gen).to(torch.bfloat16)
    ts[f"model.layers.{L}.enorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    ts[f"model.layers.{L}.hnorm.weight"] = torch.ones(H, dtype=torch.bfloat16)
    save_file(ts, p, metadata=meta or {"format": "pt"})


def expand_blocks(s, shape):
    """Per-block scales [ceil(N/B), ceil(K/B)] -> one per element [N, K]."""
    return s.repeat_interleave(FP8_BLOCK, 0)[: shape[0]].repeat_interleave(FP8_BLOCK, 1)[:, : shape[1]]


def quantize_fp8(w):
    """float32 [N, K] -> (float8_e4m3fn [N, K], scale_inv float32 [ceil(N/128), ceil(K/128)]), per
    128 x 128 block (the last ones partial): scale_inv = amax / 448, q = w / scale_inv."""
    n, k = w.shape
    nb, kb = -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)
    pad = torch.zeros(nb * FP8_BLOCK, kb * FP8_BLOCK, dtype=torch.float32)
    pad[:n, :k] = w
    amax = pad.view(nb, FP8_BLOCK, kb, FP8_BLOCK).abs().amax(dim=(1, 3))
    s = amax / FP8_MAX
    s = torch.where(s > 0, s, torch.ones_like(s))  # an all-zero block: any scale
    q = (w / expand_blocks(s, w.shape)).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return q, s.contiguous()


def dequant_fp8(q, s):
    """DeepSeek-V3's weight_dequant: w[n, k] = float32(q[n, k]) * s[n // 128, k // 128]."""
    return q.to(torch.float32) * expand_blocks(s.to(torch.float32), q.shape)


def module_of(name):
    return name[: -len(".weight")] if name.endswith(".weight") else name


def quantize_checkpoint(d, fp8):
    """Rewrites the bf16 checkpoint in d as FP8 block-scaled (see the module docstring); returns
    {Hub tensor name: float32 tensor} of the values the golden model must hold (dequantised FP8,
    upcast bf16/f32). In a sharded checkpoint every other FP8 weight's scales go to the next shard."""
    files = st_files(d)
    out = {fn: {} for fn in files}
    ref, n_fp8 = {}, 0
    for i, fn in enumerate(files):
        with safe_open(os.path.join(d, fn), "pt") as f:
            for k in f.keys():
                t = f.get_tensor(k)
                if FP8_RE.search(k) and t.dim() == 2 and module_of(k) not in fp8["not_convert"]:
                    q, sc = quantize_fp8(t.float())
                    out[fn][k] = q
                    out[files[(i + n_fp8 % 2) % len(files)]][k + "_scale_inv"] = sc
                    ref[k] = dequant_fp8(q, sc)
                    n_fp8 += 1
                else:
                    out[fn][k] = t
                    ref[k] = t.float()
    for fn in files:
        save_file(out[fn], os.path.join(d, fn), metadata={"format": "pt"})
    idx = os.path.join(d, "model.safetensors.index.json")
    if os.path.exists(idx):
        j = json.load(open(idx))
        j["weight_map"] = dict(sorted((k, fn) for fn in files for k in out[fn]))
        json.dump(j, open(idx, "w"), indent=2)
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                "modules_to_not_convert": fp8["not_convert"],
                                "weight_block_size": [FP8_BLOCK, FP8_BLOCK]}
    json.dump(c, open(p, "w"), indent=2, sort_keys=True)
    return ref, n_fp8


def check_fp8_files(d, ref):
    """The files hold what the golden model holds: every FP8 weight dequantised from disk (with its
    scales, wherever they are) equals its reference value bit for bit, every other tensor too."""
    names = tensor_names(d)
    for k, (fn, shape, dt) in names.items():
        if k.endswith("_scale_inv"):
            continue
        with safe_open(os.path.join(d, fn), "pt") as f:
            t = f.get_tensor(k)
        if dt == "F8_E4M3":
            sfn = names[k + "_scale_inv"][0]
            with safe_open(os.path.join(d, sfn), "pt") as f:
                t = dequant_fp8(t, f.get_tensor(k + "_scale_inv"))
        assert torch.equal(t.float(), ref[k]), k


def load_reference_fp8(d, ref, tmp):
    """HF float32 model on exactly the values in ref: a float32 Hub-layout checkpoint of them (with
    d's config less its quantization_config) loaded by HF, which fuses per-expert tensors itself.
    Checked by saving it back: every Hub tensor equals ref bit for bit."""
    if os.path.isdir(tmp):
        shutil.rmtree(tmp)
    os.makedirs(tmp)
    c = json.load(open(os.path.join(d, "config.json")))
    c.pop("quantization_config")
    json.dump(c, open(os.path.join(tmp, "config.json"), "w"), indent=2)
    save_file({k: v.contiguous() for k, v in ref.items()}, os.path.join(tmp, "model.safetensors"),
              metadata={"format": "pt"})
    golden = load_f32(tmp)
    back = os.path.join(tmp, "back")
    golden.save_pretrained(back)
    seen = 0
    for fn in st_files(back):
        with safe_open(os.path.join(back, fn), "pt") as f:
            for k in f.keys():
                assert torch.equal(f.get_tensor(k).float(), ref[k]), f"HF reference differs at {k}"
                seen += 1
    mtp = [k for k in ref if re.match(r"model\.layers\.(\d+)\.", k) and
           int(k.split(".")[2]) >= c["num_hidden_layers"]]
    assert seen == len(ref) - len(mtp), f"HF reference holds {seen} of {len(ref) - len(mtp)} tensors"
    return golden


def write_fp8_table(outroot):
    """torch's float8_e4m3fn -> float32 of every code, as float32 bit patterns."""
    x = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).to(torch.float32)
    bits = [int(b) & 0xFFFFFFFF for b in x.view(torch.int32).tolist()]
    p = os.path.join(outroot, "fp8_e4m3fn.json")
    with open(p, "w") as f:
        f.write('{\n "source": "torch %s: torch.arange(256, dtype=uint8).view(float8_e4m3fn).to(float32)",\n'
                ' "f32_bits": %s\n}\n' % (torch.__version__, json.dumps(bits)))
    print(f"wrote {p}")


def to_hub_style(d):
    p = os.path.join(d, "config.json")
    c = json.load(open(p))
    rp = c.pop("rope_parameters")
    assert rp.get("rope_type", "default") == "default"
    c["rope_theta"] = rp["rope_theta"]
    c.pop("dtype", None)
    c["torch_dtype"] = "bfloat16"
    c.pop("layer_types", None)
    c["transformers_version"] = "4.51.0"
    json.dump(dict(sorted(c.items())), open(p, "w"), indent=2)


def load_f32(d):
    m = T.AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="eager",
                                               experts_implementation="eager")
    return m.eval()


def forward(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], dtype=torch.long), use_cache=False).logits[0].float()


def group_router_gaps(mod, logits, topk):
    """GLM's sigmoid router: the smallest gaps its two choices can flip on: between the
    topk_group-th and the next group score, and between the k-th and (k+1)-th choice score
    (score + bias) of the kept groups' experts."""
    s = logits.float().sigmoid()
    c = s + mod.e_score_correction_bias.float()
    G, tg = mod.num_group, mod.topk_group
    per = c.shape[-1] // G
    gs = c.view(-1, G, per).topk(2, dim=-1)[0].sum(dim=-1)
    gaps = []
    if tg < G:
        sg = gs.sort(dim=-1, descending=True).values
        gaps.append((sg[:, tg - 1] - sg[:, tg]).min().item())
    keep = torch.zeros_like(gs, dtype=torch.bool).scatter_(1, gs.topk(tg, dim=-1)[1], True)
    c = c.masked_fill(~keep.repeat_interleave(per, dim=1), float("-inf"))
    if tg * per > topk:
        sc = c.sort(dim=-1, descending=True).values
        gaps.append((sc[:, topk - 1] - sc[:, topk]).min().item())
    return gaps


def router_gaps(model, ids, topk):
    """Smallest gap between the k-th and (k+1)-th router probability over all tokens/sparse layers
    (for GLM's sigmoid router: group_router_gaps)."""
    gaps = []
    hooks = []

    def hook(mod, inp, out):
        logits = out[0] if isinstance(out, tuple) else out
        if hasattr(mod, "e_score_correction_bias"):
            gaps.extend(group_router_gaps(mod, logits, topk))
            return
        pr = torch.softmax(logits.float(), dim=-1).sort(dim=-1, descending=True).values
        if pr.shape[-1] > topk:
            gaps.append((pr[:, topk - 1] - pr[:, topk]).min().item())

    for name, mod in model.named_modules():
        if name.endswith("mlp.gate") or name.endswith("block_sparse_moe.gate"):
            hooks.append(mod.register_forward_hook(hook))
    forward(model, ids)
    for h in hooks:
        h.remove()
    return min(gaps) if gaps else None


class Reject(Exception):
    pass


# Quality bars for a usable golden (random tiny models love to loop and to produce near-ties).
MIN_DISTINCT = 6          # distinct tokens per 16-token greedy continuation
MIN_LOGIT_GAP = 5e-3      # top1 - top2 logit at every greedy step
MIN_ROUTER_GAP = 1e-4     # k-th minus (k+1)-th router softmax prob, every token and sparse layer


def build(name, spec, outroot):
    """Deterministic seed search: the first seed >= spec['seed'] whose goldens pass the quality bars."""
    for seed in range(spec["seed"], spec["seed"] + 1000, 10):
        try:
            return attempt(name, spec, outroot, seed)
        except Reject as e:
            print(f"[{name}] seed {seed} rejected: {e}")
    raise SystemExit(f"{name}: no acceptable seed")


def attempt(name, spec, outroot, seed):
    d = os.path.join(outroot, name)
    if os.path.isdir(d):
        shutil.rmtree(d)
    cfg = getattr(T, spec["cfg"])(**spec["kw"], **COMMON, initializer_range=spec["init"],
                                  bos_token_id=1, eos_token_id=2)
    torch.manual_seed(seed)
    model = getattr(T, spec["cls"])(cfg)
    gen = torch.Generator().manual_seed(seed)
    randomize(model, gen, spec["init"])
    biases = {n: BIAS_STD * torch.randn(b.shape, generator=gen)
              for n, b in model.named_buffers() if n.endswith("e_score_correction_bias")}
    model = model.to(torch.bfloat16)
    for n, b in biases.items():  # float32 after the cast, as HF keeps it and real checkpoints hold it
        mod, attr = model.get_submodule(n.rsplit(".", 1)[0]), n.rsplit(".", 1)[1]
        setattr(mod, attr, torch.nn.Buffer(b))
    if spec["shard"]:
        model.save_pretrained(d, max_shard_size=spec["shard"])
    else:
        model.save_pretrained(d)
    for f in os.listdir(d):  # keep only what a Hub checkpoint dir would hold
        if f not in ("config.json", "generation_config.json", "model.safetensors",
                     "model.safetensors.index.json") and not re.match(r"model-\d+-of-\d+\.safetensors$", f):
            os.remove(os.path.join(d, f))
    if spec["kw"].get("num_nextn_predict_layers"):
        add_mtp_tensors(d, spec["kw"], gen)

    family = "mixtral" if spec["cls"].startswith("Mixtral") else "qwen"
    names = tensor_names(d)
    if any(FUSED_RE.search(k) for k in names):
        print(f"[{name}] fused expert tensors on disk -> rewriting to per-expert Hub layout")
        unfuse_to_hub(d, family)
        names = tensor_names(d)
    assert not any(FUSED_RE.search(k) for k in names), "fused expert tensors remain"
    assert any(HUB_EXPERT_RE.search(k) for k in names), "no per-expert tensors found"
    assert all(v[2] == "BF16" or (k.endswith("e_score_correction_bias") and v[2] == "F32")
               for k, v in names.items()), "non-bf16 tensor on disk"
    assert all(v[2] == "F32" for k, v in names.items() if k.endswith("e_score_correction_bias"))
    fp8_ref = None
    if spec.get("fp8"):
        fp8_ref, n_fp8 = quantize_checkpoint(d, spec["fp8"])
        names = tensor_names(d)
        check_fp8_files(d, fp8_ref)
        assert all(v[2] in ("BF16", "F8_E4M3") or (k.endswith(("_scale_inv", "e_score_correction_bias"))
                   and v[2] == "F32") for k, v in names.items()), "unexpected dtype on disk"
        partial = [k for k, v in names.items() if v[2] == "F8_E4M3" and any(x % FP8_BLOCK for x in v[1])
                   and any(x > FP8_BLOCK for x in v[1])]
        assert partial, "no FP8 weight with a full and a partial 128-block"
        print(f"[{name}] {n_fp8} FP8 weights, {len(partial)} of them with a full and a partial block")
    if spec["kw"].get("tie_word_embeddings"):
        assert "lm_head.weight" not in names
    if spec["shard"]:
        assert len(st_files(d)) >= 2, f"expected >=2 shards, got {st_files(d)}"

    # In-memory reference: a fresh float32 model holding the bf16 values upcast. (Not model.float():
    # .to(bfloat16) also rounds the non-persistent RoPE inv_freq buffer, which .float() cannot undo.)
    ref = getattr(T, spec["cls"])(cfg)
    ref.load_state_dict({k: v.float() for k, v in model.state_dict().items()})
    ref.set_attn_implementation("eager")
    ref.set_experts_implementation("eager")
    ref.eval()

    if spec["style"] == "hub":
        to_hub_style(d)

    if fp8_ref is not None:  # HF float32 on the dequantised weights; differs from the bf16 model
        golden = load_reference_fp8(d, fp8_ref, os.path.join(outroot, f".{name}-ref"))
        shutil.rmtree(os.path.join(outroot, f".{name}-ref"))
    else:
        golden = load_f32(d)
    theta = spec["kw"]["rope_parameters"]["rope_theta"]
    assert golden.config.rope_parameters["rope_theta"] == theta, golden.config.rope_parameters
    probe = list(range(3, 40))
    a, b = forward(ref, probe), forward(golden, probe)
    if fp8_ref is None:
        assert torch.equal(a, b), f"reloaded checkpoint differs from in-memory model: {(a - b).abs().max()}"
    else:
        print(f"[{name}] FP8 vs bf16 weights: logits max |diff| {(a - b).abs().max():.3e} of max {a.abs().max():.3f}")

    rng = np.random.default_rng(seed + 100)
    prompts, gens, files, gaps, rgaps = [], [], [], [], []
    for k, plen in enumerate(PROMPT_LENS):
        prompt = [int(x) for x in rng.integers(3, 256, size=plen)]
        ids = list(prompt)
        for _ in range(N_NEW):
            ids.append(int(forward(golden, ids)[-1].argmax()))
        gen = ids[len(prompt):]
        full = prompt + gen[:-1]
        logits = forward(golden, full).numpy().astype(np.float32)
        assert logits.shape == (len(full), 256)
        assert [int(x) for x in logits[len(prompt) - 1:].argmax(-1)] == gen, "one-forward argmax != greedy"
        if len(set(gen)) < MIN_DISTINCT:
            raise Reject(f"degenerate continuation {gen}")
        top2 = np.sort(logits[len(prompt) - 1:], axis=-1)[:, -2:]
        gaps.append(float((top2[:, 1] - top2[:, 0]).min()))
        if gaps[-1] < MIN_LOGIT_GAP:
            raise Reject(f"greedy logit gap {gaps[-1]:.2e}")
        rg = router_gaps(golden, full, spec["kw"]["num_experts_per_tok"])
        if rg < MIN_ROUTER_GAP:
            raise Reject(f"router top-k gap {rg:.2e}")
        rgaps.append(rg)
        fn = f"logits_{k}.npy"
        np.save(os.path.join(d, fn), np.ascontiguousarray(logits))
        prompts.append(prompt)
        gens.append(gen)
        files.append(fn)
        print(f"[{name}] prompt {k}: len {plen} gen {gen} logit std {logits.std():.3f} "
              f"min greedy top1-top2 gap {gaps[-1]:.4f} min router k/k+1 prob gap {rg:.2e}")

    eos = 2
    if any(eos in g for g in gens):
        raise Reject("eos produced during greedy decode")
    gc = {"bos_token_id": 1, "eos_token_id": eos, "do_sample": False, "transformers_version": "5.24.0"}
    json.dump(gc, open(os.path.join(d, "generation_config.json"), "w"), indent=2)
    on_disk, golden_dtype = "bfloat16", "float32"
    if fp8_ref is not None:
        on_disk = "float8_e4m3fn, 128x128 block scale_inv float32; bfloat16 where not converted"
        golden_dtype = "float32 on the FP8 weights dequantised by dequant_fp8 (DeepSeek-V3 weight_dequant)"
    meta = {"prompts": prompts, "generated": gens, "files": files,
            "architecture": spec["cls"], "config_style": spec["style"], "dtype_on_disk": on_disk,
            "golden_dtype": golden_dtype, "transformers": T.__version__, "torch": torch.__version__,
            "logits_rows": "prompt + generated[:-1]; row P-1+j predicts generated[j]",
            "min_greedy_logit_gap": min(gaps), "min_router_prob_gap": min(rgaps), "seed": seed,
            "eos_token_id": eos}
    with open(os.path.join(d, "golden.json"), "w") as f:  # one key per line, lists inline
        f.write("{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in meta.items()) + "\n}\n")
    size = sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d))
    assert size < 1.5e6, f"{d} is {size} bytes"
    print(f"[{name}] wrote {d} ({size} bytes): {sorted(os.listdir(d))}")
    return d


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data"))
    ap.add_argument("--only", nargs="*")
    a = ap.parse_args()
    torch.set_num_threads(1)  # deterministic reductions
    if not a.only or "fp8_e4m3fn" in a.only:
        write_fp8_table(os.path.normpath(a.out))
    for name, spec in VARIANTS.items():
        if a.only and name not in a.only:
            continue
        build(name, spec, os.path.normpath(a.out))


if __name__ == "__main__":
    sys.exit(main())

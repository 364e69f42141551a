#!/usr/bin/env python3
"""Compiled PyTorch decode-step peer for msmoed (gpt-fast style, our own code).

Builds the model of a msmoed shape preset (config/models/*.json: Qwen2MoeForCausalLM or
Qwen3MoeForCausalLM) with random weights, a static KV cache of context + warm-up + steps positions
filled with random values (no prefill: the step reads the same KV bytes as msmoe-bench's), and
times one decode step (B sequences, one token each, at positions context, context+1, ...) per
batch and experts path: CUDA events, median of --steps after --warmup steps. The first
--warmup steps compile; the step is then captured whole into one CUDA graph (--graph, default on
CUDA) and replayed. Each step feeds random token ids and takes the greedy token (argmax) of the
logits on the device, like msmoe-bench.

Compilation: each layer is two torch.compile units reused by every layer (attention + router +
shared expert; routed experts), so a compile costs one layer, not the model; torch's automatic
dynamic shapes compile batch 1 and then one graph for every larger batch.
Inductor's coordinate-descent tuning is on (--no-cdt turns it off): as in gpt-fast, it lowers the
batch-1 matrix-vector products (and the gathered-expert products) to tuned Triton reductions.

Routed-experts paths (--experts):
  gather      gpt-fast's w[expert_indices]: per (token, slot) products on the selected experts'
              weights (fused reductions under coordinate-descent tuning; reads duplicates again)
  grouped_mm  sort (token, slot) pairs by expert, torch.nn.functional.grouped_mm per projection
  dense       every expert on every token in two GEMMs (gate_up: x @ [E*2I, H]^T, down: the
              routing-weighted activations @ [E*I, H]), zero weights for unselected experts;
              reads all experts once, no data-dependent shapes (good when most experts are hit)
  loop        sort by expert, one matmul per hit expert (host sync for the counts: eager, no
              CUDA graph; HF's eager experts, without the Python overhead elsewhere)
  auto        (default) per batch the paths that can win: gather if B*k <= E, dense if the
              expected distinct experts under uniform routing are >= E/2, grouped_mm and loop
              always; prints each and BEST per batch
  all         every path at every batch; or a comma list, e.g. grouped_mm,dense

Usage (GPU):
  python3 bench/torch_decode.py config/models/qwen1.5-moe-a2.7b.json --batches 1,8,32,128,256
  python3 bench/torch_decode.py config/models/qwen3-30b-a3b.json --experts grouped_mm,dense
Exactness check against HF transformers (CPU, float32, tiny shapes of the preset's family):
  python3 bench/torch_decode.py config/models/qwen3-30b-a3b.json --check-hf --device cpu --tiny
CPU smoke test of the benchmark loop:
  python3 bench/torch_decode.py PRESET --device cpu --tiny --no-compile --batches 1,4 --context 16
Output: `torch <arch> experts <path> batch <B>: <ms> ms/step ...` per path and batch, then
`BEST batch <B>: <ms> ms/step (<path>)`. Other options: --help."""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

PATHS = ("gather", "grouped_mm", "dense", "loop")
ARCHS = {"Qwen2MoeForCausalLM": "qwen2_moe", "Qwen3MoeForCausalLM": "qwen3_moe"}


def log(*a):
    print(*a, flush=True)


# ---- config -------------------------------------------------------------------------------

def tiny_overrides(d):
    """Small shapes of the same family (GQA stays GQA, the shared expert stays)."""
    mha = d.get("num_key_value_heads", d["num_attention_heads"]) == d["num_attention_heads"]
    k = d["num_experts_per_tok"]
    t = {"hidden_size": 64, "num_hidden_layers": 2, "head_dim": 16, "num_attention_heads": 4,
         "num_key_value_heads": 4 if mha else 2, "num_experts": max(8, 2 * k),
         "moe_intermediate_size": 32, "intermediate_size": 96, "vocab_size": 256,
         "bos_token_id": 0, "eos_token_id": 1}
    if "shared_expert_intermediate_size" in d:
        t["shared_expert_intermediate_size"] = 48
    return t


def load_preset(path, tiny, sets):
    d = json.load(open(path))
    d.setdefault("model_type", ARCHS.get((d.get("architectures") or [""])[0], ""))
    if tiny:
        d.update(tiny_overrides(d))
    for s in sets:
        key, _, val = s.partition("=")
        d[key] = json.loads(val)
    return d


class Cfg:
    def __init__(self, d):
        arch = (d.get("architectures") or [""])[0]
        if arch not in ARCHS:
            sys.exit(f"torch_decode: architecture {arch!r} not supported ({', '.join(ARCHS)})")
        self.arch_name = arch
        self.arch = ARCHS[arch]
        q2 = self.arch == "qwen2_moe"
        self.H = d["hidden_size"]
        self.L = d["num_hidden_layers"]
        self.nh = d["num_attention_heads"]
        self.nkv = d.get("num_key_value_heads") or self.nh
        self.hd = d.get("head_dim") or self.H // self.nh
        self.E = d["num_experts"]
        self.k = d["num_experts_per_tok"]
        self.I = d["moe_intermediate_size"]
        self.Is = d.get("shared_expert_intermediate_size", 0) if q2 else 0
        self.Id = d.get("intermediate_size", 0)
        self.V = d["vocab_size"]
        self.eps = float(d.get("rms_norm_eps", 1e-6))
        self.theta = float((d.get("rope_parameters") or {}).get("rope_theta", d.get("rope_theta", 10000.0)))
        self.norm_topk = bool(d.get("norm_topk_prob", False))
        bias = d.get("qkv_bias", True) if q2 else d.get("attention_bias", False)
        self.qkv_bias = bool(bias)
        self.o_bias = bool(bias) and not q2  # Qwen3's attention_bias covers o_proj too
        self.qk_norm = not q2
        self.tie = bool(d.get("tie_word_embeddings", False))
        step, only = d.get("decoder_sparse_step", 1) or 1, set(d.get("mlp_only_layers") or [])
        self.sparse = [l not in only and self.E > 0 and (l + 1) % step == 0 for l in range(self.L)]

    def summary(self):
        return (f"{self.arch_name}: {self.L} layers, hidden {self.H}, heads {self.nh}/{self.nkv}x{self.hd}, "
                f"{self.E} experts top-{self.k} x {self.I}" + (f", shared {self.Is}" if self.Is else "") +
                f", vocab {self.V}, qkv bias {self.qkv_bias}, qk norm {self.qk_norm}, "
                f"norm_topk {self.norm_topk}")

    def uniq(self, B):
        """Expected distinct experts a layer selects for B tokens under uniform routing."""
        return self.E * (1.0 - (1.0 - self.k / self.E) ** B)


# ---- weights ------------------------------------------------------------------------------

def make_weights(cfg, device, dtype, seed, jitter_norms):
    """Random weights, uniform in +-sqrt(3/fan_in) (unit-variance outputs, like msmoed's dummy
    weights). Layouts: wqkv [(nh+2nkv)hd, H]; w13 [E, 2I, H] (gate rows, then up rows; HF's
    gate_up_proj); w2 [E, H, I] (HF's down_proj); ws13 [2Is, H], ws2 [H, Is], wsg [1, H]."""
    g = torch.Generator(device=device)
    g.manual_seed(seed)

    def U(*shape, fan_in):
        a = math.sqrt(3.0 / fan_in)
        return torch.empty(shape, device=device, dtype=dtype).uniform_(-a, a, generator=g)

    def norm(n):
        w = torch.ones(n, device=device, dtype=dtype)
        if jitter_norms:
            w += 0.2 * torch.rand(n, device=device, dtype=dtype, generator=g) - 0.1
        return w

    H, hd, nh, nkv = cfg.H, cfg.hd, cfg.nh, cfg.nkv
    qkv_rows = (nh + 2 * nkv) * hd
    W = {"embed": U(cfg.V, H, fan_in=H), "norm": norm(H), "layers": []}
    W["lm_head"] = W["embed"] if cfg.tie else U(cfg.V, H, fan_in=H)
    for l in range(cfg.L):
        lw = {"ln1": norm(H), "ln2": norm(H), "wqkv": U(qkv_rows, H, fan_in=H),
              "bqkv": U(qkv_rows, fan_in=H) if cfg.qkv_bias else None,
              "qn": norm(hd) if cfg.qk_norm else None, "kn": norm(hd) if cfg.qk_norm else None,
              "wo": U(H, nh * hd, fan_in=nh * hd), "bo": U(H, fan_in=nh * hd) if cfg.o_bias else None}
        if cfg.sparse[l]:
            lw["wr"] = U(cfg.E, H, fan_in=H)
            lw["w13"] = U(cfg.E, 2 * cfg.I, H, fan_in=H)
            lw["w2"] = U(cfg.E, H, cfg.I, fan_in=cfg.I)
            if cfg.Is:
                lw["ws13"] = U(2 * cfg.Is, H, fan_in=H)
                lw["ws2"] = U(H, cfg.Is, fan_in=cfg.Is)
                lw["wsg"] = U(1, H, fan_in=H)
        else:
            lw["wd13"] = U(2 * cfg.Id, H, fan_in=H)
            lw["wd2"] = U(H, cfg.Id, fan_in=cfg.Id)
        W["layers"].append(lw)
    return W


def add_dense_layout(W, cfg):
    """The dense path's down projection wants w2 as [H, E*I] (one GEMM whose reduction also sums
    over experts): a second copy of every w2, made once."""
    for lw in W["layers"]:
        if "w2" in lw and "w2d" not in lw:
            lw["w2d"] = lw["w2"].permute(1, 0, 2).reshape(cfg.H, cfg.E * cfg.I).contiguous()


def hf_state_dict(W, cfg):
    """Our weights under HF transformers 5's parameter names (Qwen2Moe/Qwen3MoeForCausalLM)."""
    nq, nk = cfg.nh * cfg.hd, cfg.nkv * cfg.hd
    sd = {"model.embed_tokens.weight": W["embed"], "model.norm.weight": W["norm"],
          "lm_head.weight": W["lm_head"]}
    for l, lw in enumerate(W["layers"]):
        p = f"model.layers.{l}."
        sd[p + "input_layernorm.weight"] = lw["ln1"]
        sd[p + "post_attention_layernorm.weight"] = lw["ln2"]
        for name, a, b in (("q", 0, nq), ("k", nq, nq + nk), ("v", nq + nk, nq + 2 * nk)):
            sd[p + f"self_attn.{name}_proj.weight"] = lw["wqkv"][a:b]
            if lw["bqkv"] is not None:
                sd[p + f"self_attn.{name}_proj.bias"] = lw["bqkv"][a:b]
        sd[p + "self_attn.o_proj.weight"] = lw["wo"]
        if lw["bo"] is not None:
            sd[p + "self_attn.o_proj.bias"] = lw["bo"]
        if lw["qn"] is not None:
            sd[p + "self_attn.q_norm.weight"] = lw["qn"]
            sd[p + "self_attn.k_norm.weight"] = lw["kn"]
        if "w13" in lw:
            sd[p + "mlp.gate.weight"] = lw["wr"]
            sd[p + "mlp.experts.gate_up_proj"] = lw["w13"]
            sd[p + "mlp.experts.down_proj"] = lw["w2"]
            if "ws13" in lw:
                sd[p + "mlp.shared_expert.gate_proj.weight"] = lw["ws13"][:cfg.Is]
                sd[p + "mlp.shared_expert.up_proj.weight"] = lw["ws13"][cfg.Is:]
                sd[p + "mlp.shared_expert.down_proj.weight"] = lw["ws2"]
                sd[p + "mlp.shared_expert_gate.weight"] = lw["wsg"]
        else:
            sd[p + "mlp.gate_proj.weight"] = lw["wd13"][:cfg.Id]
            sd[p + "mlp.up_proj.weight"] = lw["wd13"][cfg.Id:]
            sd[p + "mlp.down_proj.weight"] = lw["wd2"]
    return {k: v.contiguous() for k, v in sd.items()}


# ---- the model (functional) ---------------------------------------------------------------

def rmsnorm(x, w, eps):
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def linear(x, w, b=None):
    # mm + add rather than addmm: under coordinate-descent tuning inductor lowers a 1-row mm to a
    # tuned reduction (with the bias add fused); it leaves addmm to cuBLAS
    y = F.linear(x, w)
    return y if b is None else y + b


def rope(x, cos, sin):  # x [B, T, n, hd]; cos, sin [T, hd] (HF's rotate_half form)
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def make_attn_unit(cfg, attn_impl):
    """norm, qkv (+ q/k norm), RoPE, KV write, attention, o_proj, residual, norm; for a MoE layer
    also the router (softmax, top-k, optional renormalisation) and the gated shared expert."""
    nh, nkv, hd, eps, k, Is = cfg.nh, cfg.nkv, cfg.hd, cfg.eps, cfg.k, cfg.Is
    grp, scale, norm_topk = nh // nkv, cfg.hd ** -0.5, cfg.norm_topk

    def attn_unit(h, pos, cos_tab, sin_tab, kc, vc, ln1, wqkv, bqkv, qn, kn, wo, bo, ln2,
                  wr, ws13, ws2, wsg):
        B, T, H = h.shape
        x = rmsnorm(h, ln1, eps)
        qkv = linear(x, wqkv, bqkv)
        q = qkv[..., :nh * hd].view(B, T, nh, hd)
        kk = qkv[..., nh * hd:(nh + nkv) * hd].view(B, T, nkv, hd)
        v = qkv[..., (nh + nkv) * hd:].view(B, T, nkv, hd)
        if qn is not None:
            q, kk = rmsnorm(q, qn, eps), rmsnorm(kk, kn, eps)
        cos, sin = cos_tab[pos].to(h.dtype), sin_tab[pos].to(h.dtype)
        q, kk = rope(q, cos, sin), rope(kk, cos, sin)
        kc.index_copy_(2, pos, kk.transpose(1, 2))
        vc.index_copy_(2, pos, v.transpose(1, 2))
        S = kc.shape[2]
        mask = torch.arange(S, device=h.device)[None, :] <= pos[:, None]  # [T, S]
        if attn_impl == "sdpa":
            o = F.scaled_dot_product_attention(q.transpose(1, 2), kc, vc, attn_mask=mask, scale=scale,
                                               enable_gqa=grp > 1)
            o = o.transpose(1, 2).reshape(B, T, nh * hd)
        else:  # grouped-query matmuls: each K/V head read once for its group of query heads
            qg = q.view(B, T, nkv, grp, hd).permute(0, 2, 3, 1, 4).reshape(B, nkv, grp * T, hd)
            s = torch.matmul(qg, kc.transpose(-1, -2)) * scale
            s = s.view(B, nkv, grp, T, S).masked_fill(~mask, float("-inf"))
            p = torch.softmax(s, dim=-1, dtype=torch.float32).to(h.dtype).view(B, nkv, grp * T, S)
            o = torch.matmul(p, vc).view(B, nkv, grp, T, hd).permute(0, 3, 1, 2, 4).reshape(B, T, nh * hd)
        h = h + linear(o, wo, bo)
        x = rmsnorm(h, ln2, eps).view(B * T, H)
        if wr is None:
            return h, x, None, None, None
        probs = torch.softmax(linear(x, wr), dim=-1, dtype=torch.float32)
        topw, topi = torch.topk(probs, k, dim=-1)
        if norm_topk:
            topw = topw / topw.sum(dim=-1, keepdim=True)
        topw = topw.to(h.dtype)
        sh = None
        if ws13 is not None:
            gu = linear(x, ws13)
            sh = linear(F.silu(gu[:, :Is]) * gu[:, Is:], ws2)
            sh = torch.sigmoid(linear(x, wsg)) * sh
        return h, x, topw, topi, sh

    return attn_unit


def _finish(h, y, sh):
    y = y if sh is None else y + sh
    return h + y.view(h.shape)


def experts_gather(h, x, topw, topi, sh, w13, w2, w2d):
    I = w2.shape[-1]
    gu = torch.einsum("th,tkoh->tko", x, w13[topi])  # [T, k, 2I]
    a = F.silu(gu[..., :I]) * gu[..., I:]
    y = torch.einsum("tki,tkhi->tkh", a, w2[topi])  # [T, k, H]
    return _finish(h, (y * topw[..., None]).sum(dim=1), sh)


_gmm = getattr(F, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)


def experts_grouped_mm(h, x, topw, topi, sh, w13, w2, w2d):
    T, k = topi.shape
    E, I = w13.shape[0], w2.shape[-1]
    ids, perm = torch.sort(topi.reshape(-1))
    xs = x[perm // k]
    # end offset of each expert's group; searchsorted keeps the shape static (graph capture)
    offs = torch.searchsorted(ids, torch.arange(1, E + 1, device=x.device, dtype=ids.dtype)).to(torch.int32)
    gu = _gmm(xs, w13.transpose(1, 2), offs=offs)  # [T*k, 2I]
    a = F.silu(gu[:, :I]) * gu[:, I:]
    ys = _gmm(a, w2.transpose(1, 2), offs=offs) * topw.reshape(-1)[perm, None]  # [T*k, H]
    y = torch.empty_like(ys).index_copy_(0, perm, ys)
    return _finish(h, y.view(T, k, -1).sum(dim=1), sh)


def experts_dense(h, x, topw, topi, sh, w13, w2, w2d):
    T = x.shape[0]
    E, I = w13.shape[0], w2.shape[-1]
    gu = F.linear(x, w13.view(E * 2 * I, -1)).view(T, E, 2 * I)
    comb = torch.zeros(T, E, device=x.device, dtype=x.dtype).scatter(1, topi, topw)
    a = F.silu(gu[..., :I]) * gu[..., I:] * comb[..., None]  # [T, E, I]; zero for unselected
    return _finish(h, F.linear(a.view(T, E * I), w2d), sh)


def experts_loop(h, x, topw, topi, sh, w13, w2, w2d):
    T, k = topi.shape
    E, I = w13.shape[0], w2.shape[-1]
    flat = topi.reshape(-1)
    ids, perm = torch.sort(flat)
    counts = torch.bincount(flat, minlength=E).tolist()  # host sync
    xs = x[perm // k]
    ys = torch.empty(T * k, x.shape[1], device=x.device, dtype=x.dtype)
    start = 0
    for e, c in enumerate(counts):
        if c:
            gu = F.linear(xs[start:start + c], w13[e])
            ys[start:start + c] = F.linear(F.silu(gu[:, :I]) * gu[:, I:], w2[e])
            start += c
    ys = ys * topw.reshape(-1)[perm, None]
    y = torch.empty_like(ys).index_copy_(0, perm, ys)
    return _finish(h, y.view(T, k, -1).sum(dim=1), sh)


EXPERTS = {"gather": experts_gather, "grouped_mm": experts_grouped_mm, "dense": experts_dense,
           "loop": experts_loop}


def mlp_unit(h, x, wd13, wd2):
    Id = wd2.shape[1]
    gu = F.linear(x, wd13)
    return h + F.linear(F.silu(gu[:, :Id]) * gu[:, Id:], wd2).view(h.shape)


def head_unit(h, normw, lm_head, eps: float):
    return F.linear(rmsnorm(h, normw, eps), lm_head)


class Model:
    def __init__(self, cfg, W, device, compile_mode, attn_impl, max_pos, dtype):
        self.cfg, self.W, self.device = cfg, W, device
        inv = 1.0 / (cfg.theta ** (torch.arange(0, cfg.hd, 2, dtype=torch.float32) / cfg.hd))
        fr = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv)
        emb = torch.cat((fr, fr), dim=-1)
        self.cos, self.sin = emb.cos().to(device), emb.sin().to(device)
        wrap = (lambda f: f) if compile_mode is None else \
            (lambda f: torch.compile(f, mode=compile_mode, fullgraph=True))
        self.attn = wrap(make_attn_unit(cfg, attn_impl))
        self.mlp = wrap(mlp_unit)
        self.head = wrap(head_unit)
        # loop syncs (eager by design); inductor takes grouped_mm in bf16 only
        eager = {"loop"} | ({"grouped_mm"} if dtype != torch.bfloat16 else set())
        self.experts = {p: (f if p in eager else wrap(f)) for p, f in EXPERTS.items()}

    def forward(self, tokens, pos, kcs, vcs, path, topi_out=None):
        """tokens [B, T] at positions pos [T]; returns logits [B, T, V]."""
        W, cfg = self.W, self.cfg
        h = F.embedding(tokens, W["embed"])
        ex = self.experts[path]
        for l, lw in enumerate(W["layers"]):
            moe = "w13" in lw
            h, x, topw, topi, sh = self.attn(
                h, pos, self.cos, self.sin, kcs[l], vcs[l], lw["ln1"], lw["wqkv"], lw["bqkv"],
                lw["qn"], lw["kn"], lw["wo"], lw["bo"], lw["ln2"], lw.get("wr"), lw.get("ws13"),
                lw.get("ws2"), lw.get("wsg"))
            if moe:
                if topi_out is not None:
                    topi_out.append(topi)
                h = ex(h, x, topw, topi, sh, lw["w13"], lw["w2"], lw.get("w2d"))
            else:
                h = self.mlp(h, x, lw["wd13"], lw["wd2"])
        return self.head(h, W["norm"], W["lm_head"], cfg.eps)


def new_cache(cfg, B, S, device, dtype, fill, seed):
    shape = (B, cfg.nkv, S, cfg.hd)
    if fill == "zeros":
        z = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(2 * cfg.L)]
    else:
        g = torch.Generator(device=device)
        g.manual_seed(seed)
        z = [torch.empty(shape, device=device, dtype=dtype).normal_(generator=g) for _ in range(2 * cfg.L)]
    return z[:cfg.L], z[cfg.L:]


# ---- exactness check against HF transformers ----------------------------------------------

def check_hf(a, d, cfg, compile_mode):
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    dtype = {"f32": torch.float32, "bf16": torch.bfloat16}[a.check_dtype]
    dev = a.device
    torch.manual_seed(a.seed)
    W = make_weights(cfg, dev, dtype, a.seed, jitter_norms=True)
    add_dense_layout(W, cfg)
    hd = {k: v for k, v in d.items() if k not in ("architectures", "model_type")}
    hcfg = AutoConfig.for_model(cfg.arch, **hd)
    hcfg._attn_implementation = "eager"
    hf = AutoModelForCausalLM.from_config(hcfg, dtype=dtype).to(dev).eval()
    missing, unexpected = hf.load_state_dict(hf_state_dict(W, cfg), strict=True)
    log(f"# check-hf: transformers {transformers.__version__} torch {torch.__version__}, "
        f"{type(hf).__name__}, {a.check_dtype}, experts_implementation "
        f"{hf.config._experts_implementation}; {cfg.summary()}")
    B, P, N = a.check_batch, a.check_prompt, a.check_steps
    g = torch.Generator().manual_seed(a.seed + 1)
    prompt = torch.randint(0, cfg.V, (B, P), generator=g).to(dev)
    dec = torch.randint(0, cfg.V, (B, N), generator=g).to(dev)
    with torch.no_grad():
        out = hf(prompt, use_cache=True)
        ref = [out.logits.float()]
        past = out.past_key_values
        for s in range(N):
            out = hf(dec[:, s:s + 1], past_key_values=past, use_cache=True)
            past = out.past_key_values
            ref.append(out.logits.float())
    scale = max(r.abs().max().item() for r in ref)
    m = Model(cfg, W, dev, compile_mode, a.attn, P + N, dtype)
    paths = PATHS if a.experts in ("auto", "all") else a.experts.split(",")
    worst = 0.0
    for path in paths:
        try:
            kcs, vcs = new_cache(cfg, B, P + N, dev, dtype, "zeros", 0)
            with torch.no_grad():
                got = [m.forward(prompt, torch.arange(P, device=dev), kcs, vcs, path).float()]
                for s in range(N):
                    got.append(m.forward(dec[:, s:s + 1], torch.tensor([P + s], device=dev), kcs, vcs, path).float())
            diffs = [(x - r).abs().max().item() for x, r in zip(got, ref)]
            agree = all(bool((x.argmax(-1) == r.argmax(-1)).all()) for x, r in zip(got, ref))
            worst = max(worst, max(diffs))
            log(f"check-hf {cfg.arch} experts {path:10s}: max |logit diff| prefill {diffs[0]:.3e}, "
                f"decode {max(diffs[1:]):.3e} (max |logit| {scale:.3f}); argmax equal: {agree}")
        except Exception as e:  # noqa: BLE001 - report the path and go on
            log(f"check-hf {cfg.arch} experts {path}: failed: {type(e).__name__}: {str(e)[:300]}")
            worst = float("inf")
    tol = 1e-4 if dtype == torch.float32 else 1e-1
    log(f"check-hf {'PASS' if worst <= tol * max(1.0, scale) else 'FAIL'}: worst {worst:.3e} "
        f"(tolerance {tol:g} x max(1, max |logit|))")
    return worst <= tol * max(1.0, scale)


# ---- benchmark ----------------------------------------------------------------------------

def candidates(cfg, B, sel):
    if sel == "all":
        return list(PATHS)
    if sel != "auto":
        return sel.split(",")
    c = []
    if B * cfg.k <= cfg.E:
        c.append("gather")
    c.append("grouped_mm")
    if cfg.uniq(B) >= cfg.E / 2:
        c.append("dense")
    c.append("loop")
    return c


def bench(a, cfg, compile_mode):
    dev = torch.device(a.device)
    cuda = dev.type == "cuda"
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32, "f16": torch.float16}[a.dtype]
    batches = [int(x) for x in a.batches.split(",")]
    S = a.context + a.warmup + a.steps
    plan = {B: candidates(cfg, B, a.experts) for B in batches}
    paths = [p for p in PATHS if any(p in c for c in plan.values())]
    bad = [p for c in plan.values() for p in c if p not in PATHS]
    if bad:
        sys.exit(f"torch_decode: unknown experts path {bad[0]!r} (gather, grouped_mm, dense, loop, auto, all)")
    gname = torch.cuda.get_device_name(dev) if cuda else "cpu"
    log(f"# torch {torch.__version__} on {gname}; {cfg.summary()}")
    log(f"# {a.dtype} random weights, context {a.context}, KV cache {S} positions (random), warm-up {a.warmup}, "
        f"median of {a.steps}; compile {compile_mode or 'off'}"
        f"{' + coordinate-descent tuning' if compile_mode and a.cdt else ''}, attention {a.attn}, "
        f"CUDA graph {'whole step' if a.graph and cuda else 'off'}; paths per batch: "
        + ", ".join(f"{B}: {'/'.join(c)}" for B, c in plan.items()))
    t0 = time.time()
    W = make_weights(cfg, dev, dtype, a.seed, jitter_norms=False)
    if "dense" in paths:
        add_dense_layout(W, cfg)
    if cuda:
        torch.cuda.synchronize()
        log(f"# weights {sum(t.numel() * t.element_size() for t in _tensors(W)) / 1e9:.2f} GB "
            f"(dense layout included: {'dense' in paths}) in {time.time() - t0:.1f} s; "
            f"GPU memory allocated {torch.cuda.memory_allocated() / 1e9:.1f} GB")
    m = Model(cfg, W, dev, compile_mode, a.attn, S, dtype)
    results = {}
    for B in batches:
        for path in plan[B]:
            try:
                ms, info = run_one(a, cfg, m, path, B, S, dev, dtype)
            except Exception as e:  # noqa: BLE001 - one failing path must not end the run
                log(f"torch {cfg.arch} experts {path:10s} batch {B:4d}: failed: {type(e).__name__}: "
                    f"{str(e).splitlines()[0][:300] if str(e) else ''}")
                if cuda:
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
                continue
            log(f"torch {cfg.arch} experts {path:10s} batch {B:4d}: {ms:8.3f} ms/step  {info}")
            results.setdefault(B, []).append((ms, path))
        if B in results:
            ms, path = min(results[B])
            log(f"BEST batch {B}: {ms:.3f} ms/step ({path}; " +
                ", ".join(f"{p} {t:.3f}" for t, p in sorted(results[B])) + ")")
    return results


def _tensors(W):
    seen = set()
    for t in [W["embed"], W["norm"], W["lm_head"]] + [v for lw in W["layers"] for v in lw.values()]:
        if t is not None and id(t) not in seen:
            seen.add(id(t))
            yield t


def run_one(a, cfg, m, path, B, S, dev, dtype):
    cuda = dev.type == "cuda"
    kcs, vcs = new_cache(cfg, B, S, dev, dtype, a.kv_fill, a.seed + B)
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed + 7 * B)
    toks = torch.randint(0, cfg.V, (B, S - a.context), device=dev, generator=g)
    pos = torch.tensor([a.context], device=dev)
    nxt = torch.zeros(B, dtype=torch.long, device=dev)

    def step():
        tok = toks.index_select(1, pos - a.context)  # [B, 1]: a fresh random token each step
        logits = m.forward(tok, pos, kcs, vcs, path)
        nxt.copy_(logits[:, -1].argmax(dim=-1))

    use_graph = a.graph and cuda and path != "loop"
    t0 = time.time()
    with torch.no_grad():
        side = torch.cuda.Stream() if use_graph else None
        if side is not None:
            side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side) if side is not None else _null():
            for i in range(a.warmup):  # compiles on the first call(s)
                pos.fill_(a.context + i)
                step()
        if cuda:
            torch.cuda.current_stream().wait_stream(side) if side is not None else None
            torch.cuda.synchronize()
        compile_s = time.time() - t0
        graph, note = None, "graph" if use_graph else "no graph"
        if use_graph:
            try:
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    step()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - time it without the graph instead
                graph, note = None, f"no graph: capture failed: {type(e).__name__}: {str(e)[:120]}"
                torch.cuda.synchronize()
        run = graph.replay if graph is not None else step
        times = []
        deadline = time.time() + a.budget_s
        for i in range(a.steps):
            p = a.context + a.warmup + i
            if cuda:
                e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                e0.record()
                pos.fill_(p)
                run()
                e1.record()
                times.append((e0, e1))
            else:
                c0 = time.perf_counter()
                pos.fill_(p)
                run()
                times.append((time.perf_counter() - c0) * 1e3)
            if time.time() > deadline and i >= 4:
                break
        if cuda:
            torch.cuda.synchronize()
            times = [e0.elapsed_time(e1) for e0, e1 in times]
        # routing diagnostic: distinct experts a layer selected in one more (eager) step
        topis = []
        pos.fill_(a.context)
        m.forward(toks[:, :1], pos, kcs, vcs, path, topi_out=topis)
        uniq = statistics.mean(len(torch.unique(t)) for t in topis) if topis else 0.0
    del graph, kcs, vcs
    if cuda:
        torch.cuda.empty_cache()
    times.sort()
    med = statistics.median(times)
    p90 = times[min(len(times) - 1, (len(times) * 9) // 10)]
    info = (f"(p90 {p90:.3f}, {len(times)} steps, {B / med * 1e3:.0f} tok/s, distinct experts/layer "
            f"{uniq:.1f} (uniform {cfg.uniq(B):.1f}), warm-up+compile {compile_s:.1f} s, {note})")
    return med, info


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *e):
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset", help="msmoed shape preset (config/models/*.json)")
    ap.add_argument("--batches", default="1,8,32,128,256")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30, help="timed steps (median)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first (compile here)")
    ap.add_argument("--budget-s", type=float, default=30.0,
                    help="stop timing a (path, batch) after this many seconds (at least 5 steps)")
    ap.add_argument("--experts", default="auto", help="gather|grouped_mm|dense|loop|auto|all or a comma list")
    ap.add_argument("--attn", choices=("bmm", "sdpa"), default="bmm",
                    help="decode attention: grouped-query matmuls + softmax (bmm) or F.scaled_dot_product_attention")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=("bf16", "f16", "f32"), default="bf16")
    ap.add_argument("--compile-mode", default="default",
                    help="torch.compile mode (default, max-autotune-no-cudagraphs, reduce-overhead, max-autotune)")
    ap.add_argument("--no-compile", action="store_true", help="run eagerly (no torch.compile)")
    ap.add_argument("--no-cdt", dest="cdt", action="store_false", help="no coordinate-descent tuning")
    ap.add_argument("--no-graph", dest="graph", action="store_false", help="no whole-step CUDA graph")
    ap.add_argument("--kv-fill", choices=("random", "zeros"), default="random")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true", help="tiny shapes of the preset's family (CPU tests)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON",
                    help="override a preset key, e.g. --set num_hidden_layers=2 (repeatable)")
    ap.add_argument("--check-hf", action="store_true",
                    help="compare logits (prefill + decode) of every experts path with HF transformers")
    ap.add_argument("--check-dtype", choices=("f32", "bf16"), default="f32")
    ap.add_argument("--check-batch", type=int, default=2)
    ap.add_argument("--check-prompt", type=int, default=7)
    ap.add_argument("--check-steps", type=int, default=4)
    a = ap.parse_args()

    d = load_preset(a.preset, a.tiny, a.set)
    cfg = Cfg(d)
    compile_mode = None if a.no_compile else a.compile_mode
    if compile_mode:
        import torch._dynamo
        import torch._inductor.config as ic
        torch._dynamo.config.recompile_limit = 64
        torch._dynamo.config.accumulated_recompile_limit = 4096
        ic.coordinate_descent_tuning = a.cdt
        if "reduce-overhead" in compile_mode or compile_mode == "max-autotune":
            a.graph = False  # inductor's own CUDA graphs (per unit) instead of the whole-step one
    if a.device.startswith("cuda"):
        torch.backends.cuda.matmul.allow_tf32 = True
    if a.check_hf:
        sys.exit(0 if check_hf(a, d, cfg, compile_mode) else 1)
    bench(a, cfg, compile_mode)


if __name__ == "__main__":
    main()

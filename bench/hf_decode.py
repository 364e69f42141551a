#!/usr/bin/env python3
"""Peer baseline: HF transformers decode step time for a msmoed shape preset (random bf16 weights,
context 512) on the GPU, with each MoE experts implementation the installed transformers offers
(grouped_mm, batched_mm, eager), one line per implementation and batch, then the best per batch.
Run on the GPU machine next to msmoe-bench:
    python3 bench/hf_decode.py config/models/qwen1.5-moe-a2.7b.json --batches 1,32
    python3 bench/hf_decode.py config/models/qwen3-30b-a3b.json --batches 1,8,32 --impls batched_mm
CPU smoke test (tiny shapes of the preset's family):
    python3 bench/hf_decode.py config/models/qwen3-30b-a3b.json --device cpu --tiny --context 16

The model is HF's own (Qwen2MoeForCausalLM / Qwen3MoeForCausalLM from the preset, eager PyTorch,
sdpa attention, DynamicCache). The cache starts with --context positions of random K/V (as the
other peers; --prefill runs a real prefill instead) and each timed step appends one token, as
HF's generate() does. Timing: wall clock around model(...) with cuda synchronize, --warmup steps
first, median of --steps (stopping early after --budget-s per implementation and batch).

That the experts implementation really switches is shown, per implementation, by (1) the value
every experts module reads at dispatch (config._experts_implementation), with the function the
ExpertsInterface resolves it to, and (2) the aten ops one untimed decode step runs (counted with a
TorchDispatchMode): grouped_mm runs _grouped_mm, batched_mm runs bmm, eager runs index_add_."""
import argparse
import collections
import os
import statistics
import sys
import time

import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_decode import load_preset  # noqa: E402  (same preset handling, --tiny and --set)

OPS = ("_grouped_mm", "bmm", "index_add_", "mm", "nonzero", "histc")


class OpCounter(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n[func.overloadpacket.__name__] += 1
        return func(*args, **(kwargs or {}))


def log(*a):
    print(*a, flush=True)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def which_impl(model):
    """The experts implementation each experts module dispatches to, and the function behind it."""
    try:
        from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS
    except ImportError:
        ALL_EXPERTS_FUNCTIONS = None
    seen = collections.Counter()
    for name, mod in model.named_modules():
        if name.endswith(".experts") and hasattr(mod, "config"):
            impl = getattr(mod.config, "_experts_implementation", None)
            fn = "original forward"
            if ALL_EXPERTS_FUNCTIONS is not None and impl not in (None, "eager"):
                f = ALL_EXPERTS_FUNCTIONS.get(impl, None)
                fn = getattr(f, "__name__", repr(f))
            seen[(impl, fn)] += 1
    return ", ".join(f"{n} modules -> {impl} ({fn})" for (impl, fn), n in seen.items()) or "no experts modules"


def new_cache(model, cfg, B, ctx, dev, dtype, seed):
    from transformers import DynamicCache
    cache = DynamicCache(config=model.config)
    hd = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    g = torch.Generator(device=dev)
    g.manual_seed(seed)
    for l in range(cfg.num_hidden_layers):
        k = torch.randn(B, cfg.num_key_value_heads, ctx, hd, device=dev, dtype=dtype, generator=g)
        v = torch.randn(B, cfg.num_key_value_heads, ctx, hd, device=dev, dtype=dtype, generator=g)
        cache.update(k, v, l)
    return cache


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("preset")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--context", type=int, default=512)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget-s", type=float, default=20.0,
                    help="stop timing an (implementation, batch) after this many seconds (at least 3 steps)")
    ap.add_argument("--impls", default="grouped_mm,batched_mm,eager")
    ap.add_argument("--prefill", action="store_true", help="fill the cache by a real prefill (old behaviour)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtype", choices=("bf16", "f32"), default="bf16")
    ap.add_argument("--tiny", action="store_true", help="tiny shapes of the preset's family (CPU tests)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=JSON", help="override a preset key")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()

    d = load_preset(a.preset, a.tiny, a.set)
    cfg = AutoConfig.for_model(d["model_type"], **{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    dev = torch.device(a.device)
    dtype = {"bf16": torch.bfloat16, "f32": torch.float32}[a.dtype]
    torch.manual_seed(a.seed)
    t0 = time.time()
    with torch.device(dev):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    sync(dev)
    gname = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    log(f"# transformers {transformers.__version__} torch {torch.__version__} {gname}; "
        f"{type(model).__name__} {cfg.num_hidden_layers} layers, {cfg.num_experts} experts top-"
        f"{cfg.num_experts_per_tok}; attention {model.config._attn_implementation}; built in {time.time() - t0:.1f} s; "
        f"context {a.context} ({'prefill' if a.prefill else 'random KV'}), median of {a.steps} after {a.warmup}")
    results = {}
    batches = [int(x) for x in a.batches.split(",")]
    for impl in a.impls.split(","):
        try:
            model.set_experts_implementation(impl)
        except Exception as e:  # noqa: BLE001
            log(f"# experts_implementation {impl}: unavailable ({type(e).__name__}: {str(e)[:200]})")
            continue
        log(f"# experts_implementation {impl}: config {model.config._experts_implementation}; {which_impl(model)}")
        for B in batches:
            try:
                with torch.no_grad():
                    g = torch.Generator(device=dev)
                    g.manual_seed(a.seed + B)
                    if a.prefill:
                        ids = torch.randint(0, cfg.vocab_size, (B, a.context), device=dev, generator=g)
                        out = model(ids, use_cache=True, logits_to_keep=1)
                        past = out.past_key_values
                    else:
                        past = new_cache(model, cfg, B, a.context, dev, dtype, a.seed + B)
                    toks = torch.randint(0, cfg.vocab_size, (B, a.warmup + a.steps + 1), device=dev, generator=g)
                    # one untimed step under an op counter: which kernels the experts really ran
                    with OpCounter() as oc:
                        out = model(toks[:, :1], past_key_values=past, use_cache=True)
                    past = out.past_key_values
                    ops = " ".join(f"{op}={oc.n.get(op, 0)}" for op in OPS)
                    times, deadline = [], None
                    for s in range(a.warmup + a.steps):
                        sync(dev)
                        c0 = time.perf_counter()
                        out = model(toks[:, s + 1:s + 2], past_key_values=past, use_cache=True)
                        nxt = out.logits[:, -1].argmax(-1)  # the greedy token, as the other peers
                        sync(dev)
                        if s >= a.warmup:
                            times.append((time.perf_counter() - c0) * 1e3)
                            deadline = deadline or time.time() + a.budget_s
                            if time.time() > deadline and len(times) >= 3:
                                break
                        past = out.past_key_values
                    del nxt
                ms = statistics.median(times)
                log(f"impl {impl:10s} batch {B:4d}: {ms:8.2f} ms/step ({len(times)} steps; one step's aten ops: {ops})")
                results.setdefault(B, []).append((ms, impl))
            except Exception as e:  # noqa: BLE001
                log(f"impl {impl} batch {B}: failed: {type(e).__name__}: {str(e)[:200]}")
            finally:
                past = out = None
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
    for B, r in sorted(results.items()):
        ms, impl = min(r)
        log(f"BEST batch {B}: {ms:.2f} ms/step ({impl}; " + ", ".join(f"{i} {m:.2f}" for m, i in sorted(r)) + ")")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Peer baseline: HF transformers decode step time for the Qwen1.5-MoE-A2.7B shapes (random bf16
weights, context 512) on the GPU, batch 1 and 32, with each MoE experts implementation the
installed transformers offers; prints the best. Run on the GPU machine next to msmoe-bench:
    python3 bench/hf_decode.py config/models/qwen1.5-moe-a2.7b.json --batches 1,32"""
import argparse, json, statistics, sys, time

import torch
import transformers
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM

ap = argparse.ArgumentParser()
ap.add_argument("preset")
ap.add_argument("--batches", default="1,32")
ap.add_argument("--context", type=int, default=512)
ap.add_argument("--steps", type=int, default=20)
a = ap.parse_args()
cfg = Qwen2MoeConfig(**{k: v for k, v in json.load(open(a.preset)).items() if k not in ("architectures",)})
torch.manual_seed(0)
torch.set_default_dtype(torch.bfloat16)
with torch.device("cuda"):
    model = Qwen2MoeForCausalLM(cfg).eval()
print(f"# transformers {transformers.__version__} torch {torch.__version__} {torch.cuda.get_device_name()}", flush=True)
results = {}
for impl in ["grouped_mm", "batched_mm", "eager"]:
    try:
        model.set_experts_implementation(impl)
    except Exception as e:  # noqa
        try:
            model.config._experts_implementation = impl
        except Exception:
            print(f"# experts_implementation {impl}: unavailable ({e})", flush=True)
            continue
    for B in [int(x) for x in a.batches.split(",")]:
        try:
            with torch.no_grad():
                ids = torch.randint(0, cfg.vocab_size, (B, a.context), device="cuda")
                out = model(ids, use_cache=True)
                past = out.past_key_values
                tok = out.logits[:, -1:].argmax(-1)
                times = []
                for s in range(a.steps + 3):
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    out = model(tok, past_key_values=past, use_cache=True)
                    tok = out.logits[:, -1:].argmax(-1)
                    torch.cuda.synchronize()
                    if s >= 3:
                        times.append((time.perf_counter() - t0) * 1e3)
                    past = out.past_key_values
            ms = statistics.median(times)
            print(f"impl {impl:10s} batch {B:4d}: {ms:8.2f} ms/step", flush=True)
            results.setdefault(B, []).append((ms, impl))
        except Exception as e:  # noqa
            print(f"impl {impl} batch {B}: failed: {str(e)[:200]}", flush=True)
for B, r in sorted(results.items()):
    ms, impl = min(r)
    print(f"BEST batch {B}: {ms:.2f} ms/step ({impl})", flush=True)

#!/usr/bin/env python3
"""CUDA backend vs CPU backend on the golden tiny models (runs on the GPU machine, numpy only).

For every golden prompt: greedy tokens equal, logits within bf16 tolerance of the CPU oracle;
CUDA-graph replay vs eager bitwise; multi-stream on vs off bitwise; a 100-token run replays the
decode graph 100 times and must equal eager bitwise. Prints one line per check, exits non-zero
on any failure."""
import json, os, subprocess, sys, tempfile
import numpy as np

BIN = os.environ.get("MSMOE_RUN", "gpu-run/bin/msmoe-run")
fails = 0


def run(model, prompt, n, *extra):
    with tempfile.NamedTemporaryFile(suffix=".npy") as f:
        cmd = [BIN, "--model", model, "--prompt-ids", ",".join(map(str, prompt)),
               "--max-new-tokens", str(n), "--ignore-eos", "--dump-logits", f.name, *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if p.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()}")
        return [int(x) for x in p.stdout.split(",")], np.load(f.name)


def check(name, ok, detail=""):
    global fails
    fails += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name} {detail}", flush=True)


for m in ["qwen2moe-gqa", "qwen2moe-mha-tied", "qwen3moe", "mixtral", "../../models/stories260k-moe"]:
    d = f"tests/data/{m}"
    if m.startswith(".."):
        g = json.load(open("tests/data/stories260k_dragon.json"))
        prompts, lens = [g["prompt_ids"]], [len(g["expected_ids"])]
    else:
        g = json.load(open(f"{d}/golden.json"))
        prompts, lens = g["prompts"], [len(x) for x in g["generated"]]
    for i, (p, n) in enumerate(zip(prompts, lens)):
        try:
            ct, cl = run(d, p, n, "--backend", "cpu")
            gt, gl = run(d, p, n, "--backend", "cuda")
            et, el = run(d, p, n, "--backend", "cuda", "--no-cuda-graphs")
            st, sl = run(d, p, n, "--backend", "cuda", "--no-multi-stream")
        except Exception as e:  # noqa
            check(f"{m}[{i}] runs", False, str(e)[:400])
            continue
        rel = float(np.abs(gl - cl).max() / np.abs(cl).max())
        check(f"{m}[{i}] cuda vs cpu tokens", gt == ct, f"cuda={gt[:8]} cpu={ct[:8]}")
        check(f"{m}[{i}] cuda vs cpu logits", rel <= 2e-2, f"rel={rel:.2e}")
        check(f"{m}[{i}] graph replay vs eager bitwise", np.array_equal(gl, el) and gt == et,
              f"maxdiff={float(np.abs(gl - el).max()):.3e}")
        check(f"{m}[{i}] multi-stream on vs off bitwise", np.array_equal(gl, sl) and gt == st,
              f"maxdiff={float(np.abs(gl - sl).max()):.3e}")

# 100 replays of the decode graph vs eager
d = "tests/data/qwen2moe-gqa"
gt, gl = run(d, [3, 1, 4, 1, 5], 101, "--backend", "cuda")
et, el = run(d, [3, 1, 4, 1, 5], 101, "--backend", "cuda", "--no-cuda-graphs")
check("100 decode replays vs eager bitwise", np.array_equal(gl, el) and gt == et,
      f"maxdiff={float(np.abs(gl - el).max()):.3e}")
print(f"{fails} failed", flush=True)
sys.exit(1 if fails else 0)

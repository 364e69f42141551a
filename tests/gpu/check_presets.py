#!/usr/bin/env python3
"""The CUDA backend's switches at real shapes (runs on the GPU machine, numpy only).

The golden models of check_cuda_vs_cpu.py are tiny (hidden 64-192, vocab 256), so every dense
linear there is a small-N GEMV: the decode GEMVs and MMVs of full-size weights never run in that
check. Here msmoe-run generates with dummy weights of shape presets (random
bf16 or FP8 codes, filled on the GPU; `--dummy-weights PRESET.json`) and each variant must give
the default's logits and tokens bit for bit: CUDA-graph replay vs eager, multi-stream on vs off,
PDL on vs off, the GEMVs' early weight loads on vs off, the FP8 GEMV's 8 loads a lane a row in
flight vs 4, an ADD_RMSNORM and the LINEAR on its norm as one kernel vs two, the RoPE kernels'
position / weight / cosine prologue before the PDL wait vs after, the routed experts launched
after the router vs as its programmatic dependent where a shared expert runs beside them, the FP8
experts' codes decoded with integer operations vs the hardware's conversion, the qkv GEMV with the
RoPE and K/V cache write in its epilogue vs the two kernels, the norm-in qkv GEMV with the q/k
norm, RoPE and K/V write in a cluster epilogue vs the norm-in GEMV and the q/k norm kernel (Qwen3),
the q/k norm, RoPE and K/V write inside the split tensor-core attention vs the q/k norm kernel
before it (decode steps of 2-16 tokens, after any qkv projection by default, after a bf16 one only
with MSM_CUDA_ATT_QK_ROPE=1; at one token with CHECK_BASE_ENV=
"MSM_CUDA_ATT_MMA_SPLIT_MIN_T=1", which puts every decode step here on the split kernel),
the routed experts' combine inside the ADD_RMSNORM or MOE_COMBINE_NORM after them vs its own
kernel, the grouping of the routed experts' pairs by the router's last block (off by default) vs the
grouping kernel (plain and norm-fused router; at 5-64 tokens, so the 8-token prefill here), the combines reading
the routing before their PDL wait vs after it, the shared expert's gate/up GEMV
with the SwiGLU in its epilogue vs the two kernels, the qkv MMV with RoPE and the K/V write in its
epilogue vs the two kernels, the block-sliced MMVs of 8 or 16 slices streamed through shared memory
(Qwen3's qkv at 3-8 tokens) vs not, the grouped expert GEMVs' grid a row per
selected expert vs per expert, each layer's o_proj and shared expert prefetched into L2 during its
attention, the next layer's qkv at the router and the K/V cache rows from the norm before the qkv
projection (pass prefetch_l2; the K/V rows' on by default, whose fork sits between the experts and
the norm that combines their sum; the others plain and evict_last) vs not, the router's top-k ranked by one
thread-block cluster a token vs by the last block to arrive on a counter, the cluster routers' logits
gathered by st.async into the ranking blocks' mbarriers vs by distributed stores and a cluster
barrier, the grouped expert GEMVs finding their pairs themselves vs after the grouping kernel, the attention's block-table entries
copied into shared memory first vs loaded with each tile, their down's first weight loads before
the PDL wait vs after, and their tokens a pass and K chunks in flight; the routed experts' down
at 4 rows a warp vs 2 and split over the slots vs one warp a row, and their gate/up at 2 loads a row
vs 4. Not here: MSM_CUDA_MMV_BSLICE, MSM_CUDA_MMV_NJ (and MSM_CUDA_MMV_SLOTS), which choose how many
ways the MMV cuts K, and MSM_CUDA_FP8_GEMV_SPLIT(_MIN_K), which splits the one-token FP8 GEMV's
long rows over K (test_cuda_kernels' linear_fp8_split_matches_cpu holds it to the CPU), a different order of fp32 sums (the block slices are bitwise a cluster of as many slices, not
the cluster rule's own choice: the prefill logits moved by up to 0.08 on these dummy weights, H200,
2026-12-04); test_cuda_kernels' linear_mmv_block_slices holds each against the CPU (2e-5).
Prompts of 2, 4 and 8 tokens put the prefill's dense linears at T = 2, 4 and 8 (and the experts at
8 on the grouped GEMVs), then every decode step at T = 1. There is no oracle at these sizes (the CPU backend would take minutes a token): the
kernels' own tests (test_cuda_kernels) compare each path with the CPU at these shapes.
A variant with a tolerance (a fourth field) changes the numerics on purpose: the SIMT attention
against the default tensor-core kernel split over a cluster (4-16 tokens, 4-8 query heads a kv head;
MHA at one token: every decode step of Qwen1.5-MoE here),
and for scale two changes of the same kind the project already takes (the tensor-core attention
unsplit at every size; the MMVs' K slices by the cluster rule, another order of fp32 sums): its
tokens must be the default's and its logits within that relative distance (max |a - b| / max |b|);
the line prints both.
usage: check_presets.py [PRESET.json ...]   (default: the Qwen1.5-MoE, Qwen3-30B-A3B and its
FP8 presets); CHECK_VARIANTS=word[,word] keeps the variants whose names hold one of the words;
CHECK_BASE_ENV="VAR=value ..." runs the default and every variant with those switches too (e.g.
the bitwise lines on top of a switch that is not yet the default), CHECK_BASE_FLAGS="--flag ..." the
same with msmoe-run flags (e.g. "--fork-before-norm"); CHECK_PROMPTS=i[,i] keeps those
prompts (0: 2 tokens, 1: 4, 2: 8).
Prints one line per check, exits non-zero on any failure."""
import os, subprocess, sys, tempfile
import numpy as np

BIN = os.environ.get("MSMOE_RUN", "gpu-run/bin/msmoe-run")
PRESETS = sys.argv[1:] or ["config/models/qwen1.5-moe-a2.7b.json", "config/models/qwen3-30b-a3b.json",
                           "config/models/qwen3-30b-a3b-fp8.json"]
PROMPTS = [[11, 22], [101, 7, 4000, 9], [5, 1000, 77, 300, 12, 9000, 41, 2]]
N_NEW = 6
# The near lines' bound: on these dummy weights (48 layers of random bf16 or FP8 codes) a change of
# fp32 summation order alone moves the logits by up to 2.3e-2 of their largest (the MMVs' K slices,
# Qwen3-30B-A3B, 8-token prompt), the unsplit tensor-core attention against the SIMT kernel by up to
# 4.0e-2 (its FP8 preset, 2-token prompt) and the split one by up to 3.7e-2, tokens equal in all
# (H200, 2026-12-05, bench/results/2026-12-05-h200-s20 run 1); each kernel is within 1e-4 (attention)
# or 2e-5 (MMV) of the CPU in test_cuda_kernels
TOL_NEAR = 5e-2
VARIANTS = [  # (name, extra flags, environment)
    ("graph replay vs eager", ["--no-cuda-graphs"], {}),
    ("multi-stream on vs off", ["--no-multi-stream"], {}),
    ("PDL on vs off", [], {"MSM_CUDA_PDL": "0"}),
    ("early GEMV weight loads vs after the PDL wait", [], {"MSM_CUDA_GEMV_EARLY": "0"}),
    ("FP8 GEMV with 4 loads a lane a row vs 8", [], {"MSM_CUDA_FP8_GEMV_U8": "0"}),
    ("FP8 GEMVs' integer decode vs the hardware one", [], {"MSM_CUDA_FP8_GEMV_HW": "0"}),
    ("ADD_RMSNORM + LINEAR one kernel vs two", [], {"MSM_CUDA_NORM_LINEAR": "0"}),
    ("RoPE kernels' early prologue vs after the PDL wait", [], {"MSM_CUDA_SMALL_EARLY": "0"}),
    ("routed experts after the router vs programmatic beside the shared expert", [], {"MSM_CUDA_MOE_AUX_SERIAL_MAX_T": "0"}),
    ("FP8 experts' hardware decode vs the integer one", [], {"MSM_CUDA_FP8_MOE_HW": "0"}),
    ("FP8 pair-path experts on the general dot vs the lean dot with the next codes early", [], {"MSM_CUDA_FP8_MOE_LEAN": "0"}),
    ("FP8 pair-path experts on the lean dot vs the same with the next codes early", [], {"MSM_CUDA_FP8_MOE_LEAN": "1"}),
    ("FP8 tiled expert GEMMs with two K steps a pipeline stage vs one (8-token prefill)", [],
     {"MSM_CUDA_FP8_TILED_KS": "2"}),
    ("pipelined bf16 rows-dot vs one step at a time", [], {"MSM_CUDA_ROWS_PIPE": "0"}),
    ("ADD_RMSNORM + router two kernels vs one", [], {"MSM_CUDA_NORM_ROUTER": "1"}),
    ("the one-token bf16 GEMV's 4096-wide rows in one step vs four", [], {"MSM_CUDA_GEMV_U16": "0"}),
    ("the one-token bf16 GEMV's 2048-wide rows in two steps vs one", [], {"MSM_CUDA_GEMV_U8": "1"}),
    ("qkv GEMV + RoPE + K/V write one kernel vs two", [], {"MSM_CUDA_LINEAR_ROPE": "0"}),
    ("gate/up GEMV + SwiGLU one kernel vs two", [], {"MSM_CUDA_LINEAR_SWIGLU": "0"}),
    ("qkv MMV + RoPE + K/V write two kernels vs one (3-8 tokens)", [], {"MSM_CUDA_LINEAR_ROPE_MMV": "0"}),
    ("block-sliced MMVs streamed through shared memory vs not (3-8 tokens)", [], {"MSM_CUDA_MMV_STREAM_BS_MIN_N": "0"}),
    ("router as one cluster a token vs a counter and the last block", [], {"MSM_CUDA_ROUTER_CLUSTER": "0"}),
    ("routers' logits by distributed stores and a cluster barrier vs by st.async (the default)", [],
     {"MSM_CUDA_ROUTER_ST_ASYNC": "0"}),
    ("attention's block-table entries copied to shared memory vs loaded with each tile", [], {"MSM_CUDA_ATT_BT_CACHE": "0"}),
    ("qkv + RoPE kernel at 12 blocks an SM vs unbounded", [], {"MSM_CUDA_GEMV_MINB": "0"}),
    ("the one-token GEMV at 12 blocks an SM too", [], {"MSM_CUDA_GEMV_MINB": "3"}),
    ("grouped expert GEMVs after the grouping kernel vs scanning their pairs", [], {"MSM_CUDA_MOE_GROUP_SCAN_MAX_T": "64"}),
    ("grouped expert down's first weight loads before the PDL wait vs after", [], {"MSM_CUDA_MOE_GG_EARLY": "0"}),
    ("grouped expert GEMVs' grid a row per selected expert vs per expert", [], {"MSM_CUDA_MOE_GG_COMPACT": "0"}),
    ("grouped expert GEMVs at 2 tokens a pass, 3 chunks in flight vs 4 and 2", [],
     {"MSM_CUDA_MOE_GG_GATEUP_NT": "2", "MSM_CUDA_MOE_GG_DOWN_NT": "2", "MSM_CUDA_MOE_GG_DOWN_U": "3"}),
    ("grouped expert gate/up at 4 chunks in flight vs 2", [], {"MSM_CUDA_MOE_GG_GATEUP_U": "4"}),
    ("grouped expert GEMVs on persistent grids vs a block an item", [], {"MSM_CUDA_MOE_GG_PERSIST": "3"}),
    ("pair-path down at 4 rows a warp (bf16) vs 2", [], {"MSM_CUDA_MOE_DOWN_HB": "2"}),
    ("pair-path down split over the slots vs one warp a row", [], {"MSM_CUDA_MOE_KERNELS": "down_warp"}),
    ("pair-path gate/up at 2 loads a row where one wave vs never", [], {"MSM_CUDA_MOE_GU_U2": "0"}),
    ("pair-path gate/up at 2 loads a row always", [], {"MSM_CUDA_MOE_GU_U2": "1"}),
    ("L2 prefetch of o_proj and the shared expert vs none", ["--prefetch-l2"], {}),
    ("L2 prefetch with evict_last and 16 MiB set aside vs none", ["--prefetch-l2"],
     {"MSM_CUDA_L2_PREFETCH_LAST": "1", "MSM_CUDA_L2_PERSIST_MB": "16"}),
    ("L2 prefetch of the next qkv beside the K/V cache rows' vs the K/V rows' alone", ["--prefetch-l2-next"], {}),
    ("no L2 prefetch of the K/V cache rows vs their prefetch (the default; the combine inside the norm after the "
     "experts either way)", ["--no-prefetch-kv"], {}),
    ("shared expert forked before its norm (its own copy, three kernels) vs after", ["--fork-before-norm"], {}),
    ("shared expert forked before its norm, norm + gate/up + SwiGLU one kernel vs after",
     ["--fork-before-norm"], {"MSM_CUDA_NORM_LINEAR_SWIGLU": "1"}),
    ("... at 4 rows a warp", ["--fork-before-norm"], {"MSM_CUDA_NORM_LINEAR_SWIGLU": "1", "MSM_CUDA_NORM_SWIGLU_ROWS": "4"}),
    ("shared expert forked before its norm, its norm-in gate/up + SwiGLU and the norm-in cluster router vs neither",
     ["--fork-before-norm"], {"MSM_CUDA_NORM_LINEAR_SWIGLU": "1", "MSM_CUDA_NORM_ROUTER": "1"}),
    ("pair-path split down's ids and first weights after its PDL wait vs before", [], {"MSM_CUDA_MOE_PAIR_EARLY": "0"}),
    ("dense MLPs' norm + gate/up + SwiGLU one kernel vs the norm + GEMV and the SwiGLU", [],
     {"MSM_CUDA_NORM_LINEAR_SWIGLU": "1"}),
    ("norm-in qkv GEMV + q/k norm + RoPE + K/V write one kernel (a head's blocks a cluster) vs two", [],
     {"MSM_CUDA_NORM_QK_ROPE": "1"}),
    ("q/k norm + RoPE + K/V write inside the split attention vs the q/k norm kernel before it", [],
     {"MSM_CUDA_ATT_QK_ROPE": "0"}),
    ("q/k norm + RoPE + K/V write inside the split attention after a bf16 qkv only vs after any", [],
     {"MSM_CUDA_ATT_QK_ROPE": "1"}),
    ("SIMT attention vs the tensor-core kernel split over a cluster (near)", [], {"MSM_CUDA_ATT_MMA_SPLIT": "0"}, TOL_NEAR),
    ("tensor-core attention unsplit at every size vs the default (near)", [],
     {"MSM_CUDA_ATT_MMA_SPLIT": "0", "MSM_CUDA_ATT_MMA": "2"}, TOL_NEAR),
    ("MMVs' K slices by the cluster rule vs the block slices (near)", [], {"MSM_CUDA_MMV_BSLICE": "0"}, TOL_NEAR),
    ("routed experts' combine in its own kernel vs inside the next add + norm (8-token prefill)", [],
     {"MSM_CUDA_MOE_FUSED_COMBINE": "0"}),
    ("routed experts' combine inside any next norm vs only an add + norm", [], {"MSM_CUDA_MOE_FUSED_COMBINE": "1"}),
    ("routed experts' combine inside the next add + norm, one block a token vs a cluster", [],
     {"MSM_CUDA_MOE_COMBINE_CLUSTER": "0"}),
    ("routed experts' grouping in the router's last block vs the grouping kernel (8-token prefill)", [],
     {"MSM_CUDA_ROUTER_GROUP": "1"}),
    ("router grouping inside the norm-fused router vs the grouping kernel", [],
     {"MSM_CUDA_NORM_ROUTER": "1", "MSM_CUDA_ROUTER_GROUP": "1"}),
    ("combines reading the routing after their PDL wait vs before (8-token prefill)", [],
     {"MSM_CUDA_MOE_COMBINE_EARLY": "0"}),
    ("router as clusters of 2 tokens vs a counter and the last block (8-token prefill)", [],
     {"MSM_CUDA_ROUTER_TCLUSTER": "0"}),
    ("router as one cluster for 8 tokens vs clusters of 2 (8-token prefill)", [],
     {"MSM_CUDA_ROUTER_TCLUSTER_TB": "8"}),
    ("router as one cluster for 8 tokens grouping the pairs vs the grouping kernel (8-token prefill)", [],
     {"MSM_CUDA_ROUTER_TCLUSTER_TB": "8", "MSM_CUDA_ROUTER_GROUP": "1"}),
]
BASE_ENV = dict(kv.split("=", 1) for kv in os.environ.get("CHECK_BASE_ENV", "").split())
BASE_FLAGS = os.environ.get("CHECK_BASE_FLAGS", "").split()  # e.g. "--fork-before-norm": on every run
if os.environ.get("CHECK_PROMPTS"):
    PROMPTS = [PROMPTS[int(i)] for i in os.environ["CHECK_PROMPTS"].split(",")]
if os.environ.get("CHECK_VARIANTS"):  # e.g. CHECK_VARIANTS="L2 prefetch" for the lines of one change
    VARIANTS = [v for v in VARIANTS if any(w in v[0] for w in os.environ["CHECK_VARIANTS"].split(","))]
fails = 0


def run(preset, prompt, extra, env):
    with tempfile.NamedTemporaryFile(suffix=".npy") as f:
        cmd = [BIN, "--dummy-weights", preset, "--backend", "cuda", "--prompt-ids", ",".join(map(str, prompt)),
               "--max-new-tokens", str(N_NEW), "--ignore-eos", "--dump-logits", f.name, *BASE_FLAGS, *extra]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, **BASE_ENV, **env})
        if p.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: {p.stderr.strip()[-400:]}")
        return p.stdout.strip(), np.load(f.name)


def check(name, ok, detail=""):
    global fails
    fails += not ok
    print(f"{'PASS' if ok else 'FAIL'} {name}{'  ' + detail if detail else ''}", flush=True)


for preset in PRESETS:
    tag = os.path.basename(preset).removesuffix(".json")
    for i, prompt in enumerate(PROMPTS):
        try:
            toks, logits = run(preset, prompt, [], {})
        except Exception as e:  # noqa
            check(f"{tag}[{i}] runs", False, str(e))
            continue
        check(f"{tag}[{i}] logits finite", bool(np.isfinite(logits).all()), f"shape={logits.shape}")
        for name, extra, env, *tol in VARIANTS:
            try:
                t2, l2 = run(preset, prompt, extra, env)
            except Exception as e:  # noqa
                check(f"{tag}[{i}] {name}: runs", False, str(e))
                continue
            diff = float(np.nanmax(np.abs(l2 - logits))) if l2.shape == logits.shape else float("nan")
            if tol:
                rel = diff / max(float(np.abs(logits).max()), 1e-30)
                check(f"{tag}[{i}] {name} within {tol[0]:g}", t2 == toks and rel <= tol[0],
                      f"rel={rel:.3e} tokens {'equal' if t2 == toks else 'differ'}")
                continue
            same = t2 == toks and l2.shape == logits.shape and l2.tobytes() == logits.tobytes()
            check(f"{tag}[{i}] {name} bitwise", same, "" if same else f"maxdiff={diff:.3e}")
print(f"{fails} failed")
sys.exit(1 if fails else 0)

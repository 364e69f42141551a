#!/usr/bin/env bash
# The device commands prepared in the eighteenth session (README.md here), which had no device: the
# next session with device time runs them. From the repository root, with the binaries of
# `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-05-h200-s18/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
FORK="--fork-before-norm" SW="MSM_CUDA_NORM_LINEAR_SWIGLU=1" NR="MSM_CUDA_NORM_ROUTER=1" EA="MSM_CUDA_MOE_PAIR_EARLY=1"
case "$1" in
r1)
    # correctness first: the seventeenth session's unrun review refactor (the streamed MMV's kernel
    # tests, its r6), the new kernels' tests (the norm + gate/up + SwiGLU kernel, the norm-fused
    # cluster router, with the norm + GEMV and GEMV + SwiGLU pairs they sit beside); check_presets'
    # bitwise lines of the pass and the kernels on Qwen1.5-MoE and Qwen3-30B-A3B (the fused router
    # there: its norm and router were adjacent before); check_cuda_vs_cpu's new line on two models
    hdr
    timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 \
        --filter "cuda_kernels/@(linear_mmv*|tuning*|norm_linear*|norm_router*|linear_swiglu*|router*|moe_pair_early*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="before its norm,router two kernels vs one,dense MLPs,split down's ids" timeout 230 \
        python3 tests/gpu/check_presets.py config/models/$Q15.json config/models/$Q3.json > $OUT/presets.txt 2>&1
    grep -c PASS $OUT/presets.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep FAIL $OUT/presets.txt | head -5 | tee -a $OUT/gpu.txt
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,glm4moe timeout $(left 575) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    tail -1 $OUT/check.txt | tee -a $OUT/gpu.txt
    grep "before its norm" $OUT/check.txt | head -4 | tee -a $OUT/gpu.txt
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # the A/B (README: predictions), Qwen1.5-MoE at 1 / 2 / 8 tokens, three rounds: today's default
    # against the shared expert forked before its norm (alone: the aux copy as the norm + GEMV kernel
    # and a SwiGLU kernel; with the norm + gate/up + SwiGLU kernel at 2 and 4 rows a warp; and with
    # the norm-fused cluster router on the main stream), and the routed experts' early down; the
    # timeline of the fork's full arm at one token
    hdr
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q15 1,2,8 fork --
        b $Q15 1,2,8 fork -- $FORK
        b $Q15 1,2,8 fork $SW -- $FORK
        b $Q15 1,2 fork $SW MSM_CUDA_NORM_SWIGLU_ROWS=4 -- $FORK
        b $Q15 1,2,8 fork $SW $NR -- $FORK
        b $Q15 1,2,8 fork $EA --
    done
    el timelines | tee -a $OUT/gpu.txt
    tl $Q15 1 q15b1-fork $SW $NR -- $FORK
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # Qwen3-30B-A3B (1 / 2 tokens) and its FP8 preset (1): the norm-fused cluster router and the
    # experts' early down, two rounds; the streamed MMV (today the lm_head's alone) on Qwen1.5-MoE's
    # shared gate/up (11264 rows: 5.3 tiles an SM) and on every linear of 2048 rows or more (the
    # o_proj and the shared down too: 1 tile an SM) at 2 and 8 tokens, where their MMVs stream at
    # 0.7-2.2 TB/s (s17 run 2's timeline), two rounds; the timeline of Qwen3's early down at one token
    hdr
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b $Q3 1,2 q3 --
        b $Q3 1,2 q3 $NR --
        b $Q3 1,2 q3 $EA --
        b $Q3F 1 q3 --
        b $Q3F 1 q3 $NR --
        b $Q3F 1 q3 $EA --
    done
    for i in 1 2; do
        b $Q15 2,8 mmvs --
        b $Q15 2,8 mmvs MSM_CUDA_MMV_STREAM_MIN_N=8192 --
        b $Q15 2,8 mmvs MSM_CUDA_MMV_STREAM_MIN_N=2048 --
    done
    el timelines | tee -a $OUT/gpu.txt
    tl $Q3 1 q3b1-early $EA
    el done | tee -a $OUT/gpu.txt
    ;;
*)
    echo "usage: $0 r1|r2|r3" >&2
    exit 2
    ;;
esac

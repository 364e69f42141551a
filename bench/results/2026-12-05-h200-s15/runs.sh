#!/usr/bin/env bash
# The device commands planned in the fifteenth session (README.md here), which had no device, like
# the fourteenth. From the repository root, with the binaries of `BUNDLE_BINS="msmoe-run
# msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle` built from the commit in
# each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-05-h200-s15/runs.sh rN
# r1 is the fourteenth session's run 1 (the L2 / K/V prefetch and the MMV + RoPE A/Bs), unchanged;
# r2 the lean FP8 expert kernels (issue 14); r3 the bitwise checks of both; r4 the table.
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
case "$1" in
r1)
    # (packed: it leaves more files than the device tool brings back)
    bash bench/results/2026-12-04-h200-s14/runs.sh r1
    pack
    ;;
r2)
    # the lean FP8 pair-path kernels: their kernel tests first (bitwise the default's outputs, and
    # the CPU), then three rounds of A/Bs at 1-4 tokens on Qwen3-30B-A3B FP8 (gate/up 1536 blocks at
    # one token: one wave at 12 blocks an SM) and GLM-4.5-Air FP8 (2816: two waves either way), and
    # the bf16 preset once as the ratio's denominator in the same call; timelines at one token
    hdr
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 3 \
        --filter "cuda_kernels/@(moe_experts_fp8_pair_forms*|tuning*)" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    el bench | tee -a $OUT/gpu.txt
    b $Q3 1,2 lean --
    for i in 1 2 3; do
        b $Q3F 1,2,4 lean --
        b $Q3F 1,2,4 lean MSM_CUDA_FP8_MOE_LEAN=1 --
        b $Q3F 1,2,4 lean MSM_CUDA_FP8_MOE_LEAN=2 --
        b $Q3F 1 lean MSM_CUDA_FP8_MOE_LEAN=1 MSM_CUDA_MOE_DOWN_HB=2 -- # the gate/up's share alone
    done
    for i in 1 2; do
        b $GLM 1,2,4 lean --
        b $GLM 1,2,4 lean MSM_CUDA_FP8_MOE_LEAN=1 --
        b $GLM 1,2,4 lean MSM_CUDA_FP8_MOE_LEAN=2 --
    done
    el timelines | tee -a $OUT/gpu.txt
    [ "$(left)" -gt 60 ] && tl $Q3F 1 q3fp8b1
    [ "$(left)" -gt 30 ] && tl $Q3F 1 q3fp8b1-lean MSM_CUDA_FP8_MOE_LEAN=1
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # correctness of what runs 1-2 keep: the fourteenth session's run 2 (check_presets' prefetch and
    # MMV + RoPE lines on the three presets, check_cuda_vs_cpu on four golden models) with
    # check_presets' lean lines too (check_cuda_vs_cpu's lean lines run on glm4moe-fp8)
    CHECK_VARIANTS="L2 prefetch,qkv MMV,lean dot" exec bash bench/results/2026-12-04-h200-s14/runs.sh r2
    ;;
r4)
    exec bash bench/results/2026-12-04-h200-s14/runs.sh r3
    ;;
*)
    echo "usage: $0 r1|r2|r3|r4" >&2
    exit 2
    ;;
esac

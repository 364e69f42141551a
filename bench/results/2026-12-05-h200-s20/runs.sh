#!/usr/bin/env bash
# The twentieth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-05-h200-s20/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
case "$1" in
r1)
    # the new defaults (the tensor-core attention split over a cluster from 4 tokens where a kv
    # head's query heads fill a block; the pair path's early down): their kernel tests; check_presets'
    # bitwise lines on top of them and the near lines (the SIMT attention against the split, and for
    # scale two non-bitwise changes the project takes); the A/B against each off, two rounds; the
    # table; the timeline of Qwen3 at 8 tokens
    hdr
    timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 \
        --filter "cuda_kernels/@(attention*|tuning*|moe_pair*)" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs" $OUT/kernels.txt | head -5 | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="graph replay,multi-stream,PDL on,early GEMV weight,split down,SIMT attention,unsplit,K slices" \
        timeout 200 python3 tests/gpu/check_presets.py config/models/$Q3.json config/models/$Q3F.json \
        config/models/$Q15.json > $OUT/presets.txt 2>&1
    grep -c PASS $OUT/presets.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep -E "FAIL|within" $OUT/presets.txt | head -30 | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b $Q3 1,2,4,8,16,32 ab --
        b $Q3 1,2,4,8,16,32 ab MSM_CUDA_ATT_MMA_SPLIT=0 --
        b $Q3 1,2,4,8,16,32 ab MSM_CUDA_MOE_PAIR_EARLY=0 --
        b $Q3F 1,4,8 ab --
        b $Q3F 1,4,8 ab MSM_CUDA_ATT_MMA_SPLIT=0 --
        b $Q3F 1,4,8 ab MSM_CUDA_MOE_PAIR_EARLY=0 --
        b $Q15 1,2,8 ab --
        b $Q15 1,2,8 ab MSM_CUDA_MOE_PAIR_EARLY=0 --
    done
    el table | tee -a $OUT/gpu.txt
    b $Q15 1,2,4,8,16,32,128,256 table --
    b $Q3 1,2,4,8,16,32,128,256 table --
    b $Q3F 1,2,4,8,16,32,128,256 table --
    b $GLM 1,2,4,8,32,128 table --
    el attention | tee -a $OUT/gpu.txt
    # Qwen1.5-MoE at one token: its attention (16 heads, 4 MiB of cache a layer) takes 8-9 us of
    # the step a layer (s17 run 1's timeline); the SIMT kernel's existing switches, two rounds,
    # and Nsight Compute on it
    for i in 1 2; do
        b $Q15 1,2 att --
        b $Q15 1,2 att MSM_CUDA_ATT_MAX_SPLIT=8 --
        b $Q15 1,2 att MSM_CUDA_ATT_MAX_SPLIT=4 --
        b $Q15 1,2 att MSM_CUDA_ATT_CLUSTER=0 --
        b $Q15 1,2 att MSM_CUDA_ATT_EARLY=0 --
    done
    ncu_k "attention_kernel" $Q15 1 q15b1-att
    el timelines | tee -a $OUT/gpu.txt
    tl $Q3 8 q3b8
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # the rules set from run 1: the early down not at one token beside a shared expert (AUTO), the
    # split attention up to 16 tokens; against each forced either way, two rounds; then the table's
    # Qwen1.5-MoE and Qwen3-30B-A3B columns on the final defaults
    hdr
    timeout 60 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(tuning*|attention_mma_split*|moe_pair*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b $Q15 1,2 ab2 --
        b $Q15 1,2 ab2 MSM_CUDA_MOE_PAIR_EARLY=1 --
        b $Q15 1,2 ab2 MSM_CUDA_MOE_PAIR_EARLY=0 --
        b $Q15 1,2 ab2 MSM_CUDA_ATT_CLUSTER=0 --
        b $GLM 1,2 ab2 --
        b $GLM 1,2 ab2 MSM_CUDA_MOE_PAIR_EARLY=1 --
        b $Q3 1,16,32 ab2 --
        b $Q3 1,16,32 ab2 MSM_CUDA_ATT_MMA_SPLIT_MAX_T=0 --
    done
    el table | tee -a $OUT/gpu.txt
    b $Q15 1,2,4,8,16,32,128,256 table --
    b $Q3 1,2,4,8,16,32,128,256 table --
    el done | tee -a $OUT/gpu.txt
    ;;
*)
    echo "usage: $0 r1|r2" >&2
    exit 2
    ;;
esac

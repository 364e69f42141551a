#!/usr/bin/env bash
# The twenty-fourth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-06-h200-s24/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
case "$1" in
r1)
    # on an H200 (GLM-4.5-Air FP8's 111 GB need one): the table on all four presets, %HBM now against
    # the copy rate msmoe-bench measures on the card; the phase-chain probe for Qwen3-30B-A3B and
    # Qwen1.5-MoE (the batch-1 floor of a kernel per dependent phase); Qwen3's timelines at 1 and 8
    hdr
    nvidia-smi --query-gpu=memory.total --format=csv,noheader | tee -a $OUT/gpu.txt
    el table | tee -a $OUT/gpu.txt
    b $Q15 1,2,4,8,16,32,128,256 table --
    b $Q3 1,2,4,8,16,32,128,256 table --
    b $Q3F 1,2,4,8,16,32,128,256 table --
    b $GLM 1,2,4,8,32,128 table --
    grep "^# %HBM" $OUT/bench-table.txt | head -1 | tee -a $OUT/gpu.txt
    el probe | tee -a $OUT/gpu.txt
    for m in qwen3 qwen15 qwen3-fp8; do timeout 60 gpu-run/mega_probe 0 $m; done > $OUT/probe.txt 2>&1
    grep -E "^#|PDL, 8 warps|PDL, early loads, 8" $OUT/probe.txt | tee -a $OUT/gpu.txt
    el timeline | tee -a $OUT/gpu.txt
    ROWS=40 tl $Q3 1 q3b1
    ROWS=40 tl $Q3 8 q3b8
    el done | tee -a $OUT/gpu.txt
    ;;
esac

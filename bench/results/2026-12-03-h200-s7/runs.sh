#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-03-h200-s7/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, hdr
case "$1" in
r1)
    # the shared expert's branch forked after the router (--router-alone) against the router issued
    # first (default), with and without the routed experts' serial launch; the tensor-core MMV for
    # the dense linears from 2, 3 or 4 tokens (default 5); timelines of batch 1 and 8
    hdr
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for v in "--" "-- --router-alone" "MSM_CUDA_MOE_AUX_SERIAL_MAX_T=0 -- --router-alone"; do
            b qwen1.5-moe-a2.7b 1,2,3,4,6,8,12,16,32,64 alone $v
            b glm-4.5-air-fp8 1,4,8,16,32 alone $v
        done
    done
    for i in 1 2; do
        for v in "--" "MSM_CUDA_MMV_MIN_T=2 --" "MSM_CUDA_MMV_MIN_T=3 --" "MSM_CUDA_MMV_MIN_T=4 --"; do
            b qwen1.5-moe-a2.7b 2,3,4 mmv $v
            b qwen3-30b-a3b 2,3,4 mmv $v
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=40 tl qwen1.5-moe-a2.7b 1 q15
    ROWS=40 tl qwen1.5-moe-a2.7b 1 q15 -- --router-alone
    ROWS=40 tl qwen1.5-moe-a2.7b 8 q15
    ROWS=40 tl qwen1.5-moe-a2.7b 8 q15 -- --router-alone
    el done | tee -a $OUT/gpu.txt
    ;;
esac

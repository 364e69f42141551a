#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-04-h200-s13/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
case "$1" in
r1)
    # the twelfth session's planned run 9 (bundle 173419e): the 32-row MMV only where its
    # (N + 31) / 32 blocks still cover every SM; kernel test; A/B at 3-8 tokens, three rounds;
    # timelines at 8 tokens with it (where the step's time goes next)
    hdr
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/linear_mmv_block*" 2>&1 | tail -1 >> $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
            b $p 3,4,5,8 nj --
            b $p 3,4,5,8 nj MSM_CUDA_MMV_NJ=4 --
        done
    done
    el timelines | tee -a $OUT/gpu.txt
    tl qwen1.5-moe-a2.7b 8 q15b8-nj4 MSM_CUDA_MMV_NJ=4
    tl qwen3-30b-a3b 8 q3b8-nj4 MSM_CUDA_MMV_NJ=4
    el done | tee -a $OUT/gpu.txt
    ;;
esac

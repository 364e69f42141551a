#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-03-h200-s11/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
case "$1" in
r1)
    # the tenth session's unrun review commit df79b52 (GEMV_MINB constant, the qkv + RoPE
    # launcher's one chain): kernel tests linear* and tuning*; the defaults at 1-16 tokens, two
    # rounds; the tensor-core attention wherever it fits (MSM_CUDA_ATT_MMA=2) and the o_proj
    # GEMV's last block norming (MSM_CUDA_LINEAR_NORM=1) re-measured against them; timelines at
    # 1 and 8 tokens on both bf16 presets
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear*' 'tuning*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
            b $p 1,2,4,5,8,11,16 ab --
            b $p 1,2,4,5,8,11,16 ab MSM_CUDA_ATT_MMA=2 --
            b $p 1,2,4,8 ab MSM_CUDA_LINEAR_NORM=1 --
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=34 tl qwen1.5-moe-a2.7b 1 q15b1
    ROWS=34 tl qwen3-30b-a3b 1 q3b1
    ROWS=34 tl qwen1.5-moe-a2.7b 8 q15b8
    ROWS=34 tl qwen3-30b-a3b 8 q3b8
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
r2)
    # the block-sliced MMV (MSM_CUDA_MMV_BSLICE, default 1 in this bundle): kernel tests
    # linear_mmv*, tuning*; A/B against the clusters (0) at 3-8 tokens (16 unaffected), three
    # rounds, with 8 warps a cluster block (MMV_WARPS=8) as a third arm; timelines at 8 tokens;
    # check_presets on both bf16 presets (every switch bitwise with the new default)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear_mmv*' 'tuning*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
            b $p 3,4,5,6,8,16 ab --
            b $p 3,4,5,6,8,16 ab MSM_CUDA_MMV_BSLICE=0 --
        done
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do b $p 3,4,8 ab MSM_CUDA_MMV_BSLICE=0 MSM_CUDA_MMV_WARPS=8 --; done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=30 tl qwen1.5-moe-a2.7b 8 q15b8
    ROWS=30 tl qwen1.5-moe-a2.7b 8 q15b8-off MSM_CUDA_MMV_BSLICE=0
    ROWS=30 tl qwen3-30b-a3b 8 q3b8
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 590) python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json config/models/qwen3-30b-a3b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
esac

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
r2)
    # the qkv GEMV with RoPE + K/V write in its epilogue at 1-2 tokens (MSM_CUDA_LINEAR_ROPE=0: two
    # kernels) and the MMV from 3 tokens: their kernel tests, the A/B, the tables, timelines, the
    # golden check on the models without QK norm
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear_rope*' 'linear_mmv*' 'tuning*' 'qk_norm_rope*' 'linear_matches*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for v in "--" "MSM_CUDA_LINEAR_ROPE=0 --"; do
            b qwen1.5-moe-a2.7b 1,2,3,4 lrope $v
        done
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,2,3,4,8,16,32,64,128,256 final --; done
    b glm-4.5-air-fp8 1,4,8,32,128 final --
    el timeline | tee -a $OUT/gpu.txt
    ROWS=30 tl qwen1.5-moe-a2.7b 1 q15
    ROWS=30 tl qwen1.5-moe-a2.7b 1 q15 MSM_CUDA_LINEAR_ROPE=0
    ROWS=30 tl qwen3-30b-a3b 1 q3
    ROWS=30 tl qwen1.5-moe-a2.7b 4 q15
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,glm4moe,qwen2moe-mha-tied,mixtral timeout $(left 570) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # the fused qkv GEMV + RoPE with its cosines computed while the weights stream: its kernel test,
    # the A/B (three rounds), check_presets at the Qwen1.5-MoE shapes (the fused kernel vs two, bitwise,
    # with every other switch), a timeline
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/linear_rope*" 2>&1 | tail -3 >> $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for v in "--" "MSM_CUDA_LINEAR_ROPE=0 --"; do b qwen1.5-moe-a2.7b 1,2,8 lrope $v; done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=16 tl qwen1.5-moe-a2.7b 1 q15
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 570) python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    # the session's defaults (the MMV from 3 tokens: the presets' 4-token prefill takes it) end to end
    # on the Qwen3 presets: every switch bitwise (check_presets.py), the golden check of the Qwen3 and
    # FP8 models
    hdr
    el presets | tee -a $OUT/gpu.txt
    timeout 300 python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json config/models/qwen3-30b-a3b-fp8.json > $OUT/presets.txt 2>&1
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe,qwen3moe-fp8,glm4moe-fp8 timeout $(left 570) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
esac

#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-02-h200-s2/runs.sh rN
# (runs 1-7 ran with these helpers written out here; they moved unchanged to bench/device_run.sh)
source bench/device_run.sh  # el, left, b, tl, hdr
case "$1" in
r1)
    hdr
    el timeline | tee -a $OUT/gpu.txt
    tl qwen1.5-moe-a2.7b 1 q15
    tl qwen1.5-moe-a2.7b 8 q15
    tl qwen3-30b-a3b 1 q3
    tl qwen3-30b-a3b 8 q3
    tl qwen3-30b-a3b-fp8 1 q3f
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,8 base --; done
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -12 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b qwen1.5-moe-a2.7b 1,2,4,8 ab --
        b qwen1.5-moe-a2.7b 1,2,4,8 ab MSM_CUDA_MOE_AUX_PDL=1 --
        b qwen1.5-moe-a2.7b 1,2,4,8 ab MSM_CUDA_SMALL_EARLY=0 --
        b qwen3-30b-a3b 1,8 ab --
        b qwen3-30b-a3b 1,8 ab MSM_CUDA_SMALL_EARLY=0 --
        b qwen3-30b-a3b-fp8 1,8 ab --
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=40 tl qwen1.5-moe-a2.7b 1 q15
    ROWS=40 tl qwen1.5-moe-a2.7b 1 q15 MSM_CUDA_MOE_AUX_PDL=1
    ROWS=30 tl qwen3-30b-a3b 1 q3
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 585) python3 tests/gpu/check_presets.py > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/router*' 2>&1 | tail -3 > $OUT/kernels.txt
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/*linear*' 2>&1 | tail -3 >> $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for p in qwen3-30b-a3b qwen1.5-moe-a2.7b; do
            b $p 1,8 ab --
            b $p 1,8 ab MSM_CUDA_ROUTER_EARLY=0 --
            b $p 1 ab MSM_CUDA_ATT_MAX_SPLIT=8 --
            b $p 1 ab MSM_CUDA_ATT_MAX_SPLIT=4 --
            b $p 1,8 ab MSM_CUDA_ATT_GROUP_MIN=1 --
            b $p 1 ab MSM_CUDA_ATT_CLUSTER=0 --
        done
        b qwen3-30b-a3b-fp8 1,8 ab --
        b qwen3-30b-a3b-fp8 1,8 ab MSM_CUDA_ROUTER_EARLY=0 --
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=30 tl qwen3-30b-a3b 1 q3
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 585) python3 tests/gpu/check_presets.py > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -12 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for p in qwen3-30b-a3b qwen1.5-moe-a2.7b qwen3-30b-a3b-fp8; do
            b $p 1,2,4,8 ab --
            b $p 1,2,4,8 ab MSM_CUDA_ROUTER_EXPERTS=0 --
        done
    done
    b glm-4.5-air-fp8 1,8 ab --
    el timeline | tee -a $OUT/gpu.txt
    ROWS=30 tl qwen3-30b-a3b 1 q3
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe-fp8,mixtral timeout 230 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 590) python3 tests/gpu/check_presets.py > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    # the final build (the code of b9cb2a9, which run 2 tested: 39/39 kernel tests, presets)
    hdr
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8 glm-4.5-air-fp8; do b $p 1,8,32,128,256 final --; done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,2,4,8 final --; done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=40 tl qwen1.5-moe-a2.7b 1 final
    ROWS=40 tl qwen3-30b-a3b 1 final
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen2moe-mha-tied,qwen3moe,glm4moe-fp8 timeout $(left 560) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r6)
    # (run 6 itself was a direct command on the warm machine, the final build of r5:
    #  GLM-4.5-Air FP8 32,128 and Qwen1.5-MoE 32,128,256, default / MSM_CUDA_MOE_AUX_PDL=1, twice; run6-bench-aux.txt)
    ;;
r7)
    # the serial routed experts only up to 8 tokens (moe_aux_serial_max_t)
    hdr
    b glm-4.5-air-fp8 1,8,128 final --
    b qwen1.5-moe-a2.7b 1,2,4,8,32,128 final --
    b glm-4.5-air-fp8 8,128 final MSM_CUDA_MOE_AUX_SERIAL_MAX_T=0 --
    el presets | tee -a $OUT/gpu.txt
    timeout 100 python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r8)
    # NOT RUN this session (device time spent): the next session's first call. The FP8 experts
    # with the hardware decode (fp8_moe_hw, off by default): its kernel test, the presets check
    # (bitwise on / off), and the A/B on the FP8 presets at 1-8 tokens
    hdr
    timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/moe_experts_fp8*' 2>&1 | tail -4 > $OUT/kernels.txt
    # and the review's rope_copy_kernel refactor (unrun on a GPU): the RoPE / cache-write tests
    timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/*rope*' 2>&1 | tail -4 >> $OUT/kernels.txt
    for i in 1 2; do
        for p in qwen3-30b-a3b-fp8 glm-4.5-air-fp8; do
            b $p 1,2,4 ab --
            b $p 1,2,4 ab MSM_CUDA_FP8_MOE_HW=1 --
        done
    done
    timeout 200 python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b-fp8.json > $OUT/presets.txt 2>&1
    ;;
esac

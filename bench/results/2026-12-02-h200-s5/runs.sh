#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-02-h200-s5/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, hdr
case "$1" in
r1)
    # the FP8 tiled expert GEMMs with 16 / 32 tokens a pass and 8 / 6 pipeline stages
    # (MSM_CUDA_MOE_TILED_BM: 64 is the previous kernel); the FP8 tiled GEMMs from 2 tokens; the full
    # kernel suite (the fourth session's last commits had only their parts run); timelines
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 240 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -4 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for bm in 64 0; do b qwen3-30b-a3b-fp8 8,16,32,64,128,256 bm MSM_CUDA_MOE_TILED_BM=$bm --; done
    done
    for bm in 32 16; do b qwen3-30b-a3b-fp8 8,16,32,64,128,256 bm MSM_CUDA_MOE_TILED_BM=$bm --; done
    for i in 1 2; do
        b qwen3-30b-a3b-fp8 1,2,3,4,6 mint --
        b qwen3-30b-a3b-fp8 2,3,4,6 mint MSM_CUDA_FP8_MOE_TILED_MIN_T=2 --
    done
    for bm in 64 0; do b glm-4.5-air-fp8 8,32,128 glm MSM_CUDA_MOE_TILED_BM=$bm --; done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=30 tl qwen3-30b-a3b 8 q3
    ROWS=12 tl qwen3-30b-a3b-fp8 8 q3f
    ROWS=12 tl qwen3-30b-a3b-fp8 32 q3f
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe-fp8,glm4moe-fp8 timeout $(left 570) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # FP8 dense linears past 8 / 16 / 32 tokens dequantised to bf16 for cuBLASLt instead of the MMV8
    # (MSM_CUDA_FP8_NATIVE_MAX_T; the experts keep the FP8 tiled GEMMs from 8 tokens); ncu stall
    # reasons of the FP8 tiled gate/up and of the MMV8 at batch 32
    hdr
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for nm in 64 8 16 32; do b qwen3-30b-a3b-fp8 8,12,16,24,32,48,64 nm MSM_CUDA_FP8_NATIVE_MAX_T=$nm --; done
    done
    for nm in 64 8; do b glm-4.5-air-fp8 8,16,32,64 nm MSM_CUDA_FP8_NATIVE_MAX_T=$nm --; done
    el ncu | tee -a $OUT/gpu.txt
    for k in moe_gateup_tiled_fp8 moe_down_tiled_fp8 linear_fp8_mma; do
        timeout $(left 500) /usr/local/cuda/bin/ncu --clock-control none -k regex:$k -c 1 --section SpeedOfLight \
            --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats \
            gpu-run/bin/msmoe-bench decode --preset config/models/qwen3-30b-a3b-fp8.json --backend cuda \
            --batches 32 --context 512 --steps 1 --no-cuda-graphs 2>&1 | grep -v '^# weights' | tail -90 >> $OUT/ncu.txt
    done
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # decode's FP8 dense linears dequantised past 16 tokens (past 8 where the MMV8 holds one block an
    # SM; MSM_CUDA_FP8_LINEAR_DECODE_MAX_T, 64: the previous MMV8 to 64); the 16-token tiled expert
    # GEMMs at three blocks an SM (MSM_CUDA_MOE_TILED_OCC=3); the kernel tests of both
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'moe_tiled_pass*' 'moe_fp8_tiled_pass*' 'linear_fp8*' 'tuning*'; do
        timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for dm in 16 8 64; do b qwen3-30b-a3b-fp8 8,12,16,24,32,64 dm MSM_CUDA_FP8_LINEAR_DECODE_MAX_T=$dm --; done
        for dm in 16 8 64; do b glm-4.5-air-fp8 12,16,32 dm MSM_CUDA_FP8_LINEAR_DECODE_MAX_T=$dm --; done
    done
    for i in 1 2; do
        for occ in 2 3; do
            b qwen1.5-moe-a2.7b 12,16,24,32 occ MSM_CUDA_MOE_TILED_OCC=$occ --
            b qwen3-30b-a3b 12,16,24,32 occ MSM_CUDA_MOE_TILED_OCC=$occ --
            b qwen3-30b-a3b-fp8 8,16,32 occ MSM_CUDA_MOE_TILED_OCC=$occ --
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=12 tl qwen3-30b-a3b-fp8 32 q3f
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe-fp8,glm4moe-fp8 timeout $(left 570) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    # the FP8 dense linears of 9..64 tokens on the tiled GEMM on the codes (linear_tiled_fp8.cu;
    # MSM_CUDA_FP8_LINEAR_TILED_MIN_T: 65 off, i.e. decode dequantises past 8; 17 with
    # MSM_CUDA_FP8_LINEAR_DECODE_MAX_T=16: the MMV8 at 9..16); the full kernel suite; the tables;
    # the golden check of the FP8 models
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 240 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -4 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b qwen3-30b-a3b-fp8 8,9,12,16,24,32,64 lt --
        b qwen3-30b-a3b-fp8 9,12,16,24,32,64 lt MSM_CUDA_FP8_LINEAR_TILED_MIN_T=65 --
        b qwen3-30b-a3b-fp8 9,12,16 lt MSM_CUDA_FP8_LINEAR_TILED_MIN_T=17 MSM_CUDA_FP8_LINEAR_DECODE_MAX_T=16 --
        b glm-4.5-air-fp8 8,12,16,32,64 lt --
        b glm-4.5-air-fp8 12,16,32,64 lt MSM_CUDA_FP8_LINEAR_TILED_MIN_T=65 --
    done
    for i in 1 2; do # the FP8 tiled experts from 5 / 6 / 7 tokens (run 1: at 6 0.9 ms faster than the GEMVs)
        b qwen3-30b-a3b-fp8 5,6,7 mint --
        b qwen3-30b-a3b-fp8 5,6,7 mint MSM_CUDA_FP8_MOE_TILED_MIN_T=5 --
        b glm-4.5-air-fp8 5,6,7 mint --
        b glm-4.5-air-fp8 5,6,7 mint MSM_CUDA_FP8_MOE_TILED_MIN_T=5 --
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do b $p 1,2,4,8,16,32,64,128,256 final --; done
    b qwen3-30b-a3b-fp8 1,2,4,8,16,32,64,128,256 final --
    b glm-4.5-air-fp8 1,8,32,128 final --
    el timeline | tee -a $OUT/gpu.txt
    ROWS=12 tl qwen3-30b-a3b-fp8 32 q3f
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe-fp8,glm4moe-fp8 timeout $(left 570) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    # the FP8 tiled experts from 5 tokens (the new default); the tiled FP8 linear from 5 tokens
    # instead of the MMV8 (MSM_CUDA_FP8_LINEAR_TILED_MIN_T=5); the FP8 table; the FP8 kernel tests
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'moe_experts_fp8*' 'moe_fp8_tiled*' 'linear_fp8*'; do
        timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b qwen3-30b-a3b-fp8 4,5,6,8 lt5 --
        b qwen3-30b-a3b-fp8 5,6,8 lt5 MSM_CUDA_FP8_LINEAR_TILED_MIN_T=5 --
        b glm-4.5-air-fp8 5,8 lt5 --
        b glm-4.5-air-fp8 5,8 lt5 MSM_CUDA_FP8_LINEAR_TILED_MIN_T=5 --
    done
    b qwen3-30b-a3b-fp8 1,2,4,6,8,16,32,64,128,256 final --
    b glm-4.5-air-fp8 1,6,8,16,32,64,128 final --
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe-fp8,glm4moe-fp8 timeout $(left 400) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
esac

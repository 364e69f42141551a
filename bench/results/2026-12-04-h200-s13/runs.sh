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
r2)
    # bundle with the compact grouped grid, the MMV's auto 32-row rule and the gate/up + SwiGLU
    # GEMV: kernel tests; A/B of each against its off switch, three rounds; timelines; check_presets
    # on Qwen1.5-MoE (its new lines bitwise)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear_swiglu*' 'moe_grouped_simt*' 'linear_mmv_block*' 'tuning*' 'linear_rope*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -2 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b qwen1.5-moe-a2.7b 1,2,3,4,5,8,11 ab --
        b qwen1.5-moe-a2.7b 1,2 ab MSM_CUDA_LINEAR_SWIGLU=0 --
        b qwen1.5-moe-a2.7b 5,8,11 ab MSM_CUDA_MOE_GG_COMPACT=0 --
        b qwen1.5-moe-a2.7b 3,4,5,8 ab MSM_CUDA_MMV_NJ=2 --
        b qwen1.5-moe-a2.7b 3,4,5,8 ab MSM_CUDA_MMV_NJ=4 --
        b qwen3-30b-a3b 3,4,5,8,11 ab --
        b qwen3-30b-a3b 5,8,11 ab MSM_CUDA_MOE_GG_COMPACT=0 --
        b qwen3-30b-a3b 3,4,5,8 ab MSM_CUDA_MMV_NJ=2 --
    done
    el timelines | tee -a $OUT/gpu.txt
    tl qwen1.5-moe-a2.7b 1 q15b1
    tl qwen1.5-moe-a2.7b 8 q15b8
    tl qwen1.5-moe-a2.7b 8 q15b8-nj4 MSM_CUDA_MMV_NJ=4
    tl qwen3-30b-a3b 8 q3b8
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 590) python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
r3)
    # bundle with the MMV's 32 rows on the aux stream, the 2-row fused gate/up + SwiGLU and the
    # main-stream priority: kernel tests; A/B, three rounds; timelines
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/linear_swiglu*" > $OUT/kernels.txt 2>&1
    for f in 'linear_mmv_block*' 'tuning*' 'moe_grouped_simt*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -2 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b qwen1.5-moe-a2.7b 1,2,3,4,5,8,16 ab --
        b qwen1.5-moe-a2.7b 3,4,5,8,16 ab MSM_CUDA_MMV_NJ=2 --
        b qwen1.5-moe-a2.7b 3,4,5,8,16 ab MSM_CUDA_MMV_NJ=4 --
        b qwen1.5-moe-a2.7b 1,2 ab MSM_CUDA_LINEAR_SWIGLU_ROWS=2 --
        b qwen1.5-moe-a2.7b 1,2,8 ab MSM_CUDA_STREAM_PRIO=main --
        b qwen3-30b-a3b 1,2,3,4,5,8 ab --
    done
    el timelines | tee -a $OUT/gpu.txt
    tl qwen1.5-moe-a2.7b 1 q15b1-r2 MSM_CUDA_LINEAR_SWIGLU_ROWS=2
    tl qwen1.5-moe-a2.7b 8 q15b8
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    # bundle with the fused gate/up + SwiGLU at 2 rows by default: kernel tests; A/B on Qwen1.5-MoE
    # at 1-4 (8) tokens, three rounds: the fused kernel at 4 rows, the aux GEMV (shared down) at 2
    # rows, the routed experts as the router's programmatic dependent again (now that the shared
    # expert holds fewer SMs), and both
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/linear_swiglu*" > $OUT/kernels.txt 2>&1
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/tuning*" 2>&1 | tail -2 >> $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b qwen1.5-moe-a2.7b 1,2,3,4,8 ab --
        b qwen1.5-moe-a2.7b 1,2 ab MSM_CUDA_LINEAR_SWIGLU_ROWS=4 --
        b qwen1.5-moe-a2.7b 1,2 ab MSM_CUDA_AUX_GEMV_ROWS=2 --
        b qwen1.5-moe-a2.7b 1,2,3,4,8 ab MSM_CUDA_MOE_AUX_SERIAL_MAX_T=0 --
        b qwen1.5-moe-a2.7b 1,2 ab MSM_CUDA_AUX_GEMV_ROWS=2 MSM_CUDA_MOE_AUX_SERIAL_MAX_T=0 --
    done
    el timelines | tee -a $OUT/gpu.txt
    tl qwen1.5-moe-a2.7b 1 q15b1
    tl qwen1.5-moe-a2.7b 2 q15b2
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    # the session's defaults (commit in gpu.txt): kernel tests of every changed path; the table on
    # the four presets; CUDA against the CPU oracle on the golden models
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear*' 'moe_grouped_simt*' 'moe_experts_variants*' 'moe_experts_fp8_match*' 'tuning*'; do
        timeout 240 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el table | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,2,4,8,16,32,64,128,256 table --; done
    b glm-4.5-air-fp8 1,4,8,32,128 table --
    ROWS=40 tl qwen1.5-moe-a2.7b 8 q15b8
    ROWS=40 tl qwen3-30b-a3b 1 q3b1
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe,mixtral,glm4moe timeout $(left 580) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r6)
    # run 5's bundle: check_presets on the three presets (every switch bitwise at real shapes, the
    # session's new lines included)
    hdr
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 590) python3 tests/gpu/check_presets.py > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r7)
    # the MMV's 32 rows on the aux stream only up to 8 tokens: A/B at 8, 12, 16 against 16 rows,
    # three rounds; Qwen1.5-MoE's table row again
    hdr
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/linear_mmv_block*" 2>&1 | tail -1 >> $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b qwen1.5-moe-a2.7b 8,12,16 ab --
        b qwen1.5-moe-a2.7b 8,12,16 ab MSM_CUDA_MMV_NJ=2 --
    done
    b qwen1.5-moe-a2.7b 1,2,4,8,16,32,64,128,256 table --
    el done | tee -a $OUT/gpu.txt
    ;;
r8)
    # run 7's bundle, env only: with the compact grid and the shared expert's lighter kernels, the
    # grouped GEMVs' tokens a pass and chunks in flight again, and the aux stream's launch priority
    # at every decode step (auto: 3-4 tokens); two rounds
    hdr
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b qwen1.5-moe-a2.7b 1,2,5,8,11 sw --
        b qwen1.5-moe-a2.7b 1,2,5,8,11 sw MSM_CUDA_STREAM_PRIO=aux --
        b qwen1.5-moe-a2.7b 5,8,11 sw MSM_CUDA_MOE_GG_DOWN_U=3 --
        b qwen1.5-moe-a2.7b 5,8,11 sw MSM_CUDA_MOE_GG_DOWN_NT=4 --
        b qwen1.5-moe-a2.7b 5,8,11 sw MSM_CUDA_MOE_GG_GATEUP_NT=2 --
        b qwen3-30b-a3b 5,8,11 sw --
        b qwen3-30b-a3b 5,8,11 sw MSM_CUDA_MOE_GG_DOWN_U=3 --
        b qwen3-30b-a3b 5,8,11 sw MSM_CUDA_MOE_GG_DOWN_NT=4 --
        b qwen3-30b-a3b 5,8,11 sw MSM_CUDA_MOE_GG_GATEUP_NT=2 --
    done
    el done | tee -a $OUT/gpu.txt
    ;;
r9)
    # the aux stream's priority by default at 3-11 decode tokens (was 3-4): A/B against off, two
    # rounds
    hdr
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b qwen1.5-moe-a2.7b 3,5,8,9,10,11,12 prio --
        b qwen1.5-moe-a2.7b 3,5,8,9,10,11,12 prio MSM_CUDA_STREAM_PRIO=off --
    done
    el done | tee -a $OUT/gpu.txt
    ;;
r10)
    # the qkv MMV with RoPE and the K/V write in its epilogue (MSM_CUDA_LINEAR_ROPE_MMV=1, off by
    # default): kernel tests; A/B at 3, 4, 8 tokens, two rounds (the last of the device time)
    hdr
    timeout 60 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/linear_rope_kv*" > $OUT/kernels.txt 2>&1
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b qwen1.5-moe-a2.7b 3,4,8 rope --
        b qwen1.5-moe-a2.7b 3,4,8 rope MSM_CUDA_LINEAR_ROPE_MMV=1 --
    done
    el done | tee -a $OUT/gpu.txt
    ;;
esac

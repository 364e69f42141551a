#!/usr/bin/env bash
# The device commands of the sixteenth session (README.md here). From the repository root, with
# the binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline"
# tools/gpu-engine-check bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-05-h200-s16/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
NEW="MSM_CUDA_FP8_MOE_LEAN=2 MSM_CUDA_LINEAR_ROPE_MMV=1" # the defaults from 98840d7 on (s15 runs 1-3)
case "$1" in
r1)
    # on the s15 bundle (98840d7) with the defaults taken since as switches: the table; then why
    # the FP8 dense GEMVs at one token take longer than the bf16 ones of twice the bytes (Qwen3 FP8
    # o_proj 5.4 vs 4.5 us a layer, qkv 7.8 vs 7.3: s15 run 2 timelines): the existing switches
    # of the FP8 GEMV in three rounds, and Nsight Compute on both kernels
    hdr
    el table | tee -a $OUT/gpu.txt
    for p in $Q15 $Q3 $Q3F; do b $p 1,2,4,8,16,32,64,128,256 table $NEW --; done
    b $GLM 1,4,8,32,128 table $NEW --
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q3F 1,2 lin $NEW --
        b $Q3F 1,2 lin $NEW MSM_CUDA_FP8_LINEAR=simt_hw --
        b $Q3F 1,2 lin $NEW MSM_CUDA_FP8_GEMV_ROWS=1 --
        b $Q3F 1,2 lin $NEW MSM_CUDA_FP8_GEMV_U8=0 --
        b $Q3F 1 lin $NEW MSM_CUDA_NORM_LINEAR=0 --
    done
    el ncu | tee -a $OUT/gpu.txt
    ncu_k "gemv_kernel" $Q3F 1 gemv $NEW
    ncu_k "gemv_norm_in" $Q3F 1 normin $NEW
    ncu_k "gemv_kernel" $Q3 1 gemv-bf16 $NEW
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # on this session's bundle (defaults: the lean FP8 experts with early codes, the qkv MMV + RoPE):
    # the kernel tests of the split FP8 GEMV and the norm-in one's hardware decode; the table; then
    # three rounds of the one-token FP8 GEMV split over K (its three forms; the norm-in qkv GEMV split
    # too) with either decode, and the qkv unfused, on Qwen3-30B-A3B FP8 and twice on GLM-4.5-Air
    # FP8; timelines
    hdr
    timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 \
        --filter "cuda_kernels/@(linear_fp8*|norm_linear*|tuning*|linear_early*)" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    el table | tee -a $OUT/gpu.txt
    for p in $Q15 $Q3 $Q3F; do b $p 1,2,4,8,16,32,64,128,256 table --; done
    b $GLM 1,4,8,32,128 table --
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q3F 1,2 split --
        b $Q3F 1,2 split MSM_CUDA_FP8_LINEAR=simt_hw --
        b $Q3F 1 split MSM_CUDA_FP8_GEMV_SPLIT=1 --
        b $Q3F 1 split MSM_CUDA_FP8_GEMV_SPLIT=2 --
        b $Q3F 1 split MSM_CUDA_FP8_GEMV_SPLIT=1 MSM_CUDA_FP8_LINEAR=simt_hw --
        b $Q3F 1 split MSM_CUDA_FP8_GEMV_SPLIT=2 MSM_CUDA_FP8_LINEAR=simt_hw --
        b $Q3F 1 split MSM_CUDA_FP8_GEMV_SPLIT=3 MSM_CUDA_FP8_LINEAR=simt_hw --
        b $Q3F 1 split MSM_CUDA_FP8_GEMV_SPLIT=1 MSM_CUDA_FP8_LINEAR=simt_hw MSM_CUDA_NORM_LINEAR=0 --
    done
    for i in 1 2; do
        b $GLM 1,2 glm --
        b $GLM 1,2 glm MSM_CUDA_FP8_LINEAR=simt_hw --
        b $GLM 1 glm MSM_CUDA_FP8_GEMV_SPLIT=1 MSM_CUDA_FP8_LINEAR=simt_hw --
        b $GLM 1 glm MSM_CUDA_FP8_GEMV_SPLIT=2 MSM_CUDA_FP8_LINEAR=simt_hw --
        b $GLM 1 glm MSM_CUDA_FP8_GEMV_SPLIT=3 MSM_CUDA_FP8_LINEAR=simt_hw --
    done
    el presets | tee -a $OUT/gpu.txt # the bitwise lines a default split would have to keep
    MSM_CUDA_FP8_GEMV_SPLIT=1 MSM_CUDA_FP8_LINEAR=simt_hw \
        CHECK_VARIANTS="graph replay,multi-stream,PDL,early GEMV,ADD_RMSNORM + LINEAR" timeout 120 \
        python3 tests/gpu/check_presets.py config/models/$Q3F.json > $OUT/presets.txt 2>&1
    tail -1 $OUT/presets.txt | tee -a $OUT/gpu.txt
    el timelines | tee -a $OUT/gpu.txt
    tl $Q3F 1 q3fp8b1-split MSM_CUDA_FP8_GEMV_SPLIT=1 MSM_CUDA_FP8_LINEAR=simt_hw
    tl $Q3F 1 q3fp8b1-split-nl MSM_CUDA_FP8_GEMV_SPLIT=1 MSM_CUDA_FP8_LINEAR=simt_hw MSM_CUDA_NORM_LINEAR=0
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
r3)
    # not run in the sixteenth session (its device time ran out): the FP8 GEMVs' hardware decode
    # (default since run 2) and the split at 2 rows a block for rows past 4096 codes (off by
    # default: SPLIT=2 below turns the rule on), with the split's hook at one place (run 2's norm-in
    # test hung on a 768-wide row): the kernel tests, then the rule against the split at every K and
    # none on GLM-4.5-Air FP8 and against the old default on Qwen3-30B-A3B FP8; the new decode's
    # bitwise line on the FP8 preset
    hdr
    timeout 75 gpu-run/bin/test_cuda_kernels --jobs 4 \
        --filter "cuda_kernels/@(linear_fp8*|norm_linear*|tuning*)" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b $GLM 1,2 rule MSM_CUDA_FP8_GEMV_SPLIT=2 --
        b $GLM 1 rule MSM_CUDA_FP8_GEMV_SPLIT=2 MSM_CUDA_FP8_GEMV_SPLIT_MIN_K=0 --
        b $GLM 1 rule --
        b $Q3F 1,2 rule MSM_CUDA_FP8_GEMV_SPLIT=2 --
        b $Q3F 1,2 rule MSM_CUDA_FP8_GEMV_HW=0 --
    done
    el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="integer decode vs the hardware" timeout 45 python3 tests/gpu/check_presets.py \
        config/models/$Q3F.json > $OUT/presets.txt 2>&1
    tail -1 $OUT/presets.txt | tee -a $OUT/gpu.txt
    el done | tee -a $OUT/gpu.txt
    ;;
*)
    echo "usage: $0 r1|r2|r3" >&2
    exit 2
    ;;
esac

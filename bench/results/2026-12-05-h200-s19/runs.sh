#!/usr/bin/env bash
# The device commands prepared in the nineteenth session (README.md here), which had no device: the
# next session with device time runs them (the order against the eighteenth session's runs: the
# README's "Next"). From the repository root, with the binaries of
# `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-05-h200-s19/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
SP="MSM_CUDA_ATT_MMA_SPLIT=1" NQ="MSM_CUDA_NORM_QK_ROPE=1" FC="MSM_CUDA_MOE_FUSED_COMBINE=1"
case "$1" in
r1)
    # correctness first. Kernel tests: the split tensor-core attention against the CPU at every
    # attention shape (and its rule, and the new rows written just before it), the norm-in qkv GEMV
    # with the q/k norm + RoPE epilogue against the two kernels, the q/k norm kernels whose code it
    # now shares, the experts' combine inside the norm after them, the tuning switches. check_presets:
    # the fused qkv and fused combine lines (bitwise) on Qwen1.5-MoE, Qwen3 and its FP8 preset; the split attention against the SIMT kernel (tokens equal, logits near) on Qwen3,
    # its FP8 preset and GLM-4.5-Air FP8 (12 query heads a kv head: two head groups); and with the
    # split on as the base, replay = eager, multi-stream, PDL and the early GEMV loads bitwise on Qwen3
    hdr
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 \
        --filter "cuda_kernels/@(attention*|norm_linear_qk_rope*|qk_norm*|tuning*|moe_fused*|moe_combine*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs" $OUT/kernels.txt | head -5 | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="norm-in qkv GEMV,attention split,combine inside" timeout 200 python3 tests/gpu/check_presets.py \
        config/models/$Q15.json config/models/$Q3.json config/models/$Q3F.json > $OUT/presets.txt 2>&1
    CHECK_VARIANTS="attention split" timeout 100 python3 tests/gpu/check_presets.py config/models/$GLM.json \
        >> $OUT/presets.txt 2>&1
    CHECK_BASE_ENV="$SP" CHECK_PROMPTS=0,2 CHECK_VARIANTS="graph replay,multi-stream,PDL on,early GEMV" timeout $(left 580) \
        python3 tests/gpu/check_presets.py config/models/$Q3.json > $OUT/presets-split.txt 2>&1
    cat $OUT/presets-split.txt >> $OUT/presets.txt && rm $OUT/presets-split.txt
    grep -c PASS $OUT/presets.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep -E "FAIL|within" $OUT/presets.txt | head -12 | tee -a $OUT/gpu.txt
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # the A/B (README: predictions), three rounds: the split tensor-core attention on Qwen3 at 1 / 2 /
    # 4 / 8 / 16 tokens, with at most 8 splits too, and with the fused qkv epilogue; the fused qkv
    # epilogue alone at 1 / 2; the FP8 preset and GLM-4.5-Air FP8 at 1 / 8; the experts' combine
    # inside the next norm on Qwen1.5-MoE and Qwen3 at 8 / 32 / 128 / 256 tokens (and with the split
    # attention at 8) and the FP8 preset at 8 / 32; then the timelines of Qwen3 at 8 tokens, at one
    # with the split attention and the fused qkv, and of Qwen1.5-MoE at 8 with the fused combine
    hdr
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q3 1,2,4,8,16 sp --
        b $Q3 1,2,4,8,16 sp $SP --
        b $Q3 1,8 sp $SP MSM_CUDA_ATT_MAX_SPLIT=8 --
        b $Q3 1,2,4,8,16 sp $SP $NQ --
        b $Q3 1,2 sp $NQ --
        b $Q3F 1,8 spf --
        b $Q3F 1,8 spf $SP --
        b $Q3F 1,8 spf $SP $NQ --
        b $GLM 1,8 spg --
        b $GLM 1,8 spg $SP --
        b $Q15 8,32,128,256 fc --
        b $Q15 8,32,128,256 fc $FC --
        b $Q3 8,32,128,256 fc3 --
        b $Q3 8,32,128,256 fc3 $FC --
        b $Q3 8 fc3 $FC $SP --
        b $Q3F 8,32 fc3f --
        b $Q3F 8,32 fc3f $FC --
    done
    el timelines | tee -a $OUT/gpu.txt
    tl $Q3 8 q3b8-split $SP
    tl $Q3 1 q3b1-split-nq $SP $NQ
    tl $Q15 8 q15b8-fc $FC
    el done | tee -a $OUT/gpu.txt
    ;;
*)
    echo "usage: $0 r1|r2" >&2
    exit 2
    ;;
esac

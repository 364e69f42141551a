#!/usr/bin/env bash
# The twenty-first session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-05-h200-s21/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
MHA="MSM_CUDA_ATT_MMA_SPLIT_MIN_G=1 MSM_CUDA_ATT_MMA_SPLIT_MIN_T=1"
case "$1" in
r1)
    # the twentieth session's run 2 (the final rules of the early down and the split attention,
    # against each forced either way; the table's Qwen1.5-MoE and Qwen3 columns), and the
    # tensor-core attention split over a cluster for MHA (Qwen1.5-MoE's 16 heads at 1-8 tokens,
    # att_mma_split_min_g 1): its kernel tests, check_presets' bitwise and near lines on top of it,
    # the A/B (three rounds), Nsight Compute and the timeline at one token
    hdr
    timeout 120 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(tuning*|attention*|moe_pair*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs" $OUT/kernels.txt | head -5 | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_BASE_ENV="$MHA" CHECK_VARIANTS="graph replay,multi-stream,PDL on,SIMT attention" \
        timeout 100 python3 tests/gpu/check_presets.py config/models/$Q15.json > $OUT/presets.txt 2>&1
    grep -c PASS $OUT/presets.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep -E "FAIL|within" $OUT/presets.txt | head -12 | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q15 1,2,4,8 mha --
        b $Q15 1,2,4,8 mha $MHA --
        b $Q15 1,2,4,8 mha $MHA MSM_CUDA_ATT_MAX_SPLIT=8 --
    done
    el ab2 | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b $Q15 1,2 ab2 --
        b $Q15 1,2 ab2 MSM_CUDA_MOE_PAIR_EARLY=1 --
        b $Q15 1,2 ab2 MSM_CUDA_ATT_CLUSTER=0 --
        b $GLM 1,2 ab2 --
        b $GLM 1,2 ab2 MSM_CUDA_MOE_PAIR_EARLY=1 --
        b $Q3 1,16,32 ab2 --
        b $Q3 1,16,32 ab2 MSM_CUDA_ATT_MMA_SPLIT_MAX_T=0 --
    done
    el table | tee -a $OUT/gpu.txt
    b $Q15 1,2,4,8,16,32,128,256 table --
    b $Q3 1,2,4,8,16,32,128,256 table --
    el profiles | tee -a $OUT/gpu.txt
    ncu_k "attention" $Q15 1 q15b1-mha $MHA
    tl $Q15 1 q15b1
    tl $Q15 1 q15b1-mha $MHA
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # the decode latency attention (attention_dec.cu, MSM_CUDA_ATT_DEC_MAX_T): its kernel tests,
    # check_presets' bitwise lines on top of it and its near line; the A/B against the default and
    # the MHA split of run 1, three rounds (Qwen1.5-MoE at 1-4 tokens; Qwen3-30B-A3B and its FP8
    # preset at 1-2 with a block a query head, MAX_G=8); Nsight Compute and the timeline at one token
    hdr
    timeout 120 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(tuning*|attention_dec*|attention_mma_split*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs|Assert" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_BASE_ENV="MSM_CUDA_ATT_DEC_MAX_T=2" CHECK_VARIANTS="graph replay,multi-stream,PDL on" \
        timeout 100 python3 tests/gpu/check_presets.py config/models/$Q15.json > $OUT/presets.txt 2>&1
    CHECK_VARIANTS="decode latency" timeout 100 python3 tests/gpu/check_presets.py config/models/$Q15.json \
        >> $OUT/presets.txt 2>&1
    grep -c PASS $OUT/presets.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep -E "FAIL|within" $OUT/presets.txt | head -12 | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    DEC="MSM_CUDA_ATT_DEC_MAX_T=2"
    for i in 1 2 3; do
        b $Q15 1,2,4 dec --
        b $Q15 1,2,4 dec $DEC --
        b $Q15 1,2,4 dec $MHA --
        b $Q3 1,2 dec --
        b $Q3 1,2 dec $DEC MSM_CUDA_ATT_DEC_MAX_G=8 --
        b $Q3F 1,2 dec --
        b $Q3F 1,2 dec $DEC MSM_CUDA_ATT_DEC_MAX_G=8 --
    done
    el profiles | tee -a $OUT/gpu.txt
    ncu_k "attention_dec" $Q15 1 q15b1-dec $DEC
    tl $Q15 1 q15b1-dec $DEC
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # does the cluster cost the one-token attention its time? each kernel at cluster sizes 1-8
    # (MSM_CUDA_ATT_MAX_SPLIT caps the split; 1: one block a head, no cluster) and the SIMT
    # kernel's splits merged by the last block instead (ATT_CLUSTER=0), three rounds; the
    # timelines of the two best
    hdr
    DEC="MSM_CUDA_ATT_DEC_MAX_T=2"
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q15 1,2 cl --
        b $Q15 1,2 cl MSM_CUDA_ATT_CLUSTER=0 --
        b $Q15 1,2 cl $DEC --
        b $Q15 1,2 cl $DEC MSM_CUDA_ATT_MAX_SPLIT=4 --
        b $Q15 1,2 cl $DEC MSM_CUDA_ATT_MAX_SPLIT=2 --
        b $Q15 1,2 cl $DEC MSM_CUDA_ATT_MAX_SPLIT=1 --
        b $Q15 1,2 cl $MHA --
        b $Q15 1,2 cl $MHA MSM_CUDA_ATT_MAX_SPLIT=4 --
        b $Q15 1,2 cl $MHA MSM_CUDA_ATT_MAX_SPLIT=2 --
    done
    el timelines | tee -a $OUT/gpu.txt
    ROWS=40 tl $Q15 1 q15b1-nocl MSM_CUDA_ATT_CLUSTER=0
    ROWS=40 tl $Q15 1 q15b1-dec4 $DEC MSM_CUDA_ATT_MAX_SPLIT=4
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    # the final rule (the tensor-core split for MHA at one token, att_mma_split_mha_max_t 1; the lean
    # kernel dropped): the attention kernel tests, check_presets' bitwise and near lines on
    # Qwen1.5-MoE, the A/B against the rule off (three rounds), the table, Qwen3's one-token timeline and Qwen1.5-MoE's on one stream (the router without the shared expert beside)
    hdr
    timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(tuning*|attention*)" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs|Assert" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="graph replay,multi-stream,PDL on,SIMT attention,unsplit" \
        timeout 120 python3 tests/gpu/check_presets.py config/models/$Q15.json > $OUT/presets.txt 2>&1
    grep -c PASS $OUT/presets.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep -E "FAIL|within" $OUT/presets.txt | head -12 | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q15 1,2 rule --
        b $Q15 1,2 rule MSM_CUDA_ATT_MMA_SPLIT_MHA_MAX_T=0 --
    done
    el table | tee -a $OUT/gpu.txt
    b $Q15 1,2,4,8,16,32,128,256 table --
    b $Q3 1,2,4,8,16,32,128,256 table --
    b $Q3F 1,2,4,8,16,32,128,256 table --
    el timeline | tee -a $OUT/gpu.txt
    ROWS=60 tl $Q3 1 q3b1
    ROWS=60 tl $Q15 1 q15b1-1s -- --no-multi-stream
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    # for the next session, on an H200 (the README table's card): the MHA rule there, three rounds;
    # then the table on all four presets
    hdr
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q15 1,2 rule --
        b $Q15 1,2 rule MSM_CUDA_ATT_MMA_SPLIT_MHA_MAX_T=0 --
    done
    el table | tee -a $OUT/gpu.txt
    b $Q15 1,2,4,8,16,32,128,256 table --
    b $Q3 1,2,4,8,16,32,128,256 table --
    b $Q3F 1,2,4,8,16,32,128,256 table --
    b $GLM 1,2,4,8,32,128 table --
    el done | tee -a $OUT/gpu.txt
    ;;
esac

#!/usr/bin/env bash
# The twenty-second session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-05-h200-s22/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
case "$1" in
r1)
    # pass fuse_shared_down (a gated shared expert's down inside the routed experts' down, in the
    # graph of steps up to N tokens), on any GPU, in the order of what matters most if the device
    # time runs out: its kernel tests, the A/B (three rounds, 1-8 tokens; the early down and the
    # routed gate/up as the router's programmatic dependent on top of it at 1-2),
    # check_cuda_vs_cpu on qwen2moe-gqa (the fused graph against the CPU, and its replay /
    # one-stream / PDL / early-down lines bitwise), check_presets on Qwen1.5-MoE (the near line,
    # and the bitwise lines on top of it), the timeline at one token. Not run in the twenty-second
    # session (no device machine could be started); the next session's first run.
    hdr
    timeout 60 gpu-run/bin/test_cuda_kernels --jobs 4 \
        --filter "cuda_kernels/@(tuning*|moe_gateup*|moe_down_split*)" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs|Assert" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q15 1,2,4,8 fs --
        b $Q15 1,2,4,8 fs -- --fuse-shared 8
        b $Q15 1,2 fs MSM_CUDA_MOE_PAIR_EARLY=1 -- --fuse-shared 2
        b $Q15 1,2 fs MSM_CUDA_MOE_AUX_SERIAL_MAX_T=0 -- --fuse-shared 2
    done
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen2moe-mha-tied CHECK_PROMPTS=0,1 MSMOE_RUN=gpu-run/bin/msmoe-run timeout 150 \
        python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    grep -c PASS $OUT/check.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep -E "FAIL|fused|failed" $OUT/check.txt | head -14 | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=0,2 CHECK_VARIANTS="shared expert's down" timeout 80 python3 tests/gpu/check_presets.py \
        config/models/$Q15.json > $OUT/presets.txt 2>&1
    CHECK_PROMPTS=0,2 CHECK_BASE_FLAGS="--fuse-shared 16" CHECK_VARIANTS="graph replay,multi-stream,PDL on,early" \
        timeout 100 python3 tests/gpu/check_presets.py config/models/$Q15.json >> $OUT/presets.txt 2>&1
    grep -c PASS $OUT/presets.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep -E "FAIL|within" $OUT/presets.txt | head -12 | tee -a $OUT/gpu.txt
    el timeline | tee -a $OUT/gpu.txt
    ROWS=40 tl $Q15 1 q15b1-fs -- --fuse-shared 1
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # after r1 (the fused shared down lost at every size, so no arm of it here), in the order of what
    # matters if the device time runs out: the phase-chain probe (bench/mega_probe.cu, nvcc -O3
    # -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu) for
    # Qwen3-30B-A3B in bf16 and in its FP8 checkpoint's bytes (issue 14's 0.6x) and Qwen1.5-MoE; the
    # twenty-first session's MHA rule against it off, three rounds; the one-token timelines of
    # Qwen3-30B-A3B, its FP8 preset and Qwen1.5-MoE (where batch 1 goes now); the table on all four
    # presets (the twenty-first session's r5; an H200's, GLM-4.5-Air FP8 needs its memory)
    hdr
    el probe | tee -a $OUT/gpu.txt
    for m in qwen3 qwen3-fp8 qwen15; do timeout 60 gpu-run/mega_probe 0 $m; done > $OUT/probe.txt 2>&1
    grep -E "^#|PDL, early" $OUT/probe.txt | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q15 1,2,4,8 h200 --
        b $Q15 1,2 h200 MSM_CUDA_ATT_MMA_SPLIT_MHA_MAX_T=0 --
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=60 tl $Q3 1 q3b1
    ROWS=60 tl $Q3F 1 q3fb1
    ROWS=60 tl $Q15 1 q15b1
    el table | tee -a $OUT/gpu.txt
    b $Q15 1,2,4,8,16,32,128,256 table --
    b $Q3 1,2,4,8,16,32,128,256 table --
    b $Q3F 1,2,4,8,16,32,128,256 table --
    b $GLM 1,2,4,8,32,128 table --
    el done | tee -a $OUT/gpu.txt
    ;;
esac

#!/usr/bin/env bash
# The twenty-fourth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-06-h200-s24/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8

# the routed experts' combine inside the grouped SIMT down GEMV (MSM_CUDA_MOE_DOWN_COMBINE=1; Qwen3
# at 5-47 tokens; measured slower in run 2 and removed, commit 91abbf6 has it): its kernel tests, its check_presets line (bitwise at an 8-token prefill), the A/B
# at 5-32 tokens (three rounds), Qwen3's timeline at 8 with it
down_combine() {
    el kernels | tee -a $OUT/gpu.txt
    timeout 120 gpu-run/bin/test_cuda_kernels --jobs 4 \
        --filter "cuda_kernels/@(tuning*|moe_grouped_simt*|moe_down_combine*)" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs|Assert|bits|counters" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=0,2 CHECK_VARIANTS="inside the grouped down" timeout 100 python3 tests/gpu/check_presets.py \
        config/models/$Q3.json config/models/$Q15.json > $OUT/presets.txt 2>&1
    grep -c PASS $OUT/presets.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep -E "FAIL|Error|error" $OUT/presets.txt | head -6 | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q3 5,8,11,16,32 dc --
        b $Q3 5,8,11,16,32 dc MSM_CUDA_MOE_DOWN_COMBINE=1 --
    done
    ROWS=20 tl $Q3 8 q3b8-dc MSM_CUDA_MOE_DOWN_COMBINE=1
}

# on an H200 (GLM-4.5-Air FP8's 111 GB need one): the table on all four presets, %HBM now against
# the copy rate msmoe-bench measures on the card; the phase-chain probe for Qwen3-30B-A3B and
# Qwen1.5-MoE (the batch-1 floor of a kernel per dependent phase); Qwen3's timelines at 1 and 8
table_probe() {
    nvidia-smi --query-gpu=memory.total --format=csv,noheader | tee -a $OUT/gpu.txt
    el table | tee -a $OUT/gpu.txt
    b $Q15 1,2,4,8,16,32,128,256 table --
    b $Q3 1,2,4,8,16,32,128,256 table --
    b $Q3F 1,2,4,8,16,32,128,256 table --
    b $GLM 1,2,4,8,32,128 table --
    grep "^# %HBM" $OUT/bench-table.txt | head -1 | tee -a $OUT/gpu.txt
    el probe | tee -a $OUT/gpu.txt
    for m in qwen3 qwen15 qwen3-fp8 qwen3-b8; do timeout 90 gpu-run/mega_probe 0 $m; done > $OUT/probe.txt 2>&1
    grep -E "^#|PDL, 8 warps|PDL, early loads, 8" $OUT/probe.txt | tee -a $OUT/gpu.txt
    el timeline | tee -a $OUT/gpu.txt
    ROWS=40 tl $Q3 1 q3b1
    ROWS=40 tl $Q3 8 q3b8
}

# any GPU: the batch-8 floor of a kernel per phase (mega_probe qwen3-b8: an 8-token step's bytes) and
# the batch-1 one, beside msmoed's Qwen3 at 1 and 8 tokens on the same machine (three rounds)
probe_b8() {
    el probe | tee -a $OUT/gpu.txt
    for m in qwen3-b8 qwen3; do timeout 90 gpu-run/mega_probe 0 $m; done > $OUT/probe.txt 2>&1
    grep -E "^#|PDL, 8 warps|PDL, early loads, 8|persistent 32 warps x 132 blocks, U 4, prefetch 0" $OUT/probe.txt |
        tee -a $OUT/gpu.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do b $Q3 1,8 q3 --; done
    grep "^# %HBM" $OUT/bench-q3.txt | head -1 | tee -a $OUT/gpu.txt
}

# the combine kernel's loads all in flight (two round trips instead of 2k; commit in gpu.txt) against
# the bundle before it (2cd6e54, carried as gpu-old/), which no switch can restore: three rounds each
# of Qwen3-30B-A3B and its FP8 preset at 5 / 8 / 16 tokens (the grouped and tiled paths end with the
# combine kernel), then its kernel tests and the timeline at 8
combine_loads() {
    [ -f gpu-old/bundle.tar.xz ] && { (cd gpu-old && tar xJf bundle.tar.xz && rm bundle.tar.xz) || return 1; }
    cat gpu-old/REVISION | sed 's/^/old bundle: /' | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for p in $Q3 $Q3F; do
            b $p 5,8,16 cl --
            { el "$p OLD"; LD_LIBRARY_PATH=$PWD/gpu-old/lib timeout 120 gpu-old/bin/msmoe-bench decode \
                --preset config/models/$p.json --backend cuda --batches 5,8,16 --context 512 --steps 30 2>&1 |
                grep -v '^# weights'; } | tee -a $OUT/bench-cl.txt
        done
    done
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 \
        --filter "cuda_kernels/@(moe_grouped_simt*|moe_fused_combine*|moe_tiled_pass*)" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs|Assert|bits" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
    ROWS=20 tl $Q3 8 q3b8-cl
}

# the routed experts' combine inside the next add + norm as a cluster a token
# (MSM_CUDA_MOE_FUSED_COMBINE=2; the one-block form lost in the twentieth session): its kernel tests,
# check_presets' lines (bitwise, 8-token prefills), the A/B at 5-32 tokens (three rounds; Qwen1.5-MoE's
# reader is a MOE_COMBINE_NORM, which 2 leaves alone), the 8-token timeline with it
combine_norm() {
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(tuning*|moe_fused_combine*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs|Assert" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=0,2 CHECK_VARIANTS="combine inside the next" timeout 150 python3 tests/gpu/check_presets.py \
        config/models/$Q3.json config/models/$Q3F.json > $OUT/presets.txt 2>&1
    grep -c PASS $OUT/presets.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep -E "FAIL|Error|error" $OUT/presets.txt | head -6 | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for p in $Q3 $Q3F; do
            b $p 5,8,16,32 cn --
            b $p 5,8,16,32 cn MSM_CUDA_MOE_FUSED_COMBINE=2 --
            b $p 8 cn MSM_CUDA_MOE_FUSED_COMBINE=2 MSM_CUDA_MOE_COMBINE_CLUSTER=0 --
        done
    done
    ROWS=20 tl $Q3 8 q3b8-cn MSM_CUDA_MOE_FUSED_COMBINE=2
}

case "$1" in
r1) hdr; table_probe; el done | tee -a $OUT/gpu.txt ;;  # needs an H200 (GLM-4.5-Air FP8)
r2) hdr; down_combine; table_probe; el done | tee -a $OUT/gpu.txt; pack ;;  # run 2 (an H100 came)
r3) hdr; probe_b8; el done | tee -a $OUT/gpu.txt ;;
r4) hdr; combine_loads; el done | tee -a $OUT/gpu.txt ;;
r5) hdr; combine_norm; el done | tee -a $OUT/gpu.txt ;;
r6) hdr; el ab | tee -a $OUT/gpu.txt   # run 5's change at 64-256 tokens (the tiled paths), two rounds
    for i in 1 2; do for p in $Q3 $Q3F; do
        b $p 64,128,256 cn6 --
        b $p 64,128,256 cn6 MSM_CUDA_MOE_FUSED_COMBINE=2 --
    done; done
    el done | tee -a $OUT/gpu.txt ;;
r7) hdr   # the final defaults (the combine into an add + norm up to 64 tokens): kernel tests, check_presets
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(tuning*|moe_fused_combine*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs|Assert|defers" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=0,2 CHECK_VARIANTS="combine in,graph replay,multi-stream,PDL on" timeout 150 \
        python3 tests/gpu/check_presets.py config/models/$Q3.json > $OUT/presets.txt 2>&1
    grep -c PASS $OUT/presets.txt | sed 's/^/PASS lines: /' | tee -a $OUT/gpu.txt
    grep -E "FAIL|Error|error" $OUT/presets.txt | head -6 | tee -a $OUT/gpu.txt
    b $Q3 1,8,64,128 final --
    el done | tee -a $OUT/gpu.txt ;;
esac

#!/usr/bin/env bash
# The twenty-seventh session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/ (and the bundle before a change as gpu-old/):
#   bash bench/results/2026-12-06-h200-s27/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
# the twenty-sixth session's kern_tests (kernel tests by filter), old_new (old against new bundle:
# logits bitwise, then ROUNDS rounds of msmoe-bench) and final (the table on every preset, the probe's
# floors, Qwen3's timelines at 1 and 8; TABLE_ONLY=1 stops there)
source <(sed -n '/^kern_tests() {/,/^}/p;/^old_new() {/,/^}/p;/^final() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)

# any GPU: the routed experts' grouping by the router's last block (MSM_CUDA_ROUTER_GROUP=0 restores
# the grouping kernel) and the combines reading the routing before their PDL wait
# (MSM_CUDA_MOE_COMBINE_EARLY=0: after), commit in gpu.txt: their kernel tests (and the router's, the
# tuning's); msmoe-run's logits with both and with neither bitwise (8- and 12-token prompts: the
# prefill's experts on the grouped GEMVs and tiled GEMMs, then 6 decode steps); check_presets'
# variants on three presets; three rounds of Qwen3-30B-A3B, its FP8 preset and Qwen1.5-MoE at 5-32
# tokens with both, without the grouping, without the early reads; Qwen3's timelines at 8 with both
# and neither; on an H200 (over 120 GB) then the table, the probe's floors and the timelines
# (final, TABLE_ONLY)
group() {
    kern_tests "@(tuning*|router_group*|norm_router*)"
    el bitwise | tee -a $OUT/gpu.txt
    for p in $Q3 $Q3F $Q15; do for ids in 5,1000,77,300,12,9000,41,2 7,8,9,10,11,12,13,14,15,16,17,18; do
        for v in 0 1; do
            MSM_CUDA_ROUTER_GROUP=$v MSM_CUDA_MOE_COMBINE_EARLY=$v timeout 100 gpu-run/bin/msmoe-run --dummy-weights config/models/$p.json \
                --backend cuda --prompt-ids $ids --max-new-tokens 6 --ignore-eos --dump-logits /tmp/l-$v.npy \
                > /tmp/t-$v.txt 2>/dev/null
        done
        echo "$p $ids: $(cmp -s /tmp/l-0.npy /tmp/l-1.npy && cmp -s /tmp/t-0.txt /tmp/t-1.txt && echo same bits || echo DIFFER)" |
            tee -a $OUT/gpu.txt
    done; done
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for pb in "$Q3 5,8,16,32" "$Q3F 5,8,16,32" "$Q15 5,8,16,32"; do
            set -- $pb
            b $1 $2 grp --
            b $1 $2 grp MSM_CUDA_ROUTER_GROUP=0 --
            b $1 $2 grp MSM_CUDA_MOE_COMBINE_EARLY=0 --
        done
        [ $i = 2 ] && { el presets | tee -a $OUT/gpu.txt
            CHECK_PROMPTS=2 CHECK_VARIANTS="grouping,combines reading" timeout 150 python3 tests/gpu/check_presets.py \
                config/models/$Q15.json config/models/$Q3.json config/models/$Q3F.json > $OUT/presets.txt 2>&1
            grep -E "FAIL|failed|pass" $OUT/presets.txt | head -12 | tee -a $OUT/gpu.txt; el ab | tee -a $OUT/gpu.txt; }
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=20 tl $Q3 8 q3b8
    ROWS=20 tl $Q3 8 q3b8-nogrp MSM_CUDA_ROUTER_GROUP=0 MSM_CUDA_MOE_COMBINE_EARLY=0
    local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ "${mib:-0}" -gt 120000 ] && TABLE_ONLY=1 final
    return 0
}

case "$1" in
r1) hdr; TABLE_ONLY=1 final; el done | tee -a $OUT/gpu.txt ;;  # an H200: the twenty-sixth session's code (refused)
r2) hdr; group; el done | tee -a $OUT/gpu.txt ;;
esac

#!/usr/bin/env bash
# The twenty-eighth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-06-h200-s28/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
# the twenty-sixth session's kern_tests (kernel tests by filter), old_new (old against new bundle:
# logits bitwise, then ROUNDS rounds of msmoe-bench) and final (the table on every preset, the probe's
# floors, Qwen3's timelines at 1 and 8; TABLE_ONLY=1 stops there)
source <(sed -n '/^kern_tests() {/,/^}/p;/^old_new() {/,/^}/p;/^final() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)

# any GPU: the fused router as one cluster for several tokens (MSM_CUDA_ROUTER_TCLUSTER=8, 0: the
# counter form; _TB tokens a cluster), commit in gpu.txt: the router's kernel tests (and the
# tuning's); msmoe-run's logits off and on bitwise (5- and 8-token prompts: the prefill's router at
# 5 and 8 tokens, then 6 decode steps); check_presets' two variants on three presets; three rounds of
# Qwen3-30B-A3B, its FP8 preset and Qwen1.5-MoE at 2-8 tokens (Qwen1.5-MoE to 16) off, on at 8, 4, 2
# tokens a cluster; Qwen3's timelines at 8 off and on (r3: and at 2 a cluster; the o_proj MMV at 8 K
# slices a block, MSM_CUDA_MMV_BSLICE=8, so its blocks fit beside the attention's; with one cluster
# for every token the grouping in its block 0, MSM_CUDA_ROUTER_GROUP=1: arm, timeline, logits); on an H200 (over 120 GB) first the table, the
# probe's floors and the timelines of the code before (final, TABLE_ONLY: the switch is off by default)
tcl() {
    local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ "${mib:-0}" -gt 120000 ] && TABLE_ONLY=1 final
    kern_tests "@(tuning*|router_linear*|router_group*)"
    el bitwise | tee -a $OUT/gpu.txt
    for p in $Q3 $Q3F $Q15; do for ids in 5,1000,77,300,12 7,8,9,10,11,12,13,14; do
        for v in 0 8 8g; do
            MSM_CUDA_ROUTER_TCLUSTER=${v%g} MSM_CUDA_ROUTER_GROUP=$([ $v = 8g ] && echo 1 || echo 0) timeout 100 gpu-run/bin/msmoe-run --dummy-weights config/models/$p.json \
                --backend cuda --prompt-ids $ids --max-new-tokens 6 --ignore-eos --dump-logits /tmp/l-$v.npy \
                > /tmp/t-$v.txt 2>/dev/null
        done
        echo "$p $ids: $(cmp -s /tmp/l-0.npy /tmp/l-8.npy && cmp -s /tmp/t-0.txt /tmp/t-8.txt && echo same bits || echo DIFFER)" \
            "grouping in it: $(cmp -s /tmp/l-0.npy /tmp/l-8g.npy && cmp -s /tmp/t-0.txt /tmp/t-8g.txt && echo same bits || echo DIFFER)" |
            tee -a $OUT/gpu.txt
    done; done
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for pb in "$Q3 2,4,5,8" "$Q3F 2,4,8" "$Q15 2,4,8,16"; do
            set -- $pb
            b $1 $2 tcl --
            b $1 $2 tcl MSM_CUDA_ROUTER_TCLUSTER=16 --
            b $1 $2 tcl MSM_CUDA_ROUTER_TCLUSTER=16 MSM_CUDA_ROUTER_TCLUSTER_TB=4 --
            b $1 $2 tcl MSM_CUDA_ROUTER_TCLUSTER=16 MSM_CUDA_ROUTER_TCLUSTER_TB=2 --
            [ "${TB2:-0}" = 1 ] && b $1 $2 tcl MSM_CUDA_ROUTER_TCLUSTER=16 MSM_CUDA_ROUTER_GROUP=1 --
            [ "${TB2:-0}" = 1 ] && [ $1 != $Q15 ] && b $1 $2 tcl MSM_CUDA_MMV_BSLICE=8 --
        done
        [ $i = 2 ] && { el presets | tee -a $OUT/gpu.txt
            CHECK_PROMPTS=2 CHECK_VARIANTS="clusters of 2 tokens,one cluster for 8" timeout 150 python3 tests/gpu/check_presets.py \
                config/models/$Q15.json config/models/$Q3.json config/models/$Q3F.json > $OUT/presets.txt 2>&1
            grep -E "FAIL|failed|pass" $OUT/presets.txt | head -12 | tee -a $OUT/gpu.txt; el ab | tee -a $OUT/gpu.txt; }
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=20 tl $Q3 8 q3b8-off
    ROWS=20 tl $Q3 8 q3b8-on MSM_CUDA_ROUTER_TCLUSTER=8
    [ "${TB2:-0}" = 1 ] && ROWS=20 tl $Q3 8 q3b8-tb2 MSM_CUDA_ROUTER_TCLUSTER=8 MSM_CUDA_ROUTER_TCLUSTER_TB=2
    [ "${TB2:-0}" = 1 ] && ROWS=20 tl $Q3 8 q3b8-grp MSM_CUDA_ROUTER_TCLUSTER=8 MSM_CUDA_ROUTER_GROUP=1
    pack
    return 0
}

# any GPU: the batched cluster router on by default (2-8 tokens, 2 a cluster, not beside the aux
# stream), commit in gpu.txt: on an H200 first the table (final, TABLE_ONLY); the router's kernel
# tests; check_presets' three router variants (off, 8 a cluster, 8 with the grouping) on three
# presets; two rounds of Qwen3-30B-A3B and Qwen1.5-MoE (its shared expert beside: unchanged) at
# 2-8 tokens, default against MSM_CUDA_ROUTER_TCLUSTER=0
dflt() {
    local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ "${mib:-0}" -gt 120000 ] && TABLE_ONLY=1 final
    kern_tests "@(tuning*|router_linear*|router_group*|norm_router*)"
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=2 CHECK_VARIANTS="clusters of 2 tokens,one cluster for 8" timeout 150 python3 tests/gpu/check_presets.py \
        config/models/$Q15.json config/models/$Q3.json config/models/$Q3F.json > $OUT/presets.txt 2>&1
    grep -E "FAIL|failed|pass" $OUT/presets.txt | head -12 | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for pb in "$Q3 2,4,8" "$Q15 2,4,8"; do
            set -- $pb
            b $1 $2 dflt --
            b $1 $2 dflt MSM_CUDA_ROUTER_TCLUSTER=0 --
        done
    done
    pack
    return 0
}

case "$1" in
r1) hdr; TABLE_ONLY=1 final; el done | tee -a $OUT/gpu.txt ;;  # an H200: the table of the code at 432d85f
r2) hdr; tcl; el done | tee -a $OUT/gpu.txt ;;  # the first kernel (3420b93): its x loads a token after another
r3) hdr; TB2=1 tcl; el done | tee -a $OUT/gpu.txt ;;  # every token's x loads of a step at once
r4) hdr; dflt; el done | tee -a $OUT/gpu.txt ;;
esac

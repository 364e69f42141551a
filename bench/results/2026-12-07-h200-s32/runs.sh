#!/usr/bin/env bash
# The thirty-second session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s32/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
# the twenty-sixth session's kern_tests and final (the table on every preset, the probe's floors,
# Qwen3's timelines at 1 and 8; TABLE_ONLY=1 stops there), the thirtieth's h200 test, the
# thirty-first's bits (logits of MSM_CUDA_MOE_GG_STREAM 0/1/2/3/7 bitwise on Qwen3 and Qwen1.5) and
# st_ab (rounds of the stream arms SV at batches $1, Qwen1.5 at 8/16/32, on an H200 the thirtieth
# session's sweep arms too)
source <(sed -n '/^kern_tests() {/,/^}/p;/^final() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)
source <(sed -n '/^bits() {/,/^}/p;/^st_ab() {/,/^}/p' bench/results/2026-12-06-h200-s31/runs.sh)

# any GPU: the grouped SIMT expert GEMVs by bulk copies (MSM_CUDA_MOE_GG_STREAM) and on persistent
# grids (MSM_CUDA_MOE_GG_PERSIST: 1 the gate/up, 2 the down, 3 both; moe_grouped.cu): msmoe-run's
# logits of each arm bitwise against the default on Qwen3-30B-A3B and Qwen1.5-MoE, then rounds of
# each arm (on an H200 the thirtieth session's sweep arms too)
ARMS="MSM_CUDA_MOE_GG_STREAM=1 MSM_CUDA_MOE_GG_STREAM=5 MSM_CUDA_MOE_GG_STREAM=2 MSM_CUDA_MOE_GG_STREAM=3
      MSM_CUDA_MOE_GG_STREAM=7 MSM_CUDA_MOE_GG_PERSIST=1 MSM_CUDA_MOE_GG_PERSIST=2 MSM_CUDA_MOE_GG_PERSIST=3"
bits2() {
    el bitwise | tee -a $OUT/gpu.txt
    for p in $Q3 $Q15; do
        local i=0 d=""
        for a in "" $ARMS; do
            env $a timeout 100 gpu-run/bin/msmoe-run --dummy-weights config/models/$p.json --backend cuda \
                --prompt-ids 5,1000,77,300,12,9,8,7 --max-new-tokens 6 --ignore-eos --dump-logits /tmp/l-$i.npy > /tmp/t-$i.txt 2>/dev/null
            [ $i -gt 0 ] && ! { cmp -s /tmp/l-0.npy /tmp/l-$i.npy && cmp -s /tmp/t-0.txt /tmp/t-$i.txt; } && d="$d $a"
            i=$((i + 1))
        done
        echo "$p: ${d:+DIFFER:}${d:-every arm the same bits}" | tee -a $OUT/gpu.txt
    done
}
arms() {  # $1: batches of Qwen3; $2: rounds
    el arms | tee -a $OUT/gpu.txt
    for i in $(seq ${2:-3}); do
        b $Q3 $1 ab --
        for a in $ARMS "MSM_CUDA_MOE_GG_PERSIST=1 MSM_CUDA_MOE_GG_GATEUP_U=3"; do b $Q3 $1 ab $a --; done
        b $Q15 8,16,32 ab --; b $Q15 8,16,32 ab MSM_CUDA_MOE_GG_STREAM=3 --; b $Q15 8,16,32 ab MSM_CUDA_MOE_GG_PERSIST=3 --
        h200 || continue
        for a in MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4 MSM_CUDA_MOE_KERNELS=mma \
                 MSM_CUDA_MMV_STREAM_BS_MIN_N=0 MSM_CUDA_ROUTER_TCLUSTER=0 MSM_CUDA_MOE_COMBINE_EARLY=0; do
            b $Q3 $1 ab $a --
        done
    done
}

case "$1" in
r1) hdr; kern_tests "@(tuning*|moe_grouped_simt*)"; bits  # s31's r3: the bulk-copy expert GEMVs' first run
    if h200; then TABLE_ONLY=1 final; SV="0 1 5 2 3 7" st_ab 4,8 3; else SV="0 1 5 2 3 7" st_ab 5,8 3; fi
    el timeline | tee -a $OUT/gpu.txt; ROWS=14 tl $Q3 8 q3b8-s3 MSM_CUDA_MOE_GG_STREAM=3
    pack; el done | tee -a $OUT/gpu.txt ;;
r2) hdr; kern_tests "@(tuning*|moe_grouped_simt*)"; bits2  # r1 with the persistent grids' arms
    if h200; then TABLE_ONLY=1 final; arms 4,8 3; else arms 5,8 3; fi
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl $Q3 8 q3b8-s3 MSM_CUDA_MOE_GG_STREAM=3; ROWS=14 tl $Q3 8 q3b8-p3 MSM_CUDA_MOE_GG_PERSIST=3
    pack; el done | tee -a $OUT/gpu.txt ;;
r3) hdr; ARMS="MSM_CUDA_MOE_GG_STREAM=1 MSM_CUDA_MOE_GG_STREAM=3 MSM_CUDA_MOE_GG_PERSIST=1 MSM_CUDA_MOE_GG_PERSIST=3"
    bits2; el arms | tee -a $OUT/gpu.txt  # r2 cut to a short budget: two rounds of four arms
    bt=$(h200 && echo 4,8 || echo 5,8)
    for i in 1 2; do for a in "" $ARMS; do b $Q3 $bt ab $a --; done; done
    h200 && { el table | tee -a $OUT/gpu.txt; b $Q3 1,2,4,8,16,32,128,256 table --; b $Q15 1,2,4,8,16,32,128,256 table --; }
    el timeline | tee -a $OUT/gpu.txt; ROWS=14 tl $Q3 8 q3b8-p3 MSM_CUDA_MOE_GG_PERSIST=3
    kern_tests "moe_grouped_simt*"; el done | tee -a $OUT/gpu.txt ;;
r4) hdr; kern_tests "@(tuning*|moe_grouped_simt*)"  # after run 2 (H100; the bulk copies removed, the
    # persistent item loop one helper since): the H200's share; on an H100 the persistent grids' preset checks
    if ! h200; then
        el presets | tee -a $OUT/gpu.txt
        CHECK_PROMPTS=0,2 CHECK_VARIANTS="persistent grids" timeout 300 \
            python3 tests/gpu/check_presets.py config/models/$Q3.json config/models/$Q15.json > $OUT/presets.txt 2>&1
        tail -3 $OUT/presets.txt | tee -a $OUT/gpu.txt; grep -cE "FAIL|failed" $OUT/presets.txt | tee -a $OUT/gpu.txt
        el done | tee -a $OUT/gpu.txt; exit 0
    fi
    TABLE_ONLY=1 final; el arms | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for a in "" MSM_CUDA_MOE_GG_PERSIST=1 MSM_CUDA_MOE_GG_PERSIST=2 MSM_CUDA_MOE_GG_GATEUP_U=3 \
                 MSM_CUDA_MOE_GG_GATEUP_U=4; do b $Q3 4,8 ab $a --; done
    done
    pack; el done | tee -a $OUT/gpu.txt ;;
r5) hdr  # r4 cut to the last ~150 s: on an H200 the owed table of Qwen3 and Qwen1.5-MoE and one round
    if h200; then
        el table | tee -a $OUT/gpu.txt; b $Q3 1,2,4,8,16,32,128,256 table --; b $Q15 1,2,4,8,16,32,128,256 table --
        el arms | tee -a $OUT/gpu.txt
        for a in "" MSM_CUDA_MOE_GG_PERSIST=2 MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4 ""; do b $Q3 4,8 ab $a --; done
    else
        el presets | tee -a $OUT/gpu.txt
        CHECK_PROMPTS=2 CHECK_VARIANTS="persistent grids" timeout $(left 140) \
            python3 tests/gpu/check_presets.py config/models/$Q3.json > $OUT/presets.txt 2>&1
        tail -3 $OUT/presets.txt | tee -a $OUT/gpu.txt
    fi
    el done | tee -a $OUT/gpu.txt ;;
esac

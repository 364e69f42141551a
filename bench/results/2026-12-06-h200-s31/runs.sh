#!/usr/bin/env bash
# The thirty-first session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-06-h200-s31/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
# the twenty-sixth session's kern_tests and final (the table on every preset, the probe's floors,
# Qwen3's timelines at 1 and 8; TABLE_ONLY=1 stops there), the thirtieth's h200 test and sweep
# (on an H200: the table, then three rounds of Qwen3 at 4 and 8 tokens against each H100-measured
# default switched back and the grouped GEMVs' other shapes)
source <(sed -n '/^kern_tests() {/,/^}/p;/^final() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
source <(sed -n '/^h200() {/p;/^sweep() {/,/^}/p' bench/results/2026-12-06-h200-s30/runs.sh)

# any GPU: the grouped SIMT expert GEMVs streamed through shared memory (MSM_CUDA_MOE_GG_STREAM: 1
# the gate/up, 2 the down, 3 both; moe_stream.cu): their kernel tests, msm-run's logits bitwise
# against the default on Qwen3-30B-A3B and Qwen1.5-MoE, then three rounds of each arm
bits() {
    el bitwise | tee -a $OUT/gpu.txt
    for p in $Q3 $Q15; do
        for v in 0 1 2 3 7; do
            MSM_CUDA_MOE_GG_STREAM=$v timeout 100 gpu-run/bin/msmoe-run --dummy-weights config/models/$p.json --backend cuda \
                --prompt-ids 5,1000,77,300,12,9,8,7 --max-new-tokens 6 --ignore-eos --dump-logits /tmp/l-$v.npy > /tmp/t-$v.txt 2>/dev/null
        done
        echo "$p stream 0 vs 1 vs 2 vs 3 vs 7: $(for v in 1 2 3 7; do cmp -s /tmp/l-0.npy /tmp/l-$v.npy && cmp -s /tmp/t-0.txt /tmp/t-$v.txt || echo DIFFER; done | grep -q DIFFER && echo DIFFER || echo same bits)" | tee -a $OUT/gpu.txt
    done
}
st_ab() {  # $1: batches of Qwen3; $2: rounds; on an H200 also the thirtieth session's sweep arms
    el stream ab | tee -a $OUT/gpu.txt
    for i in $(seq ${2:-3}); do
        for v in ${SV:-0 1 2 3}; do b $Q3 $1 st MSM_CUDA_MOE_GG_STREAM=$v --; done
        b $Q15 8,16,32 st -- ; b $Q15 8,16,32 st MSM_CUDA_MOE_GG_STREAM=3 --
        h200 || continue
        for a in MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4 MSM_CUDA_MOE_KERNELS=mma \
                 MSM_CUDA_MMV_STREAM_BS_MIN_N=0 MSM_CUDA_ROUTER_TCLUSTER=0 MSM_CUDA_MOE_COMBINE_EARLY=0; do
            b $Q3 $1 st $a --
        done
    done
}

case "$1" in
r1) hdr; kern_tests "@(tuning*|linear_mmv*|moe_grouped_simt*)"  # b57a395: s30's r2
    h200 && { sweep; pack; }; el done | tee -a $OUT/gpu.txt ;;
r2) hdr; kern_tests "@(tuning*|moe_grouped_simt*)"; bits  # cd90a30 (its runs.sh): the persistent ring form
    if h200; then TABLE_ONLY=1 final; st_ab 4,8 3; else st_ab 5,8,16,32 3; fi
    el timeline | tee -a $OUT/gpu.txt; ROWS=14 tl $Q3 8 q3b8-s3 MSM_CUDA_MOE_GG_STREAM=3
    pack; el done | tee -a $OUT/gpu.txt ;;
r3) hdr; kern_tests "@(tuning*|moe_grouped_simt*)"; bits  # r2 with each block's rows by bulk copies at once
    if h200; then TABLE_ONLY=1 final; SV="0 1 5 2 3 7" st_ab 4,8 3; else SV="0 1 5 2 3 7" st_ab 5,8 3; fi
    el timeline | tee -a $OUT/gpu.txt; ROWS=14 tl $Q3 8 q3b8-s3 MSM_CUDA_MOE_GG_STREAM=3
    pack; el done | tee -a $OUT/gpu.txt ;;
r4) hdr; el stream ab | tee -a $OUT/gpu.txt  # e5359f3: r3 cut to the budget's last ~150 s
    for i in 1 2; do
        for v in 0 1 3 7; do b $Q3 5,8 st MSM_CUDA_MOE_GG_STREAM=$v --; done
        b $Q15 8 st --; b $Q15 8 st MSM_CUDA_MOE_GG_STREAM=3 --
    done
    h200 && { el table | tee -a $OUT/gpu.txt; b $Q3 1,2,4,8,16,32,128,256 table --; b $Q15 1,2,4,8,16,32,128,256 table --; }
    el timeline | tee -a $OUT/gpu.txt; ROWS=14 tl $Q3 8 q3b8-s3 MSM_CUDA_MOE_GG_STREAM=3
    kern_tests "moe_grouped_simt*"; el done | tee -a $OUT/gpu.txt ;;
esac

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

case "$1" in
r1) hdr; kern_tests "@(tuning*|moe_grouped_simt*)"; bits  # s31's r3: the bulk-copy expert GEMVs' first run
    if h200; then TABLE_ONLY=1 final; SV="0 1 5 2 3 7" st_ab 4,8 3; else SV="0 1 5 2 3 7" st_ab 5,8 3; fi
    el timeline | tee -a $OUT/gpu.txt; ROWS=14 tl $Q3 8 q3b8-s3 MSM_CUDA_MOE_GG_STREAM=3
    pack; el done | tee -a $OUT/gpu.txt ;;
esac

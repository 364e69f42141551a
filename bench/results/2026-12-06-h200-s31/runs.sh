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

case "$1" in
r1) hdr; kern_tests "@(tuning*|linear_mmv*|moe_grouped_simt*)"  # b57a395: s30's r2
    h200 && { sweep; pack; }; el done | tee -a $OUT/gpu.txt ;;
esac

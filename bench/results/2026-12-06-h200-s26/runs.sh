#!/usr/bin/env bash
# The twenty-sixth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-06-h200-s26/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8

# any GPU: the attention kernel tests (the twenty-fifth session's warp merge ran only against the old
# binary's logits; its slim bundles had no kernel tests)
att_tests() {
    el kernels | tee -a $OUT/gpu.txt
    timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(tuning*|attention*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs|Assert" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
}

# on an H200 (GLM-4.5-Air FP8's 111 GB need one): the kernel tests, then the twenty-fourth session's
# table_probe (the table on all four presets, the phase-chain probe, Qwen3's timelines at 1 and 8)
h200() {
    att_tests
    source <(sed -n '/^table_probe() {/,/^}/p' bench/results/2026-12-06-h200-s24/runs.sh)
    table_probe
}

case "$1" in
r1) hdr; h200; el done | tee -a $OUT/gpu.txt ;;  # needs an H200
esac

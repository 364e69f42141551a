#!/usr/bin/env bash
# The thirty-seventh session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s37/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack, arm_bits
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)
S34=bench/results/2026-12-07-h200-s34/runs.sh
S36=bench/results/2026-12-07-h200-s36/runs.sh

case "$1" in
r1) # owed from the thirty-sixth session (any card): after the sum-source fix (00a62ae), the presets'
    # bits, the default against --no-prefetch-kv and the K/V prefetch up to 16 tokens, the 8-token
    # timeline, the golden models against the CPU in the time left (LIMIT: seconds from the start)
    LIMIT=${LIMIT:-500} bash $S36 r4 ;;
r2) # on an H200 (owed for ten sessions): the table of the current code, the gate/up's chunks in
    # flight and the persistent down, the probe's floors, the 8-token timelines (the s34 r4)
    hdr; h200 || { echo "not an H200: r2 skipped" | tee -a $OUT/gpu.txt; exit 0; }
    OUT=$OUT/r4 bash $S34 r4; cat $OUT/r4/gpu.txt >> $OUT/gpu.txt; pack ;;
esac

#!/usr/bin/env bash
# The thirty-ninth session's device commands (README.md here): the thirty-eighth session's, owed
# (no machine started then), unchanged. From the repository root, with the binaries of
# `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s39/runs.sh rN     (r1, r2, or LIMIT=N r3: see s38's runs.sh)
exec bash bench/results/2026-12-07-h200-s38/runs.sh "$@"

#!/usr/bin/env bash
# The forty-first session's device plan (README.md here; no device was lent in that session, so
# these are for the next session that gets an H200). From the repository root, with the binaries of
# `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-08-h200-s41/runs.sh r1
# r1 (an H200; ~5 min: the H200 runs of session 26 took under a minute for a table and the floors):
#   the presets' table, two rounds (Qwen3 first; GLM-4.5-Air FP8 once), the routed experts' bytes in
#   flight and persistent grids as arms (the H200's experts read at 91-94% of its copy rate where
#   the H100's run at 96-100%), their bits, the probe's 8-token floors, Qwen3's timelines at 1 and 8
#   tokens, then the kernel tests and the presets' bitwise checks in the time left. On any other
#   card it says so and stops (an H100's numbers are s39's and s40's).
# r2: r1 without the GLM table and the checks (~2 min), for a short budget.
source bench/device_run.sh  # el, left, b, tl, hdr, pack, arm_bits
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)
source <(sed -n '/^kern_tests() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
source <(sed -n '/^floors() {/,/^}/p' bench/results/2026-12-07-h200-s34/runs.sh)
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
source <(sed -n '/^presets() {/,/^}/p' bench/results/2026-12-07-h200-s33/runs.sh)
# the grouped SIMT gate/up with 3 or 4 K chunks in flight a lane (default 2), the down with 3 (default
# 2), and persistent grids for the gate/up (1) or the down (2); all the same bits (kernel tests)
ARMS="MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4 MSM_CUDA_MOE_GG_DOWN_U=3 MSM_CUDA_MOE_GG_PERSIST=1 MSM_CUDA_MOE_GG_PERSIST=2"

core() {
    el table | tee -a $OUT/gpu.txt
    for i in 1 2; do for p in $Q3 $Q15 $Q3F; do b $p 1,2,4,8,16,32,128,256 table --; done; done > /dev/null 2>&1
    grep -m1 "^# %HBM" $OUT/bench-table.txt | tee -a $OUT/gpu.txt
    arm_bits "$ARMS" $Q3 $Q15
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for a in "" $ARMS; do
        b $Q3 5,8,16 ab $a --; b $Q15 8,16 ab $a --; done; done > /dev/null 2>&1
    floors
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl $Q3 8 q3b8; ROWS=14 tl $Q3 8 q3b8-u3 MSM_CUDA_MOE_GG_GATEUP_U=3; ROWS=14 tl $Q3 1 q3b1
}

case "$1" in
r1) hdr; h200 || { echo "not an H200: stopped" | tee -a $OUT/gpu.txt; exit 0; }
    core
    el glm | tee -a $OUT/gpu.txt; b $GLM 1,2,4,8,32,128 table -- > /dev/null 2>&1
    [ "$(left 570)" -gt 200 ] && kern_tests "*"
    [ "$(left 570)" -gt 150 ] && presets "" 0,2 $(( $(left 570) - 20 ))
    pack; el done | tee -a $OUT/gpu.txt ;;
r2) hdr; h200 || { echo "not an H200: stopped" | tee -a $OUT/gpu.txt; exit 0; }
    core; pack; el done | tee -a $OUT/gpu.txt ;;
esac

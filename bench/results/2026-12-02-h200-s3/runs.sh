#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-02-h200-s3/runs.sh rN
# (run 1 was the previous session's prepared `bash bench/results/2026-12-02-h200-s2/runs.sh r8`)
source bench/device_run.sh  # el, left, b, tl, prof, hdr
nk() { # KERNEL-REGEX PRESET SKIP BATCH [VAR=value ...]: ncu detail of one launch into $OUT/ncu.txt
    local k=$1 p=$2 sk=$3 bt=$4; shift 4
    echo "# ncu $k $p batch $bt $*" >> $OUT/ncu.txt
    env "$@" timeout $(left 560) /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:$k --launch-skip $sk \
        --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
        --section MemoryWorkloadAnalysis --section SchedulerStats gpu-run/bin/msmoe-bench decode \
        --preset config/models/$p.json --backend cuda --batches $bt --context 512 --steps 1 --no-cuda-graphs > /tmp/ncu.txt 2>&1
    grep -v "^==PROF==" /tmp/ncu.txt | grep -v "^    ---\|^$" | grep -v "^          " | tail -80 >> $OUT/ncu.txt
}
case "$1" in
r2)
    # where the time goes now: timelines at the targets' batches, ncu of the FP8 experts
    hdr
    el timeline | tee -a $OUT/gpu.txt
    ROWS=40 tl qwen3-30b-a3b-fp8 1 q3f
    ROWS=40 tl qwen3-30b-a3b 1 q3
    ROWS=40 tl qwen1.5-moe-a2.7b 1 q15
    ROWS=40 tl qwen1.5-moe-a2.7b 8 q15
    ROWS=40 tl qwen1.5-moe-a2.7b 32 q15
    el ncu | tee -a $OUT/gpu.txt
    nk moe_gateup_gemv qwen3-30b-a3b-fp8 20 1
    nk moe_down_split qwen3-30b-a3b-fp8 20 1
    el done | tee -a $OUT/gpu.txt
    ;;
esac

#!/usr/bin/env bash
# device_run.sh: the helpers a session's device commands share (bench/results/<session>/runs.sh
# sources it), run from the repository root on the device machine with the bundle of
# `tools/gpu-engine-check bundle` carried as gpu-run/. It unpacks the bundle and defines:
#   el WHAT                       a "# t=Ns WHAT" line (seconds since the start)
#   left [LIMIT]                  seconds left of LIMIT (585) since the start, for timeouts
#   b PRESET BATCHES TAG [VAR=value ...] -- [flags]   msmoe-bench decode into $OUT/bench-TAG.txt
#   tl PRESET BATCH TAG [VAR=value ...] [-- flags]    the decode graph's kernel timeline
#                                 (bench/cupti_timeline.c; BUNDLE_BINS with timeline) into
#                                 $OUT/timeline-TAG.txt, ROWS kernels listed (90)
#   prof PRESET BATCH TIMEOUT [VAR=value ...]         ncu per-kernel table of one eager step into
#                                 $OUT/profile.txt (bench/ncu_summary.py)
#   ncu_k REGEX PRESET BATCH TAG [VAR=value ...]    Nsight Compute sections (speed of light, memory,
#                                 warp states, occupancy, launch, scheduler) on the first 2 launches
#                                 of the kernels matching REGEX in one eager step, $OUT/ncu-TAG.txt
#   hdr                           the GPU and the bundle's revision into $OUT/gpu.txt
#   pack                          past 7 files under $OUT, all but gpu.txt into $OUT/out.tar.gz (the
#                                 device tool brings back a limited number of files: a run's last call)
#   arm_bits "ARMS" PRESET ...    msmoe-run's logits and tokens (dummy weights, 8 prompt tokens + 6)
#                                 under each arm (VAR=value, several joined by commas) against the
#                                 default, bitwise: a line a preset into $OUT/gpu.txt
# Afterwards, on any machine: `python3 bench/ab_summary.py runN-bench-TAG.txt ...` puts the rounds of
# each arm side by side (min-max ms/step, rounds, median change against the arm with no switch).
[ -f gpu-run/bundle.tar.xz ] && { (cd gpu-run && tar xJf bundle.tar.xz && rm bundle.tar.xz) || exit 1; }
export LD_LIBRARY_PATH=$PWD/gpu-run/lib PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s)
el() { echo "# t=$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( ${1:-585} - ($(date +%s) - T0) )); }
b() {
    local p=$1 bs=$2 tag=$3; shift 3
    local envs=() ; while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    { el "$p ${envs[*]} $*"; env "${envs[@]}" timeout 120 gpu-run/bin/msmoe-bench decode --preset config/models/$p.json \
        --backend cuda --batches $bs --context 512 --steps 30 "$@" 2>&1 | grep -v '^# weights'; } | tee -a $OUT/bench-$tag.txt
}
tl() {
    local p=$1 bt=$2 tag=$3; shift 3
    local envs=() ; while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done; [ $# -gt 0 ] && shift
    { el "timeline $p batch $bt ${envs[*]} $*"
      env "${envs[@]}" CUDA_INJECTION64_PATH=$PWD/gpu-run/bin/libmsm_timeline.so MSM_TIMELINE_OUT=/tmp/tl.csv timeout 120 \
        gpu-run/bin/msmoe-bench decode --preset config/models/$p.json --backend cuda --batches $bt --context 512 \
        --steps 30 "$@" 2>&1 | grep -v '^# weights'
      python3 bench/timeline_summary.py /tmp/tl.csv --rows ${ROWS:-90}; } >> $OUT/timeline-$tag.txt 2>&1
}
prof() {
    local p=$1 bt=$2 to=$3; shift 3
    env "$@" timeout $to /usr/local/cuda/bin/ncu --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base \
        gpu-run/bin/msmoe-bench decode --preset config/models/$p.json --backend cuda \
        --batches $bt --context 512 --steps 1 --no-cuda-graphs > /tmp/ncu.csv 2>&1
    echo "# $p batch $bt $*" >> $OUT/profile.txt
    python3 bench/ncu_summary.py /tmp/ncu.csv >> $OUT/profile.txt 2>&1
}
ncu_k() {
    local k=$1 p=$2 bt=$3 tag=$4; shift 4
    env "$@" timeout 120 /usr/local/cuda/bin/ncu --kernel-name "regex:$k" --launch-skip 0 --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SchedulerStats gpu-run/bin/msmoe-bench decode --preset config/models/$p.json \
        --backend cuda --batches $bt --context 512 --steps 1 --no-cuda-graphs > $OUT/ncu-$tag.txt 2>&1
}
hdr() { { nvidia-smi --query-gpu=name --format=csv; cat gpu-run/REVISION; } | tee $OUT/gpu.txt; }
pack() {
    local n; n=$(ls $OUT | wc -l)
    [ "$n" -gt 7 ] || return 0
    (cd $OUT && tar czf /tmp/out.tar.gz --exclude=gpu.txt . && find . -type f ! -name gpu.txt -delete && mv /tmp/out.tar.gz .)
}
arm_bits() {
    local arms=$1; shift
    el bitwise | tee -a $OUT/gpu.txt
    for p in "$@"; do
        local i=0 d=""
        for a in "" $arms; do
            env ${a//,/ } timeout 100 gpu-run/bin/msmoe-run --dummy-weights config/models/$p.json --backend cuda \
                --prompt-ids 5,1000,77,300,12,9,8,7 --max-new-tokens 6 --ignore-eos --dump-logits /tmp/l-$i.npy \
                > /tmp/t-$i.txt 2>/dev/null
            [ $i -gt 0 ] && ! { cmp -s /tmp/l-0.npy /tmp/l-$i.npy && cmp -s /tmp/t-0.txt /tmp/t-$i.txt; } && d="$d $a"
            i=$((i + 1))
        done
        echo "$p: ${d:+DIFFER:}${d:-every arm the same bits}" | tee -a $OUT/gpu.txt
    done
}

#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-02-h200/runs.sh rN
[ -f gpu-run/bundle.tar.xz ] && { (cd gpu-run && tar xJf bundle.tar.xz && rm bundle.tar.xz) || exit 1; }
export LD_LIBRARY_PATH=$PWD/gpu-run/lib PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s)
el() { echo "# t=$(( $(date +%s) - T0 ))s $*"; }
left() { echo $(( ${1:-585} - ($(date +%s) - T0) )); }
b() { # preset batches tag envs... -- flags
    local p=$1 bs=$2 tag=$3; shift 3
    local envs=() ; while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    { el "$p ${envs[*]} $*"; env "${envs[@]}" timeout 120 gpu-run/bin/msmoe-bench decode --preset config/models/$p.json \
        --backend cuda --batches $bs --context 512 --steps 30 "$@" 2>&1 | grep -v '^# weights'; } | tee -a $OUT/bench-$tag.txt
}
prof() { # preset batch timeout [envs...]
    local p=$1 bt=$2 to=$3; shift 3
    env "$@" timeout $to /usr/local/cuda/bin/ncu --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base \
        gpu-run/bin/msmoe-bench decode --preset config/models/$p.json --backend cuda \
        --batches $bt --context 512 --steps 1 --no-cuda-graphs > /tmp/ncu.csv 2>&1
    echo "# $p batch $bt $*" >> $OUT/profile.txt
    python3 bench/ncu_summary.py /tmp/ncu.csv >> $OUT/profile.txt 2>&1
}
hdr() { { nvidia-smi --query-gpu=name --format=csv; cat gpu-run/REVISION; } | tee $OUT/gpu.txt; }
case "$1" in
r1)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -30 > $OUT/kernels.txt
    el presets | tee -a $OUT/gpu.txt
    timeout 150 python3 tests/gpu/check_presets.py > $OUT/check.txt 2>&1
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do
        b $p 1,2,4,8 ab --
        b $p 1,2,4,8 ab MSM_CUDA_GEMV_BULK=0 --
        b $p 1,2,4 ab MSM_CUDA_GEMV_BULK_KB=48 --
        b $p 1,2,4 ab MSM_CUDA_GEMV_BULK_KB=200 MSM_CUDA_GEMV_BULK_PER_SM=1 --
        b $p 1,2,4,8 ab --
    done
    b glm-4.5-air-fp8 1,2 ab --
    b glm-4.5-air-fp8 1,2 ab MSM_CUDA_GEMV_BULK=0 --
    el profile | tee -a $OUT/gpu.txt
    prof qwen3-30b-a3b 1 $(left 560)
    prof qwen3-30b-a3b-fp8 1 $(left 580)
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # (nsys turned out not to be installed there, so the nsys part did not run; its summary
    # script, bench/nsys_step.py, was removed afterwards)
    hdr
    NSYS=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys /usr/local/cuda/nsight-systems*/bin/nsys 2>/dev/null | sort | tail -1)
    echo "# nsys: ${NSYS:-none}" | tee -a $OUT/gpu.txt
    el kernels | tee -a $OUT/gpu.txt
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/linear*' 2>&1 | tail -8 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for p in qwen3-30b-a3b qwen3-30b-a3b-fp8 qwen1.5-moe-a2.7b; do
        b $p 1,2,4 ab --
        b $p 1,2,4 ab MSM_CUDA_GEMV_BULK=0 --
        b $p 1,2,4 ab MSM_CUDA_GEMV_BULK=0 MSM_CUDA_GEMV_U8=1 --
        b $p 1,2,4 ab MSM_CUDA_CARVEOUT=100 --
        b $p 1,2,4 ab MSM_CUDA_CARVEOUT=100 MSM_CUDA_GEMV_BULK=0 --
        b $p 1,2,4 ab MSM_CUDA_CARVEOUT=0 MSM_CUDA_GEMV_BULK=0 --
        b $p 1,2,4 ab MSM_CUDA_GEMV_BULK=0 --
    done
    el nsys | tee -a $OUT/gpu.txt
    ns() { # preset batch envs...
        local p=$1 bt=$2; shift 2
        env "$@" timeout 90 $NSYS profile -o /tmp/ns --force-overwrite true --trace=cuda --cuda-graph-trace=node \
            gpu-run/bin/msmoe-bench decode --preset config/models/$p.json --backend cuda --batches $bt --context 512 \
            --steps 5 > /tmp/ns.log 2>&1 || tail -5 /tmp/ns.log >> $OUT/nsys.txt
        timeout 60 $NSYS stats --report cuda_gpu_trace --format csv --output /tmp/ns --force-export true /tmp/ns.nsys-rep > /dev/null 2>&1
        echo "# $p batch $bt $*" >> $OUT/nsys.txt
        python3 bench/nsys_step.py /tmp/ns_cuda_gpu_trace.csv 24 >> $OUT/nsys.txt 2>&1
    }
    if [ -n "$NSYS" ]; then
        ns qwen3-30b-a3b 1 MSM_CUDA_GEMV_BULK=0
        ns qwen3-30b-a3b 1
        ns qwen3-30b-a3b 1 MSM_CUDA_CARVEOUT=100
        ns qwen1.5-moe-a2.7b 1 MSM_CUDA_GEMV_BULK=0
    fi
    el ncu | tee -a $OUT/gpu.txt
    for k in linear_bulk gemv_kernel; do
        [ $k = gemv_kernel ] && export MSM_CUDA_GEMV_BULK=0
        timeout $(left 500) /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:$k --launch-skip 40 \
            --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
            --section MemoryWorkloadAnalysis gpu-run/bin/msmoe-bench decode --preset config/models/qwen3-30b-a3b.json \
            --backend cuda --batches 1 --context 512 --steps 1 --no-cuda-graphs > /tmp/ncu-$k.txt 2>&1
        grep -v "^==PROF==" /tmp/ncu-$k.txt | tail -120 >> $OUT/ncu.txt
    done
    unset MSM_CUDA_GEMV_BULK
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 585) python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json config/models/qwen3-30b-a3b-fp8.json > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -12 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for p in qwen3-30b-a3b qwen3-30b-a3b-fp8 qwen1.5-moe-a2.7b; do
        b $p 1,2,4 ab --
        b $p 1,2,4 ab MSM_CUDA_ROUTER_EARLY=0 --
        b $p 1,2,4 ab MSM_CUDA_MOE_GU_COLS=2 --
        b $p 1,2,4 ab MSM_CUDA_MOE_GU_U8=1 --
        b $p 1,2,4 ab MSM_CUDA_MOE_DOWN_ROWS=4 --
        b $p 1,2,4 ab --
    done
    b glm-4.5-air-fp8 1,2 ab --
    b glm-4.5-air-fp8 1,2 ab MSM_CUDA_MOE_GU_COLS=2 --
    b glm-4.5-air-fp8 1,2 ab MSM_CUDA_MOE_DOWN_ROWS=4 --
    el ncu | tee -a $OUT/gpu.txt
    nk() { # kernel-regex preset skip
        timeout $(left 470) /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:$1 --launch-skip $3 \
            --launch-count 1 --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
            --section MemoryWorkloadAnalysis --section SchedulerStats gpu-run/bin/msmoe-bench decode \
            --preset config/models/$2.json --backend cuda --batches 1 --context 512 --steps 1 --no-cuda-graphs > /tmp/ncu.txt 2>&1
        grep -v "^==PROF==" /tmp/ncu.txt | grep -v "^    ---\|^$" | tail -110 >> $OUT/ncu.txt
    }
    nk moe_gateup_gemv qwen3-30b-a3b-fp8 20
    nk moe_down_split qwen3-30b-a3b-fp8 20
    nk router_linear_topk qwen3-30b-a3b 20
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 585) python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json config/models/qwen3-30b-a3b-fp8.json > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -12 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for p in qwen3-30b-a3b-fp8 glm-4.5-air-fp8 qwen3-30b-a3b; do
        b $p 1,2,4 ab --
        b $p 1,2,4 ab MSM_CUDA_MOE_PATH=grouped_gemv --
        b $p 1,2,4 ab --
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8 glm-4.5-air-fp8; do
        b $p 1,8,32,128,256 final --
    done
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe,glm4moe-fp8,qwen3moe-fp8 timeout $(left 470) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 585) python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json config/models/qwen3-30b-a3b-fp8.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    hdr
    el opcosts | tee -a $OUT/gpu.txt
    oc() { # preset batches ops...: the step without each op (MSM_CUDA_SKIP_OPS; results meaningless, times real)
        local p=$1 bs=$2; shift 2
        for op in "" "$@" ""; do
            { echo "## $p without: ${op:-(nothing)}"; env ${op:+MSM_CUDA_SKIP_OPS=$op} timeout 60 gpu-run/bin/msmoe-bench \
                decode --preset config/models/$p.json --backend cuda --batches $bs --context 512 --steps 30 2>&1 |
                grep -v '^#'; } | tee -a $OUT/opcosts.txt
        done
    }
    oc qwen3-30b-a3b 1,8 ADD_RMSNORM QK_NORM ATTENTION LINEAR MOE_EXPERTS ROUTER_LINEAR_TOPK
    oc qwen3-30b-a3b-fp8 1,8 ADD_RMSNORM QK_NORM ATTENTION LINEAR MOE_EXPERTS ROUTER_LINEAR_TOPK
    oc qwen1.5-moe-a2.7b 1,8 ADD_RMSNORM MOE_COMBINE_NORM ROPE_KV_WRITE ATTENTION LINEAR MOE_EXPERTS ROUTER_LINEAR_TOPK SWIGLU
    el done | tee -a $OUT/gpu.txt
    ;;
r6)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/*linear*' 2>&1 | tail -12 > $OUT/kernels.txt
    timeout 60 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/tuning*' 2>&1 | tail -2 >> $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for p in qwen3-30b-a3b qwen3-30b-a3b-fp8; do
        b $p 1,2,4 ab --
        b $p 1,2,4 ab MSM_CUDA_NORM_LINEAR=0 --
        b $p 1,2,4 ab --
        b $p 1,2,4 ab MSM_CUDA_NORM_LINEAR=0 --
    done
    el presets | tee -a $OUT/gpu.txt
    timeout 200 python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json config/models/qwen3-30b-a3b-fp8.json > $OUT/presets.txt 2>&1
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe,qwen3moe-fp8 timeout $(left 420) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r7)
    hdr
    timeout 60 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/norm_linear*' 2>&1 | tail -2 > $OUT/kernels.txt
    for p in qwen3-30b-a3b qwen3-30b-a3b-fp8; do
        b $p 1,2,4 final --
    done
    el done | tee -a $OUT/gpu.txt
    ;;
esac

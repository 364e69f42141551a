#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels" tools/gpu-engine-check bundle`
# built in a clean worktree of the commit in each run's gpu.txt, carried as gpu-run/ (an xz
# bundle, unpacked there first):
#   (cd gpu-run && tar xJf bundle.tar.xz && rm bundle.tar.xz) && bash bench/results/2026-12-01-h200-s6/runs.sh rN
# Run 1 was `runs.sh r3` of ../2026-12-01-h200-mega (+ bench/mega_probe in gpu-run/bin). r5 was not
# run (the session's device time was spent).
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
prof() { # preset batch timeout
    timeout $3 /usr/local/cuda/bin/ncu --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum --csv --print-units base \
        gpu-run/bin/msmoe-bench decode --preset config/models/$1.json --backend cuda \
        --batches $2 --context 512 --steps 1 --no-cuda-graphs > /tmp/ncu.csv 2>&1
    echo "# $1 batch $2" >> $OUT/profile.txt
    python3 bench/ncu_summary.py /tmp/ncu.csv >> $OUT/profile.txt 2>&1
}
case "$1" in
r2)
    { nvidia-smi --query-gpu=name --format=csv; cat gpu-run/REVISION; } | tee $OUT/gpu.txt
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do
        b $p 1,2,4,8,16,32 ab --
        b $p 1,2,4,8,16,32 ab MSM_CUDA_GEMV_EARLY=0 --
        b $p 1,2,4,8,16,32 ab MSM_CUDA_QK_ROPE=0 --
        b $p 1,2,4,8,16,32 ab MSM_CUDA_GEMV_EARLY=0 MSM_CUDA_QK_ROPE=0 --
        b $p 1,2,4,8,16,32 ab --
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
        b $p 1,2,4,8 att MSM_CUDA_ATT_MAX_SPLIT=4 --
        b $p 1,2,4,8 att MSM_CUDA_ATT_MAX_SPLIT=8 --
        b $p 1,2,4,8 att MSM_CUDA_ATT_MMA=0 --
        b $p 1,2,4,8 att MSM_CUDA_ATT_MMA=2 --
    done
    b qwen1.5-moe-a2.7b 128,256 final --
    b qwen3-30b-a3b 128,256 final --
    b qwen3-30b-a3b-fp8 128,256 final --
    b glm-4.5-air-fp8 1,8,32,128,256 final --
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe,glm4moe-fp8 timeout 220 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el profile | tee -a $OUT/gpu.txt
    prof qwen3-30b-a3b-fp8 1 90
    timeout $(left) /usr/local/cuda/bin/ncu --clock-control none --kernel-name regex:mmv_kernel --launch-skip 20 \
        --launch-count 3 --section SpeedOfLight --section WarpStateStats --section Occupancy --section LaunchStats \
        --section MemoryWorkloadAnalysis gpu-run/bin/msmoe-bench decode --preset config/models/qwen1.5-moe-a2.7b.json \
        --backend cuda --batches 8 --context 512 --steps 1 --no-cuda-graphs > $OUT/ncu-mmv.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    { nvidia-smi --query-gpu=name --format=csv; cat gpu-run/REVISION; } | tee $OUT/gpu.txt
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do
        b $p 1,2,4,8,16,32 ab --
        b $p 1,2,4,8,16,32 ab MSM_CUDA_L2_PREFETCH=0 --
        b $p 1,2,4,8,16,32 ab MSM_CUDA_L2_PREFETCH=8 --
        b $p 1,2,4,8,16,32 ab MSM_CUDA_L2_PREFETCH=128 --
        b $p 1,2,4,8,16,32 ab MSM_CUDA_L2_PREFETCH=0 --
        b $p 1,2,4,8,16,32 ab --
        b $p 128,256 big --
        b $p 128,256 big MSM_CUDA_L2_PREFETCH=0 --
    done
    b glm-4.5-air-fp8 1,8,32 ab --
    b glm-4.5-air-fp8 1,8,32 ab MSM_CUDA_L2_PREFETCH=0 --
    for p in qwen3-30b-a3b-fp8 glm-4.5-air-fp8; do
        b $p 1,2 fp8 --
        b $p 1,2 fp8 MSM_CUDA_FP8_MMA_MIN_T=1 --
        b $p 8,16,32,64 fp8 --
        b $p 8,16,32,64 fp8 MSM_CUDA_MOE_PATH=tiled --
    done
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe,glm4moe-fp8,mixtral timeout 260 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el profile | tee -a $OUT/gpu.txt
    prof qwen1.5-moe-a2.7b 1 $(left)
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    { nvidia-smi --query-gpu=name --format=csv; cat gpu-run/REVISION; } | tee $OUT/gpu.txt
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for p in qwen3-30b-a3b-fp8 glm-4.5-air-fp8; do
        b $p 1,2,4,8,16,32,64,128,256 final --
        b $p 1,2,4 rows MSM_CUDA_FP8_GEMV_ROWS=2 --
        b $p 1,2,4 rows MSM_CUDA_FP8_GEMV_ROWS=1 --
        b $p 1,2,4 rows --
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
        b $p 1,8,32,128,256 final --
        b $p 8,16,32,64 tiled MSM_CUDA_MOE_PATH=tiled --
        b $p 8,16,32,64 tiled --
    done
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe,glm4moe-fp8,qwen3moe-fp8,mixtral timeout $(left 470) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    { nvidia-smi --query-gpu=name --format=csv; cat gpu-run/REVISION; } | tee $OUT/gpu.txt
    el kernels | tee -a $OUT/gpu.txt
    timeout 60 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/linear_fp8*' 2>&1 | tail -4 > $OUT/kernels.txt
    timeout 60 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/moe_experts_[mt]*' 2>&1 | tail -4 >> $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    b qwen3-30b-a3b-fp8 1,2,16,32,64 final --
    b qwen3-30b-a3b-fp8 16,32,64 native MSM_CUDA_FP8_NATIVE_MAX_T=8 --
    b glm-4.5-air-fp8 1,2,16,32,64 final --
    b glm-4.5-air-fp8 16,32,64 native MSM_CUDA_FP8_NATIVE_MAX_T=8 --
    b qwen1.5-moe-a2.7b 1,8,32 final --
    b qwen3-30b-a3b 1,8,32 final --
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,glm4moe-fp8 timeout $(left 200) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
esac

#!/usr/bin/env bash
# The device commands of this session's runs (README.md here): from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels" tools/gpu-engine-check bundle`
# (+ bench/mega_probe built by nvcc into gpu-run/bin) carried as gpu-run/: `bash runs.sh rN`.
# The bundle grew past the device call's 64 MiB with the tree, so from run 2 on it travelled as
# gpu-run/bundle.tar.xz (tar + xz of gpu-run/, ~14-18 MB), unpacked there first:
#   (cd gpu-run && tar xJf bundle.tar.xz && rm bundle.tar.xz) && bash bench/results/2026-12-01-h200-mega/runs.sh rN
# r3 and r4 were not run (the device refused new machines after run 2).
export LD_LIBRARY_PATH=$PWD/gpu-run/lib PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
D=bench/results/2026-12-01-h200-mega
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
r1)
    { nvidia-smi --query-gpu=name,clocks.max.sm --format=csv; cat gpu-run/REVISION; } | tee $OUT/gpu.txt
    el probe | tee -a $OUT/gpu.txt
    timeout 90 gpu-run/bin/mega_probe > $OUT/probe.txt 2>&1
    el kernels | tee -a $OUT/gpu.txt
    timeout 170 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    b qwen1.5-moe-a2.7b 1,8,32 main --
    for p in qwen3-30b-a3b-fp8 glm-4.5-air-fp8; do
        b $p 8,32 main --
        b $p 8,32 main MSM_CUDA_ATT_MMA=0 --
    done
    el opcosts | tee -a $OUT/gpu.txt
    for op in "" ATTENTION ADD_RMSNORM MOE_COMBINE_NORM ROUTER_LINEAR_TOPK ROPE_KV_WRITE SWIGLU MOE_EXPERTS LINEAR; do
        b qwen1.5-moe-a2.7b 1,8 opcosts ${op:+MSM_CUDA_SKIP_OPS=$op} X=$op --
    done
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe,glm4moe-fp8 timeout $(left 480) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el profile | tee -a $OUT/gpu.txt
    prof qwen1.5-moe-a2.7b 1 $(left)
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    { nvidia-smi --query-gpu=name --format=csv; cat gpu-run/REVISION; } | tee $OUT/gpu.txt
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    OLD="MSM_CUDA_ATT_ROPE=0 MSM_CUDA_ATT_CLUSTER=0 MSM_CUDA_ATT_EARLY=0"
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
        b $p 1,8,32 ab --
        b $p 1,8,32 ab MSM_CUDA_ATT_ROPE=0 --
        b $p 1,8,32 ab $OLD --
        b $p 1,8,32 ab MSM_CUDA_MMV_U=4 --
        b $p 1,8,32 ab $OLD MSM_CUDA_MMV_U=4 --
        b $p 1,8,32 ab --
        b $p 12,16,24,32 mmv --
        b $p 12,16,24,32 mmv MSM_CUDA_MMV_MAX_T=64 --
        b $p 12,16,24,32 mmv MSM_CUDA_MMV_MAX_T=64 MSM_CUDA_MMV_U=4 --
    done
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe,glm4moe,mixtral timeout 220 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el profile | tee -a $OUT/gpu.txt
    prof qwen1.5-moe-a2.7b 1 100
    prof qwen1.5-moe-a2.7b 8 $(left)
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    { nvidia-smi --query-gpu=name --format=csv; cat gpu-run/REVISION; } | tee $OUT/gpu.txt
    el probe | tee -a $OUT/gpu.txt
    timeout 100 gpu-run/bin/mega_probe > $OUT/probe.txt 2>&1
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
        b $p 1,2,4,8,16,32 ab --
        b $p 1,2,4,8,16,32 ab MSM_CUDA_ATT_EARLY=0 --
        b $p 1,2,4,8,16,32 ab MSM_CUDA_ATT_CLUSTER=0 --
        b $p 1,2,4,8,16,32 ab MSM_CUDA_ATT_CLUSTER=0 MSM_CUDA_ATT_EARLY=0 --
        b $p 1,2,4,8,16,32 ab --
    done
    for p in qwen3-30b-a3b-fp8 glm-4.5-air-fp8; do
        b $p 1,8,32 fp8 --
        b $p 1,8,32 fp8 MSM_CUDA_ATT_CLUSTER=0 MSM_CUDA_ATT_EARLY=0 --
        b $p 128,256 fp8 --
        b $p 128,256 fp8 MSM_CUDA_FP8_MOE_TILED=1 --
    done
    b qwen1.5-moe-a2.7b 128,256 fp8 --
    b qwen3-30b-a3b 128,256 fp8 --
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe,glm4moe-fp8 timeout 200 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el profile | tee -a $OUT/gpu.txt
    prof qwen1.5-moe-a2.7b 8 80
    prof qwen3-30b-a3b 1 $(left)
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    { nvidia-smi --query-gpu=name --format=csv; cat gpu-run/REVISION; } | tee $OUT/gpu.txt
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    b qwen1.5-moe-a2.7b 1,8,32,128,256 final --
    b qwen3-30b-a3b 1,8,32,128,256 final --
    b qwen3-30b-a3b-fp8 1,8,32,128,256 final --
    b qwen3-30b-a3b-fp8 128,256 final MSM_CUDA_FP8_MOE_TILED=1 --
    b glm-4.5-air-fp8 1,8,32,128,256 final --
    b glm-4.5-air-fp8 128,256 final MSM_CUDA_FP8_MOE_TILED=1 --
    el check | tee -a $OUT/gpu.txt
    timeout $(left 560) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
esac

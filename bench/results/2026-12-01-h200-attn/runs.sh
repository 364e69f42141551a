#!/usr/bin/env bash
# The device commands of this session's runs (README.md here): from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels" tools/gpu-engine-check bundle`
# carried as gpu-run/: `bash runs.sh rN` (output files in $OUT). r6 was refused (device time spent).
export LD_LIBRARY_PATH=$PWD/gpu-run/lib PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
T0=$(date +%s)
el() { echo "# t=$(( $(date +%s) - T0 ))s $*"; }
b() { # preset batches tag envs... -- flags
    local p=$1 bs=$2 tag=$3; shift 3
    local envs=() ; while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    { el "$tag ${envs[*]} $*"; env "${envs[@]}" timeout 120 gpu-run/bin/msmoe-bench decode --preset config/models/$p.json \
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
    nvidia-smi --query-gpu=name,clocks.max.sm --format=csv | tee $OUT/gpu.txt
    el kernels | tee -a $OUT/gpu.txt
    timeout 170 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    LN="MSM_CUDA_LINEAR_NORM=1"; DS="MSM_CUDA_MOE_KERNELS=down_split"
    for p in qwen3-30b-a3b qwen3-30b-a3b-fp8; do
        b $p 1,4,8 $p --
        b $p 1,4,8 $p $LN -- --fuse-linear-norm
        b $p 1,4,8 $p $DS --
        b $p 1,4,8 $p $LN $DS -- --fuse-linear-norm
        b $p 1,4,8 $p --
    done
    p=qwen1.5-moe-a2.7b
    b $p 1,8,32 $p --
    b $p 1,8,32 $p MSM_CUDA_MMV_WARPS=4 --
    b $p 1,8,32 $p $LN -- --fuse-linear-norm
    b $p 1,8,32 $p $DS --
    b $p 1,8,32 $p --
    b glm-4.5-air-fp8 1,8 glm --
    b glm-4.5-air-fp8 1,8 glm $LN $DS -- --fuse-linear-norm
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe,qwen3moe-fp8,glm4moe-fp8,mixtral MSM_CUDA_MOE_KERNELS=down_split MSM_CUDA_MMV_WARPS=4 \
        timeout 200 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check-switches.txt 2>&1
    el profile | tee -a $OUT/gpu.txt
    prof qwen3-30b-a3b 256 $(( 580 - ($(date +%s) - T0) ))
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    nvidia-smi --query-gpu=name --format=csv | tee $OUT/gpu.txt
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for p in qwen3-30b-a3b glm-4.5-air-fp8; do
        b $p 1,8,32,64,128,256 $p --
        b $p 1,8,32,64,128,256 $p MSM_CUDA_ATT_MMA=0 --
        b $p 8,32,64 $p MSM_CUDA_ATT_MMA=2 --
        b $p 1,8,32,64,128,256 $p --
    done
    b qwen3-30b-a3b 5,6,8 qwen3-30b-a3b MSM_CUDA_MMV_WARPS=4 --
    b qwen3-30b-a3b 5,6,8 qwen3-30b-a3b --
    b qwen3-30b-a3b-fp8 1,4,8,32 qwen3-30b-a3b-fp8 --
    p=qwen1.5-moe-a2.7b
    b $p 1,8,32,128,256 $p --
    b $p 1,8,32,128,256 $p MSM_CUDA_ATT_MMA=2 --
    b $p 5,6,8 $p MSM_CUDA_MMV_WARPS=4 --
    b $p 1,8,32,128,256 $p --
    el check | tee -a $OUT/gpu.txt
    MSM_CUDA_ATT_MMA=2 timeout 240 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check-mma.txt 2>&1
    el profile | tee -a $OUT/gpu.txt
    prof qwen3-30b-a3b 256 $(( 585 - ($(date +%s) - T0) ))
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    for p in qwen3-30b-a3b glm-4.5-air-fp8; do
        b $p 1,2,4,16 $p MSM_CUDA_ATT_MMA=2 --
        b $p 1,2,4,16 $p MSM_CUDA_ATT_MMA=0 --
    done
    b qwen3-30b-a3b-fp8 1,4 qwen3-30b-a3b-fp8 MSM_CUDA_ATT_MMA=2 --
    b qwen3-30b-a3b-fp8 1,4 qwen3-30b-a3b-fp8 MSM_CUDA_ATT_MMA=0 --
    p=qwen1.5-moe-a2.7b
    b $p 32,48,64,96 $p MSM_CUDA_ATT_MMA=2 --
    b $p 32,48,64,96 $p MSM_CUDA_ATT_MMA=0 --
    ;;
r4)
    nvidia-smi --query-gpu=name --format=csv | tee $OUT/gpu.txt
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    p=qwen3-30b-a3b
    b $p 1,2,4,8,16,32 $p MSM_CUDA_ATT_MMA=2 --
    b $p 1,2,4,8,16,32 $p MSM_CUDA_ATT_MMA=0 --
    b $p 1,4,8,32,64,128,256 $p --
    b $p 128,256 $p MSM_CUDA_ROUTER_CHUNK_PER_SM=1 --
    b $p 128,256 $p MSM_CUDA_ROUTER_CHUNK_PER_SM=1000000 --
    p=glm-4.5-air-fp8
    b $p 1,2,4,8 $p MSM_CUDA_ATT_MMA=2 --
    b $p 1,2,4,8 $p MSM_CUDA_ATT_MMA=0 --
    p=qwen1.5-moe-a2.7b
    b $p 1,8,16,32,64 $p MSM_CUDA_ATT_MMA=2 --
    b $p 1,8,16,32,64 $p MSM_CUDA_ATT_MMA=0 --
    b $p 1,8,32,128,256 $p --
    b qwen3-30b-a3b-fp8 1,4,8,32 qwen3-30b-a3b-fp8 --
    el check | tee -a $OUT/gpu.txt
    MSM_CUDA_ATT_MMA=2 timeout 230 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check-mma.txt 2>&1
    el check2 | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe,glm4moe-fp8,qwen2moe-gqa timeout $(( 585 - ($(date +%s) - T0) )) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check-default.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    el kernels | tee -a $OUT/gpu.txt
    timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -25 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    b qwen3-30b-a3b 1,4,8,16,32,64,128,256 qwen3-30b-a3b --
    b qwen3-30b-a3b-fp8 1,4,8,32 qwen3-30b-a3b-fp8 --
    b qwen3-30b-a3b-fp8 32 qwen3-30b-a3b-fp8 MSM_CUDA_MMV_WARPS=8 --
    b qwen3-30b-a3b-fp8 32 qwen3-30b-a3b-fp8 MSM_CUDA_ATT_MMA=0 --
    b qwen1.5-moe-a2.7b 1,8,32,128,256 qwen1.5-moe-a2.7b --
    b glm-4.5-air-fp8 1,8,32 glm --
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe,glm4moe-fp8,qwen3moe-fp8 timeout 100 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check-default.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r6)
    for p in glm-4.5-air-fp8 qwen3-30b-a3b-fp8; do
        for e in X=1 MSM_CUDA_ATT_MMA=0 MSM_CUDA_MMV_WARPS=8 MSM_CUDA_ROUTER_CHUNK_PER_SM=1000000 X=2; do
            b $p 8,32 $p $e --
        done
    done
    ;;
esac

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
r3)
    # software-pipelined bf16 rows (rows_pipe): the bitwise tests, A/B of the mask, timelines, presets
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in '*early_weight*' '*norm_linear_equals*' '*down_split_equals*' '*fp8_hw*' '*gemv_small*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for p in qwen3-30b-a3b qwen1.5-moe-a2.7b; do
            b $p 1,2,4,8 ab --
            b $p 1,2,4,8 ab MSM_CUDA_ROWS_PIPE=0 --
            b $p 1,2,4 ab MSM_CUDA_ROWS_PIPE=3 --
            b $p 1,2,4 ab MSM_CUDA_ROWS_PIPE=12 --
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=40 tl qwen3-30b-a3b 1 q3
    ROWS=40 tl qwen3-30b-a3b 1 q3 MSM_CUDA_ROWS_PIPE=0
    ROWS=40 tl qwen1.5-moe-a2.7b 1 q15
    ROWS=40 tl qwen3-30b-a3b-fp8 1 q3f
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 560) python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json config/models/qwen1.5-moe-a2.7b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    # ADD_RMSNORM + router in one kernel (norm_router); rows_pipe masks 0 / 2 (the new default) / 3
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in '*norm_router*' '*router_linear*' '*norm_linear_equals*' '*early_weight*' 'tuning*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b qwen3-30b-a3b 1,2,4,8 ab --
        b qwen3-30b-a3b 1,2,4,8 ab MSM_CUDA_NORM_ROUTER=0 --
        b qwen3-30b-a3b 1,2,4 ab MSM_CUDA_ROWS_PIPE=0 --
        b qwen3-30b-a3b 1,2,4 ab MSM_CUDA_ROWS_PIPE=3 --
        b qwen3-30b-a3b-fp8 1,2,4,8 ab --
        b qwen3-30b-a3b-fp8 1,2,4,8 ab MSM_CUDA_NORM_ROUTER=0 --
        b qwen1.5-moe-a2.7b 1,2,4 ab --
        b qwen1.5-moe-a2.7b 1,2,4 ab MSM_CUDA_ROWS_PIPE=0 --
        b qwen1.5-moe-a2.7b 1,2,4 ab MSM_CUDA_ROWS_PIPE=3 --
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=30 tl qwen3-30b-a3b 1 q3
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe,qwen3moe-fp8,mixtral timeout 200 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 570) python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json config/models/qwen3-30b-a3b-fp8.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    # the final defaults (norm_router off, rows_pipe = norm-in GEMV + GEMV at 2 tokens): full kernel
    # suite, the golden check, the table at 1-256
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -12 > $OUT/kernels.txt
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe,qwen2moe-gqa timeout 150 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,2,4,8,32,128,256 final --; done
    b glm-4.5-air-fp8 1,8 final --
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2; do # a 4096-wide bf16 row in one step of 16 loads a lane, all before the wait (gemv_u16)
        b qwen3-30b-a3b 1 ab --
        b qwen3-30b-a3b 1 ab MSM_CUDA_GEMV_U16=1 --
    done
    timeout $(left 560) python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r6)
    # (run as a direct command on the warm machine after r5, with r5's binaries) gemv_u16 again
    for i in 1 2; do b qwen3-30b-a3b 1,2,4,8 u16 MSM_CUDA_GEMV_U16=1 --; b qwen3-30b-a3b 1,2 u16 --; done
    ROWS=30 tl qwen3-30b-a3b 1 q3 MSM_CUDA_GEMV_U16=1
    ;;
r7)
    # gemv_u8: Qwen1.5-MoE's 2048-wide bf16 rows at one token in one step of 8 loads a lane
    hdr
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/*early_weight*' 2>&1 | tail -2 > $OUT/kernels.txt
    for i in 1 2 3; do
        b qwen1.5-moe-a2.7b 1,2 ab --
        b qwen1.5-moe-a2.7b 1,2 ab MSM_CUDA_GEMV_U8=1 --
    done
    ROWS=30 tl qwen1.5-moe-a2.7b 1 q15
    ROWS=30 tl qwen1.5-moe-a2.7b 1 q15 MSM_CUDA_GEMV_U8=1
    timeout $(left 300) python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
esac

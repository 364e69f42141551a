#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench msmoed msmoe test_cuda_kernels timeline"
# tools/gpu-engine-check bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-03-h200-s6/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, hdr
case "$1" in
r1)
    # the host side of a step: yielding waits, pinned staging, one sync a replayed step, polled
    # hand-offs (MSM_CUDA_HOST_WAIT=sleep: the earlier 20 us sleeps; MSM_CUDA_HOST_STAGE=0: no
    # staging); the faults (deadline, launch failure) through the daemon; the golden check
    # (replayed steps read through the staging); the tiled FP8 linear from 5 tokens (the fifth
    # session's run 5, whose output was lost); launch priorities for the two streams
    # (MSM_CUDA_STREAM_PRIO)
    hdr
    el faults | tee -a $OUT/gpu.txt
    MSMOED=gpu-run/bin/msmoed MSMOE=gpu-run/bin/msmoe CASES="1 2 4" timeout 150 bash tests/gpu/check_faults.sh > $OUT/faults.txt 2>&1
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b qwen1.5-moe-a2.7b 1,2,4,8,16,32 host --
        b qwen1.5-moe-a2.7b 1,2,4,8,16,32 host MSM_CUDA_HOST_WAIT=sleep --
        b qwen1.5-moe-a2.7b 1,2,4,8,16,32 host MSM_CUDA_HOST_WAIT=sleep MSM_CUDA_HOST_STAGE=0 --
        b qwen3-30b-a3b 1,8 host --
        b qwen3-30b-a3b 1,8 host MSM_CUDA_HOST_WAIT=sleep MSM_CUDA_HOST_STAGE=0 --
    done
    for i in 1 2; do # launch priorities: the main stream's kernels (router, routed experts) or the aux's
        b qwen1.5-moe-a2.7b 1,2,4,8,16,32,128 prio --
        b qwen1.5-moe-a2.7b 1,2,4,8,16,32,128 prio MSM_CUDA_STREAM_PRIO=main --
        b qwen1.5-moe-a2.7b 1,2,4,8,16,32,128 prio MSM_CUDA_STREAM_PRIO=aux --
        b glm-4.5-air-fp8 1,8,32 prio --
        b glm-4.5-air-fp8 1,8,32 prio MSM_CUDA_STREAM_PRIO=main --
    done
    for i in 1 2; do
        b qwen3-30b-a3b-fp8 5,6,8 lt5 --
        b qwen3-30b-a3b-fp8 5,6,8 lt5 MSM_CUDA_FP8_LINEAR_TILED_MIN_T=5 --
        b glm-4.5-air-fp8 5,8 lt5 --
        b glm-4.5-air-fp8 5,8 lt5 MSM_CUDA_FP8_LINEAR_TILED_MIN_T=5 --
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=20 tl qwen1.5-moe-a2.7b 1 q15
    ROWS=20 tl qwen1.5-moe-a2.7b 8 q15
    ROWS=20 tl qwen1.5-moe-a2.7b 8 q15 MSM_CUDA_STREAM_PRIO=main
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe timeout $(left 570) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # the tiled FP8 linear from 5 tokens by default (its kernel tests, the FP8 golden check); launch
    # priority for the routers' kernels alone (MSM_CUDA_STREAM_PRIO=router) against off and aux, and
    # the router issued before the shared expert's branch (--router-first); the tables
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear_fp8*' 'tuning*'; do
        timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do # priorities, and the router issued before the shared expert (--router-first)
        for v in "MSM_CUDA_STREAM_PRIO=off --" "MSM_CUDA_STREAM_PRIO=router --" "MSM_CUDA_STREAM_PRIO=aux --" \
            "MSM_CUDA_STREAM_PRIO=off -- --router-first" "MSM_CUDA_STREAM_PRIO=router -- --router-first"; do
            b qwen1.5-moe-a2.7b 1,2,3,4,6,8,12,16,32,128,256 prio $v
            b glm-4.5-air-fp8 1,4,8,16,32 prio $v
        done
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,2,4,8,16,32,64,128,256 final --; done
    b glm-4.5-air-fp8 1,8,32,128 final --
    el timeline | tee -a $OUT/gpu.txt
    for pr in off router aux; do ROWS=24 tl qwen1.5-moe-a2.7b 4 q15 MSM_CUDA_STREAM_PRIO=$pr; done
    ROWS=24 tl qwen1.5-moe-a2.7b 4 q15 -- --router-first
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe-fp8,glm4moe-fp8 timeout $(left 570) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # the defaults of runs 1-2: the aux stream's kernels above the main stream's at decode steps of
    # 3-4 tokens (MSM_CUDA_STREAM_PRIO=auto) and the router issued before the shared expert's branch,
    # against neither (MSM_CUDA_STREAM_PRIO=off --no-router-first); the tables; golden checks of the
    # models with a shared expert
    hdr
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for v in "--" "MSM_CUDA_STREAM_PRIO=off -- --no-router-first"; do
            b qwen1.5-moe-a2.7b 1,2,3,4,6,8,12,16,32,128,256 ab $v
            b glm-4.5-air-fp8 1,4,8,16,32 ab $v
        done
    done
    for i in 1 2; do # with the router first: the routed experts' first kernel after the router (not
        # its programmatic dependent) up to 8 tokens (the default), never, or up to 16
        for sm in 0 16; do
            b qwen1.5-moe-a2.7b 1,2,4,8,12,16 serial MSM_CUDA_MOE_AUX_SERIAL_MAX_T=$sm --
            b glm-4.5-air-fp8 1,4,8,16 serial MSM_CUDA_MOE_AUX_SERIAL_MAX_T=$sm --
        done
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,2,4,8,16,32,64,128,256 final --; done
    b glm-4.5-air-fp8 1,8,32,128 final --
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,glm4moe timeout $(left 570) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    # the final state: the whole kernel suite; the golden check of the other models
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 240 gpu-run/bin/test_cuda_kernels --jobs 4 2>&1 | tail -4 > $OUT/kernels.txt
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen3moe,mixtral,qwen2moe-mha-tied timeout $(left 400) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    # the routed experts launched after the router (decode, up to 8 tokens, a shared expert beside)
    # at the highest launch priority (MSM_CUDA_EXPERTS_PRIO=1): run 2's timeline at batch 4 showed
    # them starting 8-12 us after the router behind the shared gate/up's blocks
    hdr
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for ep in 0 1; do
            b qwen1.5-moe-a2.7b 1,2,3,4,6,8,12 ep MSM_CUDA_EXPERTS_PRIO=$ep --
            b glm-4.5-air-fp8 1,4,8 ep MSM_CUDA_EXPERTS_PRIO=$ep --
        done
    done
    ROWS=24 tl qwen1.5-moe-a2.7b 4 q15 MSM_CUDA_EXPERTS_PRIO=1
    el done | tee -a $OUT/gpu.txt
    ;;
esac

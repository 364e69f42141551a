#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-03-h200-s8/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, hdr
case "$1" in
r1)
    # the router as one thread-block cluster a token (default) vs the counter and the last block
    # (MSM_CUDA_ROUTER_CLUSTER=0): its kernel test, the A/B (three rounds), timelines at batch 1,
    # every switch bitwise at the Qwen1.5-MoE and Qwen3-30B-A3B shapes
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'router*' 'tuning*' 'norm_router*' 'linear_router*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for v in "--" "MSM_CUDA_ROUTER_CLUSTER=0 --"; do
            b qwen1.5-moe-a2.7b 1,2,4,8 rc $v
            b qwen3-30b-a3b 1,2,4,8 rc $v
            b qwen3-30b-a3b-fp8 1,2,8 rc $v
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=16 tl qwen1.5-moe-a2.7b 1 q15
    ROWS=16 tl qwen3-30b-a3b 1 q3
    ROWS=16 tl qwen3-30b-a3b 1 q3 MSM_CUDA_ROUTER_CLUSTER=0
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 570) python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json config/models/qwen3-30b-a3b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # the cluster router with the ADD_RMSNORM before it taken in (MSM_CUDA_NORM_ROUTER=1: at one token
    # now one cluster a token, every block norming the row) vs the two kernels; the routed experts as
    # the cluster router's programmatic dependent beside the shared expert
    # (MSM_CUDA_MOE_AUX_SERIAL_MAX_T=0); kernel tests; a timeline; every switch bitwise on Qwen3
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'router*' 'tuning*' 'norm_router*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for v in "--" "MSM_CUDA_NORM_ROUTER=1 --"; do
            b qwen3-30b-a3b 1,2 nr $v
            b qwen3-30b-a3b-fp8 1,2 nr $v
        done
        for v in "--" "MSM_CUDA_MOE_AUX_SERIAL_MAX_T=0 --"; do b qwen1.5-moe-a2.7b 1,2 ser $v; done
        # fewer context splits at one token: clusters of 8 / 4 (the default's 16 split blocks a head
        # are not clustered on Qwen3: 32 clusters of 16 leave no room)
        for v in "--" "MSM_CUDA_ATT_MAX_SPLIT=8 --" "MSM_CUDA_ATT_MAX_SPLIT=4 --"; do
            b qwen3-30b-a3b 1 att $v
            b qwen1.5-moe-a2.7b 1 att $v
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=16 tl qwen3-30b-a3b 1 q3 MSM_CUDA_NORM_ROUTER=1
    # why the tensor-core MMV streams 25 MB in ~15 us at 8 tokens (Qwen1.5-MoE's qkv, 8x96 blocks):
    # Nsight Compute's speed-of-light, memory and warp-state sections on its first launches
    el ncu | tee -a $OUT/gpu.txt
    timeout 150 /usr/local/cuda/bin/ncu --kernel-name regex:mmv_kernel --launch-skip 0 --launch-count 3 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats gpu-run/bin/msmoe-bench decode --preset config/models/qwen1.5-moe-a2.7b.json \
        --backend cuda --batches 8 --context 512 --steps 1 --no-cuda-graphs > $OUT/ncu-mmv.txt 2>&1
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 570) python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json config/models/qwen3-30b-a3b-fp8.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # the MMV's and MMV8's K slices keeping their clusters within one wave (default) vs by blocks alone
    # (MSM_CUDA_MMV_FIT_CLUSTERS=0): kernel tests, the A/B (three rounds), ncu on the MMVs at 8 tokens,
    # a timeline at 8 tokens, every switch bitwise at the Qwen1.5-MoE shapes
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear_mmv*' 'linear_fp8*' 'router*' 'tuning*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for v in "--" "MSM_CUDA_MMV_FIT_CLUSTERS=0 --"; do
            b qwen1.5-moe-a2.7b 3,4,6,8 fit $v
            b qwen3-30b-a3b 3,4,8 fit $v
            b qwen3-30b-a3b-fp8 1,2,4,8 fit $v
        done
    done
    el ncu | tee -a $OUT/gpu.txt
    timeout 150 /usr/local/cuda/bin/ncu --kernel-name regex:mmv_kernel --launch-skip 0 --launch-count 3 \
        --section SpeedOfLight --section Occupancy --section LaunchStats gpu-run/bin/msmoe-bench decode \
        --preset config/models/qwen1.5-moe-a2.7b.json --backend cuda --batches 8 --context 512 --steps 1 \
        --no-cuda-graphs > $OUT/ncu-mmv.txt 2>&1
    el timeline | tee -a $OUT/gpu.txt
    ROWS=20 tl qwen1.5-moe-a2.7b 8 q15
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 570) python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    # the MMV with 8 K chunks of loads in flight on grids of at most 2 blocks an SM (default) vs 4
    # (MSM_CUDA_MMV_U8_MAX_BLOCKS=0): kernel tests, the A/B (three rounds), a timeline at 8 tokens; the
    # session's final tables; the golden check on four models
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear_mmv*' 'tuning*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for v in "--" "MSM_CUDA_MMV_U8_MAX_BLOCKS=0 --"; do
            b qwen1.5-moe-a2.7b 3,4,8 u8 $v
            b qwen3-30b-a3b 3,4,8 u8 $v
        done
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,2,3,4,8,16,32,64,128,256 final --; done
    b glm-4.5-air-fp8 1,4,8,32,128 final --
    el timeline | tee -a $OUT/gpu.txt
    ROWS=20 tl qwen1.5-moe-a2.7b 8 q15
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe,qwen3moe-fp8,mixtral timeout $(left 570) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    # the FP8 MMV8's cluster fit on GLM-4.5-Air (run 4's table: 4 tokens 15.92 vs 15.18 in the seventh
    # session) vs the old rule (MSM_CUDA_MMV_FIT_CLUSTERS=0), two rounds; Qwen1.5-MoE's large batches
    # again (run 4: +2-3% against the seventh session, no code of theirs changed)
    hdr
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for v in "--" "MSM_CUDA_MMV_FIT_CLUSTERS=0 --"; do
            b glm-4.5-air-fp8 1,4,8 glm $v
            b qwen3-30b-a3b-fp8 3,4,8 glm $v
        done
    done
    b qwen1.5-moe-a2.7b 16,32,64,128,256 big --
    b qwen1.5-moe-a2.7b 16,32,64,128,256 big --
    el done | tee -a $OUT/gpu.txt
    ;;
r6)
    # the session's final defaults (the FP8 MMV8 back on its block-slot rule after run 5): the FP8
    # kernel tests, the tables of every preset, every switch bitwise on the FP8 preset
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear_fp8*' 'linear_mmv*' 'tuning*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,2,3,4,8,16,32,64,128,256 final --; done
    b glm-4.5-air-fp8 1,4,8,32,128 final --
    # 8 chunks in flight on larger MMV grids too: up to ~3 blocks an SM (Qwen1.5-MoE's qkv, 384
    # blocks) or ~6 (Qwen3's qkv, 640; its shared gate/up 704 stays at 4)
    for i in 1 2; do
        for v in "--" "MSM_CUDA_MMV_U8_MAX_BLOCKS=400 --" "MSM_CUDA_MMV_U8_MAX_BLOCKS=700 --"; do
            b qwen1.5-moe-a2.7b 3,4,8 u8 $v
            b qwen3-30b-a3b 3,4,8 u8 $v
        done
    done
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 300) python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b-fp8.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r7)
    # with 8 chunks in flight on small grids, the MMV from 2 tokens or 1 (the seventh session's MMV
    # from 2 lost 6% on Qwen3 at 2 tokens), two rounds
    hdr
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for v in "--" "MSM_CUDA_MMV_MIN_T=2 --" "MSM_CUDA_MMV_MIN_T=1 --"; do
            b qwen1.5-moe-a2.7b 1,2 mmv $v
            b qwen3-30b-a3b 1,2 mmv $v
        done
    done
    el done | tee -a $OUT/gpu.txt
    ;;
r8)
    # the cluster router with its blocks' start barrier (arrive at the start, wait before the stores
    # into rank 0's shared memory, as the programming model asks): kernel tests, every switch
    # bitwise on Qwen3 bf16 and FP8, the A/B at one token again (two rounds)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'router*' 'tuning*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for v in "--" "MSM_CUDA_ROUTER_CLUSTER=0 --"; do
            b qwen3-30b-a3b 1 rc $v
            b qwen3-30b-a3b-fp8 1 rc $v
            b qwen1.5-moe-a2.7b 1 rc $v
        done
    done
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 300) python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json config/models/qwen1.5-moe-a2.7b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
esac

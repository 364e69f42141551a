#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-04-h200-s12/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
case "$1" in
r1)
    # the eleventh session's run 2 again (its output was lost): the block-sliced MMV
    # (MSM_CUDA_MMV_BSLICE, default 1 in bundle c7f081d) against the clusters (0) at 3-8 tokens,
    # three rounds; kernel tests linear_mmv*, tuning*; the o_proj GEMV's last block norming with
    # its pass (--fuse-linear-norm MSM_CUDA_LINEAR_NORM=1) re-measured on today's step at 1-8;
    # timelines at 1 and 8 tokens; check_presets on both bf16 presets with the new default
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear_mmv*' 'tuning*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
            b $p 3,4,5,6,8,16 ab --
            b $p 3,4,5,6,8,16 ab MSM_CUDA_MMV_BSLICE=0 --
        done
    done
    for i in 1 2; do
        for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
            b $p 1,2,4,8 norm --
            b $p 1,2,4,8 norm MSM_CUDA_LINEAR_NORM=1 -- --fuse-linear-norm
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=34 tl qwen1.5-moe-a2.7b 1 q15b1
    ROWS=34 tl qwen3-30b-a3b 1 q3b1
    ROWS=30 tl qwen1.5-moe-a2.7b 8 q15b8
    ROWS=30 tl qwen1.5-moe-a2.7b 8 q15b8-off MSM_CUDA_MMV_BSLICE=0
    ROWS=30 tl qwen3-30b-a3b 8 q3b8
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 590) python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json config/models/qwen3-30b-a3b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
r2)
    # the pair path's experts in one wave at one token: the split down at 4 rows a warp
    # (MSM_CUDA_MOE_DOWN_HB=4, 2 loads a row, 64 registers) and the gate/up at 2 loads a row, 12
    # blocks an SM (MSM_CUDA_MOE_GU_U2=1), alone and together, three rounds; Qwen1.5-MoE's down
    # split (k = 4) at 2 and 4 rows; the MMV's block slices against the clusters again now that the
    # WS = 1 kernels are back to their registers (c7f081d's launch bounds took more); the table
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'moe_down_split*' 'moe_experts_fp8_hw*' 'linear*' 'tuning*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b qwen3-30b-a3b 1,2,3,4 moe --
        b qwen3-30b-a3b 1,2,3,4 moe MSM_CUDA_MOE_DOWN_HB=4 --
        b qwen3-30b-a3b 1,2,3,4 moe MSM_CUDA_MOE_GU_U2=1 --
        b qwen3-30b-a3b 1,2,3,4 moe MSM_CUDA_MOE_DOWN_HB=4 MSM_CUDA_MOE_GU_U2=1 --
        b qwen3-30b-a3b-fp8 1,2,4 moe --
        b qwen3-30b-a3b-fp8 1,2,4 moe MSM_CUDA_MOE_DOWN_HB=4 --
        b qwen1.5-moe-a2.7b 1,2,4 moe --
        b qwen1.5-moe-a2.7b 1,2,4 moe MSM_CUDA_MOE_GU_U2=1 --
        b qwen1.5-moe-a2.7b 1,2,4 moe MSM_CUDA_MOE_KERNELS=down_split --
        b qwen1.5-moe-a2.7b 1,2,4 moe MSM_CUDA_MOE_KERNELS=down_split MSM_CUDA_MOE_DOWN_HB=4 --
    done
    for i in 1 2; do
        for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
            b $p 3,4,5,6,8,16 ab --
            b $p 3,4,5,6,8,16 ab MSM_CUDA_MMV_BSLICE=0 --
        done
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do b $p 1,2,4,8,16,32,64,128,256 table --; done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=12 tl qwen3-30b-a3b 1 q3b1
    ROWS=12 tl qwen3-30b-a3b 1 q3b1-hb4u2 MSM_CUDA_MOE_DOWN_HB=4 MSM_CUDA_MOE_GU_U2=1
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
r3)
    # the new defaults (commit in gpu.txt): the bf16 pair-path down split from k 4 at 4 rows a
    # warp, the 2-load gate/up where it makes one wave with no shared expert beside. Kernel tests
    # (the pair path, every MoE variant, FP8 experts, linear, tuning); A/B against the old rules
    # at 1-4 tokens, three rounds; the table on the four presets; check_presets on all (every
    # switch bitwise, the new lines included)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'moe_down_split*' 'moe_experts_variants*' 'moe_experts_gemv*' 'moe_experts_fp8_hw*' 'moe_experts_fp8_match*' 'linear*' 'tuning*'; do
        timeout 240 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b qwen3-30b-a3b 1,2,3,4 ab --
        b qwen3-30b-a3b 1,2,3,4 ab MSM_CUDA_MOE_DOWN_HB=2 MSM_CUDA_MOE_GU_U2=0 --
        b qwen1.5-moe-a2.7b 1,2,3,4 ab --
        b qwen1.5-moe-a2.7b 1,2,3,4 ab MSM_CUDA_MOE_KERNELS=down_warp --
        b qwen3-30b-a3b-fp8 1,2,4 ab --
    done
    for i in 1 2; do  # RoPE in the attention kernel again (off since the first wave), MMV qkv at 3-8
        b qwen1.5-moe-a2.7b 1,3,4,8 rope --
        b qwen1.5-moe-a2.7b 1,3,4,8 rope MSM_CUDA_ATT_ROPE=1 --
    done
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,2,4,8,16,32,64,128,256 table --; done
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 590) python3 tests/gpu/check_presets.py > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
r4)
    # run 3's bundle: Qwen1.5-MoE at 2 tokens, the down split (default) vs one warp a row, four
    # rounds (run 3 had it 0.02 slower, run 2 0.01 faster); GLM-4.5-Air FP8 (its FP8 GEMVs back to
    # their registers); timelines with the new defaults for the next session
    hdr
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3 4; do
        b qwen1.5-moe-a2.7b 2 b2 --
        b qwen1.5-moe-a2.7b 2 b2 MSM_CUDA_MOE_KERNELS=down_warp --
    done
    b glm-4.5-air-fp8 1,4,8,32,128 table --
    el timeline | tee -a $OUT/gpu.txt
    ROWS=30 tl qwen1.5-moe-a2.7b 1 q15b1
    ROWS=30 tl qwen1.5-moe-a2.7b 4 q15b4
    ROWS=20 tl qwen3-30b-a3b 2 q3b2
    ROWS=20 tl qwen3-30b-a3b 4 q3b4
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
r5)
    # run 3's bundle (the same kernels as HEAD): CUDA against the CPU oracle on the golden models
    # the pair path's new defaults reach (bf16, k >= 4 down split, the 2-load gate/up rule)
    hdr
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe,mixtral,glm4moe timeout $(left 400) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r6)
    # run 3's bundle: Qwen3's attention at 1-2 tokens, env only: two query heads a block at any
    # size (MSM_CUDA_ATT_GROUP=2 with MSM_CUDA_ATT_GROUP_MIN=1: 256 blocks reading K/V 4x, not
    # 8x), and 8 splits merged by the last block on a counter instead of 16; three rounds
    hdr
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b qwen3-30b-a3b 1,2 att --
        b qwen3-30b-a3b 1,2 att MSM_CUDA_ATT_GROUP=2 MSM_CUDA_ATT_GROUP_MIN=1 --
        b qwen3-30b-a3b 1,2 att MSM_CUDA_ATT_MAX_SPLIT=8 MSM_CUDA_ATT_CLUSTER=0 --
    done
    el done | tee -a $OUT/gpu.txt
    ;;
r7)
    # run 3's bundle: Nsight Compute on the first four MMV launches of a Qwen1.5-MoE step at 8
    # tokens (qkv, o_proj, the shared expert's gate/up and down; one eager step, kernels
    # serialised): the shared gate/up streamed 46 MB in 20 us in the graph (2.3 TB/s) beside the
    # router: is it that slow alone? For the next session.
    hdr
    el ncu | tee -a $OUT/gpu.txt
    timeout 200 /usr/local/cuda/bin/ncu --kernel-name "regex:mmv_kernel" --launch-skip 0 --launch-count 4 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats gpu-run/bin/msmoe-bench decode --preset config/models/qwen1.5-moe-a2.7b.json \
        --backend cuda --batches 8 --context 512 --steps 1 --no-cuda-graphs > $OUT/ncu-mmv8.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r8)
    # the block-sliced MMV at 32 rows a warp, 2 chunks in flight (MSM_CUDA_MMV_NJ=4): run 7 had the
    # MMVs alone at 21-41% of DRAM, stalled on L1TEX, with x read as often as the weights (each
    # warp's fragments serve 16 rows; now 32). Kernel test; A/B at 3-16 tokens, two rounds
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear_mmv_block*' 'tuning*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
            b $p 3,4,5,8,16 nj --
            b $p 3,4,5,8,16 nj MSM_CUDA_MMV_NJ=4 --
        done
    done
    el done | tee -a $OUT/gpu.txt
    ;;
r9)
    # 32 rows a warp only where its half as many blocks still cover every SM (run 8: Qwen3's o_proj
    # at 64 blocks lost); kernel test; A/B at 3-8 tokens, two rounds
    hdr
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/linear_mmv_block*" 2>&1 | tail -1 >> $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
            b $p 3,4,5,8 nj --
            b $p 3,4,5,8 nj MSM_CUDA_MMV_NJ=4 --
        done
    done
    el done | tee -a $OUT/gpu.txt
    ;;
esac

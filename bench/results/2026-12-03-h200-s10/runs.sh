#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-03-h200-s10/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr
case "$1" in
r1)
    # the ninth session's unverified review commit 38a1efe (the pair-scan list as dynamic shared
    # memory) and the attention's staged K/V (MSM_CUDA_ATT_STAGE, default 0 here): kernel tests;
    # A/B of 0 / 1 / 2 / 3 staged iterations at 1-32 tokens, two rounds (and 3 with the RoPE in
    # the attention, whose blocks then become resident only as the qkv GEMV's leave); Nsight Compute on the
    # batch-8 attention staged and not, and on the batch-1 qkv (linear + RoPE) and o_proj GEMVs;
    # timelines at 1 token (Qwen1.5-MoE, Qwen3)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'moe_grouped_simt*' 'moe_experts_grouped*' 'attention*' 'tuning*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for s in 0 3 1 2; do
            b qwen1.5-moe-a2.7b 1,2,4,5,8,11,16,32 stage MSM_CUDA_ATT_STAGE=$s --
            b qwen3-30b-a3b 1,2,4,5,8,11,16,32 stage MSM_CUDA_ATT_STAGE=$s --
        done
    done
    b qwen1.5-moe-a2.7b 1,2,4,8,16 rope MSM_CUDA_ATT_STAGE=3 MSM_CUDA_ATT_ROPE=1 --
    b qwen3-30b-a3b 1,2,4,8,16 rope MSM_CUDA_ATT_STAGE=3 MSM_CUDA_ATT_ROPE=1 --
    for i in 1 2; do # Qwen3's attention at 1-4 tokens: 8 splits (clusters of 8) or 4 heads a block, staged
        b qwen3-30b-a3b 1,2,4 q3att MSM_CUDA_ATT_STAGE=3 --
        b qwen3-30b-a3b 1,2,4 q3att MSM_CUDA_ATT_STAGE=3 MSM_CUDA_ATT_MAX_SPLIT=8 --
        b qwen3-30b-a3b 1,2,4 q3att MSM_CUDA_ATT_STAGE=3 MSM_CUDA_ATT_GROUP_MIN=1 --
    done
    el ncu | tee -a $OUT/gpu.txt
    ncu_k attention_kernel qwen1.5-moe-a2.7b 8 att8-s0 MSM_CUDA_ATT_STAGE=0
    ncu_k attention_kernel qwen1.5-moe-a2.7b 8 att8-s3 MSM_CUDA_ATT_STAGE=3
    ncu_k linear_rope_kernel qwen1.5-moe-a2.7b 1 qkv1
    ncu_k attention_kernel qwen3-30b-a3b 1 att1-q3
    el timeline | tee -a $OUT/gpu.txt
    ROWS=30 tl qwen1.5-moe-a2.7b 1 q15
    ROWS=30 tl qwen3-30b-a3b 1 q3
    ROWS=24 tl qwen1.5-moe-a2.7b 8 q15b8 MSM_CUDA_ATT_STAGE=3
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # the final table with the defaults of the commit in gpu.txt (the benchmark whose sequences
    # keep their KV blocks: the first table measured with it), every switch bitwise on the two
    # bf16 presets, then the compiled PyTorch peer on Qwen3-30B-A3B at 32 / 128 / 256 tokens
    # (dense and grouped_mm expert paths; its 1 / 8 were run 4 of the ninth session); Qwen3's
    # attention splits at 1-2 tokens
    hdr
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do
        b $p 1,2,3,4,5,8,11,16,32,64,128,256 final --
    done
    b glm-4.5-air-fp8 1,4,8,32,128 final --
    for i in 1 2; do # Qwen3's attention at 1-2 tokens: 16 splits (last-block merge) or 8 / 4 (clusters)
        for v in 16 8 4; do b qwen3-30b-a3b 1,2 q3split MSM_CUDA_ATT_MAX_SPLIT=$v --; done
    done
    el presets | tee -a $OUT/gpu.txt
    timeout 200 python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json config/models/qwen3-30b-a3b.json > $OUT/presets.txt 2>&1
    el torch qwen3 | tee -a $OUT/gpu.txt
    echo "## torch_decode.py qwen3-30b-a3b" >> $OUT/peers.txt
    timeout $(left 585) python3 bench/torch_decode.py config/models/qwen3-30b-a3b.json --batches 32,128,256 \
        --experts dense,grouped_mm --context 512 2>&1 | grep -v '^\(W\|I\)[0-9]\{4\} ' >> $OUT/peers.txt
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # the one-head SIMT attention (head dim 128) compiled for 5 or 6 blocks an SM (96 / 80
    # registers, 72 / 264 bytes of spills; MSM_CUDA_ATT_MINB, off by default here) against the
    # unbounded one (126 registers, 4 blocks an SM): kernel tests, A/B at 2-16 tokens, two rounds
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'attention*' 'tuning*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for m in 0 5 6; do
            b qwen1.5-moe-a2.7b 1,2,4,5,8,11,16 minb MSM_CUDA_ATT_MINB=$m --
            b qwen3-30b-a3b 1,2,4,5,8,11,16 minb MSM_CUDA_ATT_MINB=$m --
        done
    done
    ncu_k attention_kernel qwen1.5-moe-a2.7b 8 att8-m5 MSM_CUDA_ATT_MINB=5
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    # the one-token bf16 GEMV and the qkv + RoPE kernel compiled for 12 blocks an SM (40 registers:
    # Qwen1.5-MoE's 1536-block qkv in one wave of 1584 instead of 1320 + 216; MSM_CUDA_GEMV_MINB=1,
    # off by default here): kernel tests, A/B at 1-2 tokens, three rounds, Nsight Compute on the qkv
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear*' 'tuning*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for m in 0 1; do
            b qwen1.5-moe-a2.7b 1,2 minb MSM_CUDA_GEMV_MINB=$m --
            b qwen3-30b-a3b 1,2 minb MSM_CUDA_GEMV_MINB=$m --
        done
    done
    ncu_k linear_rope_kernel qwen1.5-moe-a2.7b 1 qkv1-m0 MSM_CUDA_GEMV_MINB=0
    ncu_k linear_rope_kernel qwen1.5-moe-a2.7b 1 qkv1-m1 MSM_CUDA_GEMV_MINB=1
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    # run 4's 12 blocks an SM split by kernel (MSM_CUDA_GEMV_MINB mask: 1 the qkv + RoPE kernel, 2
    # the one-token GEMV: the shared expert's gate/up and down, o_proj, the LM head): A/B at 1-2
    # tokens, three rounds
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'linear*' 'tuning*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for m in 0 1 2 3; do
            b qwen1.5-moe-a2.7b 1,2 mask MSM_CUDA_GEMV_MINB=$m --
            b qwen3-30b-a3b 1,2 mask MSM_CUDA_GEMV_MINB=$m --
        done
    done
    el done | tee -a $OUT/gpu.txt
    ;;
r6)
    # the qkv + RoPE kernel at 12 blocks an SM by default (the commit in gpu.txt): every switch
    # bitwise on the two bf16 presets (with the new lines), the table at 1-256 on the bf16 presets
    hdr
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
        b $p 1,2,3,4,5,8,11,16,32,64,128,256 final --
    done
    el presets | tee -a $OUT/gpu.txt
    timeout 300 python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json config/models/qwen3-30b-a3b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r7)
    # the routed experts' pair-path gate/up GEMV at 12 blocks an SM (40 registers, with spills;
    # Qwen3's 1536 blocks at one token then one wave, Qwen1.5-MoE's 1408 too; MSM_CUDA_GEMV_MINB
    # bit 4, off here): kernel tests, A/B at 1-4 tokens, three rounds
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'moe_down_split*' 'moe_experts_fp8_hw*' 'tuning*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for m in 1 5; do
            for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do b $p 1,2,4 gu MSM_CUDA_GEMV_MINB=$m --; done
        done
    done
    el done | tee -a $OUT/gpu.txt
    ;;
esac

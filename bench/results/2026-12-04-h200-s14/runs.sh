#!/usr/bin/env bash
# The device commands planned in the fourteenth session (README.md here), which had no device: no
# machine was lent. From the repository root, with the binaries of `BUNDLE_BINS="msmoe-run
# msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle` built from the commit in
# each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-04-h200-s14/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b
case "$1" in
r1)
    # first call (benches take 2-3 s a call): kernel tests of what no GPU has run yet (the L2 and
    # K/V prefetch kernels, the thirteenth session's MMV + RoPE pairing); three rounds of A/Bs:
    # --prefetch-l2 (24 MiB; evict_last with 24 MiB of L2 set aside and without; 8 and 48 MiB),
    # --prefetch-l2-next on Qwen3 (plain and evict_last), --prefetch-kv (alone, with the weights',
    # 48 MiB), the aux stream's priority at 1-2 tokens with the prefetch (its shared GEMVs then read
    # L2), the prefetch grid and chunk, past 16 tokens, the MMV + RoPE pairing at 3-8 tokens;
    # GLM-4.5-Air FP8 twice; timelines with the prefetch, and Qwen3 FP8 batch 1 for issue 14
    hdr
    timeout 120 gpu-run/bin/test_cuda_kernels --jobs 4 \
        --filter "cuda_kernels/@(l2_prefetch*|kv_prefetch*|linear_rope_kv*|tuning*|linear_mmv*)" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for p in $Q15 $Q3; do
            b $p 1,2,4,8 pf --
            b $p 1,2,4,8 pf -- --prefetch-l2
            b $p 1,2,4,8 pf MSM_CUDA_L2_PREFETCH_LAST=1 MSM_CUDA_L2_PERSIST_MB=24 -- --prefetch-l2
            b $p 1,8 pf MSM_CUDA_L2_PREFETCH_LAST=1 -- --prefetch-l2
            b $p 1,8 pf MSM_CUDA_L2_PREFETCH_MB=8 -- --prefetch-l2
            b $p 1,8 pf MSM_CUDA_L2_PREFETCH_MB=48 -- --prefetch-l2
        done
        b $Q3 1,2,4,8 pfn -- --prefetch-l2-next
        b $Q3 1,2,4,8 pfn MSM_CUDA_L2_PREFETCH_LAST=1 MSM_CUDA_L2_PERSIST_MB=32 -- --prefetch-l2-next
        b $Q15 1,2,4,8,16 kv -- --prefetch-kv
        b $Q15 1,2,4,8,16 kv -- --prefetch-kv --prefetch-l2
        b $Q15 1,2,4,8,16 kv MSM_CUDA_L2_PREFETCH_KV_MB=48 -- --prefetch-kv
        b $Q3 1,2,4,8,16 kv -- --prefetch-kv
        b $Q15 1,2 prio MSM_CUDA_STREAM_PRIO=aux -- --prefetch-l2
        b $Q15 1,8 grid MSM_CUDA_L2_PREFETCH_BLOCKS=8 -- --prefetch-l2
        b $Q15 1,8 grid MSM_CUDA_L2_PREFETCH_BLOCKS=132 MSM_CUDA_L2_PREFETCH_CHUNK_KB=64 -- --prefetch-l2
        b $Q15 16,32 maxt --
        b $Q15 16,32 maxt MSM_CUDA_L2_PREFETCH_MAX_T=64 -- --prefetch-l2
        b $Q15 3,4,8 rope --
        b $Q15 3,4,8 rope MSM_CUDA_LINEAR_ROPE_MMV=1 --
        b $Q3 3,4,8 rope --
        b $Q3 3,4,8 rope MSM_CUDA_LINEAR_ROPE_MMV=1 --
    done
    for i in 1 2; do
        b glm-4.5-air-fp8 1,8 glm --
        b glm-4.5-air-fp8 1,8 glm -- --prefetch-l2
    done
    el timelines | tee -a $OUT/gpu.txt
    [ "$(left)" -gt 100 ] && tl $Q15 1 q15b1-pf -- --prefetch-l2
    [ "$(left)" -gt 70 ] && tl $Q15 8 q15b8-pfkv -- --prefetch-l2 --prefetch-kv
    [ "$(left)" -gt 40 ] && tl $Q3 1 q3b1-pfn MSM_CUDA_L2_PREFETCH_LAST=1 MSM_CUDA_L2_PERSIST_MB=32 -- --prefetch-l2-next
    [ "$(left)" -gt 40 ] && tl qwen3-30b-a3b-fp8 1 q3fp8b1 # issue 14: where an FP8 batch-1 step goes (none since s5)
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # correctness of what run 1 keeps: check_presets' prefetch and MMV + RoPE lines on the three
    # presets, check_cuda_vs_cpu on four golden models (its prefetch line among them)
    hdr
    el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="${CHECK_VARIANTS:-L2 prefetch,qkv MMV}" timeout 330 python3 tests/gpu/check_presets.py \
        > $OUT/presets.txt 2>&1
    tail -1 $OUT/presets.txt | tee -a $OUT/gpu.txt
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe,glm4moe-fp8,mixtral timeout $(left) python3 tests/gpu/check_cuda_vs_cpu.py \
        > $OUT/check.txt 2>&1
    tail -1 $OUT/check.txt | tee -a $OUT/gpu.txt
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # the table, on the bundle whose defaults take what runs 1-2 kept
    hdr
    el table | tee -a $OUT/gpu.txt
    for p in $Q15 $Q3 qwen3-30b-a3b-fp8; do b $p 1,2,4,8,16,32,64,128,256 table --; done
    b glm-4.5-air-fp8 1,4,8,32,128 table --
    el done | tee -a $OUT/gpu.txt
    ;;
*)
    echo "usage: $0 r1|r2|r3" >&2
    exit 2
    ;;
esac

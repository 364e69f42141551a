#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-02-h200-s4/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, hdr
# bef: as b, with the msmoe-bench built with -DMSM_STREAM_EVICT_FIRST=1 (gpu-run/ef/msmoe-bench.xz)
[ -f gpu-run/ef/msmoe-bench.xz ] && xz -d gpu-run/ef/msmoe-bench.xz && chmod +x gpu-run/ef/msmoe-bench
bef() {
    local p=$1 bs=$2 tag=$3; shift 3
    local envs=() ; while [ $# -gt 0 ] && [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    { el "evict-first $p ${envs[*]} $*"; env "${envs[@]}" timeout 120 gpu-run/ef/msmoe-bench decode --preset config/models/$p.json \
        --backend cuda --batches $bs --context 512 --steps 30 "$@" 2>&1 | grep -v '^# weights'; } | tee -a $OUT/bench-$tag.txt
}
case "$1" in
r1)
    # the weight prefetch (pass prefetch_weights) at 0 / 8 / 16 / 24 / 32 MiB a layer; the chunked
    # greedy arg-max (kernel tests); timelines; the prefetch's bitwise checks at real shapes
    hdr
    el kernels | tee -a $OUT/gpu.txt
    timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/sample*' 2>&1 | tail -3 > $OUT/kernels.txt
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for mb in 0 8 16 24 32; do b qwen1.5-moe-a2.7b 1,2,4,8,32 ab -- --prefetch-mb $mb; done
        for mb in 0 16 24; do b qwen3-30b-a3b 1,2,4,8 ab -- --prefetch-mb $mb; done
        for mb in 0 16; do b qwen3-30b-a3b-fp8 1,2,8 ab -- --prefetch-mb $mb; done
    done
    for mb in 0 24; do b qwen1.5-moe-a2.7b 128,256 ab -- --prefetch-mb $mb; done
    if [ -x gpu-run/ef/msmoe-bench ]; then
        el evict-first | tee -a $OUT/gpu.txt
        for i in 1 2; do
            b qwen3-30b-a3b 1,2,4 ef -- --prefetch-mb 24
            b qwen3-30b-a3b 1,2,4 ef -- --prefetch-mb 24 --prefetch-next-mb 24
            bef qwen3-30b-a3b 1,2,4 ef -- --prefetch-mb 0
            bef qwen3-30b-a3b 1,2,4 ef -- --prefetch-mb 24
            bef qwen3-30b-a3b 1,2,4 ef -- --prefetch-mb 24 --prefetch-next-mb 24
            b qwen1.5-moe-a2.7b 1,2,8 ef -- --prefetch-mb 24
            bef qwen1.5-moe-a2.7b 1,2,8 ef -- --prefetch-mb 0
            bef qwen1.5-moe-a2.7b 1,2,8 ef -- --prefetch-mb 24
        done
    fi
    el timeline | tee -a $OUT/gpu.txt
    ROWS=40 tl qwen1.5-moe-a2.7b 1 q15 -- --prefetch-mb 24
    ROWS=40 tl qwen3-30b-a3b 1 q3 -- --prefetch-mb 24
    ROWS=40 tl qwen1.5-moe-a2.7b 8 q15b
    ROWS=40 tl qwen1.5-moe-a2.7b 32 q15b
    el check | tee -a $OUT/gpu.txt
    CHECK_MODELS=qwen2moe-gqa,qwen3moe timeout 150 python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 570) python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json config/models/qwen3-30b-a3b-fp8.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # the bf16 tiled expert GEMMs with 16 / 32 tokens a pass and deeper pipelines (MSM_CUDA_MOE_TILED_BM):
    # bitwise against 64, the A/B at 16-256, a timeline at batch 32
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'moe_tiled_pass_sizes*' 'moe_experts_variants*' 'moe_experts_grouped_large*'; do
        timeout 150 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for bm in 64 32 16 0; do
            b qwen1.5-moe-a2.7b 16,32,64,128,256 bm MSM_CUDA_MOE_TILED_BM=$bm --
            b qwen3-30b-a3b 16,32,64,128,256 bm MSM_CUDA_MOE_TILED_BM=$bm --
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=10 tl qwen1.5-moe-a2.7b 32 q15 MSM_CUDA_MOE_TILED_BM=16
    ROWS=10 tl qwen1.5-moe-a2.7b 128 q15 MSM_CUDA_MOE_TILED_BM=32
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # the final build (prefetch removed, tiled pass size by the tokens an expert): the tables; the tiled
    # experts from 8 tokens instead of 32 (A/B); the MoE, sampling and tuning kernel tests (device time
    # was short: the full suite and the golden check ran in runs 1-2 on the parts that changed)
    hdr
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do b $p 1,2,4,8,16,32,64,128,256 final --; done
    b qwen3-30b-a3b-fp8 1,2,4,8,32,128,256 final --
    b glm-4.5-air-fp8 1,8 final --
    el ab | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b; do
        b $p 8,16,24 ab --
        b $p 8,16,24 ab MSM_CUDA_MOE_TILED_MIN_T=8 --
    done
    el kernels | tee -a $OUT/gpu.txt
    for f in 'moe*' 'sample*' 'tuning*'; do
        timeout $(left 270) gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el done | tee -a $OUT/gpu.txt
    ;;
esac

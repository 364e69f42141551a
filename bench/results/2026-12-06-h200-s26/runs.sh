#!/usr/bin/env bash
# The twenty-sixth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-06-h200-s26/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8

# any GPU: the kernel tests whose names match FILTER (test_cuda_kernels --filter), into $OUT/kernels.txt
# (r1: tuning and attention, the twenty-fifth session's warp merge having run only against the old
# binary's logits; later runs the router's too)
kern_tests() {
    el kernels | tee -a $OUT/gpu.txt
    timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$1" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    grep -E "FAIL|rel err|differs|Assert" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
}

# on an H200 (GLM-4.5-Air FP8's 111 GB need one): the kernel tests, then the twenty-fourth session's
# table_probe (the table on all four presets, the phase-chain probe, Qwen3's timelines at 1 and 8)
h200() {
    kern_tests "@(tuning*|attention*)"
    source <(sed -n '/^table_probe() {/,/^}/p' bench/results/2026-12-06-h200-s24/runs.sh)
    table_probe
}

# any GPU: a change with no switch against the bundle before it (gpu-old/, slim: msmoe-run and
# msmoe-bench), as the twenty-fifth session's old_new: the logits of both msmoe-run bitwise (2- and
# 8-token prompts + 6 decode steps), then ROUNDS rounds of old against new msmoe-bench, Qwen3-30B-A3B
# at 1-256 tokens, its FP8 preset at 4-32, Qwen1.5-MoE at 1 / 8 / 32, into $OUT/bench-TAG.txt
old_new() {
    local tag=$1
    [ -f gpu-old/bundle.tar.xz ] && { (cd gpu-old && tar xJf bundle.tar.xz && rm bundle.tar.xz) || return 1; }
    cat gpu-old/REVISION | sed 's/^/old bundle: /' | tee -a $OUT/gpu.txt
    el bitwise | tee -a $OUT/gpu.txt
    for p in $Q15 $Q3 $Q3F; do for ids in 11,22 5,1000,77,300,12,9000,41,2; do
        for v in old new; do
            bin=gpu-run/bin/msmoe-run; lib=$PWD/gpu-run/lib
            [ $v = old ] && bin=gpu-old/bin/msmoe-run && lib=$PWD/gpu-old/lib
            LD_LIBRARY_PATH=$lib timeout 100 $bin --dummy-weights config/models/$p.json --backend cuda --prompt-ids $ids \
                --max-new-tokens 6 --ignore-eos --dump-logits /tmp/l-$v.npy > /tmp/t-$v.txt 2>/dev/null
        done
        echo "$p $ids: $(cmp -s /tmp/l-old.npy /tmp/l-new.npy && cmp -s /tmp/t-old.txt /tmp/t-new.txt && echo same bits || echo DIFFER)" |
            tee -a $OUT/gpu.txt
    done; done
    el ab | tee -a $OUT/gpu.txt
    for i in $(seq ${ROUNDS:-4}); do
        for pb in "$Q3 1,2,4,8,16,32,128,256" "$Q3F 4,8,16,32" "$Q15 1,8,32"; do
            set -- $pb
            b $1 $2 $tag --
            { el "$1 OLD"; LD_LIBRARY_PATH=$PWD/gpu-old/lib timeout 120 gpu-old/bin/msmoe-bench decode \
                --preset config/models/$1.json --backend cuda --batches $2 --context 512 --steps 30 2>&1 |
                grep -v '^# weights'; } | tee -a $OUT/bench-$tag.txt
        done
    done
}

# any GPU: existing switches whose defaults were measured before the cheaper cluster merge (commit
# d590652): the tensor-core split attention from 2 tokens (MSM_CUDA_ATT_MMA_SPLIT_MIN_T=2; default
# 4), 8 splits at most (MSM_CUDA_ATT_MAX_SPLIT=8: at 4 tokens Qwen3's 16 pairs take 16 splits of 32
# positions, two idle warps a block), the grouped GEMVs scanning the ids themselves instead of the
# grouping kernel (MSM_CUDA_MOE_GROUP_SCAN_MAX_T=16; rows then in pair order, so the combine loads
# them in one round trip), four rounds
switches() {
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3 4; do
        b $Q3 2,3,4,8,16 sw --
        b $Q3 2,3 sw MSM_CUDA_ATT_MMA_SPLIT_MIN_T=2 --
        b $Q3 4 sw MSM_CUDA_ATT_MAX_SPLIT=8 --
        b $Q3 4,8,16 sw MSM_CUDA_MOE_GROUP_SCAN_MAX_T=16 --
        b $Q3F 4,8,16 sw --
        b $Q3F 4,8,16 sw MSM_CUDA_MOE_GROUP_SCAN_MAX_T=16 --
        b $Q15 8,16 sw --
        b $Q15 8,16 sw MSM_CUDA_MOE_GROUP_SCAN_MAX_T=16 --
    done
}

# the table on all four presets after this session's changes (GLM-4.5-Air FP8's 111 GB need an H200;
# on an H100 it fails at load and the rest runs), the phase-chain probe's floors for Qwen3 at 1 / 2 /
# 4 / 8 / 16 tokens' bytes (mega_probe qwen3-bN) and Qwen1.5-MoE at 1, Qwen3's timelines at 1 and 8,
# three rounds of the q/k norm inside the split attention against the kernel before it (the FP8
# preset: off by default since commit ad7412e; there the arm turns it on, MSM_CUDA_ATT_QK_ROPE=2) and of the
# split attention at 2 tokens against the SIMT kernel (from 4, the old default), check_presets'
# bitwise lines for the fused q/k norm attention (every decode step on the split kernel)
final() {
    nvidia-smi --query-gpu=memory.total --format=csv,noheader | tee -a $OUT/gpu.txt
    el table | tee -a $OUT/gpu.txt
    b $Q15 1,2,4,8,16,32,128,256 table --
    b $Q3 1,2,4,8,16,32,128,256 table --
    b $Q3F 1,2,4,8,16,32,128,256 table --
    local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ "${mib:-0}" -gt 120000 ] && b $GLM 1,2,4,8,32,128 table --  # 111 GB: not on an H100
    grep "^# %HBM" $OUT/bench-table.txt | head -1 | tee -a $OUT/gpu.txt
    el probe | tee -a $OUT/gpu.txt
    for m in qwen3 qwen3-b2 qwen3-b4 qwen3-b8 qwen3-b16 qwen15; do timeout 90 gpu-run/mega_probe 0 $m; done > $OUT/probe.txt 2>&1
    grep -E "^#|PDL, 8 warps|PDL, early loads, 8" $OUT/probe.txt | tee -a $OUT/gpu.txt
    el timeline | tee -a $OUT/gpu.txt
    ROWS=40 tl $Q3 1 q3b1
    ROWS=40 tl $Q3 8 q3b8
    [ "${TABLE_ONLY:-0}" = 1 ] && return 0
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for p in $Q3 $Q3F; do
            b $p 1,2,4,8,16 ab --
            b $p 1,2,4,8,16 ab MSM_CUDA_ATT_QK_ROPE=$([ $p = $Q3F ] && echo 2 || echo 0) --
            b $p 2 ab MSM_CUDA_ATT_MMA_SPLIT_MIN_T=4 --
        done
    done
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=0,2 CHECK_BASE_ENV="MSM_CUDA_ATT_MMA_SPLIT_MIN_T=1" \
        CHECK_VARIANTS="inside the split attention,graph replay,multi-stream,PDL on" timeout 200 \
        python3 tests/gpu/check_presets.py config/models/$Q3.json config/models/$Q3F.json > $OUT/presets.txt 2>&1
    grep -E "FAIL|failed" $OUT/presets.txt | tee -a $OUT/gpu.txt
}

# any GPU: the q/k norm + RoPE + cache write inside the split tensor-core attention (commit in
# gpu.txt; MSM_CUDA_ATT_QK_ROPE=0 restores the qk_norm_rope_kv kernel): its kernel tests; msmoe-run's
# logits with and without it bitwise (the split kernel from one token, so the decode steps take the
# fused kernel); four rounds of Qwen3-30B-A3B and its FP8 preset at 1-16 tokens with and without
# it, and at 1 token the split kernel from one token with and without; Qwen3's timelines at 8 with
# and without; then Qwen1.5-MoE at 2-7 tokens (SIMT, MHA) with the counter merge and 4 splits at most
qk_rope() {
    kern_tests "@(tuning*|attention*|router*)"
    el bitwise | tee -a $OUT/gpu.txt
    for p in $Q3 $Q3F; do for ids in 11,22 5,1000,77,300,12,9000,41,2; do
        for v in 0 1; do
            MSM_CUDA_ATT_MMA_SPLIT_MIN_T=1 MSM_CUDA_ATT_QK_ROPE=$v timeout 100 gpu-run/bin/msmoe-run --dummy-weights \
                config/models/$p.json --backend cuda --prompt-ids $ids --max-new-tokens 6 --ignore-eos \
                --dump-logits /tmp/l-$v.npy > /tmp/t-$v.txt 2>/dev/null
        done
        echo "$p $ids: $(cmp -s /tmp/l-0.npy /tmp/l-1.npy && cmp -s /tmp/t-0.txt /tmp/t-1.txt && echo same bits || echo DIFFER)" |
            tee -a $OUT/gpu.txt
    done; done
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3 4; do
        for p in $Q3 $Q3F; do
            b $p 1,2,3,4,8,16 qk --
            b $p 1,2,3,4,8,16 qk MSM_CUDA_ATT_QK_ROPE=0 --
            b $p 1 qk MSM_CUDA_ATT_MMA_SPLIT_MIN_T=1 --
            b $p 1 qk MSM_CUDA_ATT_MMA_SPLIT_MIN_T=1 MSM_CUDA_ATT_QK_ROPE=0 --
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=20 tl $Q3 8 q3b8
    ROWS=20 tl $Q3 8 q3b8-noqk MSM_CUDA_ATT_QK_ROPE=0
    el simt | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q15 2,3,4,5,6,7 mha --
        b $Q15 2,3,4,5,6,7 mha MSM_CUDA_ATT_CLUSTER=0 --
        b $Q15 2,3,4,5,6,7 mha MSM_CUDA_ATT_MAX_SPLIT=4 --
    done
}

case "$1" in
r1) hdr; h200; el done | tee -a $OUT/gpu.txt ;;  # needs an H200
r2) hdr; kern_tests "@(tuning*|attention*|router*)"; old_new sm; el done | tee -a $OUT/gpu.txt ;;  # the split merge + router early against 171b574
r3) hdr; switches; el done | tee -a $OUT/gpu.txt ;;
r4) hdr; qk_rope; el done | tee -a $OUT/gpu.txt ;;
r5) hdr; kern_tests "@(tuning*|attention*|router*)"; final; el done | tee -a $OUT/gpu.txt ;;  # an H200 for GLM-4.5-Air FP8
    # (run 5 got an H100, at fd0f825; run 6 the final code's table, floors and timelines, for an H200,
    # with the budget left after eight refused H200 starts)
r6) hdr; TABLE_ONLY=1 final; el done | tee -a $OUT/gpu.txt ;;  # an H200: the table, floors and timelines only
esac

#!/usr/bin/env bash
# The twenty-ninth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-06-h200-s29/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
# the twenty-sixth session's kern_tests, old_new and final (the table on every preset, the probe's
# floors, Qwen3's timelines at 1 and 8; TABLE_ONLY=1 stops there); the twenty-eighth's dflt (on an
# H200 the table first; the router's kernel tests, check_presets' router variants, two rounds of
# the batched router against MSM_CUDA_ROUTER_TCLUSTER=0)
source <(sed -n '/^kern_tests() {/,/^}/p;/^old_new() {/,/^}/p;/^final() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
source <(sed -n '/^dflt() {/,/^}/p' bench/results/2026-12-06-h200-s28/runs.sh | sed '/^    pack$/d')

# any GPU: the qkv linear (5120 x 2048) of Qwen3-30B-A3B at 2-8 tokens on the streamed MMV
# (MSM_CUDA_MMV_STREAM_MIN_N=5120: its weight tiles brought into shared memory by bulk copies, the
# first stages before the PDL wait), three rounds at 2, 4, 8 against the block-sliced MMV; Qwen3's
# timelines at 8 both ways
sqkv() {
    el sqkv | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q3 2,4,8 sq --
        b $Q3 2,4,8 sq MSM_CUDA_MMV_STREAM_MIN_N=5120 --
        [ -n "$SQ_MORE" ] && b $Q3 2,4,8 sq MSM_CUDA_MMV_STREAM_MIN_N=5120 $SQ_MORE --
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=20 tl $Q3 8 q3b8
    ROWS=20 tl $Q3 8 q3b8-sq MSM_CUDA_MMV_STREAM_MIN_N=5120
    return 0
}

# any GPU: the MMVs' later rounds of weight loads prefetched into L2 before the PDL wait
# (MSM_CUDA_MMV_L2_REST=1; Qwen3's qkv at 2-16 tokens: 8 K chunks a slice, 4 in registers early),
# commit in gpu.txt: on an H200 first the table; the MMV kernel tests; msmoe-run's logits off and on
# bitwise; three rounds of Qwen3-30B-A3B and Qwen1.5-MoE at 2-16 tokens off and on, Qwen3 also on
# with the MMVs at 4 and 8 K slices a block (MSM_CUDA_MMV_BSLICE=4 / 8: the o_proj's blocks of 4 / 8
# warps, which fit beside the attention's, one round of loads early and the rest via L2); Qwen3's
# timelines at 8 on, and on at 4 slices
l2r() {
    local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ "${mib:-0}" -gt 120000 ] && TABLE_ONLY=1 final
    kern_tests "@(tuning*|linear_mmv*)"
    el bitwise | tee -a $OUT/gpu.txt
    for p in $Q3 $Q15; do
        for v in 0 1; do
            MSM_CUDA_MMV_L2_REST=$v timeout 100 gpu-run/bin/msmoe-run --dummy-weights config/models/$p.json --backend cuda \
                --prompt-ids 5,1000,77,300,12,9,8,7 --max-new-tokens 6 --ignore-eos --dump-logits /tmp/l-$v.npy > /tmp/t-$v.txt 2>/dev/null
        done
        echo "$p: $(cmp -s /tmp/l-0.npy /tmp/l-1.npy && cmp -s /tmp/t-0.txt /tmp/t-1.txt && echo same bits || echo DIFFER)" | tee -a $OUT/gpu.txt
    done
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for p in $Q3 $Q15; do
            b $p 2,4,8,16 l2 --
            b $p 2,4,8,16 l2 MSM_CUDA_MMV_L2_REST=1 --
        done
        b $Q3 2,4,8,16 l2 MSM_CUDA_MMV_L2_REST=1 MSM_CUDA_MMV_BSLICE=4 --
        b $Q3 2,4,8,16 l2 MSM_CUDA_MMV_L2_REST=1 MSM_CUDA_MMV_BSLICE=8 --
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=20 tl $Q3 8 q3b8-l2 MSM_CUDA_MMV_L2_REST=1
    ROWS=20 tl $Q3 8 q3b8-l2bs4 MSM_CUDA_MMV_L2_REST=1 MSM_CUDA_MMV_BSLICE=4
    return 0
}

# any GPU: the streamed MMV for Qwen3's qkv at 2 stages (MSM_CUDA_MMV_STREAM_ST=2: 150 KiB, inside
# the attention's 196 KiB carveout, where 3 stages took 216 KiB and the L1 of the kernels after it
# shrank; run 1) and the MMVs at 4 and 8 K slices a block (MSM_CUDA_MMV_BSLICE=4 / 8, now read from
# the environment: the o_proj's blocks of 4 / 8 warps beside the attention's), commit in gpu.txt: on
# an H200 first the table; the MMV kernel tests; msmoe-run's logits at 2 and 3 stages bitwise; three
# rounds of Qwen3-30B-A3B at 2, 4, 8; its timelines at 8
sq2() {
    local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ "${mib:-0}" -gt 120000 ] && TABLE_ONLY=1 final
    kern_tests "@(tuning*|linear_mmv*)"
    el bitwise | tee -a $OUT/gpu.txt
    for v in 2 3; do
        MSM_CUDA_MMV_STREAM_MIN_N=5120 MSM_CUDA_MMV_STREAM_ST=$v timeout 100 gpu-run/bin/msmoe-run --dummy-weights \
            config/models/$Q3.json --backend cuda --prompt-ids 5,1000,77,300,12,9,8,7 --max-new-tokens 6 --ignore-eos \
            --dump-logits /tmp/l-$v.npy > /tmp/t-$v.txt 2>/dev/null
    done
    echo "$Q3 streamed qkv, 2 vs 3 stages: $(cmp -s /tmp/l-2.npy /tmp/l-3.npy && cmp -s /tmp/t-2.txt /tmp/t-3.txt && echo same bits || echo DIFFER)" | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q3 2,4,8 s2 --
        b $Q3 2,4,8 s2 MSM_CUDA_MMV_STREAM_MIN_N=5120 --
        b $Q3 2,4,8 s2 MSM_CUDA_MMV_STREAM_MIN_N=5120 MSM_CUDA_MMV_STREAM_ST=2 --
        b $Q3 2,4,8 s2 MSM_CUDA_MMV_BSLICE=8 --
        b $Q3 2,4,8 s2 MSM_CUDA_MMV_BSLICE=4 --
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=20 tl $Q3 8 q3b8-st2 MSM_CUDA_MMV_STREAM_MIN_N=5120 MSM_CUDA_MMV_STREAM_ST=2
    ROWS=20 tl $Q3 8 q3b8-bs8 MSM_CUDA_MMV_BSLICE=8
    return 0
}

# any GPU: the block-sliced MMV's picks of 8 / 16 slices streamed through shared memory at 3-8
# tokens by default (MSM_CUDA_MMV_STREAM_BS_MIN_N=4096: Qwen3's qkv on mmv_stream_kernel<8>, the
# same bits as the default's MMV), commit in gpu.txt: on an H200 first the table; the MMV, RoPE-MMV
# and norm-linear kernel tests; check_presets' new variant and its neighbours on Qwen3 and
# Qwen1.5-MoE; three rounds of Qwen3-30B-A3B at 2-8 tokens against =0 and against the 16-slice
# stream at 2 stages (run 3's arm), Qwen1.5-MoE at 4 and 8 (its qkv on the RoPE MMV: unchanged);
# Qwen3's timeline at 8
bs8() {
    local mib; mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)
    [ "${mib:-0}" -gt 120000 ] && TABLE_ONLY=1 final
    kern_tests "@(tuning*|linear_mmv*|linear_rope_kv_mmv*|norm_linear_equals*)"
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=1,2 CHECK_VARIANTS="streamed through,qkv MMV + RoPE,graph replay,ADD_RMSNORM + LINEAR" timeout 150 \
        python3 tests/gpu/check_presets.py config/models/$Q3.json config/models/$Q15.json > $OUT/presets.txt 2>&1
    grep -E "FAIL|failed|pass" $OUT/presets.txt | head -12 | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q3 2,3,4,8 bs --
        b $Q3 2,3,4,8 bs MSM_CUDA_MMV_STREAM_BS_MIN_N=0 --
        b $Q3 2,3,4,8 bs MSM_CUDA_MMV_STREAM_BS_MIN_N=0 MSM_CUDA_MMV_STREAM_MIN_N=5120 MSM_CUDA_MMV_STREAM_ST=2 --
        b $Q15 4,8 bs --
        b $Q15 4,8 bs MSM_CUDA_MMV_STREAM_BS_MIN_N=0 --
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=20 tl $Q3 8 q3b8
    return 0
}

case "$1" in
r1) hdr; dflt; sqkv; pack; el done | tee -a $OUT/gpu.txt ;;  # HEAD 934899c: the table on an H200, the default router's checks, the qkv streamed
r2) hdr; l2r; pack; el done | tee -a $OUT/gpu.txt ;;  # fb1dad0
r3) hdr; sq2; pack; el done | tee -a $OUT/gpu.txt ;;  # 00f1b7b
r4) hdr; bs8; pack; el done | tee -a $OUT/gpu.txt ;;  # aff70ec
r5) hdr; TABLE_ONLY=1 final; pack; el done | tee -a $OUT/gpu.txt ;;
r6) hdr; kern_tests "@(tuning*|linear_mmv*)"  # the final commit's tests; on an H200 then the table
    [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 120000 ] && TABLE_ONLY=1 final
    pack; el done | tee -a $OUT/gpu.txt ;;  # the table of the code at aff70ec (on an H200 with GLM-4.5-Air)
esac

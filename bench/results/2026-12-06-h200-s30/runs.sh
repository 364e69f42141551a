#!/usr/bin/env bash
# The thirtieth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-06-h200-s30/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
# the twenty-sixth session's kern_tests and final (the table on every preset, the probe's floors,
# Qwen3's timelines at 1 and 8; TABLE_ONLY=1 stops there)
source <(sed -n '/^kern_tests() {/,/^}/p;/^final() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
h200() { [ "$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)" -gt 120000 ]; }

# any GPU: the grouped SIMT expert GEMVs (5-47 tokens) with more K chunks in flight a lane a row
# (MSM_CUDA_MOE_GG_GATEUP_U=3 / 4: 128 / 164 registers, 4 / 3 blocks an SM, against 2 at 124;
# MSM_CUDA_MOE_GG_DOWN_U=3), where the H200's gate/up and down at 8 tokens read 3.94 / 3.83 TB/s
# against its 4.19 copy rate (s26 run 1) and the H100's at its copy rate; and the 16-slice
# streamed qkv at 2 stages (s29 run 4's faster arm, other numerics). Commit in gpu.txt: the MMV,
# tuning and grouped-GEMV kernel tests; on an H200 the table first; msmoe-run's logits at gate/up
# U 2 / 3 / 4 bitwise; three rounds of Qwen3-30B-A3B at 5-32 tokens and Qwen1.5-MoE at 8-32;
# Qwen3's timelines at 8
gu() {
    kern_tests "@(tuning*|linear_mmv*|moe_grouped_simt*)"
    h200 && TABLE_ONLY=1 final
    el bitwise | tee -a $OUT/gpu.txt
    for v in 2 3 4; do
        MSM_CUDA_MOE_GG_GATEUP_U=$v timeout 100 gpu-run/bin/msmoe-run --dummy-weights config/models/$Q3.json --backend cuda \
            --prompt-ids 5,1000,77,300,12,9,8,7 --max-new-tokens 6 --ignore-eos --dump-logits /tmp/l-$v.npy > /tmp/t-$v.txt 2>/dev/null
    done
    echo "$Q3 gate/up U 2 vs 3 vs 4: $(cmp -s /tmp/l-2.npy /tmp/l-3.npy && cmp -s /tmp/l-2.npy /tmp/l-4.npy && cmp -s /tmp/t-2.txt /tmp/t-4.txt && echo same bits || echo DIFFER)" | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q3 5,8,16,32 gu --
        b $Q3 5,8,16,32 gu MSM_CUDA_MOE_GG_GATEUP_U=3 --
        b $Q3 5,8,16,32 gu MSM_CUDA_MOE_GG_GATEUP_U=4 --
        b $Q3 5,8,16,32 gu MSM_CUDA_MOE_GG_DOWN_U=3 --
        b $Q3 5,8,16,32 gu MSM_CUDA_MMV_STREAM_MIN_N=5120 MSM_CUDA_MMV_STREAM_BS_MIN_N=0 MSM_CUDA_MMV_STREAM_ST=2 --
        b $Q15 8,16,32 gu --
        b $Q15 8,16,32 gu MSM_CUDA_MOE_GG_GATEUP_U=3 --
        b $Q15 8,16,32 gu MSM_CUDA_MOE_GG_GATEUP_U=4 --
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl $Q3 8 q3b8-u3 MSM_CUDA_MOE_GG_GATEUP_U=3
    ROWS=14 tl $Q3 8 q3b8-u4 MSM_CUDA_MOE_GG_GATEUP_U=4
    return 0
}

# any GPU (meant for an H200): the kept defaults of the twenty-sixth to twenty-ninth sessions were
# measured on H100s; each switched back, and the other grouped-GEMV shapes, on Qwen3-30B-A3B at 4 and
# 8 tokens (the batch-8 cell is issue 15's last miss on the H200), three rounds; on an H200 the
# table first (the down at 3 chunks, the gate/up at 2 tokens a pass, the router's grouping and the
# attention's q/k norm were left out to fit the session's last device minutes)
sweep() {
    h200 && TABLE_ONLY=1 final
    el sweep | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q3 4,8 sw --
        b $Q3 4,8 sw MSM_CUDA_MOE_GG_GATEUP_U=3 --
        b $Q3 4,8 sw MSM_CUDA_MOE_GG_GATEUP_U=4 --
        b $Q3 4,8 sw MSM_CUDA_MOE_GG_DOWN_NT=4 --
        b $Q3 4,8 sw MSM_CUDA_MOE_KERNELS=mma --
        b $Q3 4,8 sw MSM_CUDA_MMV_STREAM_BS_MIN_N=0 --
        b $Q3 4,8 sw MSM_CUDA_MMV_STREAM_MIN_N=5120 MSM_CUDA_MMV_STREAM_BS_MIN_N=0 MSM_CUDA_MMV_STREAM_ST=2 --
        b $Q3 4,8 sw MSM_CUDA_ROUTER_TCLUSTER=0 --
        b $Q3 4,8 sw MSM_CUDA_MOE_COMBINE_EARLY=0 --
    done
    return 0
}

case "$1" in
r1) hdr; gu; pack; el done | tee -a $OUT/gpu.txt ;;  # f156e03 (on an H100)
r2) hdr; kern_tests "@(tuning*|linear_mmv*|moe_grouped_simt*)"  # on an H100 only these (run 1 did the rest)
    h200 && { sweep; pack; }; el done | tee -a $OUT/gpu.txt ;;
r3) hdr; h200 && { TABLE_ONLY=1 final; el sweep | tee -a $OUT/gpu.txt  # f156e03: r2 cut to the budget's end
        for i in 1 2; do for u in 2 3 4; do b $Q3 4,8 sw MSM_CUDA_MOE_GG_GATEUP_U=$u --; done; done; pack; }
    el done | tee -a $OUT/gpu.txt ;;
esac

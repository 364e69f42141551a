#!/usr/bin/env bash
# The thirty-third session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s33/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
# the twenty-sixth session's kern_tests and final (the table on every preset, the probe's floors,
# Qwen3's timelines at 1 and 8; TABLE_ONLY=1 stops there), the thirtieth's h200 test
source <(sed -n '/^kern_tests() {/,/^}/p;/^final() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)

# the switches whose answer only an H200 can give (its routed experts read 94% of its copy rate at
# 8 tokens where an H100's read 100% of theirs): more K chunks in flight, persistent grids, the tiled
# tensor-core experts at 4-8 tokens
H200_ARMS="MSM_CUDA_MOE_GG_PERSIST=1 MSM_CUDA_MOE_GG_PERSIST=2 MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4
           MSM_CUDA_MOE_GG_DOWN_U=3 MSM_CUDA_MOE_KERNELS=mma MSM_CUDA_MOE_TILED_MIN_T=8"
presets() {  # $1: variants; $2: prompts; $3: timeout
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=${2:-0,2} CHECK_VARIANTS="$1" timeout ${3:-300} \
        python3 tests/gpu/check_presets.py config/models/$Q3.json config/models/$Q15.json > $OUT/presets.txt 2>&1
    tail -3 $OUT/presets.txt | tee -a $OUT/gpu.txt; echo "FAIL lines: $(grep -cE "FAIL|failed" $OUT/presets.txt)" | tee -a $OUT/gpu.txt
}

probe() {  # the phase chain's floors with the routed gate/up's rows after the wait (new variant)
    el probe | tee -a $OUT/gpu.txt
    for m in qwen3 qwen3-b8 qwen15 "qwen3-b8 engine" "qwen3-b4 engine"; do timeout 90 gpu-run/mega_probe 0 $m; done > $OUT/probe.txt 2>&1
    grep -E "^#|PDL, 8 warps|PDL, early loads, 8|early loads but routed, 8" $OUT/probe.txt | tee -a $OUT/gpu.txt
}

small_ncu() {  # Nsight Compute on the 8-token step's small kernels after the attention and the experts,
    # each alone (no PDL overlap): how much of their share of the step is their own work
    el ncu | tee -a $OUT/gpu.txt
    # (run 1: 10 launches with the MMVs ran past 150 s and printed nothing; 4 launches, 220 s)
    timeout 220 /usr/local/cuda/bin/ncu --kernel-name "regex:router_tcluster|moe_add_rmsnorm_cl|add_rmsnorm_kernel|moe_group_kernel" \
        --launch-skip 0 --launch-count 4 --section SpeedOfLight --section WarpStateStats --section LaunchStats \
        gpu-run/bin/msmoe-bench decode --preset config/models/$Q3.json --backend cuda --batches 8 --context 512 \
        --steps 1 --no-cuda-graphs > $OUT/ncu-small.txt 2>&1
    grep -E "^  [a-z_]+.*\(|Duration" $OUT/ncu-small.txt | head -24 | tee -a $OUT/gpu.txt
}

# the grouping kernel's gate/up prefetch (MSM_CUDA_MOE_GG_PREFETCH=experts, _HEAD=bytes of each row;
# moe.cu): the first 6 selected experts are about the gate/up grid's first wave on an H100 or H200
# (4 blocks an SM x 132 SMs / 96 row chunks an expert at Qwen3's shapes)
PF_ARMS="MSM_CUDA_MOE_GG_PREFETCH=6 MSM_CUDA_MOE_GG_PREFETCH=6,MSM_CUDA_MOE_GG_PREFETCH_HEAD=2048
         MSM_CUDA_MOE_GG_PREFETCH=6,MSM_CUDA_MOE_GG_PREFETCH_HEAD=4096 MSM_CUDA_MOE_GG_PREFETCH=12"
pf_bits() { arm_bits "$PF_ARMS" $Q3 $Q15; }  # under each prefetch arm against the default, bitwise (device_run.sh)

case "$1" in
r1) hdr; kern_tests "@(tuning*|moe_grouped_simt*)"  # the s32 second look's item loop (gg_each_item) first
    if ! h200; then  # an H100: the persistent grids' preset checks and one A/B of them at the second look
        presets "persistent grids"
        el arms | tee -a $OUT/gpu.txt
        for i in 1 2; do for a in "" MSM_CUDA_MOE_GG_PERSIST=1 MSM_CUDA_MOE_GG_PERSIST=2; do b $Q3 5,8 ab $a --; done; done
        probe; small_ncu; el done | tee -a $OUT/gpu.txt; exit 0
    fi
    TABLE_ONLY=1 final; grep -E "early loads but routed, 8" $OUT/probe.txt | tee -a $OUT/gpu.txt
    for m in "qwen3-b8 engine" "qwen3-b4 engine"; do timeout 90 gpu-run/mega_probe 0 $m; done > $OUT/probe-engine.txt 2>&1
    grep -E "^#|PDL, 8 warps|PDL, early loads, 8|early loads but routed, 8" $OUT/probe-engine.txt | tee -a $OUT/gpu.txt
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2; do for a in "" $H200_ARMS; do b $Q3 4,8 ab $a --; done; done
    pack; el done | tee -a $OUT/gpu.txt ;;
r2) hdr  # after r1 on an H100: on an H200 r1's share (no kernel tests); on an H100 the gate/up at 3 and 4
    # chunks again, three rounds (what an H200-only default would cost there, were the H200 to take it)
    if h200; then
        TABLE_ONLY=1 final; grep -E "early loads but routed, 8" $OUT/probe.txt | tee -a $OUT/gpu.txt
    for m in "qwen3-b8 engine" "qwen3-b4 engine"; do timeout 90 gpu-run/mega_probe 0 $m; done > $OUT/probe-engine.txt 2>&1
    grep -E "^#|PDL, 8 warps|PDL, early loads, 8|early loads but routed, 8" $OUT/probe-engine.txt | tee -a $OUT/gpu.txt
        el arms | tee -a $OUT/gpu.txt
        for i in 1 2; do for a in "" $H200_ARMS; do b $Q3 4,8 ab $a --; done; done
    else
        el arms | tee -a $OUT/gpu.txt
        for i in 1 2 3; do for a in "" MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4; do
            b $Q3 5,8 ab $a --; b $Q15 8,16 ab $a --; done; done
    fi
    pack; el done | tee -a $OUT/gpu.txt ;;
r3) hdr  # r1 for a short budget, the most wanted first; on an H100 (after run 1 there) the small
    # kernels' Nsight Compute only
    if h200; then
        kern_tests "@(tuning*|moe_grouped_simt*)"; probe
        el table | tee -a $OUT/gpu.txt; b $Q3 1,2,4,8,16,32,128,256 table --; b $Q15 1,2,4,8,16,32,128,256 table --
        el arms | tee -a $OUT/gpu.txt
        for a in "" MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4 MSM_CUDA_MOE_GG_PERSIST=2 ""; do b $Q3 4,8 ab $a --; done
        b $Q3F 1,2,4,8,16,32,128,256 table --
    else
        small_ncu
    fi
    el done | tee -a $OUT/gpu.txt ;;
r4) hdr; kern_tests "@(tuning*|moe_grouped_simt*|moe_experts_fp8_match*)"; pf_bits  # the prefetch's first run
    if h200; then  # its rounds beside the owed Qwen3 / Qwen1.5-MoE table and the gate/up's chunk switch
        el table | tee -a $OUT/gpu.txt; b $Q3 1,2,4,8,16,32,128,256 table --; b $Q15 1,2,4,8,16,32,128,256 table --
        el arms | tee -a $OUT/gpu.txt
        for i in 1 2; do for a in "" $PF_ARMS MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4; do
            b $Q3 4,8 ab ${a//,/ } --; done; done
        for m in "qwen3-b8 engine" "qwen3-b8"; do timeout 90 gpu-run/mega_probe 0 $m; done > $OUT/probe.txt 2>&1
        grep -E "^#|PDL, 8 warps|PDL, early loads, 8|early loads but routed, 8" $OUT/probe.txt | tee -a $OUT/gpu.txt
    else
        el arms | tee -a $OUT/gpu.txt
        for i in 1 2 3; do for a in "" $PF_ARMS; do b $Q3 5,8 ab ${a//,/ } --; b $Q15 8 ab ${a//,/ } --; done; done
    fi
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl $Q3 8 q3b8; ROWS=14 tl $Q3 8 q3b8-pf6 MSM_CUDA_MOE_GG_PREFETCH=6
    el done | tee -a $OUT/gpu.txt ;;
r5) hdr; kern_tests "@(tuning*|moe_grouped_simt*)"  # r4 cut to ~150 s (the session's last device time)
    PF_ARMS="MSM_CUDA_MOE_GG_PREFETCH=6 MSM_CUDA_MOE_GG_PREFETCH=6,MSM_CUDA_MOE_GG_PREFETCH_HEAD=4096"; pf_bits
    el arms | tee -a $OUT/gpu.txt
    if h200; then
        b $Q3 1,2,4,8,16,32,128,256 table --
        for i in 1 2; do for a in "" $PF_ARMS MSM_CUDA_MOE_GG_GATEUP_U=3; do b $Q3 4,8 ab ${a//,/ } --; done; done
    else
        for i in 1 2; do for a in "" $PF_ARMS; do b $Q3 5,8 ab ${a//,/ } --; b $Q15 8 ab ${a//,/ } --; done; done
    fi
    el done | tee -a $OUT/gpu.txt ;;
r6) hdr  # on an H200 only (the next session's first call, on a bundle of HEAD: the prefetch is removed):
    # the owed Qwen3 / Qwen1.5-MoE table, the chunk switch and the persistent down, the probe's floors
    # for msmoed's chain
    h200 || exit 0
    el table | tee -a $OUT/gpu.txt; b $Q3 1,2,4,8,16,32,128,256 table --; b $Q15 1,2,4,8,16,32,128,256 table --
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2; do for a in "" MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4 MSM_CUDA_MOE_GG_PERSIST=2; do
        b $Q3 4,8 ab $a --; done; done
    for m in "qwen3-b8 engine" "qwen3-b8"; do timeout 90 gpu-run/mega_probe 0 $m; done > $OUT/probe.txt 2>&1
    grep -E "^#|PDL, 8 warps|PDL, early loads, 8|early loads but routed, 8" $OUT/probe.txt | tee -a $OUT/gpu.txt
    el done | tee -a $OUT/gpu.txt ;;
r7) hdr; small_ncu; el done | tee -a $OUT/gpu.txt ;;  # any GPU (~200 s): the small kernels each alone, for
    # the 8-token chain's latency (the combine + norm ends ~7 us after the down where the add + norm
    # after the o_proj ends ~3 us after it: its own work, or the boundary?)
esac

#!/usr/bin/env bash
# The device commands of this session's runs (README.md here), from the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check
# bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-03-h200-s9/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, hdr
ncu_k() { # KERNEL-REGEX PRESET BATCH TAG: Nsight Compute sections on the kernel's first 2 launches
    timeout 120 /usr/local/cuda/bin/ncu --kernel-name "regex:$1" --launch-skip 0 --launch-count 2 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
        --section LaunchStats --section SchedulerStats gpu-run/bin/msmoe-bench decode --preset config/models/$2.json \
        --backend cuda --batches $3 --context 512 --steps 1 --no-cuda-graphs > $OUT/ncu-$4.txt 2>&1
}
case "$1" in
r1)
    # the review commit 30837b5 (no behaviour change intended) on the GPU: kernel tests, every
    # switch bitwise at the Qwen1.5-MoE and Qwen3 shapes, the table at 1 / 8 tokens; Nsight Compute
    # on the batch-8 grouped expert GEMVs and the attention (Qwen1.5-MoE)
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'router*' 'linear_mmv*' 'attention*' 'tuning*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    b qwen1.5-moe-a2.7b 1,2,4,8 base --
    b qwen3-30b-a3b 1,2,4,8 base --
    el ncu | tee -a $OUT/gpu.txt
    ncu_k moe_down_grouped qwen1.5-moe-a2.7b 8 down8
    ncu_k moe_gateup_grouped qwen1.5-moe-a2.7b 8 gateup8
    ncu_k attention_kernel qwen1.5-moe-a2.7b 8 att8
    el timeline | tee -a $OUT/gpu.txt
    ROWS=24 tl qwen1.5-moe-a2.7b 8 q15
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 580) python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json config/models/qwen3-30b-a3b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r2)
    # the grouped SIMT expert GEMVs (5-11 tokens, bf16): finding their pairs themselves (no grouping
    # kernel; MSM_CUDA_MOE_GROUP_SCAN_MAX_T=0 the kernel), the down's first weights before its PDL
    # wait (MSM_CUDA_MOE_GG_EARLY=0 after), 2 tokens a pass (gate/up, down), 3 chunks in flight
    # (down): kernel tests, the A/B (two rounds), a timeline at 8 tokens, every switch bitwise
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'moe_grouped_simt*' 'moe_experts_grouped*' 'moe_experts_variants*' 'moe_experts_gemv*' 'tuning*' 'moe_combine*'; do
        timeout 200 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for v in "--" "MSM_CUDA_MOE_GROUP_SCAN_MAX_T=0 MSM_CUDA_MOE_GG_EARLY=0 --" "MSM_CUDA_MOE_GROUP_SCAN_MAX_T=0 --" \
                 "MSM_CUDA_MOE_GG_EARLY=0 --" "MSM_CUDA_MOE_GG_DOWN_NT=2 --" "MSM_CUDA_MOE_GG_GATEUP_NT=2 --" \
                 "MSM_CUDA_MOE_GG_DOWN_U=3 --"; do
            b qwen1.5-moe-a2.7b 5,8,11 gg $v
            b qwen3-30b-a3b 5,8,11 gg $v
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=24 tl qwen1.5-moe-a2.7b 8 q15
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 585) python3 tests/gpu/check_presets.py config/models/qwen1.5-moe-a2.7b.json config/models/qwen3-30b-a3b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r3)
    # the pair scan in one round trip and the down at 2 tokens a pass (new defaults) vs the grouping
    # kernel (MSM_CUDA_MOE_GROUP_SCAN_MAX_T=0) vs the old kernels (grouping, down waiting first, 4
    # tokens a pass), and the gate/up, now the experts' first kernel, as the router's programmatic
    # dependent past 4 tokens (MSM_CUDA_MOE_AUX_SERIAL_MAX_T=4; default 8: launched once the router
    # is done): kernel tests, the A/B (two rounds), timelines at 8 tokens, the final table,
    # every switch bitwise at the Qwen3-30B-A3B shapes
    hdr
    el kernels | tee -a $OUT/gpu.txt
    for f in 'moe_grouped_simt*' 'tuning*' 'attention*'; do
        timeout 100 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/$f" 2>&1 | tail -3 >> $OUT/kernels.txt
    done
    el bench | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for v in "--" "MSM_CUDA_MOE_GROUP_SCAN_MAX_T=0 --" \
                 "MSM_CUDA_MOE_GROUP_SCAN_MAX_T=0 MSM_CUDA_MOE_GG_EARLY=0 MSM_CUDA_MOE_GG_DOWN_NT=4 --" \
                 "MSM_CUDA_MOE_AUX_SERIAL_MAX_T=4 --"; do
            b qwen1.5-moe-a2.7b 5,8,11 gg $v
            b qwen3-30b-a3b 5,8,11 gg $v
        done
    done
    # the SIMT attention's block-table entries in shared memory first and the tensor-core one's
    # loaded an iteration ahead (default) vs a table load before each tile's K/V loads
    # (MSM_CUDA_ATT_BT_CACHE=0)
    for i in 1 2; do
        for v in "--" "MSM_CUDA_ATT_BT_CACHE=0 --"; do
            b qwen1.5-moe-a2.7b 1,8,16,32,64 bt $v
            b qwen3-30b-a3b 1,8,16,32 bt $v
        done
    done
    ncu_k attention_kernel qwen1.5-moe-a2.7b 8 att8
    # batch 1-4: the routed experts as the router's programmatic dependent with the aux stream's
    # kernels (the shared expert's) first in the block scheduler's queue, so the waiting routed
    # blocks take only the slots the shared GEMV leaves
    for i in 1 2; do
        for v in "--" "MSM_CUDA_MOE_AUX_SERIAL_MAX_T=0 --" "MSM_CUDA_MOE_AUX_SERIAL_MAX_T=0 MSM_CUDA_STREAM_PRIO=aux --" \
                 "MSM_CUDA_STREAM_PRIO=aux --"; do
            b qwen1.5-moe-a2.7b 1,2,4 prio $v
        done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=24 tl qwen1.5-moe-a2.7b 8 q15
    ROWS=24 tl qwen3-30b-a3b 8 q3
    el final | tee -a $OUT/gpu.txt
    b qwen1.5-moe-a2.7b 1,2,3,4,8,16,32,64,128,256 final --
    b qwen3-30b-a3b 1,2,3,4,8,16,32,64,128,256 final --
    b qwen3-30b-a3b-fp8 1,2,3,4,8,16,32,64,128,256 final --
    b glm-4.5-air-fp8 1,4,8,32,128 final --
    el presets | tee -a $OUT/gpu.txt
    timeout $(left 585) python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json > $OUT/presets.txt 2>&1
    el done | tee -a $OUT/gpu.txt
    ;;
r4)
    # the final table with the defaults chosen from run 3 (the bundle of run 3 with the pair scan
    # switched off, as the next commit's default), then the peers in the same call: the compiled
    # PyTorch decoder (bench/torch_decode.py; its best expert paths: gather at 1 / 8, dense or
    # grouped_mm from 32), Qwen1.5-MoE first, Qwen3-30B-A3B at 1 / 8 while device time lasts
    hdr
    el bench | tee -a $OUT/gpu.txt
    for p in qwen1.5-moe-a2.7b qwen3-30b-a3b qwen3-30b-a3b-fp8; do
        b $p 1,2,3,4,5,8,11,16,32,64,128,256 final MSM_CUDA_MOE_GROUP_SCAN_MAX_T=0 --
    done
    b glm-4.5-air-fp8 1,4,8,32,128 final MSM_CUDA_MOE_GROUP_SCAN_MAX_T=0 --
    el torch | tee -a $OUT/gpu.txt
    T=bench/torch_decode.py
    echo "## torch_decode.py qwen1.5-moe-a2.7b" >> $OUT/peers.txt
    timeout $(left 330) python3 $T config/models/qwen1.5-moe-a2.7b.json --batches 1,8 --experts gather --context 512 \
        2>&1 | grep -v '^\(W\|I\)[0-9]\{4\} ' >> $OUT/peers.txt
    timeout $(left 330) python3 $T config/models/qwen1.5-moe-a2.7b.json --batches 32,128,256 --experts dense,grouped_mm \
        --context 512 2>&1 | grep -v '^\(W\|I\)[0-9]\{4\} ' >> $OUT/peers.txt
    el torch qwen3 | tee -a $OUT/gpu.txt
    echo "## torch_decode.py qwen3-30b-a3b" >> $OUT/peers.txt
    timeout $(left 330) python3 $T config/models/qwen3-30b-a3b.json --batches 1,8 --experts gather --context 512 \
        2>&1 | grep -v '^\(W\|I\)[0-9]\{4\} ' >> $OUT/peers.txt
    el done | tee -a $OUT/gpu.txt
    ;;
esac

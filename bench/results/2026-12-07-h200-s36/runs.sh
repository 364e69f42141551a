#!/usr/bin/env bash
# The thirty-sixth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s36/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack, arm_bits
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8
S35=bench/results/2026-12-07-h200-s35/runs.sh

case "$1" in
r1) bash $S35 r3 ;;  # owed from the thirty-fifth session: the K/V prefetch default's bits and rounds
r2) hdr  # r1, then on an H200 the experts' GEMVs at 8 tokens in Nsight Compute (DRAM throughput,
    # occupancy, warp stalls: why the H200 reads them at ~94% of its copy rate where the H100 reads
    # ~100%), the same on an H100 for the comparison
    OUT=$OUT/r1 bash $0 r1; cat $OUT/r1/gpu.txt >> $OUT/gpu.txt
    el ncu | tee -a $OUT/gpu.txt
    ncu_k "moe_gateup_grouped|moe_down_grouped" $Q3 8 experts
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Block Limit" \
        $OUT/ncu-experts.txt | head -40 | tee -a $OUT/gpu.txt
    pack; el done | tee -a $OUT/gpu.txt ;;
r3) hdr  # the cluster routers' logits by st.async (router_st_async, off by default): the router kernel
    # tests (both ways, bitwise against the two kernels), the three presets' logits and tokens with it
    # against without (bitwise), three rounds against off; then r2 (r1 and the experts in Nsight)
    el kernels | tee -a $OUT/gpu.txt
    timeout 120 gpu-run/bin/test_cuda_kernels --jobs 4 --filter 'cuda_kernels/*router*' > $OUT/kernels.txt 2>&1
    tail -2 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    arm_bits "MSM_CUDA_ROUTER_ST_ASYNC=1" $Q3 $Q15 $Q3F
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for a in "--" "MSM_CUDA_ROUTER_ST_ASYNC=1 --"; do
        b $Q3 1,2,8 sa $a; b $Q15 1,8 sa $a; b $Q3F 1,8 sa $a; done; done
    el r2 | tee -a $OUT/gpu.txt
    OUT=$OUT/r2 bash $0 r2; cat $OUT/r2/gpu.txt >> $OUT/gpu.txt
    pack; el done | tee -a $OUT/gpu.txt ;;
r4) hdr  # after the fix of the experts' sum reader across the K/V prefetch's fork (00a62ae) and with
    # the routers' logits by st.async on by default: the presets' bits (the K/V rows' and st.async
    # variants, bitwise), three rounds of the default against --no-prefetch-kv and the K/V prefetch
    # up to 16 tokens; the 8-token timeline; the golden models against the CPU in the time left
    el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="K/V cache rows,st.async" timeout 150 python3 tests/gpu/check_presets.py config/models/$Q3.json \
        config/models/$Q15.json config/models/$Q3F.json > $OUT/presets.txt 2>&1
    tail -1 $OUT/presets.txt | tee -a $OUT/gpu.txt; echo "PASS lines: $(grep -c "^PASS" $OUT/presets.txt), FAIL lines: $(grep -c "^FAIL" $OUT/presets.txt)" | tee -a $OUT/gpu.txt
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for a in "--" "-- --no-prefetch-kv" "MSM_CUDA_L2_PREFETCH_KV_MAX_T=16 --"; do b $Q3 1,2,4,8,16 ab $a; done
        for a in "--" "-- --no-prefetch-kv"; do b $Q3F 1,2,8 ab $a; done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl $Q3 8 q3b8
    el cuda_vs_cpu | tee -a $OUT/gpu.txt
    timeout $(left ${LIMIT:-400}) python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/cuda-vs-cpu.txt 2>&1; tail -2 $OUT/cuda-vs-cpu.txt | tee -a $OUT/gpu.txt
    el done | tee -a $OUT/gpu.txt ;;
esac

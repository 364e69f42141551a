#!/usr/bin/env bash
# The thirty-fifth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s35/runs.sh rN
# Run 1 was the thirty-fourth session's `runs.sh r13` (its r12: the GQA split cap's validation).
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack, arm_bits
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8
S34=bench/results/2026-12-07-h200-s34/runs.sh

case "$1" in
r2) hdr  # on an H200 first the owed table, chunks in flight and floors (the s34 script's r4); then on
    # any card the L2 prefetch passes again (last measured in the thirteenth-sixteenth sessions, on
    # kernels since rewritten): the K/V rows from the norm before the qkv, the o_proj during the
    # attention, and with it the next layer's qkv during the router
    h200 && { OUT=$OUT/r4 bash $S34 r4; cat $OUT/r4/gpu.txt >> $OUT/gpu.txt; }
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for f in "" --prefetch-kv --prefetch-l2 --prefetch-l2-next "--prefetch-kv --prefetch-l2-next"; do
        b $Q3 1,2,4,8,16 ab -- $f; b $Q15 1,4,8 ab -- $f; done; done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl $Q3 8 q3b8; ROWS=14 tl $Q3 8 q3b8-pkv -- --prefetch-kv; ROWS=14 tl $Q3 8 q3b8-pl2n -- --prefetch-l2-next
    pack; el done | tee -a $OUT/gpu.txt ;;
r3) hdr  # the K/V prefetch by default (layers without a shared expert, decode steps of up to 2 tokens;
    # its fork no longer splits the experts' combine from the norm after it): its bits (the presets'
    # variant off against on, bitwise), three rounds against off and against on up to 16 tokens; on
    # an H200 first the s34 r4
    h200 && { OUT=$OUT/r4 bash $S34 r4; cat $OUT/r4/gpu.txt >> $OUT/gpu.txt; }
    el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="K/V cache rows" timeout 150 python3 tests/gpu/check_presets.py config/models/$Q3.json \
        config/models/$Q15.json config/models/$Q3F.json > $OUT/presets.txt 2>&1
    tail -1 $OUT/presets.txt | tee -a $OUT/gpu.txt; echo "PASS lines: $(grep -c "^PASS" $OUT/presets.txt), FAIL lines: $(grep -c "^FAIL" $OUT/presets.txt)" | tee -a $OUT/gpu.txt
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for a in "--" "-- --no-prefetch-kv" "MSM_CUDA_L2_PREFETCH_KV_MAX_T=16 --"; do
            b $Q3 1,2,4,8,16 ab $a; b $Q3F 1,2,8 ab $a; done
        for a in "--" "-- --no-prefetch-kv"; do b $Q15 1,8 ab $a; done
    done
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl $Q3 8 q3b8-kv16 MSM_CUDA_L2_PREFETCH_KV_MAX_T=16
    [ "$(left)" -gt 120 ] && { ROWS=14 tl $Q3 1 q3b1; ROWS=14 tl $Q3 1 q3b1-nokv -- --no-prefetch-kv; }
    pack; el done | tee -a $OUT/gpu.txt ;;
esac

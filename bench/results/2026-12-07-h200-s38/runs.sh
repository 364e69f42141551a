#!/usr/bin/env bash
# The thirty-eighth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s38/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack, arm_bits
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)
S37=bench/results/2026-12-07-h200-s37/runs.sh

case "$1" in
r1) # the thirty-seventh session's owed runs: on an H200 its r2 (the table of the current code, the
    # gate/up's chunks in flight and the persistent down, the floors, the 8-token timelines) within
    # 430 s; on any card its r7 (the default against --no-prefetch-kv, with only the 4/8/16 buckets
    # captured and with the engine's buckets); on an H100 the table of the current code as well
    hdr
    if h200; then OUT=$OUT/r2 timeout 430 bash $S37 r2; cat $OUT/r2/gpu.txt >> $OUT/gpu.txt
    else el table | tee -a $OUT/gpu.txt
        for p in qwen3-30b-a3b qwen1.5-moe-a2.7b qwen3-30b-a3b-fp8; do b $p 1,2,4,8,16,32,128,256 table --; done
    fi
    OUT=$OUT/r7 timeout $(left 570) bash $S37 r7; cat $OUT/r7/gpu.txt >> $OUT/gpu.txt
    pack; el done | tee -a $OUT/gpu.txt ;;
r2) # on an H200 only (once an H100 has run r1's r7): the s37 r2 within 520 s
    hdr; h200 || { echo "not an H200: r2 skipped" | tee -a $OUT/gpu.txt; exit 0; }
    OUT=$OUT/r2 timeout 520 bash $S37 r2; cat $OUT/r2/gpu.txt >> $OUT/gpu.txt
    pack; el done | tee -a $OUT/gpu.txt ;;
r3) # the lean form for a short budget (LIMIT seconds in all): on an H200 the three presets' table
    # (Qwen3 first) and the probe's 8-token floors, then the s37 r7 in the time left; on an H100
    # the s37 r7 first, then Qwen3's table
    hdr; L=${LIMIT:-330}
    if h200; then el table | tee -a $OUT/gpu.txt
        for p in qwen3-30b-a3b qwen1.5-moe-a2.7b qwen3-30b-a3b-fp8; do b $p 1,2,4,8,16,32,128,256 table --; done
        source <(sed -n '/^floors() {/,/^}/p' bench/results/2026-12-07-h200-s34/runs.sh); floors
        OUT=$OUT/r7 timeout $(left $L) bash $S37 r7; cat $OUT/r7/gpu.txt >> $OUT/gpu.txt
    else OUT=$OUT/r7 timeout $(left $((L - 40))) bash $S37 r7; cat $OUT/r7/gpu.txt >> $OUT/gpu.txt
        el table | tee -a $OUT/gpu.txt; b qwen3-30b-a3b 1,2,4,8,16,32,128,256 table --
    fi
    pack; el done | tee -a $OUT/gpu.txt ;;
esac

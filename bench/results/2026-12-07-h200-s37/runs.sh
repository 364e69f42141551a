#!/usr/bin/env bash
# The thirty-seventh session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s37/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack, arm_bits
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)
S34=bench/results/2026-12-07-h200-s34/runs.sh
S36=bench/results/2026-12-07-h200-s36/runs.sh

case "$1" in
r1) # owed from the thirty-sixth session (any card): after the sum-source fix (00a62ae), the presets'
    # bits, the default against --no-prefetch-kv and the K/V prefetch up to 16 tokens, the 8-token
    # timeline, the golden models against the CPU in the time left (LIMIT: seconds from the start)
    LIMIT=${LIMIT:-500} bash $S36 r4 ;;
r2) # on an H200 (owed for ten sessions): the table of the current code, the gate/up's chunks in
    # flight and the persistent down, the probe's floors, the 8-token timelines (the s34 r4)
    hdr; h200 || { echo "not an H200: r2 skipped" | tee -a $OUT/gpu.txt; exit 0; }
    OUT=$OUT/r4 bash $S34 r4; cat $OUT/r4/gpu.txt >> $OUT/gpu.txt; pack ;;
r3) # the K/V prefetch's fork where its kernel does not act (3-16 tokens: the cap is 2): run 1 had
    # --no-prefetch-kv -0.030 / -0.039 ms at 4 / 16 tokens, +0.012 at 8 (Qwen3), +0.042 at 8 (FP8).
    # New default (idle_aux_one_stream): such steps run the one-stream graph. Its bits (the presets'
    # variant --keep-idle-aux against the default, and the K/V rows' variant), then rounds of the
    # default against --keep-idle-aux (the old graphs) and against --no-prefetch-kv
    hdr; el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="idles,K/V cache rows" timeout 120 python3 tests/gpu/check_presets.py config/models/qwen3-30b-a3b.json \
        config/models/qwen3-30b-a3b-fp8.json > $OUT/presets.txt 2>&1
    tail -1 $OUT/presets.txt | tee -a $OUT/gpu.txt; echo "PASS lines: $(grep -c "^PASS" $OUT/presets.txt), FAIL lines: $(grep -c "^FAIL" $OUT/presets.txt)" | tee -a $OUT/gpu.txt
    el arms | tee -a $OUT/gpu.txt
    for i in $(seq ${ROUNDS:-3}); do for a in "" "--keep-idle-aux" "--no-prefetch-kv"; do
        b qwen3-30b-a3b 1,2,4,8,16 fork -- $a; b qwen3-30b-a3b-fp8 1,2,4,8,16 fork -- $a; done; done
    el done | tee -a $OUT/gpu.txt ;;
r4) # r2 on an H200 (first, within 380 s: H200s are rare), then r3 (5 rounds where no H200 came)
    hdr; if h200; then OUT=$OUT/r2 timeout 380 bash $0 r2; cat $OUT/r2/gpu.txt >> $OUT/gpu.txt; R=3; else R=5; fi
    OUT=$OUT/r3 ROUNDS=$R bash $0 r3; cat $OUT/r3/gpu.txt >> $OUT/gpu.txt; pack ;;
r5) # on an H200 r2; on an H100 the table of the code that lands (--keep-idle-aux: the graph choice
    # without the idle-aux switch, which runs 1-2 found no faster and which is not kept)
    hdr; if h200; then OUT=$OUT/r2 timeout 500 bash $0 r2; cat $OUT/r2/gpu.txt >> $OUT/gpu.txt; pack; exit 0; fi
    el table | tee -a $OUT/gpu.txt
    for p in qwen3-30b-a3b qwen1.5-moe-a2.7b qwen3-30b-a3b-fp8; do b $p 1,2,4,8,16,32,128,256 table -- --keep-idle-aux; done
    el done | tee -a $OUT/gpu.txt ;;
r6) # the placement probe: run 2's --no-prefetch-kv against the default moved Qwen3 -0.028 / -0.053 ms
    # at 4 / 16 tokens and its FP8 preset +0.034 / +0.022, though the fork was ruled out and the two
    # graphs run the same kernels (same arena, same workspaces). MSM_CUDA_PAD_MB=N takes N MiB before
    # any buffer: if times move by as much across pads, where the buffers lie explains it (and A/B
    # differences of that size are placement). On an H200 (the owed table cannot fit the time left)
    # Qwen3's 1-32 tokens first
    hdr; h200 && { el table | tee -a $OUT/gpu.txt; b qwen3-30b-a3b 1,2,4,8,16,32 table --; }
    el pads | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for pad in 0 2 96; do b qwen3-30b-a3b 4,8,16 pad MSM_CUDA_PAD_MB=$pad --; b qwen3-30b-a3b-fp8 4,8 pad MSM_CUDA_PAD_MB=$pad --; done
        for pad in 0 96; do b qwen3-30b-a3b 4,8,16 pad MSM_CUDA_PAD_MB=$pad -- --no-prefetch-kv; b qwen3-30b-a3b-fp8 4,8 pad MSM_CUDA_PAD_MB=$pad -- --no-prefetch-kv; done
    done
    el done | tee -a $OUT/gpu.txt ;;
r7) # what else differs with --no-prefetch-kv at 4-16 tokens, where the graphs are identical
    # (msm_graph_equal, the same value offsets): the process also captures the 1-2 token buckets'
    # graphs, which with the pass hold the fork and the aux stream's prefetch kernels. Only the 4, 8
    # and 16 buckets captured (--buckets, new) against the engine's buckets, each with and without
    # the pass
    hdr; el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for a in "" "--no-prefetch-kv" "--buckets 4,8,16" "--buckets 4,8,16 --no-prefetch-kv"; do
        b qwen3-30b-a3b 4,16 bk -- $a; b qwen3-30b-a3b-fp8 4,8 bk -- $a; done; done
    el done | tee -a $OUT/gpu.txt ;;
esac

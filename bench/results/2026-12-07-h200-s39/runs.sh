#!/usr/bin/env bash
# The thirty-ninth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s39/runs.sh rN
# r1-r3: the thirty-eighth session's, unchanged (owed; see its runs.sh). r4-r6: the commands of
# runs 2-4 here, on the machine run 1 left warm.
S38=bench/results/2026-12-07-h200-s38/runs.sh
case "$1" in
r4) # run 2: the 4/8/16-bucket bench with its stderr kept, then two rounds of default and
    # --no-prefetch-kv (the engine's buckets)
    source bench/device_run.sh
    ( timeout 60 gpu-run/bin/msmoe-bench decode --preset config/models/qwen3-30b-a3b.json --backend cuda \
        --batches 4,16 --context 512 --steps 30 --buckets 4,8,16; echo "rc=$?" ) > $OUT/diag.txt 2>&1
    for i in 1 2; do for a in "" "--no-prefetch-kv"; do
        b qwen3-30b-a3b 4,8,16 bk -- $a; b qwen3-30b-a3b-fp8 4,8 bk -- $a; done; done > /dev/null 2>&1 ;;
r5) # run 3: the s37 r7 arms, three rounds, Qwen3 at 8 tokens too
    source bench/device_run.sh
    for i in 1 2 3; do for a in "" "--no-prefetch-kv" "--buckets 4,8,16" "--buckets 4,8,16 --no-prefetch-kv"; do
        b qwen3-30b-a3b 4,8,16 bk -- $a; b qwen3-30b-a3b-fp8 4,8 bk -- $a
        echo "round $i arm '$a' rc=$?" >> $OUT/log.txt; done; done > $OUT/stdout.txt 2> $OUT/stderr.txt
    el done >> $OUT/log.txt ;;
r6) # run 4: the three presets' table, two rounds
    source bench/device_run.sh
    for i in 1 2; do for p in qwen3-30b-a3b qwen1.5-moe-a2.7b qwen3-30b-a3b-fp8; do
        b $p 1,2,4,8,16,32,128,256 table --; done; done > /dev/null 2>&1; el done ;;
*) exec bash $S38 "$@" ;;
esac

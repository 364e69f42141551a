#!/usr/bin/env bash
# The fortieth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s40/runs.sh rN
# The switches of r2, r4 and r6 exist only in the commits that ran or built them (80f4392, 8877fbf,
# f1c774e; each reverted after): on a later commit's bundle those arms run the default.
# r1: on an H200 the thirty-eighth session's r2 (= the s37 r2: the table, the gate/up's chunks in
# flight, the persistent down, the probe's floors, the 8-token timelines), owed since session 27;
# on an H100 one round of the three presets' table (a repeat of s39 run 4, for its spread).
# r2 (any card): the streamed MMV's one-stage form for K up to 4096 (MSM_CUDA_MMV_STREAM_LONG_K=1:
# Qwen3's o_proj, 2048 x 4096, every 16-row tile copied whole into shared memory before the PDL
# wait, while the attention runs), and Qwen1.5-MoE's o_proj (2048 x 2048) on the streamed MMV
# (MSM_CUDA_MMV_STREAM_BS_MIN_N=2048). Commit in gpu.txt: the streamed-MMV and tuning kernel
# tests; msmoe-run's logits under each arm bitwise; three rounds of each arm against the default;
# Qwen3's 8-token timeline with and without the one-stage form.
# r3: r1 on an H200, else r2.
# r4 (any card): the streamed MMV (Qwen3's and Qwen1.5-MoE's qkv at 3-8 tokens) with only its first
# stage's tile copied before the PDL wait (MSM_CUDA_MMV_STREAM_PRE=1; the second right after it),
# so that less of its burst falls beside the combine + add + norm before it. Commit in gpu.txt:
# the streamed-MMV and tuning kernel tests; msmoe-run's logits bitwise; three rounds against the
# default; Qwen3's 8-token timelines: the default, PRE=1, and the qkv not streamed
# (MSM_CUDA_MMV_STREAM_BS_MIN_N=0: what the combine takes without the burst beside it).
# r5: r1 on an H200, else r4.
# r6 (any card): the combine + add + norm cluster's late PDL trigger (MSM_CUDA_MOE_COMBINE_LATE=1:
# the qkv launches once the combine's loads have returned, so its bulk copies do not queue beside
# them). Commit in gpu.txt: the fused-combine and tuning kernel tests; msmoe-run's logits bitwise;
# three rounds against the default (Qwen3 and its FP8 preset at 5-32 tokens, where the routed
# experts' sum is read by that add + norm); Qwen3's 8-token timelines.
# r7: r1 on an H200, else r6.
# r8: on an H200 the lean form for a short budget (two rounds of the three presets' table, Qwen3
# first; the probe's 8-token floors; Qwen3's 8-token timeline), else r6.
S38=bench/results/2026-12-07-h200-s38/runs.sh
source bench/device_run.sh
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)
case "$1" in
r1) if h200; then exec bash $S38 r2; fi
    hdr; el table | tee -a $OUT/gpu.txt
    for p in qwen3-30b-a3b qwen1.5-moe-a2.7b qwen3-30b-a3b-fp8; do b $p 1,2,4,8,16,32,128,256 table --; done
    pack; el done | tee -a $OUT/gpu.txt ;;
r2) hdr; source <(sed -n '/^kern_tests() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
    kern_tests "@(tuning*|linear_mmv_stream)"
    arm_bits "MSM_CUDA_MMV_STREAM_LONG_K=1" qwen3-30b-a3b
    arm_bits "MSM_CUDA_MMV_STREAM_BS_MIN_N=2048" qwen1.5-moe-a2.7b
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b qwen3-30b-a3b 2,4,8 lk --; b qwen3-30b-a3b 2,4,8 lk MSM_CUDA_MMV_STREAM_LONG_K=1 --
        b qwen1.5-moe-a2.7b 4,8 lk --; b qwen1.5-moe-a2.7b 4,8 lk MSM_CUDA_MMV_STREAM_BS_MIN_N=2048 --
    done > /dev/null 2>&1
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl qwen3-30b-a3b 8 q3b8; ROWS=14 tl qwen3-30b-a3b 8 q3b8-lk MSM_CUDA_MMV_STREAM_LONG_K=1
    pack; el done | tee -a $OUT/gpu.txt ;;
r3) if h200; then exec bash $0 r1; else exec bash $0 r2; fi ;;
r4) hdr; source <(sed -n '/^kern_tests() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
    kern_tests "@(tuning*|linear_mmv_stream)"
    arm_bits "MSM_CUDA_MMV_STREAM_PRE=1" qwen3-30b-a3b qwen1.5-moe-a2.7b
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for a in "" MSM_CUDA_MMV_STREAM_PRE=1; do
        b qwen3-30b-a3b 4,8 pre $a --; b qwen1.5-moe-a2.7b 4,8 pre $a --; done; done > /dev/null 2>&1
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl qwen3-30b-a3b 8 q3b8; ROWS=14 tl qwen3-30b-a3b 8 q3b8-pre1 MSM_CUDA_MMV_STREAM_PRE=1
    ROWS=14 tl qwen3-30b-a3b 8 q3b8-nostream MSM_CUDA_MMV_STREAM_BS_MIN_N=0
    pack; el done | tee -a $OUT/gpu.txt ;;
r5) if h200; then exec bash $0 r1; else exec bash $0 r4; fi ;;
r6) hdr; source <(sed -n '/^kern_tests() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
    kern_tests "@(tuning*|moe_fused_combine*)"
    arm_bits "MSM_CUDA_MOE_COMBINE_LATE=1" qwen3-30b-a3b qwen3-30b-a3b-fp8
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for a in "" MSM_CUDA_MOE_COMBINE_LATE=1; do
        b qwen3-30b-a3b 5,8,16,32 late $a --; b qwen3-30b-a3b-fp8 8,16 late $a --; done; done > /dev/null 2>&1
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl qwen3-30b-a3b 8 q3b8; ROWS=14 tl qwen3-30b-a3b 8 q3b8-late MSM_CUDA_MOE_COMBINE_LATE=1
    pack; el done | tee -a $OUT/gpu.txt ;;
r7) if h200; then exec bash $0 r1; else exec bash $0 r6; fi ;;
r8) h200 || exec bash $0 r6
    hdr; el table | tee -a $OUT/gpu.txt
    for i in 1 2; do for p in qwen3-30b-a3b qwen1.5-moe-a2.7b qwen3-30b-a3b-fp8; do
        b $p 1,2,4,8,16,32,128,256 table --; done; done > /dev/null 2>&1
    source <(sed -n '/^floors() {/,/^}/p' bench/results/2026-12-07-h200-s34/runs.sh); floors
    el timeline | tee -a $OUT/gpu.txt; ROWS=14 tl qwen3-30b-a3b 8 q3b8
    pack; el done | tee -a $OUT/gpu.txt ;;
esac

#!/usr/bin/env bash
# The forty-first session's device plan (README.md here; no device was lent in that session, so
# these are for the next session that gets an H200). From the repository root, with the binaries of
# `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-08-h200-s41/runs.sh r1
# r1 (an H200; ~5 min: the H200 runs of session 26 took under a minute for a table and the floors):
#   the presets' table, two rounds (Qwen3 first; GLM-4.5-Air FP8 once), the routed experts' bytes in
#   flight and persistent grids as arms (the H200's experts read at 91-94% of its copy rate where
#   the H100's run at 96-100%), their bits, the probe's 8-token floors, Qwen3's timelines at 1 and 8
#   tokens, GLM-4.5-Air FP8's table, then the FP8 section (r3), the kernel tests and the presets'
#   bitwise checks in the time left. On any other card it says so and runs only the FP8 section
#   (an H100's table is s39's and s40's).
# r2: r1 without the GLM table, the FP8 section and the checks (~2 min), for a short budget.
# r3 (any card; what r1 runs on an H100): the FP8 section. The FP8 preset's step at 5-32 tokens
#   spends ~4 ms beyond streaming its bytes on an H100 where the bf16 one spends ~1.2 (s39 run 4:
#   Qwen3 FP8 8 tokens 8.59 ms at 54% of the copy rate, bf16 9.91 at 88%): its routed experts there
#   take the tiled FP8 GEMMs (from 5 tokens), which ran at ~55% of the copy rate in session 5's
#   32-token timeline on an H200 (gate/up 150 us a layer for ~350 MB of codes). The section: Qwen3
#   FP8's timelines at 4, 8 and 32 tokens (and 8 with two K steps a stage, and on the SIMT GEMVs);
#   the tiled FP8 GEMMs with two 64-wide K steps a pipeline stage (MSM_CUDA_FP8_TILED_KS=2, new in
#   this session: 128 contiguous bytes of each code row a stage and half the barriers; kernel tests
#   and bits first), also at 32 tokens a pass (MSM_CUDA_MOE_TILED_BM=32: 6 stages of one step, or 3
#   of two, against 16 tokens' 8 or 4: whether the bytes in flight matter); the grouped FP8 GEMVs
#   (measured against the tiled GEMMs only in sessions 5-6, before the grouped GEMVs' compact grids
#   and chunk changes) against the tiled GEMMs as arms (MSM_CUDA_FP8_MOE_TILED_MIN_T=9 / 33: the
#   grouped GEMVs up to 8 / 32 tokens, in their default tensor-core form or with
#   MSM_CUDA_MOE_KERNELS=simt the SIMT one), three rounds (another path: other sums, each checked
#   against the CPU by the kernel tests, so no bitwise line); Nsight Compute on each path's gate/up
#   and down at 8 tokens (the first two launches of each).
source bench/device_run.sh  # el, left, b, tl, ncu_k, hdr, pack, arm_bits
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)
source <(sed -n '/^kern_tests() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
source <(sed -n '/^floors() {/,/^}/p' bench/results/2026-12-07-h200-s34/runs.sh)
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
source <(sed -n '/^presets() {/,/^}/p' bench/results/2026-12-07-h200-s33/runs.sh)
# the grouped SIMT gate/up with 3 or 4 K chunks in flight a lane (default 2), the down with 3 (default
# 2), and persistent grids for the gate/up (1) or the down (2); all the same bits (kernel tests)
ARMS="MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4 MSM_CUDA_MOE_GG_DOWN_U=3 MSM_CUDA_MOE_GG_PERSIST=1 MSM_CUDA_MOE_GG_PERSIST=2"

core() {
    el table | tee -a $OUT/gpu.txt
    for i in 1 2; do for p in $Q3 $Q15 $Q3F; do b $p 1,2,4,8,16,32,128,256 table --; done; done > /dev/null 2>&1
    grep -m1 "^# %HBM" $OUT/bench-table.txt | tee -a $OUT/gpu.txt
    arm_bits "$ARMS" $Q3 $Q15
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for a in "" $ARMS; do
        b $Q3 5,8,16 ab $a --; b $Q15 8,16 ab $a --; done; done > /dev/null 2>&1
    floors
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl $Q3 8 q3b8; ROWS=14 tl $Q3 8 q3b8-u3 MSM_CUDA_MOE_GG_GATEUP_U=3; ROWS=14 tl $Q3 1 q3b1
}

# an arm's switches joined by "+"
FP8_ARMS="MSM_CUDA_FP8_TILED_KS=2 MSM_CUDA_MOE_TILED_BM=32 MSM_CUDA_MOE_TILED_BM=32+MSM_CUDA_FP8_TILED_KS=2
          MSM_CUDA_FP8_MOE_TILED_MIN_T=9 MSM_CUDA_FP8_MOE_TILED_MIN_T=9+MSM_CUDA_MOE_KERNELS=simt
          MSM_CUDA_FP8_MOE_TILED_MIN_T=33 MSM_CUDA_FP8_MOE_TILED_MIN_T=33+MSM_CUDA_MOE_KERNELS=simt"
fp8() {
    kern_tests "@(tuning*|moe_fp8_tiled*|moe_experts_fp8_tiled*)"; mv $OUT/kernels.txt $OUT/kernels-fp8.txt
    arm_bits "MSM_CUDA_FP8_TILED_KS=2" $Q3F
    el fp8 timelines | tee -a $OUT/gpu.txt
    for bt in 4 8 32; do ROWS=24 tl $Q3F $bt q3fb$bt; done
    ROWS=24 tl $Q3F 8 q3fb8-ks2 MSM_CUDA_FP8_TILED_KS=2
    ROWS=24 tl $Q3F 8 q3fb8-simt MSM_CUDA_FP8_MOE_TILED_MIN_T=9 MSM_CUDA_MOE_KERNELS=simt
    el fp8 arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for a in "" $FP8_ARMS; do b $Q3F 5,8,16,32,128,256 fp8 ${a//+/ } --; done; done > /dev/null 2>&1
    el fp8 ncu | tee -a $OUT/gpu.txt
    [ "$(left 570)" -gt 130 ] && ncu_k "moe_(gateup|down)_tiled_fp8" $Q3F 8 fp8-tiled
    [ "$(left 570)" -gt 130 ] && ncu_k "moe_(gateup|down)_tiled_fp8" $Q3F 8 fp8-tiled-ks2 MSM_CUDA_FP8_TILED_KS=2
    [ "$(left 570)" -gt 130 ] && ncu_k "moe_(gateup|down)_mma_kernel" $Q3F 8 fp8-mma MSM_CUDA_FP8_MOE_TILED_MIN_T=9
    [ "$(left 570)" -gt 130 ] && ncu_k "moe_(gateup|down)_grouped_gemv" $Q3F 8 fp8-simt MSM_CUDA_FP8_MOE_TILED_MIN_T=9 MSM_CUDA_MOE_KERNELS=simt
    grep -E "^  [a-z_]+.*<|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per" \
        $OUT/ncu-fp8-*.txt | head -60 >> $OUT/gpu.txt
}

case "$1" in
r1) hdr; h200 || { echo "not an H200: the FP8 section (r3) only" | tee -a $OUT/gpu.txt; fp8; pack
                   el done | tee -a $OUT/gpu.txt; exit 0; }
    core
    el glm | tee -a $OUT/gpu.txt; b $GLM 1,2,4,8,32,128 table -- > /dev/null 2>&1
    [ "$(left 570)" -gt 240 ] && fp8
    [ "$(left 570)" -gt 200 ] && kern_tests "*"
    [ "$(left 570)" -gt 150 ] && presets "" 0,2 $(( $(left 570) - 20 ))
    pack; el done | tee -a $OUT/gpu.txt ;;
r2) hdr; h200 || { echo "not an H200: stopped" | tee -a $OUT/gpu.txt; exit 0; }
    core; pack; el done | tee -a $OUT/gpu.txt ;;
r3) hdr; fp8; pack; el done | tee -a $OUT/gpu.txt ;;
esac

#!/usr/bin/env bash
# The device commands of the seventeenth session (README.md here). From the repository root, with
# the binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline"
# tools/gpu-engine-check bundle` built from the commit in each run's gpu.txt, carried as gpu-run/:
#   bash bench/results/2026-12-05-h200-s17/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8
# Nsight Compute on one launch of the kernels whose demangled name matches REGEX, after SKIP of them
ncu_lm() {
    local k=$1 skip=$2 p=$3 bt=$4 tag=$5; shift 5
    env "$@" timeout 150 /usr/local/cuda/bin/ncu --clock-control none --kernel-name-base demangled --kernel-name "regex:$k" \
        --launch-skip $skip --launch-count 1 --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section Occupancy --section LaunchStats --section SchedulerStats --section ComputeWorkloadAnalysis \
        gpu-run/bin/msmoe-bench decode --preset config/models/$p.json --backend cuda --batches $bt \
        --context 512 --steps 1 --no-cuda-graphs > $OUT/ncu-$tag.txt 2>&1
}
case "$1" in
r1)
    # on the s16 bundle (8a3a4a3): the sixteenth session's unrun r3 (the split FP8 GEMV's kernel
    # tests after the hook fix; its long-row rule on GLM-4.5-Air FP8 against the split everywhere
    # and none; Qwen3-30B-A3B FP8 with the rule and with the integer decode; the hardware decode's
    # bitwise line), then why the lm_head's MMV at 8 tokens streams at ~3.1 TB/s where the one-token
    # GEMV of the same weight streams at ~4.0 (190 vs 153 us in the s13/s15 timelines): Nsight
    # Compute on both, and the current timelines of Qwen1.5-MoE at 1 and 8 tokens
    hdr
    timeout 75 gpu-run/bin/test_cuda_kernels --jobs 4 \
        --filter "cuda_kernels/@(linear_fp8*|norm_linear*|tuning*)" > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2; do
        b $GLM 1,2 rule MSM_CUDA_FP8_GEMV_SPLIT=2 --
        b $GLM 1 rule MSM_CUDA_FP8_GEMV_SPLIT=2 MSM_CUDA_FP8_GEMV_SPLIT_MIN_K=0 --
        b $GLM 1,2 rule --
        b $Q3F 1,2 rule MSM_CUDA_FP8_GEMV_SPLIT=2 --
        b $Q3F 1,2 rule --
        b $Q3F 1,2 rule MSM_CUDA_FP8_GEMV_HW=0 --
    done
    el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="integer decode vs the hardware" timeout 45 python3 tests/gpu/check_presets.py \
        config/models/$Q3F.json > $OUT/presets.txt 2>&1
    tail -1 $OUT/presets.txt | tee -a $OUT/gpu.txt
    el ncu | tee -a $OUT/gpu.txt
    # (this regex matched nothing: ncu's demangled names read "mmv_kernel<(int)1, (int)1, ...>"; r2)
    ncu_lm "mmv_kernel<1, ?1, ?4, ?4, ?1," 0 $Q15 8 lm8 # the lm_head's MMV: its one launch a step
    ncu_lm "gemv_kernel<1, ?1, ?4, ?true" 48 $Q15 1 lm1 # past the layers' 48 (o_proj, shared down)
    grep -E "Duration|DRAM Throughput|Grid Size" $OUT/ncu-lm8.txt $OUT/ncu-lm1.txt | tee -a $OUT/gpu.txt
    el timelines | tee -a $OUT/gpu.txt
    tl $Q15 1 q15b1
    tl $Q15 8 q15b8
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
r2)
    # on bundle c79de8a (the streamed MMV, off by default): its kernel tests with the other MMVs';
    # r1's Nsight Compute with the demangled names' "(int)" casts: the lm_head's MMV at 8 tokens,
    # under the existing switches that change its launch (8 chunks in flight: the U8 rule's grid
    # limit lifted; the block-sliced form forced at 16 and 4 K slices, past the layers' o_proj,
    # shared gate/up and down: 72), the streamed MMV, and the GEMVs of the same weight at 1 and 2
    # tokens (204 us at 2 in s13 run 4, 156 at 1); then three rounds of the streamed lm_head against
    # the default at 2-8 tokens on Qwen1.5-MoE, Qwen3-30B-A3B and its FP8 preset; a timeline
    hdr
    timeout 120 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(linear_mmv*|tuning*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    el ncu | tee -a $OUT/gpu.txt
    I="\\(int\\)" ST="MSM_CUDA_MMV_STREAM_MIN_N=32768"
    ncu_lm "mmv_kernel<${I}1, ${I}1, ${I}4, ${I}4, ${I}1," 0 $Q15 8 lm8
    ncu_lm "mmv_kernel<${I}1, ${I}1, ${I}4, ${I}8, ${I}1," 0 $Q15 8 lm8-u8 MSM_CUDA_MMV_U8_MAX_BLOCKS=100000
    ncu_lm "mmv_kernel<${I}1, ${I}1, ${I}16, ${I}4, ${I}16, ${I}2, \\(bool\\)0" 72 $Q15 8 lm8-b16 MSM_CUDA_MMV_BSLICE=16
    ncu_lm "mmv_kernel<${I}1, ${I}1, ${I}4, ${I}4, ${I}4, ${I}2, \\(bool\\)0" 72 $Q15 8 lm8-b4 MSM_CUDA_MMV_BSLICE=4
    ncu_lm "mmv_stream_kernel" 0 $Q15 8 lm8-stream $ST
    ncu_lm "gemv_kernel<${I}1, ${I}1, ${I}4, \\(bool\\)1" 24 $Q15 1 lm1 # past the o_projs
    ncu_lm "gemv_kernel<${I}2, ${I}1, ${I}4, \\(bool\\)1" 48 $Q15 2 lm2 # past the o_projs, shared downs
    ncu_lm "mmv_stream_kernel" 0 $Q15 2 lm2-stream $ST
    grep -E "==PROF== Profiling|Duration|DRAM Throughput|Grid Size|Registers Per" $OUT/ncu-*.txt | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        b $Q15 2,3,4,8 lm --
        b $Q15 2,3,4,8 lm $ST --
        b $Q3 2,4,8 lm --
        b $Q3 2,4,8 lm $ST --
        b $Q3F 2,8 lm --
        b $Q3F 2,8 lm $ST --
    done
    el timeline | tee -a $OUT/gpu.txt
    tl $Q15 8 q15b8-stream $ST
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
r3)
    # on the bundle of the streamed MMV's bulk-copy form, on by default (32768 rows; 8-row tiles
    # for GLM-4.5-Air's K of 4096, which spill 72 bytes): its kernel tests; Nsight Compute of the
    # lm_head at 8 and 2 tokens; three rounds against it off at 2-8 tokens (two on GLM); check_presets' bitwise lines on the three presets (decode steps at 2 tokens take it);
    # check_cuda_vs_cpu with it taking every linear of 16 rows or more at 2-8 tokens; the table
    hdr
    timeout 120 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(linear_mmv*|tuning*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    el ncu | tee -a $OUT/gpu.txt
    ncu_lm "mmv_stream_kernel" 0 $Q15 8 lm8-stream
    ncu_lm "mmv_stream_kernel" 0 $Q15 2 lm2-stream
    grep -E "Duration|DRAM Throughput|L2 Cache Throughput|Registers Per" $OUT/ncu-*.txt | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    OFF="MSM_CUDA_MMV_STREAM_MIN_N=0"
    for i in 1 2 3; do
        b $Q15 2,3,4,8 lm --
        b $Q15 2,3,4,8 lm $OFF --
        b $Q3 2,4,8 lm --
        b $Q3 2,4,8 lm $OFF --
        b $Q3F 2,8 lm --
        b $Q3F 2,8 lm $OFF --
        [ $i = 3 ] || { b $GLM 2,4,8 lm --; b $GLM 2,4,8 lm $OFF --; }
    done
    el presets | tee -a $OUT/gpu.txt
    CHECK_VARIANTS="graph replay,multi-stream,PDL" timeout 200 python3 tests/gpu/check_presets.py \
        > $OUT/presets.txt 2>&1
    tail -1 $OUT/presets.txt | tee -a $OUT/gpu.txt
    el check | tee -a $OUT/gpu.txt
    MSM_CUDA_MMV_STREAM_MIN_N=16 CHECK_MODELS=qwen2moe-gqa,qwen3moe timeout 150 \
        python3 tests/gpu/check_cuda_vs_cpu.py > $OUT/check.txt 2>&1
    tail -1 $OUT/check.txt | tee -a $OUT/gpu.txt
    el table | tee -a $OUT/gpu.txt
    for p in $Q15 $Q3 $Q3F; do b $p 1,2,4,8,16,32,64,128,256 table --; done
    b $GLM 1,2,4,8,32,128 table --
    el done | tee -a $OUT/gpu.txt
    pack
    ;;
r4)
    # the final bundle (the streamed MMV for K <= 2048 only): its kernel tests; GLM-4.5-Air FP8 at
    # 2-8 tokens back on the MMV (two rounds); Qwen1.5-MoE at 1 / 8 tokens (three rounds)
    hdr
    timeout 120 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(linear_mmv*|tuning*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2; do b $GLM 2,4,8 final --; done
    for i in 1 2 3; do b $Q15 1,8 final --; done
    el done | tee -a $OUT/gpu.txt
    ;;
r5)
    # for the next session's batch-1 work: what each op costs a Qwen1.5-MoE step today at 1 and 8
    # tokens (MSM_CUDA_SKIP_OPS: the step without that op; results meaningless, time real), two rounds
    hdr
    el opcosts | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for op in "" ATTENTION ADD_RMSNORM MOE_COMBINE_NORM ROUTER_LINEAR_TOPK ROPE_KV_WRITE MOE_EXPERTS; do
            b $Q15 1,8 opcosts ${op:+MSM_CUDA_SKIP_OPS=$op} --
        done
    done
    el done | tee -a $OUT/gpu.txt
    ;;
r6)
    # the review's refactor (the streamed MMV without its template; the same code): its kernel tests,
    # and Qwen1.5-MoE at 2 / 8 tokens
    hdr
    timeout 120 gpu-run/bin/test_cuda_kernels --jobs 4 --filter "cuda_kernels/@(linear_mmv*|tuning*)" \
        > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt
    for i in 1 2; do b $Q15 2,8 final --; done
    el done | tee -a $OUT/gpu.txt
    ;;
*)
    echo "usage: $0 r1|r2|r3|r4|r5|r6" >&2
    exit 2
    ;;
esac

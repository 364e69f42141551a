#!/usr/bin/env bash
# The thirty-fourth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-07-h200-s34/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack, arm_bits
# the twenty-sixth session's kern_tests, the thirtieth's h200 test (run 1 had neither: no kernel tests)
source <(sed -n '/^kern_tests() {/,/^}/p' bench/results/2026-12-06-h200-s26/runs.sh)
source <(sed -n '/^h200() {/p' bench/results/2026-12-06-h200-s30/runs.sh)
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b
# the thirty-third session's presets, probe floors and small kernels' Nsight Compute
source <(sed -n '/^presets() {/,/^}/p;/^small_ncu() {/,/^}/p' bench/results/2026-12-07-h200-s33/runs.sh)

# the grouped SIMT GEMVs' rows past each warp's first step requested towards L2 at an item's start
# (MSM_CUDA_MOE_GG_L2PF: 1 the gate/up, 2 the down, 3 both; new): more bytes in flight without registers
L2_ARMS="MSM_CUDA_MOE_GG_L2PF=1 MSM_CUDA_MOE_GG_L2PF=2 MSM_CUDA_MOE_GG_L2PF=3"
bits() { arm_bits "$1" $Q3 $Q15; }  # under each arm against the default, bitwise (device_run.sh)
floors() {  # the probe's floors at 8 tokens: seven phases a layer and msmoed's own chain
    el probe | tee -a $OUT/gpu.txt
    for m in "qwen3-b8 engine" "qwen3-b8"; do timeout 90 gpu-run/mega_probe 0 $m; done > $OUT/probe.txt 2>&1
    grep -E "^#|PDL, 8 warps|PDL, early loads, 8|early loads but routed, 8" $OUT/probe.txt | tee -a $OUT/gpu.txt
}

# the binaries of the bundle before a change (gpu-run/old.tar.xz: bin/msmoe-bench, bin/msmoe-run,
# REVISION), for an A/B of a change that has no switch
[ -f gpu-run/old.tar.xz ] && { mkdir -p gpu-run/old && (cd gpu-run/old && tar xJf ../old.tar.xz) && rm gpu-run/old.tar.xz; }
bo() {  # b with the old binaries: the arm "binary=old"
    local p=$1 bs=$2 tag=$3; shift 3; [ "$1" = "--" ] && shift
    { el "$p binary=old $*"; timeout 120 gpu-run/old/bin/msmoe-bench decode --preset config/models/$p.json \
        --backend cuda --batches $bs --context 512 --steps 30 "$@" 2>&1 | grep -v '^# weights'; } | tee -a $OUT/bench-$tag.txt
}
old_bits() {  # msmoe-run's logits and tokens, new against old binaries: bitwise
    el "bitwise against $(cat gpu-run/old/REVISION)" | tee -a $OUT/gpu.txt
    for p in $*; do
        for x in old/bin bin; do
            timeout 100 gpu-run/$x/msmoe-run --dummy-weights config/models/$p.json --backend cuda \
                --prompt-ids 5,1000,77,300,12,9,8,7 --max-new-tokens 6 --ignore-eos --dump-logits /tmp/l-${x%%/*}.npy \
                > /tmp/t-${x%%/*}.txt 2>/dev/null
        done
        { cmp -s /tmp/l-old.npy /tmp/l-bin.npy && cmp -s /tmp/t-old.txt /tmp/t-bin.txt && echo "$p: the same bits"; } ||
            echo "$p: DIFFER"
    done | tee -a $OUT/gpu.txt
}

case "$1" in
r1) hdr; kern_tests "@(tuning*|moe_grouped_simt*|moe_experts_fp8_match*)"; bits "$L2_ARMS"
    presets "rows prefetched into L2"
    if h200; then  # the owed table, the H200-only switches, the floors
        el table | tee -a $OUT/gpu.txt; b $Q3 1,2,4,8,16,32,128,256 table --; b $Q15 1,2,4,8,16,32,128,256 table --
        el arms | tee -a $OUT/gpu.txt
        for i in 1 2 3; do for a in "" $L2_ARMS MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4 MSM_CUDA_MOE_GG_PERSIST=2; do
            b $Q3 4,8,16 ab $a --; b $Q15 8,16 ab $a --; done; done
        floors
    else
        el arms | tee -a $OUT/gpu.txt
        for i in 1 2 3; do for a in "" $L2_ARMS; do b $Q3 4,8,16 ab $a --; b $Q15 8,16 ab $a --; done; done
    fi
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl $Q3 8 q3b8; ROWS=14 tl $Q3 8 q3b8-l2pf3 MSM_CUDA_MOE_GG_L2PF=3
    [ "$(left)" -gt 240 ] && ! h200 && small_ncu
    pack; el done | tee -a $OUT/gpu.txt ;;
r2) hdr; kern_tests "@(tuning*|moe_grouped_simt*|moe_experts_fp8_match*)"; el done | tee -a $OUT/gpu.txt ;;
r3) hdr; kern_tests "@(tuning*|moe_grouped_simt*|moe_experts_fp8_match*)"  # after run 1's whole rows: a bounded
    # prefetch (MSM_CUDA_MOE_GG_L2PF_BYTES: one more step of 2 chunks, 1 KiB a row, or half of it)
    L2_ARMS="MSM_CUDA_MOE_GG_L2PF=1,MSM_CUDA_MOE_GG_L2PF_BYTES=512 MSM_CUDA_MOE_GG_L2PF=1,MSM_CUDA_MOE_GG_L2PF_BYTES=1024
             MSM_CUDA_MOE_GG_L2PF=3,MSM_CUDA_MOE_GG_L2PF_BYTES=512"
    bits "$L2_ARMS"
    if h200; then
        el table | tee -a $OUT/gpu.txt; b $Q3 1,2,4,8,16,32,128,256 table --; b $Q15 1,2,4,8,16,32,128,256 table --
        el arms | tee -a $OUT/gpu.txt
        for i in 1 2 3; do for a in "" $L2_ARMS MSM_CUDA_MOE_GG_L2PF=3 MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4 \
                MSM_CUDA_MOE_GG_PERSIST=2; do b $Q3 5,8 ab ${a//,/ } --; b $Q15 8 ab ${a//,/ } --; done; done
        floors
    else
        el arms | tee -a $OUT/gpu.txt
        for i in 1 2 3; do for a in "" $L2_ARMS; do b $Q3 5,8 ab ${a//,/ } --; b $Q15 8 ab ${a//,/ } --; done; done
    fi
    el timeline | tee -a $OUT/gpu.txt
    ROWS=14 tl $Q3 8 q3b8; ROWS=14 tl $Q3 8 q3b8-l2pf1-512 MSM_CUDA_MOE_GG_L2PF=1 MSM_CUDA_MOE_GG_L2PF_BYTES=512
    pack; el done | tee -a $OUT/gpu.txt ;;
r4) hdr  # after the prefetch's removal (HEAD = the thirty-third session's kernels): on an H200 the owed
    # table, the gate/up's chunks in flight and the persistent down, the floors; on an H100 its table
    Q3F=qwen3-30b-a3b-fp8
    el table | tee -a $OUT/gpu.txt; b $Q3 1,2,4,8,16,32,128,256 table --; b $Q15 1,2,4,8,16,32,128,256 table --
    if h200; then
        b $Q3F 1,2,4,8,16,32,128,256 table --
        el arms | tee -a $OUT/gpu.txt
        for i in 1 2 3; do for a in "" MSM_CUDA_MOE_GG_GATEUP_U=3 MSM_CUDA_MOE_GG_GATEUP_U=4 MSM_CUDA_MOE_GG_PERSIST=2; do
            b $Q3 5,8 ab $a --; b $Q15 8 ab $a --; done; done
        floors
        el timeline | tee -a $OUT/gpu.txt
        ROWS=14 tl $Q3 8 q3b8; ROWS=14 tl $Q3 8 q3b8-u3 MSM_CUDA_MOE_GG_GATEUP_U=3
    fi
    pack; el done | tee -a $OUT/gpu.txt ;;
r5) hdr; h200 || exit 0; bash $0 r4 ;;  # r4 on an H200 only (a later call for one, once an H100 has run r4)
r6) hdr  # an H100 (the H200 does not come while H100s do): Nsight Compute on the 8-token step's split
    # attention and combine + norm, each alone: where their ~14 / ~6.5 us after their input's end go
    el ncu | tee -a $OUT/gpu.txt
    timeout 400 /usr/local/cuda/bin/ncu --kernel-name "regex:attention_mma_split|moe_add_rmsnorm_cl" --launch-skip 0 \
        --launch-count 4 --section SpeedOfLight --section WarpStateStats --section SchedulerStats \
        --section InstructionStats --section LaunchStats --section Occupancy --section SourceCounters \
        gpu-run/bin/msmoe-bench decode --preset config/models/$Q3.json --backend cuda --batches 8 --context 512 \
        --steps 1 --no-cuda-graphs > $OUT/ncu-att.txt 2>&1
    grep -E "^  [a-z_]+.*\(|Duration|Executed Ipc A|Issue Slots Busy|Warp Cycles Per Issued|Executed Instructions  " $OUT/ncu-att.txt | head -40 | tee -a $OUT/gpu.txt
    el done | tee -a $OUT/gpu.txt ;;
r7) hdr  # the split attention's second look (no bank conflicts, no first rescale, rows at once): kernel
    # tests, logits against the old binaries at 8 prompt tokens + 6 (batch 1) and a batched decode, A/B
    kern_tests "@(attention*|qk*|norm_linear_qk*)"; old_bits $Q3 $Q15 qwen3-30b-a3b-fp8
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        bo $Q3 2,4,8,16 ab --; b $Q3 2,4,8,16 ab --; bo $Q15 1,4,8 ab --; b $Q15 1,4,8 ab --
        bo qwen3-30b-a3b-fp8 8 ab --; b qwen3-30b-a3b-fp8 8 ab --
    done
    el timeline | tee -a $OUT/gpu.txt; ROWS=14 tl $Q3 8 q3b8
    pack; el done | tee -a $OUT/gpu.txt ;;
r8) hdr  # the cluster barriers' restricted release (af2754f) against 65d9b52: every kernel test, logits, A/B
    el kernels | tee -a $OUT/gpu.txt
    timeout 330 gpu-run/bin/test_cuda_kernels --jobs 8 > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt; grep -E "FAIL|rel err|differs|Assert" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
    old_bits $Q3 $Q15 qwen3-30b-a3b-fp8
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        bo $Q3 1,2,4,8,16,32 ab --; b $Q3 1,2,4,8,16,32 ab --; bo $Q15 1,4,8,32 ab --; b $Q15 1,4,8,32 ab --
        bo qwen3-30b-a3b-fp8 2,8 ab --; b qwen3-30b-a3b-fp8 2,8 ab --
    done
    el timeline | tee -a $OUT/gpu.txt; ROWS=14 tl $Q3 8 q3b8
    pack; el done | tee -a $OUT/gpu.txt ;;
r9) hdr  # the session's last call: every kernel test, the presets' invariants, the H100 table of the final
    # code, and two free A/Bs after the attention's changes (its split count; the q/k norm inside it
    # after the FP8 projection)
    el kernels | tee -a $OUT/gpu.txt
    timeout 300 gpu-run/bin/test_cuda_kernels --jobs 8 > $OUT/kernels.txt 2>&1
    tail -1 $OUT/kernels.txt | tee -a $OUT/gpu.txt; grep -E "FAIL|rel err|differs|Assert" $OUT/kernels.txt | head -8 | tee -a $OUT/gpu.txt
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=2 CHECK_VARIANTS="graph replay,multi-stream on,PDL on,qkv MMV + RoPE,block-sliced" timeout 200 \
        python3 tests/gpu/check_presets.py > $OUT/presets.txt 2>&1
    tail -2 $OUT/presets.txt | tee -a $OUT/gpu.txt; echo "FAIL lines: $(grep -c "^FAIL" $OUT/presets.txt)" | tee -a $OUT/gpu.txt
    el table | tee -a $OUT/gpu.txt
    for p in $Q3 $Q15 qwen3-30b-a3b-fp8; do b $p 1,2,4,8,16,32,128,256 table --; done
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for a in "" MSM_CUDA_ATT_MAX_SPLIT=4 MSM_CUDA_ATT_MAX_SPLIT=16; do b $Q3 4,8,16 ab $a --; done
        for a in "" MSM_CUDA_ATT_QK_ROPE=2; do b qwen3-30b-a3b-fp8 2,4,8 ab $a --; done
    done
    pack; el done | tee -a $OUT/gpu.txt ;;
r10) hdr  # att_qk_rope 2 by default (the q/k norm inside the split attention after the FP8 projection too):
    # its preset checks (1 against 2 and 0, bitwise) and three rounds against 1
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=0,2 CHECK_VARIANTS="inside the split attention" timeout 150 python3 tests/gpu/check_presets.py \
        config/models/qwen3-30b-a3b-fp8.json config/models/$Q3.json > $OUT/presets.txt 2>&1
    tail -2 $OUT/presets.txt | tee -a $OUT/gpu.txt; echo "PASS lines: $(grep -c "^PASS" $OUT/presets.txt), FAIL lines: $(grep -c "^FAIL" $OUT/presets.txt)" | tee -a $OUT/gpu.txt
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for a in MSM_CUDA_ATT_QK_ROPE=1 ""; do b qwen3-30b-a3b-fp8 2,4,8,16 ab $a --; b $Q3 8 ab $a --; done; done
    el done | tee -a $OUT/gpu.txt ;;
r11) hdr  # the split attention's split count after its second look (run 11: 4 splits beat 16 at 4 tokens
    # and 8 at 8): caps of 2 / 4 / 8 against the rule's 16 / 16 / 8 / 4 at 2 / 4 / 8 / 16 tokens
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for a in "" MSM_CUDA_ATT_MAX_SPLIT=8 MSM_CUDA_ATT_MAX_SPLIT=4 MSM_CUDA_ATT_MAX_SPLIT=2; do
        b $Q3 2,4,8,16 ab $a --; b qwen3-30b-a3b-fp8 4,8 ab $a --; done; done
    el done | tee -a $OUT/gpu.txt ;;
r12) hdr  # the GQA split cap of 8 by default (against 16: MSM_CUDA_ATT_MMA_SPLIT_GQA_MAX=0): attention
    # kernel tests, the presets' near checks of the split kernel, three rounds
    kern_tests "@(attention*|qk*)"
    el presets | tee -a $OUT/gpu.txt
    CHECK_PROMPTS=2 CHECK_VARIANTS="graph replay,SIMT attention vs the tensor-core kernel split" timeout 120 \
        python3 tests/gpu/check_presets.py config/models/$Q3.json config/models/qwen3-30b-a3b-fp8.json > $OUT/presets.txt 2>&1
    tail -1 $OUT/presets.txt | tee -a $OUT/gpu.txt; echo "PASS lines: $(grep -c "^PASS" $OUT/presets.txt), FAIL lines: $(grep -c "^FAIL" $OUT/presets.txt)" | tee -a $OUT/gpu.txt
    el arms | tee -a $OUT/gpu.txt
    for i in 1 2 3; do for a in MSM_CUDA_ATT_MMA_SPLIT_GQA_MAX=0 ""; do
        b $Q3 2,4,8 ab $a --; b qwen3-30b-a3b-fp8 2,4 ab $a --; b $Q15 1 ab $a --; done; done
    el done | tee -a $OUT/gpu.txt ;;
r13) hdr  # the next session's first call (any GPU): r12's validation of the GQA split cap; on an H200
    # also r4's owed table, the gate/up's chunks in flight and the floors (r4 needs gpu-run/mega_probe)
    # (each in its own folder under $OUT: their arms' files would otherwise mix)
    OUT=$OUT/r12 bash $0 r12
    h200 && OUT=$OUT/r4 bash $0 r4
    cat $OUT/*/gpu.txt >> $OUT/gpu.txt; el done | tee -a $OUT/gpu.txt ;;
esac

#!/usr/bin/env bash
# The twenty-fifth session's device commands (README.md here). From the repository root, with the
# binaries of `BUNDLE_BINS="msmoe-run msmoe-bench test_cuda_kernels timeline" tools/gpu-engine-check bundle`
# built from the commit in each run's gpu.txt and the phase-chain probe
# (nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o gpu-run/mega_probe bench/mega_probe.cu),
# carried as gpu-run/:
#   bash bench/results/2026-12-06-h200-s25/runs.sh rN
source bench/device_run.sh  # el, left, b, tl, prof, ncu_k, hdr, pack
Q15=qwen1.5-moe-a2.7b Q3=qwen3-30b-a3b Q3F=qwen3-30b-a3b-fp8 GLM=glm-4.5-air-fp8

# any GPU: where the attention and router time goes at 1 and 8 tokens (Nsight Compute sections of
# the kernels alone, their first two launches of one eager step), and existing switches whose
# defaults were measured on older kernels: the cluster router up to 8 tokens, the tensor-core split
# attention from one token (two rounds, Qwen3-30B-A3B and its FP8 preset at 1 / 2 / 4 / 8 tokens)
diag() {
    el ncu | tee -a $OUT/gpu.txt
    ncu_k "attention" $Q3 1 att1
    ncu_k "attention_mma_split" $Q3 8 att8
    ncu_k "router_linear_topk" $Q3 8 rt8
    for f in att1 att8 rt8; do
        grep -E "^  [a-z_]+.*\(|Duration|Elapsed Cycles|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issued Warp" \
            $OUT/ncu-$f.txt | head -40 | sed "s/^/$f: /" | tee -a $OUT/gpu.txt
    done
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2; do
        for p in $Q3 $Q3F; do
            b $p 1,2,4,8 sw --
            b $p 2,4,8 sw MSM_CUDA_ROUTER_CLUSTER=8 --
            b $p 1,2 sw MSM_CUDA_ATT_MMA_SPLIT_MIN_T=1 --
        done
    done
}

# any GPU: one shared-memory carveout for every kernel (MSM_CUDA_SMEM_CARVEOUT: the driver otherwise
# picks one a kernel: 32 KiB for the one-token attention, 64 for the router, 200 for the split
# tensor-core attention, run 2's Nsight Compute; an SM changes its split only when idle, so a kernel
# of another split may not start beside the one before), and the one-token SIMT attention at 8
# splits (its 16-block clusters do not fit, so it merges through the workspace; at 8 they may):
# three rounds, Qwen3-30B-A3B and its FP8 preset at 1-32 tokens, Qwen1.5-MoE at 1 / 8 / 32
carveout() {
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for p in $Q3 $Q3F; do
            b $p 1,2,4,8,16,32 co --
            b $p 1,2,4,8,16,32 co MSM_CUDA_SMEM_CARVEOUT=100 --
            b $p 1,2,4,8,16,32 co MSM_CUDA_SMEM_CARVEOUT=87 --
            b $p 1,2 co MSM_CUDA_ATT_MAX_SPLIT=8 --
        done
        b $Q15 1,8,32 co --
        b $Q15 1,8,32 co MSM_CUDA_SMEM_CARVEOUT=100 --
    done
    ROWS=20 tl $Q3 8 q3b8-co100 MSM_CUDA_SMEM_CARVEOUT=100
    ROWS=20 tl $Q3 8 q3b8
}

# any GPU: the shared-memory split the driver gives each kernel of one eager step (Nsight Compute's
# launch statistics, every kernel), in launch order, Qwen3-30B-A3B at 1 and 8 tokens and Qwen1.5-MoE
# at 1: where consecutive kernels ask for different splits
splits() {
    el ncu | tee -a $OUT/gpu.txt
    for a in "$Q3 1 q3b1" "$Q3 8 q3b8" "$Q15 1 q15b1" "$Q3F 8 q3fb8"; do
        set -- $a
        timeout 150 /usr/local/cuda/bin/ncu --clock-control none --section LaunchStats --section Occupancy \
            gpu-run/bin/msmoe-bench decode --preset config/models/$1.json --backend cuda --batches $2 --context 512 \
            --steps 1 --no-cuda-graphs > /tmp/ncu-$3.txt 2>&1
        python3 - /tmp/ncu-$3.txt > $OUT/splits-$3.txt <<'PY'
import re, sys
rows, cur = [], None
for line in open(sys.argv[1], errors="replace"):
    m = re.match(r"\s\s(?:void )?([A-Za-z_][\w:<>, ]*?)(?:\(.*\))? \((\d+, \d+, \d+)\)x\((\d+, \d+, \d+)\)", line)
    if m:
        cur = {"k": m.group(1)[:60], "grid": m.group(2), "blk": m.group(3)}
        rows.append(cur)
        continue
    if cur is None:
        continue
    for key, pat in (("cfg", "Shared Memory Configuration Size"), ("dyn", "Dynamic Shared Memory Per Block"),
                     ("st", "Static Shared Memory Per Block"), ("reg", "Registers Per Thread"),
                     ("occ", "Theoretical Occupancy"), ("lim", "Block Limit Shared Mem")):
        if pat in line:
            parts = line.split()
            cur[key] = parts[-1] + parts[-2].replace("/block", "").replace("register/thread", "r")
print("# kernel, grid, block, shared config, dynamic, static, registers, theoretical occupancy")
for r in rows:
    print(r["k"], "|", r["grid"], "|", r["blk"], "|", r.get("cfg"), "|", r.get("dyn"), "|", r.get("st"), "|",
          r.get("reg"), "|", r.get("occ"))
PY
        head -40 $OUT/splits-$3.txt | tee -a $OUT/gpu.txt
    done
}

# any GPU: one split for the kernels without dynamic shared memory (MSM_CUDA_SMEM_CARVEOUT=14: ~32 KiB,
# 28: ~64 KiB of the 228 an SM has; the split tensor-core attention keeps its 200): run 3's 100 for
# every kernel took the attention's cost down 2.2 us a layer at 8 tokens but the MMVs' up 5 (their
# L1 down to 28 KiB); here the L1 stays 192-224 KiB. Three rounds, then the splits it gave (ncu)
carveout2() {
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for p in $Q3 $Q3F; do
            b $p 1,2,4,8,16,32 co2 --
            b $p 1,2,4,8,16,32 co2 MSM_CUDA_SMEM_CARVEOUT=14 --
            b $p 1,2,4,8,16,32 co2 MSM_CUDA_SMEM_CARVEOUT=28 --
        done
        b $Q15 1,2,8,32 co2 --
        b $Q15 1,2,8,32 co2 MSM_CUDA_SMEM_CARVEOUT=14 --
        b $Q15 1,2,8,32 co2 MSM_CUDA_SMEM_CARVEOUT=28 --
    done
    el ncu | tee -a $OUT/gpu.txt
    for c in 14 28; do
        MSM_CUDA_SMEM_CARVEOUT=$c timeout 150 /usr/local/cuda/bin/ncu --clock-control none --section LaunchStats \
            --kernel-name regex:"^(?!fill)" gpu-run/bin/msmoe-bench decode --preset config/models/$Q3.json --backend cuda \
            --batches 8 --context 512 --steps 1 --no-cuda-graphs > /tmp/ncu-c.txt 2>&1
        grep -E "^  [a-z_]+.*\(|Shared Memory Configuration Size" /tmp/ncu-c.txt | sed -n 1,30p |
            sed -E 's/\(float.*\) \(/ (/; s/\(int.*\) \(/ (/; s/\(const.*\) \(/ (/' | sed "s/^/co$c: /" | tee -a $OUT/gpu.txt
    done
}

# any GPU: a change with no switch against the bundle before it, carried as gpu-old/ (both bundles slim,
# msmoe-run and msmoe-bench only, to fit the 64 MiB a call carries, so no kernel tests): the logits of
# the old and new msmoe-run bitwise (2- and 8-token prompts + 6 decode steps; the 8-token prefill runs
# Qwen3's split attention at 8 tokens, Qwen1.5-MoE's decode the MHA split kernel), then three rounds
# of old against new msmoe-bench, Qwen3-30B-A3B and its FP8 preset at 4-256 tokens, Qwen1.5-MoE at
# 1 / 8 / 32 / 128, into $OUT/bench-TAG.txt; EXTRA (a function) runs inside each round
old_new() {
    local tag=$1 extra=${2:-true}
    [ -f gpu-old/bundle.tar.xz ] && { (cd gpu-old && tar xJf bundle.tar.xz && rm bundle.tar.xz) || return 1; }
    cat gpu-old/REVISION | sed 's/^/old bundle: /' | tee -a $OUT/gpu.txt
    el bitwise | tee -a $OUT/gpu.txt
    for p in $Q15 $Q3 $Q3F; do for ids in 11,22 5,1000,77,300,12,9000,41,2; do
        for v in old new; do
            bin=gpu-run/bin/msmoe-run; lib=$PWD/gpu-run/lib
            [ $v = old ] && bin=gpu-old/bin/msmoe-run && lib=$PWD/gpu-old/lib
            LD_LIBRARY_PATH=$lib timeout 100 $bin --dummy-weights config/models/$p.json --backend cuda --prompt-ids $ids \
                --max-new-tokens 6 --ignore-eos --dump-logits /tmp/l-$v.npy > /tmp/t-$v.txt 2>/dev/null
        done
        echo "$p $ids: $(cmp -s /tmp/l-old.npy /tmp/l-new.npy && cmp -s /tmp/t-old.txt /tmp/t-new.txt && echo same bits || echo DIFFER)" |
            tee -a $OUT/gpu.txt
    done; done
    el ab | tee -a $OUT/gpu.txt
    for i in 1 2 3; do
        for pb in "$Q3 4,8,16,32,128,256" "$Q3F 4,8,16,32,128,256" "$Q15 1,8,32,128"; do
            set -- $pb
            b $1 $2 $tag --
            { el "$1 OLD"; LD_LIBRARY_PATH=$PWD/gpu-old/lib timeout 120 gpu-old/bin/msmoe-bench decode \
                --preset config/models/$1.json --backend cuda --batches $2 --context 512 --steps 30 2>&1 |
                grep -v '^# weights'; } | tee -a $OUT/bench-$tag.txt
        done
        $extra
    done
}

# the split attentions' cluster merge with no clusters kept spare (MSM_CUDA_ATT_CLUSTER_SPARE=0;
# default 8: at one token Qwen3-30B-A3B's SIMT attention, 32 heads x 16 splits, merges through the
# workspace because 32 + 8 clusters of 16 do not fit) at 1 / 2 tokens
spare() {
    for p in $Q3 $Q15; do
        b $p 1,2 sp --
        b $p 1,2 sp MSM_CUDA_ATT_CLUSTER_SPARE=0 --
    done
}

case "$1" in
r1) exec bash bench/results/2026-12-06-h200-s24/runs.sh r1 ;;  # needs an H200 (GLM-4.5-Air FP8): the table on all four
    # presets, the phase-chain probe (batch 1 and 8 floors), Qwen3's timelines at 1 and 8 (still not run)
r2) hdr; diag; el done | tee -a $OUT/gpu.txt; pack ;;
r3) hdr; carveout; el done | tee -a $OUT/gpu.txt ;;
r4) hdr; splits; el done | tee -a $OUT/gpu.txt ;;
r5) hdr; carveout2; el done | tee -a $OUT/gpu.txt ;;
r7) hdr; old_new mg spare; el done | tee -a $OUT/gpu.txt ;;  # the merge weights once a head (851606c) against f4272f9
r8) hdr; old_new m4; el done | tee -a $OUT/gpu.txt ;;  # four columns a thread (810b609) against 851606c
esac

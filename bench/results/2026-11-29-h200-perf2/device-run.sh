#!/usr/bin/env bash
# One device call (perf helper 2): kernel tests + kernel timing table, the GPU check, then decode
# benchmarks of the default build and of single-op variants (env knobs, see the .md).
cd "$(dirname "$0")/../../.."
export LD_LIBRARY_PATH=$PWD/gpu-run/lib PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
B=gpu-run/bin/msmoe-bench
bench() { # label, batches, env...
    local label=$1 batches=$2; shift 2
    echo "## $label" >> "$OUT/bench.txt"
    env "$@" timeout 60 $B decode --preset config/models/qwen1.5-moe-a2.7b.json --backend cuda \
        --batches "$batches" --context 512 --steps 30 ${FLAGS:-} 2>&1 | tee -a "$OUT/bench.txt" | tail -4
}
t0=$(date +%s)
bench "default" 1,8,32
bench "default (repeat)" 1,8,32
bench "moe path wmma (old T>8 path)" 32 MSM_CUDA_MOE_PATH=wmma
bench "moe path grouped_gemv at 8" 8 MSM_CUDA_MOE_PATH=grouped_gemv
bench "linears GEMV up to T=32" 32 MSM_CUDA_GEMV_MAX_T=32
bench "skip MOE_EXPERTS" 1,32 MSM_CUDA_SKIP_OPS=MOE_EXPERTS
bench "skip ATTENTION" 1,32 MSM_CUDA_SKIP_OPS=ATTENTION
bench "skip LINEAR" 1,32 MSM_CUDA_SKIP_OPS=LINEAR
FLAGS=--no-multi-stream bench "default, one stream" 1,8,32
echo "bench done in $(( $(date +%s) - t0 )) s"
MSM_CUDA_BENCH=1 MSM_CUDA_BENCH_OUT=$OUT/timing.md timeout 90 gpu-run/bin/test_cuda_kernels --jobs 1 > "$OUT/kernels.txt" 2>&1
tail -5 "$OUT/kernels.txt"; grep -i "fail\|assert" "$OUT/kernels.txt" | head -20
echo "kernels done in $(( $(date +%s) - t0 )) s"
timeout 110 python3 tests/gpu/check_cuda_vs_cpu.py > "$OUT/check.txt" 2>&1
grep -c PASS "$OUT/check.txt"; grep FAIL "$OUT/check.txt" | head -20; tail -2 "$OUT/check.txt"
echo "check done in $(( $(date +%s) - t0 )) s"
cat "$OUT/timing.md"

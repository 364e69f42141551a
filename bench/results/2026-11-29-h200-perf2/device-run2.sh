#!/usr/bin/env bash
# Second device call: after the reduction fix in the grouped GEMVs. Benchmarks, kernel tests, check.
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
bench "skip MOE_EXPERTS" 32 MSM_CUDA_SKIP_OPS=MOE_EXPERTS
echo "bench done in $(( $(date +%s) - t0 )) s"
timeout 60 gpu-run/bin/test_cuda_kernels --jobs 1 > "$OUT/kernels.txt" 2>&1
tail -2 "$OUT/kernels.txt"; grep -i "fail\|assert" "$OUT/kernels.txt" | head -20
echo "kernels done in $(( $(date +%s) - t0 )) s"
timeout 80 python3 tests/gpu/check_cuda_vs_cpu.py > "$OUT/check.txt" 2>&1
grep -c PASS "$OUT/check.txt"; grep FAIL "$OUT/check.txt" | head -20; tail -1 "$OUT/check.txt"
echo "check done in $(( $(date +%s) - t0 )) s"

#!/bin/sh
# msmoe-bench decode's %HBM column on the CPU backend (the embedded model): no ceiling, no %HBM ("-"
# in its column, no "# %HBM" line); --ceiling GBPS gives one (a "# %HBM ... (--ceiling)" line and a
# percentage); the CUDA backend without a usable GPU says why there is no %HBM (and the engine then
# fails with its own message); --buckets takes a list of positive numbers and refuses anything
# else with a message. Each: PASS/FAIL lines, non-zero exit on any FAIL.
# usage: test_msmoe_bench.sh path/to/msmoe-bench   (run from the repository root)
set -u
BENCH=$1
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
check() { # name, condition (a command)
    name=$1; shift
    if "$@"; then echo "PASS $name"; else echo "FAIL $name"; fails=$((fails + 1)); fi
}
B="$BENCH decode --model models/stories260k-moe --batches 1 --steps 2 --context 32"

$B > "$tmp/none" 2> "$tmp/none.err"
check "no ceiling: exits 0" test $? -eq 0
check "no ceiling: the row's %HBM is -" grep -Eq '^ +1 +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+ +-$' "$tmp/none"
check "no ceiling: no %HBM line" sh -c "! grep -q '^# %HBM' '$tmp/none'"

$B --ceiling 50 > "$tmp/given" 2> "$tmp/given.err"
check "--ceiling: exits 0" test $? -eq 0
check "--ceiling: its %HBM line" grep -q '^# %HBM: .* against 50 GB/s a GPU (--ceiling)' "$tmp/given"
check "--ceiling: the row's %HBM is a percentage" grep -Eq '^ +1 +[0-9.]+ +[0-9.]+ +[0-9]+ +[0-9.]+ +[0-9.]+%$' "$tmp/given"

$B --buckets 1,2 > "$tmp/bk" 2> "$tmp/bk.err"
check "--buckets 1,2: exits 0" test $? -eq 0
for bad in "4,x" "0" "2;4"; do
    $B --buckets "$bad" > "$tmp/bad" 2> "$tmp/bad.err"
    check "--buckets $bad: exits 2" test $? -eq 2
    check "--buckets $bad: says what it expects" grep -q "msmoe-bench: --buckets $bad: expected up to 32 positive numbers" "$tmp/bad.err"
done

if nvidia-smi > /dev/null 2>&1; then
    echo "SKIP cuda without a GPU: this machine has one"
else
    $B --backend cuda > "$tmp/cuda" 2> "$tmp/cuda.err"
    check "cuda without a GPU: fails" test $? -ne 0
    check "cuda without a GPU: says why no %HBM" grep -q 'no %HBM; --ceiling GBPS gives one' "$tmp/cuda.err"
fi
[ "$fails" -eq 0 ]

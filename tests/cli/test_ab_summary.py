#!/usr/bin/env python3
"""bench/ab_summary.py on synthetic bench-TAG.txt content (no GPU): arms keyed by their switches and
flags, rounds gathered per batch, min-max ranges, the change of the median against the baseline arm
(or --base), section and timeline headers ignored, a missing row leaving its round out. Prints a
line per check; exits non-zero if any fails."""
import importlib.util, os, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "bench", "ab_summary.py")
spec = importlib.util.spec_from_file_location("ab", SCRIPT)
ab = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ab)
fails = 0


def expect(what, got, want):
    global fails
    ok = got == want
    fails += not ok
    print(f"{'PASS' if ok else 'FAIL'} {what}: {got!r}" + ("" if ok else f" (want {want!r})"))


def call(ms1, ms8, head):
    rows = [f"# t=3s {head}", "# Qwen3MoeForCausalLM decode, backend cuda, ...",
            " batch    ms/step     p90 ms      tok/s    GB/step     %HBM"]
    if ms1 is not None:
        rows.append(f"     1      {ms1:.3f}      2.947        341      6.134    48.7%")
    rows.append(f"     8      {ms8:.3f}      9.000       1000     12.000    60.0%")
    return rows


lines = ["# t=0s bench"]
for r in range(3):
    lines += call(2.60 + 0.01 * r, 9.00, "q3  ")
    lines += call(2.50 + 0.02 * r if r != 1 else None, 9.10, "q3 MSM_X=1 -- --flag")
lines += ["# t=40s timelines", "# t=41s timeline q3 batch 1 MSM_X=1", " 1 2.000 2.0 1 1.0 1.0%"]
lines += call(7.0, 20.0, "glm MSM_X=1")
runs = ab.parse(lines)
expect("arms", sorted(runs), [("glm", "MSM_X=1"), ("q3", ""), ("q3", "MSM_X=1 -- --flag")])
expect("base rounds at 1", runs[("q3", "")][1], [2.60, 2.61, 2.62])
expect("a failed call's row left out", runs[("q3", "MSM_X=1 -- --flag")][1], [2.50, 2.54])
expect("the timeline's row not taken", len(runs[("q3", "MSM_X=1 -- --flag")][8]), 3)
out = ab.table(runs)
expect("base line", [l for l in out if l.startswith("(base)") and l.split()[1] == "1"][0].split()[2:],
       ["2.600-2.620", "3"])
row = [l for l in out if l.startswith("MSM_X=1 -- --flag") and l.split()[-4] == "1"][0].split()
expect("arm range, rounds, median change", row[-3:], ["2.500-2.540", "2", "-0.090"])
glm = [l for l in out if l.startswith("MSM_X=1 ") and l.split()[1] == "8"]
expect("no baseline: no change printed", glm[0].split()[2:], ["20.000", "1"])
out = ab.table(runs, base="MSM_X=1 -- --flag")
row = [l for l in out if l.startswith("(base)") and l.split()[1] == "8"][0].split()
expect("--base: the other arm's change", row[-1], "-0.100")
# a bench without a ceiling (the CPU backend) prints "-" for %HBM: its rows count all the same
cpu = ab.parse(["# t=0s tiny  ", " batch    ms/step     p90 ms      tok/s    GB/step     %HBM",
                "     1      0.237      0.241       4225      0.001        -"])
expect("a row without %HBM", cpu[("tiny", "")][1], [0.237])
# arms that share a prefix longer than the default column are printed in full, apart
long_a = "MSM_CUDA_FP8_MOE_LEAN=2 MSM_CUDA_LINEAR_ROPE_MMV=1 MSM_CUDA_FP8_GEMV_SPLIT=1"
long_b = "MSM_CUDA_FP8_MOE_LEAN=2 MSM_CUDA_LINEAR_ROPE_MMV=1 MSM_CUDA_FP8_GEMV_SPLIT=2"
out = ab.table(ab.parse(call(2.4, 8.0, "q3f " + long_a) + call(2.3, 8.1, "q3f " + long_b)))
expect("long arm names in full", [l.rsplit(None, 3)[0].strip() for l in out if l.startswith("MSM_")][:2],
       [long_a, long_b])
with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
    f.write("\n".join(lines) + "\n")
r = subprocess.run([sys.executable, SCRIPT, f.name], capture_output=True, text=True)
expect("command line: exit status", r.returncode, 0)
expect("command line: a section per preset", r.stdout.count("## "), 2)
r = subprocess.run([sys.executable, SCRIPT, f.name + ".missing"], capture_output=True, text=True)
expect("a missing file: exit status 1 and its name", (r.returncode, f.name + ".missing" in r.stderr), (1, True))
os.unlink(f.name)
print(f"{fails} failed")
sys.exit(1 if fails else 0)

#!/usr/bin/env python3
"""ab_summary.py: the A/B rounds of a device run's msmoe-bench outputs as one table.

A session's runs.sh calls `b PRESET BATCHES TAG [VAR=value ...] -- [flags]` (bench/device_run.sh)
several times per arm, in rounds, each call appending to bench-TAG.txt a header line
"# t=Ns PRESET [VAR=value ...] [flags]" and msmoe-bench's table (batch, ms/step, p90, tok/s, GB/step,
%HBM). This reads those files and prints, per preset and batch, every arm's range of ms/step over
its rounds (min-max, the form the results READMEs quote), the number of rounds, and the change of
its median against the baseline arm: the one with no switch and no flag, or --base ARM.

usage: ab_summary.py [--base ARM] FILE [FILE ...]
An arm is named by its switches and flags as written in the header ("" for the baseline); a row
that msmoe-bench did not print (a failed call) just leaves that round out.
"""
import re
import statistics
import sys

HDR = re.compile(r"^# t=\d+s (\S+)\s*(.*?)\s*$")
ROW = re.compile(r"^\s*(\d+)\s+([0-9.]+)\s+[0-9.]+\s+\d+\s+[0-9.]+\s+(?:[0-9.]+%|-)\s*$")  # "-": no ceiling


def parse(lines):
    """{(preset, arm): {batch: [ms, ...]}} in the order the arms first appear"""
    runs = {}
    key = None
    for line in lines:
        m = HDR.match(line)
        if m:
            if m.group(1) in ("timeline", "bench", "timelines", "done", "presets", "check", "table"):
                key = None  # el's section lines and timeline headers are not bench calls
            else:
                key = (m.group(1), m.group(2))
                runs.setdefault(key, {})
            continue
        m = ROW.match(line)
        if m and key is not None:
            runs[key].setdefault(int(m.group(1)), []).append(float(m.group(2)))
    return runs


def table(runs, base=""):
    """the report's lines"""
    out = []
    presets = []
    for p, _ in runs:
        if p not in presets:
            presets.append(p)
    for p in presets:
        arms = [a for (q, a) in runs if q == p]
        batches = sorted({b for a in arms for b in runs[(p, a)]})
        w = max([48] + [len(a) for a in arms])  # arms named in full: they often share a long prefix
        out.append(f"## {p}")
        out.append(f"{'arm':{w}s} {'batch':>5s} {'ms/step (min-max)':>19s} {'n':>3s} {'vs base':>8s}")
        for b in batches:
            ref = runs.get((p, base), {}).get(b)
            ref_med = statistics.median(ref) if ref else None
            for a in arms:
                v = runs[(p, a)].get(b)
                if not v:
                    continue
                med = statistics.median(v)
                rng = f"{min(v):.3f}" if len(v) == 1 else f"{min(v):.3f}-{max(v):.3f}"
                d = "" if ref_med is None or a == base else f"{med - ref_med:+.3f}"
                out.append(f"{a or '(base)':{w}s} {b:5d} {rng:>19s} {len(v):3d} {d:>8s}")
        out.append("")
    return out


def main(argv):
    base = ""
    if len(argv) >= 2 and argv[0] == "--base":
        base, argv = argv[1], argv[2:]
    if not argv:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    lines = []
    for path in argv:
        try:
            with open(path) as f:
                lines += f.read().splitlines()
        except OSError as e:
            print(f"ab_summary.py: {path}: {e.strerror}", file=sys.stderr)
            return 1
    print("\n".join(table(parse(lines), base)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

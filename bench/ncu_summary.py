#!/usr/bin/env python3
"""Per-kernel table of one decode step from an ncu CSV (tools/gpu-engine-check with PROFILE=1).

ncu runs `msmoe-bench decode --steps 1 --no-cuda-graphs` (4 steps: 3 warm-up + 1) with
--metrics gpu__time_duration.sum,dram__bytes_read.sum and --cache-control none; the last step
starts at the last embedding kernel. Kernels are serialised under ncu, so the sum of durations
is an upper bound of the step's GPU time (no overlap of the aux stream, no PDL).
usage: ncu_summary.py FILE.csv"""
import collections, csv, io, sys

txt = open(sys.argv[1]).read().splitlines()
start = next(i for i, l in enumerate(txt) if l.startswith('"ID"'))
rows = csv.DictReader(io.StringIO("\n".join(l for l in txt[start:] if l.startswith('"'))))
k = collections.OrderedDict()
for r in rows:
    d = k.setdefault(int(r["ID"]), {"name": r["Kernel Name"], "grid": r.get("Grid Size", "")})
    d[r["Metric Name"]] = float(r["Metric Value"].replace(",", ""))
ks = list(k.values())
emb = [i for i, x in enumerate(ks) if "embed" in x["name"].lower()]
last = ks[emb[-1]:] if emb else ks
tot = sum(x.get("gpu__time_duration.sum", 0) for x in last)
byt = sum(x.get("dram__bytes_read.sum", 0) for x in last)
print(f"last step: {len(last)} kernels, sum of durations {tot / 1e3:.1f} us, DRAM read {byt / 1e9:.3f} GB")
agg = collections.defaultdict(lambda: [0, 0.0, 0.0])
for x in last:
    nm = x["name"].split("(")[0].split("<")[0].replace("void ", "") + " " + x["grid"]
    a = agg[nm]
    a[0] += 1
    a[1] += x.get("gpu__time_duration.sum", 0)
    a[2] += x.get("dram__bytes_read.sum", 0)
print(f"{'kernel grid':62s} {'n':>4s} {'total us':>9s} {'GB':>7s} {'GB/s':>6s} {'avg us':>7s}")
for nm, a in sorted(agg.items(), key=lambda t: -t[1][1]):
    bw = a[2] / a[1] if a[1] else 0
    print(f"{nm[:62]:62s} {a[0]:4d} {a[1] / 1e3:9.1f} {a[2] / 1e9:7.3f} {bw:6.0f} {a[1] / a[0] / 1e3:7.1f}")

#!/usr/bin/env python3
"""The last decode step of an Nsight Systems trace as a timeline (runs where nsys ran).

The trace is `nsys profile --trace=cuda --cuda-graph-trace=node msmoe-bench decode ...` (CUDA
graphs replayed as in serving, programmatic dependent launch on), reported with
`nsys stats --report cuda_gpu_trace --format csv`. Unlike ncu's serialised kernels this shows
what each kernel adds to a step when kernels overlap (PDL, the aux stream): a kernel's "adds" is
how far its end moves the step's end past every kernel before it (0 for one that ends inside
another's span). The step starts at the last embedding kernel.
usage: nsys_step.py TRACE.csv [LAYER_KERNELS]   (LAYER_KERNELS: also print that many kernels of the
step's middle, one a line)"""
import collections, csv, sys

rows = list(csv.DictReader(open(sys.argv[1])))
if not rows:
    sys.exit("no kernels in the trace")
col = lambda key: next(c for c in rows[0] if c.startswith(key))
cs, cd, cn = col("Start"), col("Duration"), col("Name")
cst = next((c for c in rows[0] if c.startswith("Strm")), None)
ks = []
for r in rows:
    try:
        s, d = float(r[cs]), float(r[cd])
    except ValueError:
        continue  # memcpy / memset rows without numbers
    name = r[cn].split("(")[0].split("<")[0].replace("void ", "").strip()
    if not name or "[CUDA mem" in r[cn]:
        continue
    ks.append((s, s + d, name, r.get(cst, "") if cst else ""))
ks.sort()
emb = [i for i, k in enumerate(ks) if "embed" in k[2]]
step = ks[emb[-1]:] if emb else ks
if len(emb) >= 2:  # the step ends where the next one would start: stop at the sampler
    pass
t0 = step[0][0]
end = t0
agg = collections.OrderedDict()
timeline = []
for s, e, n, st in step:
    add = max(0.0, e - max(s, end))
    gap = s - end  # negative: overlaps what ran before
    end = max(end, e)
    a = agg.setdefault(n, [0, 0.0, 0.0])
    a[0] += 1
    a[1] += e - s
    a[2] += add
    timeline.append((s - t0, e - s, gap, add, n, st))
total = end - t0
print(f"last step: {len(step)} kernels, {total / 1e3:.1f} us from the first kernel's start to the last one's end")
print(f"{'kernel':46s} {'n':>4s} {'sum us':>9s} {'avg us':>8s} {'adds us':>9s} {'adds %':>7s}")
for n, (c, d, a) in sorted(agg.items(), key=lambda kv: -kv[1][2]):
    print(f"{n[:46]:46s} {c:4d} {d / 1e3:9.1f} {d / c / 1e3:8.2f} {a / 1e3:9.1f} {100 * a / total:6.1f}%")
if len(sys.argv) > 2:
    m = int(sys.argv[2])
    mid = len(timeline) // 2
    print(f"\n{m} kernels of the step's middle (us: start from the step's start, duration, gap after the "
          "previous end (negative: overlap), what it adds; stream)")
    for s, d, g, a, n, st in timeline[mid:mid + m]:
        print(f"{s / 1e3:9.2f} {d / 1e3:7.2f} {g / 1e3:7.2f} {a / 1e3:6.2f}  {n[:50]} {st}")

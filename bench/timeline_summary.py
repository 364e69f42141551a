#!/usr/bin/env python3
"""timeline_summary.py: one CUDA graph replay of a decode step, from bench/cupti_timeline.c's CSV.

    python3 bench/timeline_summary.py T.csv [--graph ID] [--rows N] [--replay last|median] [--min-nodes N]

For each graph (the largest first, or --graph), the replays are its records cut into runs of as
many records as the graph has nodes. Of the median replay (by span) it prints:
  - span (first start to last end), the sum of kernel times, the union of busy time and the idle
    time in which no kernel of the graph ran;
  - per kernel (name, grid): count a replay, mean time, and the time it is the only thing running
    vs shares the GPU with another kernel, with the idle gap before each of its starts that no
    other kernel covered ("gap": launch/dependency latency charged to the kernel that ends it);
  - the time between replays (the host's part of a step) and the copies in it;
  - the first --rows records in start order: offset, time, gap, stream, kernel.
Times in microseconds. The numbers come with CUPTI's per-kernel timestamp cost; compare them with
msmoe-bench's step time of the same run."""
import argparse
import csv
import re
import statistics
import subprocess
import sys
from collections import defaultdict


def short(name):
    n = re.sub(r"^void ", "", name)
    base = re.split(r"[<(]", n, maxsplit=1)[0]
    # keep the boolean/integer template arguments: they tell variants apart
    m = re.match(r"[^<]*<([^()]*)>", n)
    if m and len(m.group(1)) < 60:
        base += "<" + m.group(1).replace(" ", "") + ">"
    return base


def demangle(names):
    """Mangled C++ names -> readable ones through c++filt where it exists (binutils), else as given."""
    names = sorted(set(names))
    try:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True, timeout=30).stdout
        got = out.split("\n")[: len(names)]
        if len(got) == len(names):
            return dict(zip(names, got))
    except (OSError, subprocess.SubprocessError):
        pass
    return {n: n for n in names}


def load(path):
    rows = []
    with open(path, newline="") as f:
        recs = list(csv.DictReader(f))
    readable = demangle(r["name"] for r in recs)
    for r in recs:
        rows.append(
            dict(
                s=int(r["start_ns"]),
                e=int(r["end_ns"]),
                stream=int(r["stream"]),
                graph=int(r["graph_id"]),
                node=int(r["graph_node"]),
                grid=f'{r["grid_x"]}x{r["grid_y"]}x{r["grid_z"]}',
                regs=int(r["regs"]),
                name=short(readable[r["name"]]),
            )
        )
    return rows


def replays(recs):
    nodes = len({r["node"] for r in recs})
    recs = sorted(recs, key=lambda r: r["s"])
    return [recs[i : i + nodes] for i in range(0, len(recs) - nodes + 1, nodes)], nodes


def analyse(rep):
    t0 = min(r["s"] for r in rep)
    span = max(r["e"] for r in rep) - t0
    # sweep: elementary intervals between all boundaries
    pts = sorted({r["s"] for r in rep} | {r["e"] for r in rep})
    alone = defaultdict(float)
    shared = defaultdict(float)
    busy = 0.0
    for a, b in zip(pts, pts[1:]):
        run = [r for r in rep if r["s"] <= a and r["e"] >= b]
        if not run:
            continue
        busy += b - a
        for r in run:  # an interval several kernels share is split evenly between them
            (alone if len(run) == 1 else shared)[(r["name"], r["grid"])] += (b - a) / len(run)
    gaps = defaultdict(float)
    adv = defaultdict(float)
    order = sorted(rep, key=lambda r: r["s"])
    reach = order[0]["s"]
    gap_of, adv_of = {}, {}
    for r in order:
        k = (r["name"], r["grid"])
        g = max(0, r["s"] - reach)
        a = max(0, r["e"] - reach)
        gaps[k] += g
        adv[k] += a
        gap_of[id(r)], adv_of[id(r)] = g, a
        reach = max(reach, r["e"])
    return t0, span, busy, alone, shared, gaps, gap_of, adv, adv_of


def between(reps, loose):
    """The GPU's time between one replay's last end and the next one's first start (the host's part
    of a step: its inputs up, the launch, its tokens down and the wait for them), median over the
    replay pairs, with what ran in it outside any graph (copies, kernels) and the time from the
    last of those to the next replay's start (the launch's own latency as the GPU sees it)."""
    gaps, busy, lead, names = [], [], [], defaultdict(list)
    for p, q in zip(reps, reps[1:]):
        a, b = max(r["e"] for r in p), min(r["s"] for r in q)
        if b <= a:
            continue
        inside = [r for r in loose if r["s"] >= a and r["e"] <= b]
        gaps.append(b - a)
        busy.append(sum(r["e"] - r["s"] for r in inside))
        lead.append(b - max([r["e"] for r in inside] or [a]))
        for r in inside:
            names[r["name"]].append(r["e"] - r["s"])
    if not gaps:
        return
    n = len(gaps)
    print(f"between replays (median of {n}): gap {statistics.median(gaps)/1e3:.1f} us, of it copies/kernels outside "
          f"graphs {statistics.median(busy)/1e3:.1f}, last of them to the next replay {statistics.median(lead)/1e3:.1f}")
    for k in sorted(names, key=lambda k: -sum(names[k])):
        d = names[k]
        print(f"  {k[:60]:60s} {len(d)/n:5.1f} a gap, mean {statistics.mean(d)/1e3:6.2f} us")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--graph", type=int)
    ap.add_argument("--rows", type=int, default=60)
    ap.add_argument("--replay", choices=["median", "last"], default="median")
    ap.add_argument("--min-nodes", type=int, default=20, help="skip graphs of fewer kernels (not a step)")
    a = ap.parse_args()
    rows = load(a.csv)
    graphs = defaultdict(list)
    for r in rows:
        if r["graph"]:
            graphs[r["graph"]].append(r)
    if not graphs:
        print("no graph kernels in", a.csv)
        return 1
    ids = [a.graph] if a.graph else sorted(graphs, key=lambda g: -len({r["node"] for r in graphs[g]}))
    for gid in ids:
        reps, nodes = replays(graphs[gid])
        if not reps or nodes < a.min_nodes:
            continue
        spans = [max(r["e"] for r in p) - min(r["s"] for r in p) for p in reps]
        pick = reps[-1] if a.replay == "last" else reps[spans.index(sorted(spans)[len(spans) // 2])]
        t0, span, busy, alone, shared, gaps, gap_of, adv, adv_of = analyse(pick)
        ksum = sum(r["e"] - r["s"] for r in pick)
        print(f"## graph {gid}: {nodes} kernels, {len(reps)} replays, span median {statistics.median(spans)/1e3:.1f} us "
              f"(min {min(spans)/1e3:.1f})")
        print(f"replay: span {span/1e3:.1f} us, kernel sum {ksum/1e3:.1f}, busy {busy/1e3:.1f}, idle {(span-busy)/1e3:.1f}, "
              f"streams {sorted({r['stream'] for r in pick})}")
        per = defaultdict(list)
        for r in pick:
            per[(r["name"], r["grid"])].append(r["e"] - r["s"])
        print("adv: how far the kernel's end moved the step's frontier (the latest end of every kernel that")
        print("started before it); the advs add up to the span: the step time charged to each kernel")
        print(f"{'kernel':58s} {'grid':>12s} {'n':>4s} {'mean':>7s} {'total':>8s} {'adv':>8s} {'alone':>8s} {'shared':>8s} {'gap':>7s}")
        for k in sorted(per, key=lambda k: -adv[k]):
            d = per[k]
            print(f"{k[0][:58]:58s} {k[1]:>12s} {len(d):4d} {statistics.mean(d)/1e3:7.2f} {sum(d)/1e3:8.1f} "
                  f"{adv[k]/1e3:8.1f} {alone[k]/1e3:8.1f} {shared[k]/1e3:8.1f} {gaps[k]/1e3:7.1f}")
        tot_gap = sum(gaps.values())
        print(f"{'(sum)':58s} {'':>12s} {len(pick):4d} {'':>7s} {ksum/1e3:8.1f} {sum(adv.values())/1e3:8.1f} "
              f"{sum(alone.values())/1e3:8.1f} {sum(shared.values())/1e3:8.1f} {tot_gap/1e3:7.1f}")
        between(reps, [r for r in rows if not r["graph"]])
        print(f"first {a.rows} kernels: start offset, end offset, time, adv (us), stream, kernel, grid, registers")
        for r in sorted(pick, key=lambda r: r["s"])[: a.rows]:
            print(f"{(r['s']-t0)/1e3:9.2f} {(r['e']-t0)/1e3:9.2f} {(r['e']-r['s'])/1e3:7.2f} {adv_of[id(r)]/1e3:6.2f} "
                  f"{r['stream']:4d}  {r['name'][:60]} {r['grid']} r{r['regs']}")
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

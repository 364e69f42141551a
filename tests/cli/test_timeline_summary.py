#!/usr/bin/env python3
"""bench/timeline_summary.py's arithmetic on a synthetic CUPTI timeline (no GPU): replays are cut by
the graph's node count, each kernel is charged the time its end moved the step's frontier, the
charges add up to the replay's span, idle gaps are found, mangled names are demangled where
c++filt exists, and the time between replays is reported with the copies in it. Prints a line per check; exits non-zero if any fails."""
import csv, importlib.util, os, shutil, subprocess, sys, tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("ts", os.path.join(ROOT, "bench", "timeline_summary.py"))
ts = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ts)

# one replay (us): a [0, 10) main; b [2, 14) aux; c [12, 15) main, started by PDL before b ends;
# d [18, 20) after an idle gap of 3; the same replay twice, 100 us apart
KERNELS = [("ka", 0, 10, 13), ("kb", 2, 14, 19), ("kc", 12, 15, 13), ("_Z2kdv", 18, 20, 13)]
KD = "kd" if shutil.which("c++filt") else "_Z2kdv"  # demangled where binutils' c++filt exists
fails = 0


def expect(what, got, want):
    global fails
    ok = abs(got - want) < 1e-6 if isinstance(want, float) else got == want
    fails += not ok
    print(f"{'PASS' if ok else 'FAIL'} {what}: {got!r}" + ("" if ok else f" (want {want!r})"))


def write_timeline(copies=()):
    """KERNELS' replay twice, then each (start us, end us, kind) copy outside the graph (graph id 0),
    as the timeline's CSV; returns its path."""
    with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False, newline="") as f:
        w = csv.writer(f)
        w.writerow(["start_ns", "end_ns", "stream", "graph_id", "graph_node", "grid_x", "grid_y", "grid_z",
                    "block_x", "regs", "name"])
        for rep in range(2):
            for node, (name, s, e, st) in enumerate(KERNELS):
                w.writerow([(rep * 100 + s) * 1000, (rep * 100 + e) * 1000, st, 5, node, 1, 1, 1, 128, 32, name])
        for s, e, kind in copies:
            w.writerow([s * 1000, e * 1000, 13, 0, 0, 0, 0, 0, 0, 0, f"memcpy {kind} B"])
        return f.name


def report(path, rows):
    """bench/timeline_summary.py's report of path, ROWS kernels listed"""
    return subprocess.run([sys.executable, os.path.join(ROOT, "bench", "timeline_summary.py"), path, "--rows",
                           str(rows), "--min-nodes", "1"], capture_output=True, text=True)


path = write_timeline()
rows = ts.load(path)
reps, nodes = ts.replays(rows)
expect("nodes", nodes, 4)
expect("replays", len(reps), 2)
t0, span, busy, alone, shared, gaps, gap_of, adv, adv_of = ts.analyse(reps[1])
expect("span (us)", span / 1e3, 20.0)
expect("busy (us)", busy / 1e3, 17.0)
name = {r["name"]: r for r in reps[1]}
a, b, c, d = (adv_of[id(name[n])] / 1e3 for n in ("ka", "kb", "kc", KD))
expect("a's advance", a, 10.0)
expect("b's advance (its end past a's)", b, 4.0)
expect("c's advance (past b's end)", c, 1.0)
expect("d's advance (the gap and itself)", d, 5.0)
expect("advances add up to the span", sum(adv.values()) / 1e3, 20.0)
expect("d's gap", gap_of[id(name[KD])] / 1e3, 3.0)
out = report(path, 4)
expect("the report runs", out.returncode, 0)
expect("the report names the span", "span 20.0 us" in out.stdout, True)
os.unlink(path)

# between replays: replay 0 ends at 20 us, replay 1 starts at 100; copies outside the graph (graph id
# 0) of 1, 2 and 1 us in the gap, the last ending 6 us before replay 1; one copy inside a replay,
# which is not in the gap
path = write_timeline(((21, 22, "DtoH 32"), (90, 92, "HtoD 1120"), (93, 94, "HtoD 32"), (5, 6, "HtoD 8")))
out = report(path, 1)
expect("the report with copies runs", out.returncode, 0)
expect("between replays: the gap, its copies and the last copy's lead",
       "between replays (median of 1): gap 80.0 us, of it copies/kernels outside graphs 4.0, "
       "last of them to the next replay 6.0" in out.stdout, True)
expect("the copies in the gap listed, the one inside a replay not",
       ("memcpy HtoD 1120 B" in out.stdout, "memcpy HtoD 8 B" in out.stdout), (True, False))
os.unlink(path)
print(f"{fails} failed")
sys.exit(1 if fails else 0)

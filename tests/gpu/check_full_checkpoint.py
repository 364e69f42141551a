#!/usr/bin/env python3
"""Issue #12 on the GPU machine: a full-size checkpoint written by HF transformers loads at the
speed of the disk, and its logits match HF's float32 logits on the same weights.

Here:   tools/gpu-engine-check bundle            (gpu-run/bin: msmoed, msmoe, msmoe-run, msmoe-bench, test_weights)
There:  python3 tests/gpu/check_full_checkpoint.py   (device run with carry ["gpu-run"]; ~3-5 minutes)

Steps, each printed as it goes, then a summary (also written to $OUT/full-checkpoint.txt):
 1. makes the checkpoint: Qwen2MoeForCausalLM(Qwen2MoeConfig(**preset)) on torch.device("cuda"),
    .to(torch.bfloat16), save_pretrained(CKPT_DIR, max_shard_size="5GB") (~35 s; 27 GB for the
    default preset); reused when CKPT_DIR/.complete names the same preset;
 2. `cat` of its shards from the page cache (best of two after a first read);
 3. msmoed (CUDA backend on GPU 0, default settings: decode graphs captured) started on it:
    seconds from the start to READY=1 (its own NOTIFY_SOCKET) and to a healthy `msmoe health`,
    its STATUS= progress lines and its load log line; PASS when READY <= 1.5 x the cat;
 4. msmoe-bench load --backend cuda --repeat 2, printed as it is (plain reads next to the load);
 5. msmoe-run --backend cuda --dump-logits over a 48-token prompt (one prefill, teacher-forced)
    against HF in float32 on the GPU (the bf16 weights upcast, eager attention and experts):
    max|diff| / max|ref| (PASS <= LOGITS_TOL, default 2e-2: bf16 K/V cache and bf16 GEMM operands
    on the CUDA side) and ||diff|| / ||ref|| for information; HF from_pretrained times (bf16 and
    float32) for information;
 6. gpu-run/bin/test_weights (the CUDA loader against the host reference, bit for bit), if bundled;
 7. from a cold cache (shards dropped with posix_fadvise DONTNEED after a sync): msmoe-bench load
    --cold, whose cat-like line is the disk's sequential read; PASS when the engine's load reaches
    >= 80% of that GB/s;
 8. with two or more GPUs: the logits at --tp 2 (step 5) and msmoe-bench load --tp 2.
Steps past BUDGET_S seconds (default 500) are skipped with a line saying so. Exits 0 when every
check passed, 1 otherwise, 2 when it could not run (no binaries).

Environment: PRESET (default config/models/qwen1.5-moe-a2.7b.json), CKPT_DIR (/tmp/msm-full-ckpt),
KEEP=1 keeps the checkpoint, SKIP_COLD=1, SKIP_HF=1, LOGITS_TOL, BUDGET_S, BIN (gpu-run/bin), OUT, and
BACKEND=cpu for a dry run of the script without a GPU (on a checkpoint already in CKPT_DIR with a
.complete file naming PRESET, e.g. one from bench/make_checkpoint.py)."""
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.environ.get("BIN", os.path.join(ROOT, "gpu-run/bin"))
PRESET = os.environ.get("PRESET", os.path.join(ROOT, "config/models/qwen1.5-moe-a2.7b.json"))
CKPT = os.environ.get("CKPT_DIR", "/tmp/msm-full-ckpt")
TOL = float(os.environ.get("LOGITS_TOL", "2e-2"))
BACKEND = os.environ.get("BACKEND", "cuda")
T0 = time.time()
BUDGET_S = int(os.environ.get("BUDGET_S", "500"))  # skip optional steps past this (the device allows 600)
results = []  # (ok or None for information, line)


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


def check(ok, line):
    results.append((ok, line))
    log(f"{'PASS' if ok else 'FAIL'} {line}")


def info(line):
    results.append((None, line))
    log(f"INFO {line}")


def env():
    e = dict(os.environ)
    lib = os.path.join(os.path.dirname(BIN), "lib")
    if os.path.isdir(lib):
        e["LD_LIBRARY_PATH"] = lib + (":" + e["LD_LIBRARY_PATH"] if e.get("LD_LIBRARY_PATH") else "")
    return e


def run(cmd, timeout, check_rc=True):
    log("$ " + " ".join(cmd))
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env(), cwd=ROOT)
    if check_rc and p.returncode:
        raise RuntimeError(f"{cmd[0]} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-1500:]}")
    return p


def shards():
    return sorted(os.path.join(CKPT, f) for f in os.listdir(CKPT) if f.endswith(".safetensors"))


def ckpt_bytes():
    return sum(os.path.getsize(f) for f in shards())


def drop_cache():
    """Syncs and drops the shards from the page cache (posix_fadvise DONTNEED); returns the share
    still resident by util-linux fincore, or None where fincore is missing."""
    os.sync()
    res, tot = 0, 0
    for f in shards():
        fd = os.open(f, os.O_RDONLY)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.close(fd)
        tot += os.path.getsize(f)
        try:
            out = subprocess.run(["fincore", "-b", "-n", "-o", "RES", f], capture_output=True, text=True)
            res = res + int(out.stdout.split()[0]) if res is not None and out.returncode == 0 else None
        except (OSError, ValueError, IndexError):
            res = None
    return res / tot if res is not None and tot else None


def time_cat():
    t = time.time()
    subprocess.run(["cat", *shards()], stdout=subprocess.DEVNULL, check=True)
    return time.time() - t


# ---- 1. the checkpoint ------------------------------------------------------------------------

MAKE = r'''
import json, sys, time, torch, transformers as T
preset, out = sys.argv[1], sys.argv[2]
c = {k: v for k, v in json.load(open(preset)).items() if k not in ("architectures", "model_type", "torch_dtype")}
torch.manual_seed(0)
t = time.time()
with torch.device("cuda"):
    model = T.Qwen2MoeForCausalLM(T.Qwen2MoeConfig(**c))
model = model.to(torch.bfloat16)
t1 = time.time()
model.save_pretrained(out, max_shard_size="5GB")
print(f"built in {t1 - t:.1f} s, saved in {time.time() - t1:.1f} s; transformers {T.__version__}, torch {torch.__version__}")
'''


def make_checkpoint():
    mark = os.path.join(CKPT, ".complete")
    if os.path.exists(mark) and open(mark).read() == PRESET:
        info(f"checkpoint {CKPT} reused ({ckpt_bytes() / 1e9:.2f} GB)")
        return
    subprocess.run(["rm", "-rf", CKPT])
    p = run([sys.executable, "-c", MAKE, PRESET, CKPT], timeout=240)
    log(p.stdout.strip())
    idx = os.path.join(CKPT, "model.safetensors.index.json")
    names = list(json.load(open(idx))["weight_map"]) if os.path.exists(idx) else []
    fused = [n for n in names if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]
    if fused:
        raise RuntimeError(f"save_pretrained wrote fused expert tensors ({fused[0]}, ...): msmoed reads the "
                           "Hub layout (experts.N.gate_proj.weight); see unfuse_to_hub in tests/golden/make_golden.py")
    open(mark, "w").write(PRESET)
    info(f"checkpoint {CKPT}: {len(shards())} shards, {ckpt_bytes() / 1e9:.2f} GB, {len(names)} tensors")


# ---- 3. msmoed start to ready -------------------------------------------------------------


def daemon_ready(label):
    """Starts msmoed on the checkpoint; returns (seconds to READY=1, seconds to healthy, log)."""
    sock, nsock = "/tmp/msm-full.sock", "/tmp/msm-full-notify.sock"
    for p in (sock, nsock):
        if os.path.exists(p):
            os.unlink(p)
    ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    ns.bind(nsock)
    ns.setblocking(False)
    e = env()
    e["NOTIFY_SOCKET"] = nsock
    logf = tempfile.NamedTemporaryFile(mode="w+", suffix=".log", delete=False)
    cmd = [os.path.join(BIN, "msmoed"), "--set", f"engine.model={CKPT}", "--set", f"engine.backend={BACKEND}",
           "--set", f"server.socket={sock}", "--set", "log.level=info"]
    if BACKEND == "cuda":  # one group on GPU 0 (empty engine.gpus: a group per visible GPU, loaded in turn)
        cmd += ["--set", "engine.gpus=0"]
    log("$ " + " ".join(cmd))
    t0 = time.time()
    d = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=e)
    ready = healthy = None
    status = []
    try:
        while time.time() - t0 < 240 and d.poll() is None:
            try:
                while True:
                    m = ns.recv(4096).decode(errors="replace")
                    for line in m.split("\n"):
                        if line.startswith("STATUS="):
                            status.append((time.time() - t0, line[7:]))
                        if line == "READY=1" and ready is None:
                            ready = time.time() - t0
            except BlockingIOError:
                pass
            if ready is not None and healthy is None and os.path.exists(sock):
                h = subprocess.run([os.path.join(BIN, "msmoe"), "--socket", sock, "health"], capture_output=True,
                                   env=env())
                if h.returncode == 0:
                    healthy = time.time() - t0
                    break
            time.sleep(0.01)
    finally:
        d.terminate()
        try:
            d.wait(timeout=60)
        except subprocess.TimeoutExpired:
            d.kill()
        ns.close()
    logf.seek(0)
    text = logf.read()
    os.unlink(logf.name)
    shown = status if len(status) <= 6 else status[:3] + [(None, "...")] + status[-3:]
    for t, s in shown:
        log(f"  {label} STATUS at {t:5.2f} s: {s}" if t is not None else "  ...")
    for line in text.splitlines():
        if "weights" in line or "error" in line or "ready:" in line:
            log(f"  {label} log: {line}")
    if ready is None:
        raise RuntimeError(f"msmoed never sent READY=1 ({label}); its log ends:\n" + "\n".join(text.splitlines()[-15:]))
    return ready, healthy, text


def load_line(text):
    for line in text.splitlines():
        if "GB read in" in line:
            return line[line.index("weights"):]
    return "(no load line)"


# ---- 5. logits against HF float32 -------------------------------------------------------------

HF = r'''
import json, sys, time, numpy as np, torch, transformers as T
d, ids, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
torch.backends.cuda.matmul.allow_tf32 = False


def load(dtype, **kw):
    # device_map="cuda" needs accelerate; without it, load on the host and move (said in the output)
    tries = [(dict(kw, device_map="cuda"), "device_map=cuda"), (kw, "host, then .to(cuda)"),
             ({}, "host, then .to(cuda), default attention and experts")]
    for extra, how in tries:
        try:
            return T.AutoModelForCausalLM.from_pretrained(d, dtype=dtype, **extra).to("cuda"), how
        except (TypeError, ValueError, ImportError) as e:
            print(f"from_pretrained({extra}) failed: {e}", flush=True)
    raise RuntimeError("from_pretrained failed")


t = time.time()
m, how = load(torch.bfloat16)
torch.cuda.synchronize()
print(f"HF from_pretrained bf16 ({how}): {time.time() - t:.1f} s", flush=True)
del m
torch.cuda.empty_cache()
t = time.time()
m, how = load(torch.float32, attn_implementation="eager", experts_implementation="eager")
m.eval()
torch.cuda.synchronize()
print(f"HF from_pretrained float32 ({how}): {time.time() - t:.1f} s", flush=True)
with torch.no_grad():
    lg = m(input_ids=torch.tensor([ids], device="cuda"), use_cache=False).logits[0].float().cpu().numpy()
np.save(out, lg)
'''


def compare_logits(ids, ref, tp):
    import numpy as np
    with tempfile.NamedTemporaryFile(suffix=".npy") as f:
        run([os.path.join(BIN, "msmoe-run"), "--model", CKPT, "--backend", BACKEND, "--tp", str(tp), "--prompt-ids",
             ",".join(map(str, ids)), "--max-new-tokens", "1", "--ignore-eos", "--dump-logits", f.name], timeout=300)
        got = np.load(f.name)
    if got.shape != ref.shape:
        check(False, f"logits at tp {tp}: shape {got.shape}, HF {ref.shape}")
        return
    diff = np.abs(got - ref)
    rel_max = float(diff.max() / np.abs(ref).max())
    rel_norm = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))
    agree = float((got.argmax(-1) == ref.argmax(-1)).mean())
    check(rel_max <= TOL, f"logits vs HF float32 at tp {tp} ({ref.shape[0]} rows): max|diff|/max|ref| = {rel_max:.2e} "
          f"(tol {TOL:g}), ||diff||/||ref|| = {rel_norm:.2e}, argmax agrees on {agree:.0%} of rows")


def bench_load(extra):
    """msmoe-bench load with extra flags; prints it; returns {line label: GB/s} or None on failure."""
    p = run([os.path.join(BIN, "msmoe-bench"), "load", "--model", CKPT, "--backend", BACKEND, *extra],
            timeout=420, check_rc=False)
    print(p.stdout + p.stderr, flush=True)
    if p.returncode:
        check(False, f"msmoe-bench load {' '.join(extra)} exited {p.returncode}")
        return None
    rates = {}
    for line in p.stdout.splitlines():
        if line.startswith(("engine", "plain")):
            info(f"bench {' '.join(extra)}: {line}")
            label, _gb, _s, gbps, _cpu, _rss = line.rsplit(None, 5)
            rates[label.strip()] = float(gbps)
    return rates


def time_left(need_s, what):
    """Whether `need_s` more seconds fit in the 9-minute budget; says so when they do not."""
    if time.time() - T0 + need_s <= BUDGET_S:
        return True
    info(f"skipped {what}: {time.time() - T0:.0f} s gone of the {BUDGET_S} s budget")
    return False


def main():
    if not os.path.exists(os.path.join(BIN, "msmoed")):
        print(f"no binaries in {BIN}: run tools/gpu-engine-check bundle first", file=sys.stderr)
        return 2
    try:
        ngpu = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.count("GPU ")
    except OSError:
        ngpu = 0
    info(f"{ngpu} GPU(s); preset {os.path.basename(PRESET)}; checkpoint dir {CKPT}")
    make_checkpoint()
    gb = ckpt_bytes() / 1e9
    # 2. cat, warm (the cold one is msmoe-bench --cold's first line, below)
    time_cat()
    warm_cat = min(time_cat(), time_cat())
    info(f"cat of the shards, warm: {warm_cat:.2f} s ({gb / warm_cat:.2f} GB/s), best of 2")
    # 3. msmoed, warm
    ready, healthy, text = daemon_ready("warm")
    check(ready <= 1.5 * warm_cat, f"msmoed start to READY=1, warm cache: {ready:.2f} s (healthy at {healthy or 0:.2f} s) "
          f"<= 1.5 x cat {warm_cat:.2f} s = {1.5 * warm_cat:.2f} s; {load_line(text)}")
    # 4. msmoe-bench load, warm
    bench_load(["--repeat", "2"])
    # 5. logits against HF float32
    if os.environ.get("SKIP_HF") != "1" and time_left(150, "the logits against HF"):
        import numpy as np
        rng = random.Random(12)
        vocab = json.load(open(os.path.join(CKPT, "config.json")))["vocab_size"]
        ids = [rng.randrange(vocab) for _ in range(48)]
        with tempfile.NamedTemporaryFile(suffix=".npy") as f:
            p = run([sys.executable, "-c", HF, CKPT, json.dumps(ids), f.name], timeout=300)
            for line in p.stdout.strip().splitlines():
                info(line)
            ref = np.load(f.name)
        for tp in (1, 2) if ngpu >= 2 else (1,):
            compare_logits(ids, ref, tp)
    # 6. the CUDA loader unit test
    tw = os.path.join(BIN, "test_weights")
    if os.path.exists(tw) and BACKEND == "cuda":
        p = run([tw, "--jobs", "1", "--filter", "weights/cuda*"], timeout=300, check_rc=False)
        tail = (p.stdout + p.stderr).strip().splitlines()[-1:] or [""]
        check(p.returncode == 0, f"test_weights (CUDA weights vs the host reference, bitwise): {tail[0]}")
    # 7. cold: three cold reads of the checkpoint (cat, parallel pread, the engine's load)
    if os.environ.get("SKIP_COLD") != "1" and time_left(3 * gb / 1.0 + 30, "the cold-cache run (at 1 GB/s)"):
        resident = drop_cache()
        info(f"page cache dropped: {'?' if resident is None else f'{resident:.0%}'} of the shards resident (fincore)")
        r = bench_load(["--cold"])
        if r:
            cat = r.get("plain read, cat-like (1 thread, 128 KiB reads)", 0.0)
            eng = next((v for k, v in r.items() if k.startswith("engine 1: weights read")), 0.0)
            check(eng >= 0.8 * cat, f"cold cache: the engine's load at {eng:.2f} GB/s >= 80% of cat's {cat:.2f} GB/s "
                  "(the disk's sequential read, same run)")
    # 8. TP 2
    if ngpu >= 2 and time_left(90, "msmoe-bench load --tp 2"):
        bench_load(["--tp", "2"])
    return 0


if __name__ == "__main__":
    try:
        rc = main()
    except Exception as e:  # noqa: BLE001 (every failure ends in the summary)
        check(False, f"could not finish: {e}")
        rc = 1
    finally:
        if os.environ.get("KEEP") != "1" and os.path.isdir(CKPT):
            subprocess.run(["rm", "-rf", CKPT])
    fails = sum(ok is False for ok, _ in results)
    lines = [f"{'PASS' if ok else 'FAIL' if ok is False else 'INFO'} {line}" for ok, line in results]
    summary = "\n".join(["== check_full_checkpoint summary ==", *lines,
                         f"{'ALL PASSED' if not fails and rc == 0 else f'{fails} FAILED'} in {time.time() - T0:.0f} s"])
    print(summary, flush=True)
    if os.environ.get("OUT"):
        os.makedirs(os.environ["OUT"], exist_ok=True)
        open(os.path.join(os.environ["OUT"], "full-checkpoint.txt"), "w").write(summary + "\n")
    sys.exit(rc if rc else (1 if fails else 0))

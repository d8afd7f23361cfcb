"""Judges run_mps.sh's outputs: prints one line per check, NAME <tab> JSON fragment
({"verdict", "figure", ...}) for the GPU suite's records.

Usage: judge.py OUTDIR
"""
import json
import os
import re
import sys

d = sys.argv[1]


def result(name):
    """The JSON after the last RESULT line of a file, or None."""
    try:
        lines = [l for l in open(os.path.join(d, name)) if l.startswith("RESULT ")]
    except OSError:
        return None
    return json.loads(lines[-1][7:]) if lines else None


def text(name):
    try:
        return open(os.path.join(d, name)).read()
    except OSError:
        return ""


def emit(name, verdict, figure, **extra):
    print(f"{name}\t" + json.dumps({"verdict": verdict, "figure": figure, **extra})[1:-1])


alone, mps = result("decode-alone.txt"), result("decode-mps.txt")
if alone and mps:
    ratio = mps["p99_ms"] / alone["p99_ms"]
    emit("decode-p99-beside-neighbour", "PASS" if ratio <= 1.2 else "FAIL",
         f"p50/p99 {mps['p50_ms']}/{mps['p99_ms']} ms beside a busy neighbour at 50/50 vs alone "
         f"{alone['p50_ms']}/{alone['p99_ms']} ms: p99 x{ratio:.2f} (bar 1.2)",
         alone=alone, mps=mps)
else:
    emit("decode-p99-beside-neighbour", "FAIL", "missing", alone=alone, mps=mps)

bare = result("matmul-alone.txt")
neighbour = result("neighbour.txt")
if bare and neighbour and bare.get("tflops"):
    emit("neighbour-throughput", "INFO",
         f"neighbour at 50: {neighbour['tflops']} TFLOP/s over its {neighbour.get('seconds')} s (the decode run beside it for its last ~4 s), "
         f"{100 * neighbour['tflops'] / bare['tflops']:.0f}% of bare {bare['tflops']}",
         bare=bare, neighbour=neighbour)
for cores in (30, 70):
    share = result(f"share-{cores}.txt")
    if bare and share and share.get("tflops") and bare.get("tflops"):
        pct = 100 * share["tflops"] / bare["tflops"]
        emit(f"share-{cores}", "PASS" if abs(pct - cores) <= 5 else "FAIL",
             f"{share['tflops']} TFLOP/s = {pct:.1f}% of bare {bare['tflops']} at cores {cores} (bar +-5)",
             share=share)
    else:
        emit(f"share-{cores}", "FAIL", "missing", share=share)

pre = result("preflight.txt") or {}
fallback = result("preflight-hostshm.txt")
emit("first-client", "PASS" if pre.get("ok") or (fallback or {}).get("ok") else "FAIL",
     f"client {pre}; {text('preflight-servers.txt').strip()}; host-shm fallback: {fallback}")
apps = text("smi-apps.txt").strip()
emit("nvml-processes", "PASS" if "mps-server" in apps else "FAIL",
     "host nvidia-smi while decode and neighbour ran (the server listed: the clients ran "
     "under MPS): " + apps.replace("\n", " | "))

for fw in ("torch", "cupy"):
    out = text(f"memory-{fw}.txt")
    res = result(f"memory-{fw}.txt") or {}
    inside = out.split("INSIDE", 1)[1].strip().replace("\n", " | ") if "INSIDE" in out else ""
    ok = res.get("fit_3g") and res.get("oom_2g") and res.get("total") == 4 << 30
    emit(f"memory-{fw}", "PASS" if ok else "FAIL",
         f"total {res.get('total')} fit 3G {res.get('fit_3g')} OOM at +2G {res.get('oom_2g')}; "
         f"inside nvidia-smi: {inside}; outside: {text(f'memory-{fw}-outside.txt').strip().replace(chr(10), ' | ')}",
         result=res)
ours = result("memory-ours-first.txt") or {}
emit("memory-quota-alone", "PASS" if ours.get("fit_3g") and ours.get("oom_2g") and ours.get("total") == 4 << 30 else "FAIL",
     f"--memory 4GiB with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M (ours refuses first): {ours}")
fence = result("memory-mps-fence-only.txt")
emit("mps-pinned-limit-alone", "INFO", f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M, no quota of ours: {fence}")

fault, neigh = result("fault.txt"), result("fault-neighbour.txt")
after = result("fault-after.txt") or {}
retry = result("fault-after-retry.txt")
recovered = after.get("ok") or (retry or {}).get("ok")
emit("fault", "PASS" if fault and fault.get("error") and recovered else "FAIL",
     f"faulting client: {fault}; neighbour: {neigh}; daemon after: "
     f"{text('fault-daemon.txt').strip()}; new client: {after}; retry: {retry}",
     keeper=text("keeper.txt").strip()[-600:])
stop = text("stop.txt")
clean = ("left in pipe: \n" in stop + "\n" and "nvidia-cuda-mps-control -f" not in stop
         and "nvidia-cuda-mps-server" not in stop)
emit("stop", "PASS" if clean else "FAIL", stop.strip().replace("\n", " | "))

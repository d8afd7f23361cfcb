"""Judges one check of the GPU suite's `reserve` section (issue 24) and prints the JSON
fragment that `record` appends (`verdict` and `figure`, as summarize.py prints them).

  judge.py pattern QUOTA_MIB BARE_RC BARE_JSON SHIM_RC SHIM_JSON
      a reservation pattern run bare and under the shim at QUOTA_MIB: PASS when the
      shim's run ended, and the driver's figure for the process (NVML, at every step)
      never passed the quota; the bare figures beside it
  judge.py loadtime BARE_JSON SHIM_JSON
      median module load and first-function times, bare and under the shim
"""
import json, sys


def parse(text):
    try:
        return json.loads(text or "{}")
    except json.JSONDecodeError:
        return {}


def emit(ok, figure, **extra):
    fields = {"verdict": "PASS" if ok else "FAIL", "figure": figure, **extra}
    print(", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in fields.items()))


def figures(result):
    """(step, driver MiB) at every step."""
    return [(s.get("step"), s.get("driver_mib")) for s in result.get("steps", [])]


def outcome(result):
    return result.get("set") or result.get("load") or "?"


kind = sys.argv[1]
if kind == "pattern":
    quota = float(sys.argv[2])
    bare_rc, bare = int(sys.argv[3]), parse(sys.argv[4])
    shim_rc, shim = int(sys.argv[5]), parse(sys.argv[6])
    peaks = [v for _, v in figures(shim) if isinstance(v, (int, float))]
    peak = max(peaks, default=None)
    ok = shim_rc == 0 and peak is not None and peak <= quota
    bare_steps = " ".join(f"{n}={v}" for n, v in figures(bare))
    emit(
        ok,
        f"shim: {outcome(shim)}, peak {peak} MiB of {quota:.0f}; bare: {outcome(bare)}, {bare_steps}",
        bare_rc=bare_rc,
        shim_rc=shim_rc,
        bare=bare,
        shim=shim,
    )
elif kind == "loadtime":
    bare, shim = parse(sys.argv[2]), parse(sys.argv[3])
    load_b, load_s = bare.get("load_ms_median"), shim.get("load_ms_median")
    fn_b, fn_s = bare.get("function_ms_median"), shim.get("function_ms_median")
    ok = None not in (load_b, load_s, fn_b, fn_s)
    emit(ok, f"load {load_b} ms bare, {load_s} ms shim; first function {fn_b} ms bare, {fn_s} ms shim", bare=bare, shim=shim)
else:
    raise SystemExit(f"unknown check {kind}")

"""Judges one check of the GPU suite's `memory` section and prints the JSON fragment
that `record` appends (with `verdict` and `figure`, so summarize.py prints it as is).

  judge.py pattern RC PEAK_OUTSIDE_MIB QUOTA_MIB RESULT_JSON
      an allocation pattern under the quota: the first allocation fits, every later one
      fits or is CUDA_ERROR_OUT_OF_MEMORY, and the driver's figure for the process
      (nvidia-smi outside, by host PID, sampled through the run; and NVML inside) never
      passes the quota
  judge.py sum RC SMI_USED_INSIDE_MIB APPS_OUTSIDE_MIB...
      the container's used memory in nvidia-smi inside equals the sum of its processes'
      NVML figures within 2 MiB
  judge.py framework RC PEAK_OUTSIDE_MIB QUOTA_MIB RESULT_JSON
      PyTorch / CuPy: 3 GiB fits, 2 GiB more is OutOfMemoryError, and the driver's
      figure stays within the quota
"""
import json, sys


def number(text):
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def emit(ok, figure, **extra):
    fields = {"verdict": "PASS" if ok else "FAIL", "figure": figure, **extra}
    print(", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in fields.items()))


kind = sys.argv[1]
if kind == "pattern":
    rc, peak, quota = int(sys.argv[2]), number(sys.argv[3]), float(sys.argv[4])
    result = json.loads(sys.argv[5] or "{}")
    results = result.get("results", [])
    inside = [s.get("driver_mib") for s in result.get("steps", [])]
    inside_peak = max((v for v in inside if isinstance(v, (int, float))), default=None)
    allowed = {"CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"}
    ok = (
        rc == 0
        and results[:1] == ["CUDA_SUCCESS"]
        and all(r in allowed for r in results)
        and peak is not None
        and peak <= quota
        and (inside_peak is None or inside_peak <= quota)
    )
    fits = results.count("CUDA_SUCCESS")
    emit(
        ok,
        f"{fits}/{len(results)} fit, {len(results) - fits} refused; driver peak {peak} MiB outside, {inside_peak} MiB NVML inside; quota {quota:.0f}",
        rc=rc,
        peak_outside_mib=peak,
        result=result,
    )
elif kind == "sum":
    rc, used = int(sys.argv[2]), number(sys.argv[3])
    apps = [number(a) for a in sys.argv[4:]]
    total = sum(a for a in apps if a is not None)
    ok = rc == 0 and used is not None and len(apps) == 2 and None not in apps and abs(used - total) <= 2
    emit(ok, f"nvidia-smi inside used {used} MiB, processes {apps} MiB (sum {total}), within 2 MiB: {ok}", rc=rc)
elif kind == "framework":
    rc, peak, quota = int(sys.argv[2]), number(sys.argv[3]), float(sys.argv[4])
    result = json.loads(sys.argv[5] or "{}")
    ok = rc == 0 and result.get("fit_3g") is True and result.get("oom_2g") is True and peak is not None and peak <= quota
    emit(ok, f"3 GiB fits: {result.get('fit_3g')}, 2 GiB more OOM: {result.get('oom_2g')}, driver peak {peak} MiB of {quota:.0f}", rc=rc, result=result)
else:
    raise SystemExit(f"unknown check {kind}")

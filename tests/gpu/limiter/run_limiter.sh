#!/usr/bin/env bash
# Compute limiter on a real GPU: tests/gpu/limiter/run_limiter.sh PREFIX OUT
#
# PREFIX holds bin/vgpu (and the shims it installs); OUT receives limiter.json, the raw
# logs and (if matplotlib is there) limiter.png. Runs in about 3 minutes:
#   1. for L in 10 30 50 70: ~10 ms spin kernels, ~100 us spin kernels, a PyTorch MLP at
#      batch 1, each ${CASE_S}s under `vgpu run --cores L`, card utilization sampled from
#      NVML (nvidia-smi, outside the container) every 200 ms: mean and worst 1-s window;
#   2. two containers at 30 and 60 at once (each reports its own busy fraction from
#      kernel count x measured kernel time);
#   3. soft mode (30) alone, then a second container (hard 60) starts: when it falls back;
#   4. no-limit launch overhead: empty-kernel launches/s bare vs under `vgpu run` with a
#      config that has no core limit.
# Every case runs under `timeout`; a failed case is reported as failed, never hangs.
set -u
PREFIX=${1:?usage: run_limiter.sh PREFIX OUT}
OUT=${2:?usage: run_limiter.sh PREFIX OUT}
CASE_S=${CASE_S:-10}
HERE=$(cd "$(dirname "$0")" && pwd)
VGPU="$PREFIX/bin/vgpu"
mkdir -p "$OUT/logs"
export PYTHONUNBUFFERED=1

if [ ! -x "$VGPU" ]; then echo "no $VGPU" >&2; exit 2; fi
KERNELS="$OUT/kernels"
if ! timeout 120 nvcc -O2 -arch=sm_90 -o "$KERNELS" "$HERE/kernels.cu" -lcuda >"$OUT/logs/nvcc.log" 2>&1; then
  echo "nvcc failed:"; cat "$OUT/logs/nvcc.log"; KERNELS=""
fi
HAVE_TORCH=0
python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1 && HAVE_TORCH=1

# sample NAME: NVML card utilization every 200 ms into logs/NAME.util (t_monotonic util)
start_sampler() {
  local name=$1
  ( nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits -i 0 -lms 200 2>/dev/null \
      | while read -r u; do printf '%s %s\n' "$(awk '{print $1}' /proc/uptime)" "$u"; done ) >"$OUT/logs/$name.util" &
  SAMPLER=$!
}
# The sampler is a pipeline in a subshell: killing the subshell leaves nvidia-smi (and
# its reader) writing on, so stop every sampling nvidia-smi, then reap the subshell.
stop_sampler() { pkill -f -- "-lms 200" 2>/dev/null; kill "$SAMPLER" 2>/dev/null; wait "$SAMPLER" 2>/dev/null; }

# run_case NAME LIMIT WORKLOAD...: one container under --cores LIMIT (or "none")
run_case() {
  local name=$1 limit=$2; shift 2
  local cores=(); [ "$limit" != none ] && cores=(--cores "$limit")
  start_sampler "$name"
  sleep 0.5
  timeout $((CASE_S + 40)) "$VGPU" run --memory 8GiB "${cores[@]}" -- "$@" >"$OUT/logs/$name.out" 2>"$OUT/logs/$name.err"
  echo $? >"$OUT/logs/$name.rc"
  sleep 0.5
  stop_sampler
}

# The MLP's own utilization with no limit: a launch-bound loop cannot reach every limit.
[ "$HAVE_TORCH" = 1 ] && run_case "mlp-none" none python3 "$HERE/mlp.py" "$CASE_S"
for L in 10 30 50 70; do
  if [ -n "$KERNELS" ]; then
    run_case "long-$L" "$L" "$KERNELS" spin 10000 "$CASE_S"
    run_case "short-$L" "$L" "$KERNELS" spin 100 "$CASE_S"
  fi
  [ "$HAVE_TORCH" = 1 ] && run_case "mlp-$L" "$L" python3 "$HERE/mlp.py" "$CASE_S"
done

if [ -n "$KERNELS" ]; then
  # Two containers at once, 30 and 60.
  start_sampler pair
  timeout $((CASE_S + 40)) "$VGPU" run --memory 8GiB --cores 30 -- "$KERNELS" spin 1000 "$CASE_S" >"$OUT/logs/pair-30.out" 2>"$OUT/logs/pair-30.err" &
  P1=$!
  timeout $((CASE_S + 40)) "$VGPU" run --memory 8GiB --cores 60 -- "$KERNELS" spin 1000 "$CASE_S" >"$OUT/logs/pair-60.out" 2>"$OUT/logs/pair-60.err" &
  P2=$!
  wait $P1; echo $? >"$OUT/logs/pair-30.rc"; wait $P2; echo $? >"$OUT/logs/pair-60.rc"
  stop_sampler

  # Soft 30 alone for 4 s, then a hard 60 container joins for 5 s.
  start_sampler soft
  timeout 60 "$VGPU" run --memory 8GiB --cores 30 --core-mode soft -- "$KERNELS" spin 1000 11 >"$OUT/logs/soft.out" 2>"$OUT/logs/soft.err" &
  P1=$!
  sleep 4
  timeout 60 "$VGPU" run --memory 8GiB --cores 60 -- "$KERNELS" spin 1000 5 >"$OUT/logs/soft-other.out" 2>"$OUT/logs/soft-other.err"
  echo $? >"$OUT/logs/soft-other.rc"
  wait $P1; echo $? >"$OUT/logs/soft.rc"
  stop_sampler

  # Launch overhead with no core limit.
  timeout 60 "$KERNELS" empty 3 >"$OUT/logs/overhead-bare.out" 2>"$OUT/logs/overhead-bare.err"; echo $? >"$OUT/logs/overhead-bare.rc"
  timeout 60 "$VGPU" run --memory 8GiB -- "$KERNELS" empty 3 >"$OUT/logs/overhead-shim.out" 2>"$OUT/logs/overhead-shim.err"; echo $? >"$OUT/logs/overhead-shim.rc"
fi

python3 - "$OUT" "$CASE_S" <<'PY'
import glob, json, os, sys
out, case_s = sys.argv[1], float(sys.argv[2])
logs = os.path.join(out, "logs")

def rc(name):
    try:
        return int(open(os.path.join(logs, name + ".rc")).read().strip())
    except Exception:
        return None

def result(name):
    try:
        for line in open(os.path.join(logs, name + ".out")):
            line = line.strip()
            if line.startswith("{"):
                return json.loads(line)
    except Exception:
        pass
    return None

def util(name):
    samples = []
    try:
        for line in open(os.path.join(logs, name + ".util")):
            t, u = line.split()
            samples.append((float(t), float(u)))
    except Exception:
        pass
    return samples

def windows_1s(samples, res=None, skip_s=1.0):
    """Mean utilization per 1-s window of the case's own run (from its t0 and wall time,
    both on /proc/uptime's clock, after a 1 s warm-up)."""
    busy = [(t, u) for t, u in samples if u > 0]
    if not busy:
        return []
    if res and "t0" in res and "wall_s" in res:
        start, end = res["t0"] + skip_s, res["t0"] + res["wall_s"]
    else:
        start, end = busy[0][0] + skip_s, busy[-1][0]
    out, t = [], start
    while t + 1.0 <= end + 1e-6:
        part = [u for s, u in samples if t <= s < t + 1.0]
        if part:
            out.append(sum(part) / len(part))
        t += 1.0
    return out

report = {"case_s": case_s, "cases": [], "pair": {}, "soft": {}, "overhead": {}}
rows = []
natural = windows_1s(util("mlp-none"), result("mlp-none"))
natural_mlp = sum(natural) / len(natural) if natural else None
report["mlp_natural"] = natural_mlp
if natural_mlp is not None:
    rows.append(("mlp-none", 100, natural_mlp, max(natural), None, "reference (no limit)"))
for limit in (10, 30, 50, 70):
    for kind in ("long", "short", "mlp"):
        name = f"{kind}-{limit}"
        if rc(name) is None:
            continue
        res = result(name)
        w = windows_1s(util(name), res)
        mean = sum(w) / len(w) if w else None
        worst = max(w) if w else None
        # A launch-bound MLP cannot go above its own unlimited utilization.
        target = limit if kind != "mlp" or natural_mlp is None else min(limit, natural_mlp)
        ok = rc(name) == 0 and mean is not None and abs(mean - target) <= 5 and worst <= limit + 10
        case = {"name": name, "limit": limit, "target": target, "rc": rc(name), "nvml_mean": mean, "nvml_worst_1s": worst,
                "own_busy_pct": (res or {}).get("busy_pct"), "result": res, "pass": ok}
        report["cases"].append(case)
        rows.append((name, limit, mean, worst, case["own_busy_pct"], "ok" if ok else ("FAILED rc=%s" % rc(name) if rc(name) else "off target")))

for limit in (30, 60):
    res = result(f"pair-{limit}")
    busy = (res or {}).get("busy_pct")
    report["pair"][str(limit)] = {"rc": rc(f"pair-{limit}"), "own_busy_pct": busy, "pass": busy is not None and abs(busy - limit) <= 5}
soft, other = result("soft"), result("soft-other")
if soft and other:
    wins = soft["windows"]
    offset = int((other["t0"] - soft["t0"]) * 10)
    alone = wins[10:max(10, offset)]
    after = wins[offset:offset + 50]
    fell_back_at = next((i for i in range(len(after)) if all(x <= 40 for x in after[i:i + 10])), None)
    settled = after[10:45]
    report["soft"] = {
        "alone_mean": sum(alone) / len(alone) if alone else None,
        "fallback_ms": None if fell_back_at is None else fell_back_at * 100,
        "contended_mean": sum(settled) / len(settled) if settled else None,
        "other_busy_pct": other.get("busy_pct"),
        "pass": fell_back_at is not None and fell_back_at <= 10 and bool(alone) and sum(alone) / len(alone) > 40,
    }
bare, shim = result("overhead-bare"), result("overhead-shim")
if bare and shim:
    report["overhead"] = {"bare_launches_per_s": bare["launches_per_s"], "shim_launches_per_s": shim["launches_per_s"],
                          "ratio": shim["launches_per_s"] / bare["launches_per_s"]}
json.dump(report, open(os.path.join(out, "limiter.json"), "w"), indent=1)

try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 3, figsize=(15, 4), sharey=True)
    for ax, kind in zip(axes, ("long", "short", "mlp")):
        for limit in (10, 30, 50, 70):
            s = util(f"{kind}-{limit}")
            if s:
                ax.plot([t - s[0][0] for t, _ in s], [u for _, u in s], label=f"--cores {limit}")
                ax.axhline(limit, linestyle=":", linewidth=0.8)
        ax.set_title(kind); ax.set_xlabel("s"); ax.legend(fontsize=7)
    axes[0].set_ylabel("NVML utilization %")
    fig.tight_layout(); fig.savefig(os.path.join(out, "limiter.png"), dpi=90)
except Exception as err:
    print("no plot:", err)

print("\n%-10s %5s %9s %10s %9s  %s" % ("case", "limit", "nvml mean", "worst 1s", "own busy", "verdict"))
fmt = lambda x: "-" if x is None else "%.1f" % x
for name, limit, mean, worst, own, verdict in rows:
    print("%-10s %5d %9s %10s %9s  %s" % (name, limit, fmt(mean), fmt(worst), fmt(own), verdict))
for limit, p in report["pair"].items():
    print("pair-%s    own busy %s%%  %s" % (limit, fmt(p["own_busy_pct"]), "ok" if p["pass"] else "FAILED"))
if report["soft"]:
    s = report["soft"]
    print("soft-30    alone %s%%, falls back after %s ms, contended %s%%  %s" % (fmt(s["alone_mean"]), s["fallback_ms"], fmt(s["contended_mean"]), "ok" if s["pass"] else "FAILED"))
else:
    print("soft-30    FAILED (no result)")
if report["overhead"]:
    o = report["overhead"]
    print("overhead   bare %.0f/s, vgpu run (no core limit) %.0f/s, ratio %.3f" % (o["bare_launches_per_s"], o["shim_launches_per_s"], o["ratio"]))
else:
    print("overhead   FAILED (no result)")
PY

#!/usr/bin/env bash
# What a limited launch costs on the CPU, over the simulated driver (not a GPU figure):
#   tests/bench/launch_cost.sh VGPU [N] [PAIRS]
# VGPU is a built `vgpu` (target/release/vgpu; the shims and the sim beside it).
# Runs launch_cost.c N times (default 500000) under `vgpu run --simulate` with a memory
# quota only and with `--cores 99` (a limit that never binds: what is left is what the
# limiter adds), PAIRS interleaved pairs (default 7): the median of each and of the
# pairs' ratios. LAUNCH_STREAM=legacy launches into the legacy default stream (as cudart's
# <<<>>> does) instead of a stream of its own. Wall time on a shared machine is noisy, so with CALLGRIND=1 it also
# counts instructions (valgrind, deterministic): the shim's instructions per limited
# launch on the fast path, and the slow path's (samples, waits, settling) amortized
# over all launches. Under valgrind launches are ~50x slower, so the minimum sample gap
# lets far more launches be sampled than at full speed: the slow path's share there is
# an upper bound.
set -eu
VGPU=${1:?usage: launch_cost.sh VGPU [N] [PAIRS]}
N=${2:-500000}
PAIRS=${3:-7}
HERE=$(cd "$(dirname "$0")" && pwd)
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
cc -O2 -o "$WORK/launch_cost" "$HERE/launch_cost.c" -ldl
quota=(run --simulate --memory 8GiB --)
limited=(run --simulate --memory 8GiB --cores 99 --)
for _ in $(seq 1 "$PAIRS"); do
    q=$("$VGPU" "${quota[@]}" "$WORK/launch_cost" "$N" | cut -d' ' -f1)
    l=$("$VGPU" "${limited[@]}" "$WORK/launch_cost" "$N" | cut -d' ' -f1)
    echo "$q $l"
done | python3 -c '
import statistics as s, sys
pairs = [tuple(map(float, line.split())) for line in sys.stdin if line.strip()]
q = [a for a, _ in pairs]; l = [b for _, b in pairs]
print("pairs (quota only / --cores 99, ns):", " ".join("%.0f/%.0f" % p for p in pairs))
print("median %.0f -> %.0f ns per launch, median ratio %.3f, median difference %.0f ns"
      % (s.median(q), s.median(l), s.median([b / a for a, b in pairs]), s.median([b - a for a, b in pairs])))'
if [ "${CALLGRIND:-0}" = 1 ]; then
    "$VGPU" "${limited[@]}" valgrind --tool=callgrind --callgrind-out-file="$WORK/cg.out" \
        "$WORK/launch_cost" 100000 >/dev/null 2>&1
    callgrind_annotate --tree=calling --inclusive=yes "$WORK/cg.out" | python3 -c '
import re, sys
def num(s): return int(s.replace(",", ""))
inside = False; total = None; calls = []
for line in sys.stdin:
    head = re.match(r"\s*([\d,]+) \([^)]*\)\s+\*\s+\?\?\?:(\S+)", line)
    if head:
        inside = head.group(2).endswith("fast::limited_launch")
        if inside: total = num(head.group(1))
        continue
    call = re.match(r"\s*([\d,]+) \([^)]*\)\s+>\s+\?\?\?:(.*) \(([\d,]+)x\)", line)
    if inside and call: calls.append((num(call.group(1)), call.group(2), num(call.group(3))))
launches = max(c for _, name, c in calls if name == "cuLaunchKernel")
driver = sum(ir for ir, name, _ in calls if name == "cuLaunchKernel")
slow_names = ("begin_sample", "wait_turn", "settle", "cuEventRecord", "push_back", "rides_along")
slow = sum(ir for ir, name, _ in calls if any(k in name for k in slow_names))
sampled = sum(c for _, name, c in calls if "begin_sample" in name)
print("callgrind: %d limited launches, fast path %.0f instructions each in the shim, "
      "slow path %.0f amortized (%d sampled, %.1f %%)"
      % (launches, (total - driver - slow) / launches, slow / launches, sampled, 100 * sampled / launches))'
fi

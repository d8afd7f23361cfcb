"""Sets what the limiter charged each kernel beside what the card ran it for, in one
limited run: the run's `train_kernels.py --by-grid` lines (the PyTorch profiler: each
kernel's launches and mean GPU time per grid) and its limiter trace (`kernel COST_NS
SAMPLES LAUNCHES CHARGED_NS GRID_CLASS NAME` lines: what the limiter learned, how often
it charged it and what it charged in all). Kernels are matched by name (the trace's mangled names through c++filt
where it is on PATH) and class of grid (`grid_class` below, the limiter's
`duty::grid_class`). A diagnostic of the limiter's GPU section, not judged.

Usage: charge_by_kernel.py PROFILE_JSONL TRACE...
Prints one line per matched kernel and class, the largest excess first (what it was
charged less its launches times the profiler's mean), then the totals and what did not
match.
"""
import collections
import json
import shutil
import subprocess
import sys


def grid_class(blocks):
    """The limiter's class of a grid of `blocks` blocks (libcuda-shim duty::grid_class)."""
    if blocks <= 16:
        return blocks
    octave = blocks.bit_length() - 1
    eighth = (blocks >> (octave - 3)) & 7
    return min(17 + (octave - 4) * 8 + eighth, 255)


def demangled(names):
    """The names as c++filt reads them, or as they are where it is not on PATH."""
    if not names or shutil.which("c++filt") is None:
        return {name: name for name in names}
    out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                         text=True, check=False).stdout.splitlines()
    return dict(zip(names, out)) if len(out) == len(names) else {n: n for n in names}


def main():
    profile_path, traces = sys.argv[1], sys.argv[2:]
    profiled = collections.defaultdict(lambda: [0.0, 0.0])  # launches/step, us/step
    steps = None
    for line in open(profile_path):
        row = json.loads(line)
        if "steps" in row:
            steps = row["steps"]
            continue
        if "blocks" not in row:
            sys.exit("the profile needs train_kernels.py --by-grid")
        entry = profiled[(row["kernel"][:160], grid_class(int(row["blocks"])))]
        entry[0] += row["launches_per_step"]
        entry[1] += row["us_per_step"]
    learned = []
    for path in traces:
        for line in open(path):
            parts = line.split(maxsplit=6)
            if len(parts) == 7 and parts[0] == "kernel":
                learned.append((int(parts[1]), int(parts[2]), int(parts[3]), int(parts[4]),
                                int(parts[5]), parts[6].strip()))
    names = demangled(sorted({k[5] for k in learned}))
    rows, unmatched = [], []
    charged_total = ran_total = 0.0
    for cost_ns, samples, launches, charged_ns, klass, name in learned:
        key = (names[name][:160], klass)
        if key not in profiled or profiled[key][0] == 0:
            unmatched.append((charged_ns / 1e3, names[name][:100], klass, launches))
            continue
        per_step, us_per_step = profiled[key]
        mean_us = us_per_step / per_step
        charged = charged_ns / 1e3
        ran = launches * mean_us
        charged_total += charged
        ran_total += ran
        rows.append((charged - ran, charged / max(launches, 1), cost_ns / 1e3, mean_us,
                     samples, launches, klass, names[name][:100]))
    for excess, per_launch, cost, mean, samples, launches, klass, name in sorted(rows, reverse=True):
        print(f"excess_ms {excess / 1e3:8.2f} charged_us {per_launch:8.2f} learned_us {cost:8.2f}"
              f" profiled_us {mean:8.2f} samples {samples:5d} launches {launches:7d}"
              f" class {klass:3d} {name}")
    unmatched_ms = sum(u[0] for u in unmatched) / 1e3
    print(json.dumps({"matched_charged_ms": round(charged_total / 1e3, 1),
                      "matched_ran_ms": round(ran_total / 1e3, 1),
                      "ratio": round(charged_total / ran_total, 3) if ran_total else None,
                      "unmatched_kernels": len(unmatched),
                      "unmatched_charged_ms": round(unmatched_ms, 1),
                      "profiled_steps": steps}))
    for charged, name, klass, launches in sorted(unmatched, reverse=True)[:15]:
        print(f"unmatched charged_ms {charged / 1e3:8.2f} launches {launches:7d} class {klass:3d} {name}")


if __name__ == "__main__":
    main()

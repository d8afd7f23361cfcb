"""Judges contention.sh's runs (the compute limiter beside neighbours, issue 25): writes
OUT/contention.json (every figure), OUT/records.tsv (one "NAME<TAB>JSON fragment" line
per check, with "verdict" and "figure") and prints a table.

Usage: contention.py OUT PARTS

Shares are of the same kernel's bare throughput in this call, per 100 ms window of each
container (streams.c `windows`), over the part of the run both containers were busy
(from 1 s after the later one started: the host's charge factor needs about that). A hard container's worst 1 s (ten windows) is
judged against its limit + 2. Where every container is limited, each busy one's mean is
judged within 5 of its share: its limit, or, where the limits ask for more than two busy
unlimited containers got of the card in the same call (`two-bare-KERNEL`: the card's
switches between slices cost work), its limit's part of that. Beside each, the card's own account: the mean of NVML's
per-process samples (asked from the host, nvml_probe.py) of the same span.
"""
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import nvml_probe  # noqa: E402 (this folder's probe-file reader)
import runlogs  # noqa: E402 (this folder's logs reader)

out, parts = sys.argv[1], sys.argv[2].split()
logs = os.path.join(out, "logs")
records = []
figures = {}


LOGS = runlogs.Logs(logs)
result, why = LOGS.result, LOGS.why


def record(name, verdict, figure, **values):
    records.append((name, verdict, figure))
    figures[name] = dict(verdict=verdict, figure=figure, **values)


PIDS = LOGS.host_pids()
fmt = lambda x: "-" if x is None else f"{x:.1f}"


def bare_share_per_window(kernel):
    """What one 100 ms window of the bare run reads, in the windows' unit (percent of
    the card by nominal work): the reference for 100 % of bare."""
    bare = result(f"bare-{kernel}")
    if not bare:
        return None
    return bare["per_s"] * bare["work_s"] * 100.0 / bare["fit"]


def mean_of(wins):
    """The mean of 100 ms windows' shares, or None without any."""
    return statistics.mean(wins) if wins else None


def worst_second(wins):
    """The highest mean of ten consecutive windows (a second), or None with fewer."""
    if len(wins) < 10:
        return None
    return max(statistics.mean(wins[i:i + 10]) for i in range(len(wins) - 9))


def pair(name, kernel, limits, capacity=None):
    """Judges pair NAME; limits: (limit or None, hard?) of side a and b. capacity: what the
    card gave two busy unlimited containers of this kernel in this call (the sum of their
    shares of bare, `two-bare-KERNEL`), or None: where every side is limited and the
    limits ask for more than that, each side's share is its limit scaled to it."""
    a, b = result(f"{name}-a"), result(f"{name}-b")
    ref = bare_share_per_window(kernel)
    if not (a and b and ref and a.get("windows") and b.get("windows")):
        record(name, "FAIL", f"{why(name + '-a')}; {why(name + '-b')}; bare {why('bare-' + kernel)}")
        return
    start = max(a["t0"], b["t0"]) + 1.0
    end = min(a["t0"] + len(a["windows"]) / 10, b["t0"] + len(b["windows"]) / 10)

    def span(side):
        first = max(0, int(round((start - side["t0"]) * 10)))
        last = int(round((end - side["t0"]) * 10))
        return [w / ref * 100.0 for w in side["windows"][first:last]]

    samples = nvml_probe.samples(os.path.join(logs, name + ".nvml.jsonl"))
    every_limited = all(l is not None for l, _ in limits)
    asked = sum(l for l, _ in limits) if every_limited else None
    scale = min(1.0, capacity / asked) if capacity and asked else 1.0
    figures_ = []
    verdict = "PASS"
    texts = []
    for side, (limit, hard), label in ((a, limits[0], "a"), (b, limits[1], "b")):
        wins = span(side)
        mean, worst = mean_of(wins), worst_second(wins)
        pid = PIDS.get(f"{name}-{label}")
        card = None
        if pid in samples:
            # NVML stamps samples on the wall clock: the run's last seconds, from 1 s in.
            stamps = [ts for ts, _ in samples[pid]]
            card = nvml_probe.mean(samples, pid, stamps[0] + 1_000_000) if stamps else None
        share = limit * scale if every_limited else None
        figures_.append(dict(side=label, limit=limit, hard=hard, mean=mean, worst_1s=worst, card=card,
                             share=share))
        ok = True
        if limit is not None and hard and worst is not None and worst > limit + 2:
            ok = False
        # Each within 5 of its share only where every container has one: an unlimited
        # neighbour takes every time slice the card gives it (about half of a card two
        # busy processes share), whatever the other's limit. The share is of what the
        # card gives busy neighbours: time-slicing two contexts costs work (fixed-work
        # kernels cut by the other's slices), so limits that fill the card get that much
        # less each, as two unlimited containers do.
        if share is not None and (mean is None or abs(mean - share) > 5):
            ok = False
        if not ok:
            verdict = "FAIL"
        role = "unlimited" if limit is None else f"{'hard' if hard else 'soft'} {limit}"
        texts.append(f"{role}: {fmt(mean)}% of bare (worst 1 s {fmt(worst)}), card {fmt(card)}%")
    if not any(l is not None for l, _ in limits):
        # Two unlimited containers: what the card gives busy neighbours, judged by nothing.
        means = [f["mean"] for f in figures_]
        capacity = None if None in means else sum(means)
        record(name, "INFO", f"{kernel}: " + "; ".join(texts) + f" (the card shared: {fmt(capacity)}% of bare)",
               sides=figures_, capacity=capacity)
        return
    if not every_limited:
        target = "hard: worst 1 s <= limit+2"
    elif scale < 1.0:
        target = (f"hard: worst 1 s <= limit+2; each busy: its limit's part of the {fmt(capacity)}% "
                  f"two busy unlimited ones got ({'/'.join(fmt(f['share']) for f in figures_)}) +-5")
    else:
        target = "hard: worst 1 s <= limit+2; each busy: limit+-5"
    record(name, verdict, f"{kernel}: " + "; ".join(texts) + f" ({target})", sides=figures_)


def pair_limits(name):
    """(limit, hard) of each side, from the pair's name."""
    if name.startswith("two-bare"):
        return (None, False), (None, False)
    if name.startswith("two"):
        x, y = name[3:].split("-")[:2]
        return (int(x), True), (int(y), True)
    hard, neighbour = name.split("-")[:2]
    limit = int(hard[4:])
    if neighbour == "soft30":
        return (limit, True), (30, False)
    return (limit, True), (None, False)


if "pairs" in parts:
    for limit in (30, 40, 60):
        for kernel in ("f1ms", "w1ms"):
            for neighbour in ("soft30", "unlimited"):
                name = f"hard{limit}-{neighbour}-{kernel}"
                pair(name, kernel, pair_limits(name))
if "two" in parts:
    for kernel in ("w1ms", "f1ms"):
        pair(f"two-bare-{kernel}", kernel, pair_limits(f"two-bare-{kernel}"))
        capacity = figures.get(f"two-bare-{kernel}", {}).get("capacity")
        for name in (f"two30-60-{kernel}", f"two50-50-{kernel}"):
            pair(name, kernel, pair_limits(name), capacity)


def hostile(name):
    """Judges the hostile tenant (side a, streams.c h1ms at hard 30) beside a busy hard 30
    (side b, w1ms): before the host can act (1-3 s in) and from 5 s in."""
    a, b = result(f"{name}-a"), result(f"{name}-b")
    refs = {"a": bare_share_per_window("f1ms"), "b": bare_share_per_window("w1ms")}
    if not (a and b and all(refs.values()) and a.get("windows") and b.get("windows")):
        record(name, "FAIL", f"{why(name + '-a')}; {why(name + '-b')}; bare {why('bare-f1ms')}, {why('bare-w1ms')}")
        return
    samples = nvml_probe.samples(os.path.join(logs, name + ".nvml.jsonl"))
    # NVML stamps samples on the wall clock, the windows count on the monotonic one:
    # contention.sh read both at once.
    try:
        with open(os.path.join(logs, name + ".clocks")) as f:
            wall, monotonic = (float(x) for x in f.read().split())
    except (OSError, ValueError):
        wall = monotonic = None

    def span(label, since, until):
        """Side LABEL's windows from SINCE to UNTIL s after a's start, in percent of the
        same kind of kernel bare (a: 1 ms spin, b: 1 ms fixed work)."""
        side = a if label == "a" else b
        first = max(0, int(round((a["t0"] + since - side["t0"]) * 10)))
        last = int(round((a["t0"] + until - side["t0"]) * 10))
        return [w / refs[label] * 100.0 for w in side["windows"][first:last]]

    def card(label, since, until):
        """The mean of NVML's samples of side LABEL from SINCE to UNTIL s after a's start."""
        pid = PIDS.get(f"{name}-{label}")
        if pid not in samples or wall is None:
            return None
        at = lambda s: int((a["t0"] + s - monotonic + wall) * 1e6)
        return nvml_probe.mean(samples, pid, at(since), at(until))

    before_a, after_a = span("a", 1.0, 3.0), span("a", 5.0, 9.3)
    after_b = span("b", 5.0, 9.3)
    worst, neighbour = worst_second(after_a), mean_of(after_b)
    ok = worst is not None and worst <= 32 and neighbour is not None and abs(neighbour - 30) <= 5
    record(name, "PASS" if ok else "FAIL",
           f"hostile hard 30 (taught short, launched 10x long into an idle stream) beside a busy "
           f"hard 30: before the host acts (1-3 s) {fmt(mean_of(before_a))}% of bare, card "
           f"{fmt(card('a', 1.0, 3.0))}%; from 5 s {fmt(mean_of(after_a))}% (worst 1 s {fmt(worst)}), "
           f"card {fmt(card('a', 5.0, 9.3))}%; neighbour {fmt(neighbour)}%, card "
           f"{fmt(card('b', 5.0, 9.3))}% (target: worst 1 s <= 32 from 5 s; neighbour 30+-5)",
           before=mean_of(before_a), after=mean_of(after_a), worst_1s=worst, neighbour=neighbour)


if "hostile" in parts:
    hostile("hostile30-hard30")


def trace_text(name):
    """What the limiter's trace of run NAME says, for a figure ("" without one)."""
    counters = LOGS.trace(name)
    if not counters:
        return ""
    keys = ("launches", "fast_path", "sampled", "settled", "settled_idle", "settled_idle_discounted",
            "waits", "waited_ns", "longest_wait_ns", "longest_first_measurement_wait_ns")
    return "; traced: " + ", ".join(f"{k} {counters.get(k, '-')}" for k in keys)


if "decode" in parts:
    alone = result("decode-alone")
    splits = {s: result(f"decode-{s}") for s in ("bare-bare", "50-50", "70-30")}
    bare_max = splits["bare-bare"].get("max_ms") if splits["bare-bare"] else None
    # Nothing ran at all: no PyTorch with CUDA here. The splits are then skipped, not
    # failed (a run that started and gave no result still fails).
    ran = not (alone is None and all(v is None for v in splits.values()))
    if not ran:
        record("decode-beside-neighbour", "SKIP", "no PyTorch with CUDA (or a simulated run)")
    for split, res in splits.items():
        if split == "bare-bare":
            continue
        if not ran:
            record(f"decode-{split}", "SKIP", "no PyTorch with CUDA (or a simulated run)")
            continue
        name = f"decode-{split}"
        if not res or bare_max is None:
            record(name, "FAIL", f"{why(name)}; bare pair: {why('decode-bare-bare')}")
            continue
        ok = res["max_ms"] <= 2 * bare_max
        text = lambda r: f"p50 {r['p50_ms']:.2f} / p99 {r['p99_ms']:.2f} / max {r['max_ms']:.2f} ms, {r['steps_per_s']:.0f} steps/s"
        record(name, "PASS" if ok else "FAIL",
               f"decode at {split.replace('-', ' beside a busy ')}: {text(res)}; the same pair bare: "
               f"{text(splits['bare-bare'])}; alone: {text(alone) if alone else '-'} (target: max <= 2x the bare pair's)"
               + trace_text(name),
               decode=res, bare_pair=splits["bare-bare"], alone=alone)


def launch_cost(kind, key, label):
    runs = [(result(f"{kind}-bare-{i}"), result(f"{kind}-99-{i}")) for i in range(1, 6)]
    ratios = [(b[key], l[key]) for b, l in runs if b and l and key in b and key in l]
    if not ratios:
        record(f"launch-cost-{kind}", "FAIL", f"{why(kind + '-bare-1')}; {why(kind + '-99-1')}")
        return
    ratio = statistics.median(l / b for b, l in ratios)
    b = statistics.median(b for b, _ in ratios)
    l = statistics.median(l for _, l in ratios)
    # The same launches under a memory quota only: the shim forwarding inside `vgpu run`
    # (its coordinator running), without the limiter. --cores 99 against it is the
    # limiter's own cost; the quota-only run against bare is the rest.
    quota = [(result(f"{kind}-quota-{i}"), result(f"{kind}-99-{i}")) for i in range(1, 6)]
    quota = [(q[key], l[key]) for q, l in quota if q and l and key in q and key in l]
    split = ""
    if quota:
        q = statistics.median(q for q, _ in quota)
        own = statistics.median(l / q for q, l in quota)
        split = (f"; quota only {q:.3f} us ({q / b:.3f}x bare), the limiter's own {own:.3f}x "
                 f"(--cores 99 against quota only, median of pairs)")
    record(f"launch-cost-{kind}", "PASS" if ratio <= 1.05 else "FAIL",
           f"{label}: {ratio:.3f}x, the median of {len(ratios)} interleaved pairs "
           f"({', '.join(f'{l / b:.2f}' for b, l in ratios)}); medians bare {b:.3f} us, --cores 99 {l:.3f} us "
           f"(target <=1.05)" + split + trace_text(f"{kind}-99-trace"),
           ratio=ratio, bare_us=b, limited_us=l, pairs=ratios, quota_pairs=quota)


if "launch" in parts:
    launch_cost("launch", "per_launch_us", "driver API, 200k launches")
if "cudart" in parts:
    if os.path.exists(os.path.join(logs, "cudart-bare-1.out")):
        launch_cost("cudart", "per_op_us", "cudart <<<>>> (bench launch), 200k launches")
    else:
        record("launch-cost-cudart", "SKIP", "no nvcc (or a simulated run): bench.cu not built")

with open(os.path.join(out, "contention.json"), "w") as f:
    json.dump(figures, f, indent=1)
with open(os.path.join(out, "records.tsv"), "w") as tsv:
    for name, verdict, figure in records:
        fragment = json.dumps({"verdict": verdict, "figure": figure, **{
            k: v for k, v in figures[name].items() if k not in ("verdict", "figure")}})[1:-1]
        tsv.write(f"{name}\t{fragment}\n")
width = max((len(n) for n, _, _ in records), default=10)
for name, verdict, figure in records:
    print(f"{name:<{width}} {verdict:<5} {figure}")

"""Readers of the limiter scripts' logs/ folder (run_limiter.sh and contention.sh write
it, judge.py and contention.py read it): each run NAME leaves NAME.out (its JSON lines,
bare or after `RESULT `), NAME.err, NAME.rc, NAME.trace.<pid> (VGPU_LIMITER_TRACE, one
per process) and a line `NAME HOST_PID` in pids.txt; runs served in rounds (rounds.py)
print a `ROUND CYCLE` line before each round's RESULT (which carries "cycle"), and
interleave.py leaves rounds.json (each run's rounds and why it was given up); pairs.py
(the launch cost's pairs) leaves NAME-pairs.json and, for each of its sides, .out lines
with "cycle" (and no `ROUND` lines).
"""
import glob
import json
import os


class Logs:
    def __init__(self, folder):
        self.folder = folder

    def path(self, name):
        return os.path.join(self.folder, name)

    def rc(self, name):
        try:
            return int(open(self.path(name + ".rc")).read().strip())
        except (OSError, ValueError):
            return None

    def lines(self, name):
        """The JSON objects a run printed (bare lines, or after `RESULT `)."""
        found = []
        try:
            for line in open(self.path(name + ".out")):
                line = line.strip()
                if line.startswith("RESULT "):
                    line = line[len("RESULT "):]
                if line.startswith("{"):
                    try:
                        found.append(json.loads(line))
                    except json.JSONDecodeError:
                        pass
        except OSError:
            pass
        return found

    def result(self, name):
        """A run's last result; for a run made in rounds (`ROUND N` lines, each round's
        RESULT after its own), its rounds together (`rounds_together`)."""
        found = self.lines(name)
        if not found:
            return None
        if self.rounds_of(name) > 1:
            return rounds_together(found)
        return found[-1]

    def cycles(self, name):
        """{cycle: that round's result} of a run served in rounds (rounds.py); {} for
        one that was not."""
        return {r["cycle"]: r for r in self.lines(name) if isinstance(r.get("cycle"), int)}

    def rounds_state(self):
        """interleave.py's rounds.json (its plan and each run's state), or None."""
        try:
            with open(self.path("rounds.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def pairs_state(self, name):
        """pairs.py's NAME-pairs.json (its plan and each side's state), or None."""
        try:
            with open(self.path(name + "-pairs.json")) as f:
                return json.load(f)
        except (OSError, ValueError):
            return None

    def rounds_of(self, name):
        """How many rounds run NAME was made in (0: not in rounds)."""
        try:
            return sum(1 for line in open(self.path(name + ".out")) if line.startswith("ROUND "))
        except OSError:
            return 0

    def trace(self, name):
        """The limiter's counters of run NAME, summed over its processes ({} without
        any); the `longest_...` counters (`longest_wait_ns`, the part of it
        `longest_first_measurement_wait_ns`, an older trace's `longest_hold_ns`) and
        `fast_clock_counter` (whether a process's fast path read the counter's clock) are
        maxima, not sums."""
        total = {}
        for path in glob.glob(self.path(name + ".trace.*")):
            for line in open(path):
                parts = line.split()
                if len(parts) == 2 and parts[1].isdigit():
                    value = int(parts[1])
                    if parts[0].startswith("longest_") or parts[0] == "fast_clock_counter":
                        total[parts[0]] = max(total.get(parts[0], 0), value)
                    else:
                        total[parts[0]] = total.get(parts[0], 0) + value
        return total

    def learned_charge(self, name):
        """(busy ms charged, ms of learned cost times launches) over run NAME's kernel
        lines (`kernel COST SAMPLES LAUNCHES CHARGED CLASS NAME`, summed over its
        processes), or None where its traces have no such lines (older traces)."""
        charged = learned = 0
        for path in glob.glob(self.path(name + ".trace.*")):
            for line in open(path):
                parts = line.split()
                if len(parts) >= 6 and parts[0] == "kernel":
                    try:
                        cost, launches, kernel_charged = int(parts[1]), int(parts[3]), int(parts[4])
                    except ValueError:
                        continue
                    charged += kernel_charged
                    learned += cost * launches
        return (charged / 1e6, learned / 1e6) if learned > 0 else None

    def tail(self, file):
        """The last line of logs/FILE that is not blank (80 characters at most), or ""."""
        try:
            lines = [l.strip() for l in open(self.path(file)) if l.strip()]
        except OSError:
            lines = []
        return lines[-1][:80] if lines else ""

    def why(self, name):
        """One line on why a run has no result."""
        tail = self.tail(name + ".err")
        return f"rc={self.rc(name)}" + (f": {tail}" if tail else "")

    def host_pids(self):
        """{run name: host PID of its workload} from pids.txt."""
        found = {}
        try:
            for line in open(self.path("pids.txt")):
                parts = line.split()
                if len(parts) == 2 and parts[1].isdigit():
                    found[parts[0]] = int(parts[1])
        except OSError:
            pass
        return found


def rounds_together(results):
    """One result for a run made in rounds of equal length: steps over the rounds' wall
    time, the mean of each round's p50 and p99 and card figure, the worst step; with
    each round's steps/s in `rounds` (a round that printed nothing is missing there)."""
    timed = [r for r in results if r.get("steps_per_s") is not None]
    if not timed:
        return results[-1]
    merged = dict(timed[-1])
    wall = sum(r.get("wall_s", 0) for r in timed)
    if wall > 0 and all("steps" in r for r in timed):
        merged["steps"] = sum(r["steps"] for r in timed)
        merged["wall_s"] = round(wall, 3)
        merged["steps_per_s"] = round(merged["steps"] / wall, 3)
    for key in ("p50_ms", "p99_ms", "card_util"):
        values = [r[key] for r in timed if r.get(key) is not None]
        if values:
            merged[key] = round(sum(values) / len(values), 3)
    worst = [r["max_ms"] for r in timed if r.get("max_ms") is not None]
    if worst:
        merged["max_ms"] = max(worst)
    merged["rounds"] = [r["steps_per_s"] for r in timed]
    return merged

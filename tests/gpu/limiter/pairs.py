"""The launch cost's interleaved pairs (run_limiter.sh's parts `launch` and `cudart`):
one bare and one limited process, each started once and serving rounds of launches
(`streams launch-serve N`, `bench launch-serve N`), take turns, so that the host's
drift cancels in each cycle's ratio and each process's own pace is seen round by round.

Usage: pairs.py NAME LOGS [--pairs P] [--cycles C] [--ready-s S] [--round-s S]
                [--exit-s S] bare: COMMAND... limited: COMMAND...
  COMMAND is the whole command line of a side, wrapper included (run_limiter.sh gives
  `step`'s: bare, and `vgpu run ... --cores 99 --`), ending in a `launch-serve` server.

For each of P pairs (default 5), one after the other: both sides are started at once
(each under `timeout`, in a process group of its own, stderr into LOGS/RUN.err), and
once both said they are ready (a JSON line with "ready": true, within --ready-s, default
60), C cycles (default 30) follow, each one round of each side, bare first in even
cycles and limited first in odd ones (BLLBBL...: neither side has a place of its own):
a round is one line sent to the side's stdin and its answer, a JSON line with
"per_launch_ns", awaited for --round-s (default 10). Then `quit` to both and their exit
(--exit-s, default 15). RUN is NAME-pairP-bare or NAME-pairP-limited; LOGS/RUN.out gets
the side's lines (JSON ones re-written), each round's with "cycle" and "first" added, and
LOGS/RUN.rc its exit status. A side that cannot start, ends before it is ready, is not
ready in time, ends mid-way or misses a round's deadline fails its pair: no more
rounds for either side, both are stopped (stdin closed, then SIGTERM and SIGKILL to
their process groups where they do not end), and LOGS/NAME-pairs.json says why. Nothing
here waits without a deadline.

LOGS/NAME-pairs.json (rewritten as each pair starts and ends, so that a coordinator
killed mid-way leaves what it knew: a pair under way has "rc": null): {"name",
"pairs", "cycles", "runs": {RUN: {"pair", "side", "ready", "rounds", "failed" (why the
pair was given up, or null), "rc"}}, "wall_s"}.

A pair's ratio is the median over its cycles of limited / bare of that cycle (a pace
that drifts from cycle to cycle cancels in each cycle's ratio, and the median leaves
out the cycle a one-off stall hit); the launch cost is the median of the pairs'
ratios (`pair_figures` and `summary`, which judge.py uses too).
"""
import argparse
import json
import math
import os
import select
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from childio import Lines, write_whole  # noqa: E402

SIDES = ("bare", "limited")
# How long a side told to stop (its stdin closed) may take to end before SIGTERM, and
# SIGTERM before SIGKILL.
STOP_GRACE_S = 3


def median_interval(values, miss=0.05):
    """A distribution-free interval holding the median of what VALUES were drawn from
    with probability at least 1 - MISS: the k-th smallest and k-th largest value, k the
    largest count with P(Binomial(n, 1/2) < k) <= MISS / 2 (for 30 values the 10th and
    21st of them, 95.7 %); None for fewer than 6 values, too few for any k."""
    ordered, n = sorted(values), len(values)
    k, below = 0, 0.0
    while k < n:
        below += math.comb(n, k) / 2 ** n
        if below > miss / 2:
            break
        k += 1
    return [ordered[k - 1], ordered[n - k]] if k else None


def pair_figures(bare, limited):
    """One pair's figures from its sides' rounds ({cycle: per-launch ns}): the median of
    the cycles' ratios limited / bare over the cycles both sides have (with the 95 %
    interval of that median from the cycles' scatter, `median_interval`), and each side's
    median per-launch ns; None where no cycle is in common."""
    cycles = sorted(c for c in bare.keys() & limited.keys() if bare[c] > 0)
    if not cycles:
        return None
    ratios = [limited[c] / bare[c] for c in cycles]
    return {"ratio": statistics.median(ratios), "cycles": len(cycles),
            "spread": [min(ratios), max(ratios)], "interval": median_interval(ratios),
            "bare_ns": statistics.median(bare[c] for c in cycles),
            "limited_ns": statistics.median(limited[c] for c in cycles)}


def summary(pairs):
    """The launch cost over pairs' figures (`pair_figures`, None ones left out): the
    median of the pairs' ratios, and of their sides' medians; None without any."""
    pairs = [p for p in pairs if p]
    if not pairs:
        return None
    return {"ratio": statistics.median(p["ratio"] for p in pairs),
            "bare_ns": statistics.median(p["bare_ns"] for p in pairs),
            "limited_ns": statistics.median(p["limited_ns"] for p in pairs)}


def parse_line(line):
    """A side's line as JSON (after an optional `RESULT `), or None."""
    line = line.strip()
    if line.startswith("RESULT "):
        line = line[len("RESULT "):]
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class Side:
    """The coordinator's end of one launch-serve process."""

    def __init__(self, run, pair, side, command, logs, limit_s):
        self.run, self.pair, self.side = run, pair, side
        self.logs = logs
        self.ready = False
        self.rounds = 0
        self.failed = None
        self.rc = None
        self.ns = {}
        self.lines = None
        self.queue = []
        self.ended = False
        self.stopped = False
        self.out = open(os.path.join(logs, run + ".out"), "w")
        self.proc = None
        with open(os.path.join(logs, run + ".err"), "wb") as err:
            try:
                self.proc = subprocess.Popen(
                    ["timeout", "-k", "5", f"{limit_s:.0f}", *command], stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE, stderr=err, start_new_session=True)
            except OSError as error:
                self.fail(f"cannot start: {error}")
                err.write(f"pairs.py: cannot start {command[0]}: {error}\n".encode())
                return
        os.set_blocking(self.proc.stdout.fileno(), False)
        self.lines = Lines(self.proc.stdout.fileno())

    def fail(self, why):
        if self.failed is None:
            self.failed = why
            print(f"pairs: {self.run}: {why}", file=sys.stderr, flush=True)

    def send(self, text):
        """Whether the line reached the side's stdin."""
        try:
            self.proc.stdin.write((text + "\n").encode())
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False

    def read(self):
        """Queues the whole lines the side wrote since the last call; sets `ended` once
        its stdout closed (it ended)."""
        whole, ended = self.lines.read()
        self.ended = self.ended or ended
        self.queue += whole

    def await_line(self, want, deadline):
        """The side's next line that `want(json)` accepts, or None once it ended (`ended`)
        or the deadline passed; the lines before it go to its .out as they came."""
        while True:
            while self.queue:
                line = self.queue.pop(0)
                value = parse_line(line)
                if value is not None and want(value):
                    return value
                self.out.write(line + "\n")
            if self.ended:
                return None
            left = deadline - time.monotonic()
            # Past the deadline, what the side already wrote is still read once.
            readable, _, _ = select.select([self.proc.stdout], [], [], min(max(left, 0), 0.5))
            if readable:
                self.read()
            elif left <= 0:
                return None

    def stop(self, grace_s):
        """Ends the side: stdin closed (a healthy server ends by itself), then SIGTERM and
        SIGKILL to its process group where it is still there; its exit status kept in
        .rc (128 + the signal for a signal)."""
        if self.stopped:
            return
        if self.proc is None:
            self.rc = 127
        else:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
            for sig, wait_s in ((None, grace_s), (signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 10)):
                if sig is not None:
                    try:
                        os.killpg(self.proc.pid, sig)
                    except OSError:
                        pass
                try:
                    self.proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
            code = self.proc.returncode
            self.rc = code if code is None or code >= 0 else 128 - code
            self.proc.stdout.close()
        self.out.close()
        with open(os.path.join(self.logs, self.run + ".rc"), "w") as f:
            f.write(f"{self.rc}\n")
        # Only now: a stop cut short (a SIGTERM meanwhile) is made again by run_pair.
        self.stopped = True

    def state(self):
        return {"pair": self.pair, "side": self.side, "ready": self.ready, "rounds": self.rounds,
                "failed": self.failed, "rc": self.rc}


def run_pair(name, pair, commands, args, started):
    """One pair: both sides started (then `started(sides)`), made ready, served every
    cycle's rounds, stopped (also when this ends early: a SIGTERM). Returns its Sides."""
    limit_s = args.ready_s + args.cycles * args.round_s + args.exit_s + 30
    sides = {side: Side(f"{name}-pair{pair}-{side}", pair, side, commands[side], args.logs, limit_s)
             for side in SIDES}
    try:
        started(sides)
        serve(sides, args)
        for side in sides.values():
            if not side.failed:
                side.send("quit")
        for side in sides.values():
            side.stop(args.exit_s if not side.failed else STOP_GRACE_S)
            # One that did its rounds but did not end as told fails too: a server that
            # does not end on `quit` would hang its next caller.
            if not side.failed and side.rc != 0:
                side.fail(f"ended with rc={side.rc} after its rounds")
    finally:
        for side in sides.values():
            side.stop(0)
    return sides


def serve(sides, args):
    """Waits until both sides are ready, then runs the cycles' rounds; stops at the
    first side that fails."""
    deadline = time.monotonic() + args.ready_s
    for side in sides.values():
        if side.failed:
            continue
        ready = side.await_line(lambda v: v.get("ready") is True, deadline)
        if ready is None:
            side.fail("ended before it was ready" if side.ended
                      else f"not ready within {args.ready_s:g} s")
            continue
        side.ready = True
        side.out.write(json.dumps(ready) + "\n")
    for cycle in range(args.cycles):
        if any(s.failed for s in sides.values()):
            return
        order = SIDES if cycle % 2 == 0 else SIDES[::-1]
        for place, label in enumerate(order):
            side = sides[label]
            sent = side.send(f"round {cycle}")
            answer = side.await_line(lambda v: "per_launch_ns" in v,
                                     time.monotonic() + args.round_s) if sent else None
            if answer is None:
                side.fail(f"ended in cycle {cycle}'s round ({side.rounds} rounds done)"
                          if not sent or side.ended else
                          f"cycle {cycle}'s round not done within {args.round_s:g} s "
                          f"({side.rounds} rounds done)")
                return
            answer.update(cycle=cycle, first=place == 0)
            side.out.write(json.dumps(answer) + "\n")
            side.out.flush()
            side.ns[cycle] = float(answer["per_launch_ns"])
            side.rounds += 1


def main():
    argv = sys.argv[1:]
    if "bare:" not in argv or "limited:" not in argv:
        raise SystemExit(__doc__)
    b, l = argv.index("bare:"), argv.index("limited:")
    if not b < l:
        raise SystemExit(__doc__)
    commands = {"bare": argv[b + 1:l], "limited": argv[l + 1:]}
    if not commands["bare"] or not commands["limited"]:
        raise SystemExit(__doc__)
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("name")
    parser.add_argument("logs")
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--ready-s", type=float, default=60.0)
    parser.add_argument("--round-s", type=float, default=10.0)
    parser.add_argument("--exit-s", type=float, default=15.0)
    args = parser.parse_args(argv[:b])
    # run_limiter.sh's `timeout` ends this with SIGTERM: the sides are stopped first.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    runs = {}
    figures = []
    path = os.path.join(args.logs, f"{args.name}-pairs.json")

    def write_state():
        state = {"name": args.name, "pairs": args.pairs, "cycles": args.cycles,
                 "runs": {run: side.state() for run, side in runs.items()},
                 "wall_s": round(time.monotonic() - began, 1)}
        write_whole(path, state)

    def started(sides):
        runs.update((s.run, s) for s in sides.values())
        write_state()

    for pair in range(1, args.pairs + 1):
        sides = run_pair(args.name, pair, commands, args, started)
        write_state()
        got = pair_figures(sides["bare"].ns, sides["limited"].ns)
        figures.append(got)
        failed = "; ".join(f"{s.side} {s.failed}" for s in sides.values() if s.failed)
        print(f"pairs: {args.name} pair {pair}: "
              + (f"{got['ratio']:.3f}x over {got['cycles']} cycles (bare {got['bare_ns']:.0f} ns, "
                 f"limited {got['limited_ns']:.0f} ns)" if got else "no cycle of both sides")
              + (f"; failed: {failed}" if failed else ""), file=sys.stderr, flush=True)
    total = summary(figures)
    print(f"pairs: {args.name}: " + (f"{total['ratio']:.3f}x, the median of the pairs' ratios"
                                     if total else "no pair measured")
          + f" ({time.monotonic() - began:.1f} s)", file=sys.stderr, flush=True)
    return 1 if any(s.failed for s in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())

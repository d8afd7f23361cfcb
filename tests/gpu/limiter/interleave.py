"""The coordinator of run_limiter.sh's part `torch`: runs many short rounds of several
persistent processes (rounds.py's servers: decode.py, train.py or standin.py with
`serve BASE`), one process computing at a time, in a different order each cycle, so
that every run of a comparison sees the same host pace; judge.py then judges each
limited run against bare by the median of per-cycle ratios.

Usage: interleave.py FIFOS LOGS [--cycles N] [--lead S] [--ready-s S] [--grace-s S]
                     [--exit-s S] GROUP...
  GROUP is SECONDS:NAME,NAME,...: runs whose rounds are SECONDS long (one group is one
  kind of loop; bare first by convention, nothing depends on it). Each run NAME was
  started under its own wrapper (run_limiter.sh's `step`, which writes LOGS/NAME.rc when
  it ends) with `serve FIFOS/NAME`; FIFOS/NAME.cmd and FIFOS/NAME.reply exist.

It opens every run's FIFOs (the reply end to read, without waiting; the command end to
read and write, so that the run's open does not wait either, and closing it is the
run's end of commands), waits until every run said READY (--ready-s, default 90), then
for each of N cycles (default 10) sends each live run, in the cycle's order, `round
CYCLE SECONDS LEAD` and waits for its DONE (the lead-in plus the round plus --grace-s,
default 15), then `quit` to all and waits for their LOGS/NAME.rc (--exit-s, default
30). A run that ends before it is ready, is not ready in time, ends mid-way (its reply
FIFO closes, or its .rc appears) or misses a round's deadline is given up: its FIFOs
are closed (a run still starting or in a round then ends itself, see rounds.py), it
gets no more rounds, and LOGS/rounds.json says why. Nothing here waits without a
deadline; the runs' own `timeout` is the last resort for a process stuck in the driver.

LOGS/rounds.json (rewritten after every stage, so a coordinator killed mid-way leaves
what it knew): {"cycles", "lead_s", "groups", "order" (each cycle's), "runs": {NAME:
{"ready", "rounds", "failed" (why it was given up, or null), "rc", "exit" (how a run
that did all its rounds ended, where not as asked: a note, not a failure, as a one-shot
run's exit status was not judged either)}}, "wall_s"}.
"""
import argparse
import json
import os
import select
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from childio import Lines, write_whole  # noqa: E402

POLL_S = 0.1


def cycle_order(groups, cycle):
    """The runs' order in cycle CYCLE (0-based): each group's runs rotated by the cycle,
    and on odd cycles reversed, and the groups themselves in reverse order: every run
    takes every place in its group, both before and after each other run, so a pace that
    changes over a cycle favours none, and the runs compared with each other (one group)
    stay within a few rounds of each other."""
    order = []
    for _, names in (groups if cycle % 2 == 0 else list(reversed(groups))):
        shift = cycle % len(names)
        turned = names[shift:] + names[:shift]
        order += list(reversed(turned)) if cycle % 2 else turned
    return order


class Run:
    """The coordinator's end of one run."""

    def __init__(self, name, seconds, fifos, logs):
        self.name, self.seconds, self.logs = name, seconds, logs
        base = os.path.join(fifos, name)
        self.reply = os.open(base + ".reply", os.O_RDONLY | os.O_NONBLOCK)
        self.cmd = os.open(base + ".cmd", os.O_RDWR)
        self.lines = Lines(self.reply)
        self.ready = False
        self.rounds = 0
        self.failed = None
        self.closed = False
        self.rc = None
        self.exit = None

    def rc_file(self):
        """The run's exit status once its wrapper wrote it, else None."""
        try:
            with open(os.path.join(self.logs, self.name + ".rc")) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return None

    def read(self):
        """The whole lines the run sent since the last call, and whether its end closed
        (it exited)."""
        return self.lines.read()

    def send(self, text):
        os.write(self.cmd, (text + "\n").encode())

    def close(self):
        if not self.closed:
            self.closed = True
            os.close(self.cmd)
            os.close(self.reply)

    def give_up(self, why):
        self.failed = why
        self.close()
        print(f"interleave: {self.name}: {why}", file=sys.stderr, flush=True)


def wait_for(runs, word, deadline, why_late, why_ended):
    """Waits until each run of `runs` sent a line starting with `word` (returns {run:
    its JSON}); a run that ends first (`why_ended`), or is late for `deadline`
    (`why_late`), is given up."""
    got = {}
    waiting = [r for r in runs if not r.closed]
    while waiting:
        left = deadline - time.monotonic()
        if left <= 0:
            for run in waiting:
                run.give_up(why_late)
            break
        readable, _, _ = select.select([r.reply for r in waiting], [], [], min(POLL_S, left))
        for run in list(waiting):
            lines, ended = run.read() if run.reply in readable else ([], False)
            for line in lines:
                head, _, rest = line.partition(" ")
                if head == word and run not in got:
                    try:
                        got[run] = json.loads(rest) if rest else {}
                    except json.JSONDecodeError:
                        got[run] = {}
            if run in got:
                waiting.remove(run)
            elif ended or run.rc_file() is not None:
                # Its reply end closed, or (one that never opened it) its wrapper ended;
                # the wrapper writes the status a moment after the process ends.
                settle = time.monotonic() + 2
                while run.rc_file() is None and time.monotonic() < settle:
                    time.sleep(POLL_S)
                run.give_up(f"{why_ended} (rc={run.rc_file()})")
                waiting.remove(run)
    return got


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("fifos")
    parser.add_argument("logs")
    parser.add_argument("groups", nargs="+")
    parser.add_argument("--cycles", type=int, default=10)
    parser.add_argument("--lead", type=float, default=0.25)
    parser.add_argument("--ready-s", type=float, default=90.0)
    parser.add_argument("--grace-s", type=float, default=15.0)
    parser.add_argument("--exit-s", type=float, default=30.0)
    args = parser.parse_args()
    groups = []
    for group in args.groups:
        seconds, _, names = group.partition(":")
        groups.append((float(seconds), [n for n in names.split(",") if n]))
    began = time.monotonic()
    runs = {}
    for seconds, names in groups:
        for name in names:
            runs[name] = Run(name, seconds, args.fifos, args.logs)
    orders = []
    state_path = os.path.join(args.logs, "rounds.json")

    def write_state():
        state = {"cycles": args.cycles, "lead_s": args.lead,
                 "groups": [{"seconds": s, "runs": n} for s, n in groups], "order": orders,
                 "runs": {r.name: {"ready": r.ready, "rounds": r.rounds, "failed": r.failed, "rc": r.rc,
                                  "exit": r.exit}
                          for r in runs.values()},
                 "wall_s": round(time.monotonic() - began, 1)}
        write_whole(state_path, state)

    ready = wait_for(list(runs.values()), "READY", began + args.ready_s,
                     f"not ready within {args.ready_s:g} s", "ended before it was ready")
    for run in ready:
        run.ready = True
    print(f"interleave: {len(ready)} of {len(runs)} runs ready in {time.monotonic() - began:.1f} s",
          file=sys.stderr, flush=True)
    write_state()

    for cycle in range(args.cycles):
        order = cycle_order(groups, cycle)
        orders.append(order)
        for name in order:
            run = runs[name]
            if run.closed:
                continue
            run.send(f"round {cycle} {run.seconds:g} {args.lead:g}")
            limit = args.lead + run.seconds + args.grace_s
            if wait_for([run], "DONE", time.monotonic() + limit,
                        f"cycle {cycle}'s round not done within {limit:g} s ({run.rounds} rounds done)",
                        f"ended in cycle {cycle}'s round ({run.rounds} rounds done)"):
                run.rounds += 1
        write_state()

    live = [r for r in runs.values() if not r.closed]
    for run in live:
        run.send("quit")
    # Each run closes its reply end as it exits; then its wrapper writes its .rc.
    deadline = time.monotonic() + args.exit_s
    for run in runs.values():
        while run.rc_file() is None and time.monotonic() < deadline:
            time.sleep(POLL_S)
        run.rc = run.rc_file()
        if run in live:
            run.close()
            if run.rc is None:
                run.exit = f"not ended within {args.exit_s:g} s of quit"
            elif run.rc != 0:
                run.exit = f"ended with rc={run.rc} after its rounds"
    write_state()
    failed = [r.name for r in runs.values() if r.failed]
    print(f"interleave: {args.cycles} cycles in {time.monotonic() - began:.1f} s"
          + (f"; given up: {', '.join(failed)}" if failed else ""), file=sys.stderr, flush=True)


if __name__ == "__main__":
    main()

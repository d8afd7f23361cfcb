"""Timed rounds of a host-bound loop for the compute limiter's GPU section, and the
serving of them on command: decode.py, train.py and standin.py pass their per-step
function here, and interleave.py (the coordinator, run_limiter.sh's part `torch`) runs
many short rounds of several such processes in turn, so that every run of a comparison
sees the same host pace (it drifts by a quarter within a minute).

measure(step, seconds, ...) -> one round's figures (a dict), for a one-shot run too.

Server(base): opens BASE.reply (lines to the coordinator) and BASE.cmd (its commands),
two FIFOs the coordinator made and holds open; make it before the slow start-up (import
torch, the model), so that a coordinator that gives up on a process still loading
(closes its FIFOs) ends it. Then server.serve(step, ...) says `READY {...}` and serves:
  round CYCLE SECONDS LEAD_S   an unmeasured lead-in of LEAD_S, then SECONDS measured;
                               prints `ROUND CYCLE` and `RESULT {...}` on stdout (the
                               run's NAME.out, which runlogs.py reads) and answers
                               `DONE {...}`
  quit (or the end of BASE.cmd) returns, and the process exits as usual (the limiter's
                               trace is written at exit)
Between commands the process waits in a read: no CPU, no GPU work.
"""
import json
import os
import queue
import threading
import time

from cardutil import CardUtil

# How long a process the coordinator gave up on (closed its commands) may take to end
# by itself before it is ended (see Server._listen).
GONE_GRACE_S = 20


def uptime():
    """The host's uptime in seconds (comparable across processes and namespaces)."""
    with open("/proc/uptime") as f:
        return float(f.read().split()[0])


def measure(step, seconds, lead_s=0.0, sync=None, sync_every=0, timed=True, card=None, stop=None):
    """Runs `step()` for `seconds` after `lead_s` of unmeasured steps; returns
    {steps_per_s, steps, wall_s, t0, card_util} and, where `timed` (each step waits for
    its own result, as a decode step does), its steps' p50_ms, p99_ms and max_ms.

    `sync` (with `sync_every`): a loop whose steps do not wait for the card (training)
    waits for it every `sync_every` steps and before the clock stops, so the wall time
    covers the work counted; it is also called after the lead-in, so that no queued work
    of the lead-in is timed. `card`: a CardUtil, started once the lead-in is over.
    `stop()`: asked before each step; true ends the round early (the coordinator gave up).

    The lead-in: a limited process that sat idle between its rounds has a full bucket
    (the limiter lets `limit` of WINDOW_NS = 20 ms of GPU time through at once, see
    libcuda-shim/src/limiter/mod.rs), and a burst of unthrottled steps at the start of
    a short round would flatter it; with a lead-in of 100 ms or more that credit is spent
    (and the host's coordinator, which counts a container active for 200 ms after its
    last work, has stopped counting the previous round's) before the clock starts.
    """
    def run_until(end, counted):
        steps = 0
        while time.perf_counter() < end:
            if stop is not None and stop():
                break
            if counted is not None:
                began = time.perf_counter()
                step()
                counted.append(time.perf_counter() - began)
            else:
                step()
            steps += 1
            if sync_every and steps % sync_every == 0:
                sync()
        return steps

    if lead_s > 0:
        run_until(time.perf_counter() + lead_s, None)
    if sync is not None:
        sync()
    t0 = uptime()
    if card is not None:
        card.start()
    times = [] if timed else None
    start = time.perf_counter()
    steps = run_until(start + seconds, times)
    if sync is not None:
        sync()
    wall = time.perf_counter() - start
    card_util = card.stop() if card is not None else None
    result = {"steps_per_s": round(steps / wall, 3) if wall > 0 else 0.0, "steps": steps,
              "wall_s": round(wall, 3), "t0": t0, "card_util": card_util}
    if timed and times:
        times.sort()
        pick = lambda q: times[min(len(times) - 1, int(q * len(times)))] * 1e3  # noqa: E731
        result.update(p50_ms=round(pick(0.50), 3), p99_ms=round(pick(0.99), 3),
                      max_ms=round(times[-1] * 1e3, 3))
    return result


class Server:
    """One run's end of the coordinator's two FIFOs (see the module's docstring)."""

    def __init__(self, base):
        self.name = os.path.basename(base)
        # Both opens wait for the coordinator, which opens its ends first thing (the
        # reply end to read, the command end to read and write, so neither waits).
        self.reply = open(base + ".reply", "w")
        self.commands_in = open(base + ".cmd")
        self.ready = False
        self.cycle = None
        # Set once the coordinator closed the command FIFO (gave up on this run, or
        # ended): a round under way stops at its next step.
        self.gone = threading.Event()
        self.commands = queue.Queue()
        threading.Thread(target=self._listen, daemon=True).start()

    def _listen(self):
        try:
            for line in self.commands_in:
                if line.split():
                    self.commands.put(line.split())
        except (OSError, ValueError):
            pass
        self.gone.set()
        if not self.ready:
            # Given up on while still starting (stuck in start-up, or the coordinator
            # died): nothing was measured and nothing will be asked; end now.
            os._exit(3)
        self.commands.put(None)
        # Given up on, or the coordinator died: a round under way stops at its next step
        # and the process ends as usual (its limiter trace written); one stuck in the
        # driver is ended here instead (this thread dies with a process that ends).
        time.sleep(GONE_GRACE_S)
        os._exit(4)

    def _say(self, word, fields):
        try:
            self.reply.write(f"{word} {json.dumps(fields)}\n")
            self.reply.flush()
            return True
        except (BrokenPipeError, OSError, ValueError):
            return False  # the coordinator is gone

    def serve(self, step, **how):
        """Serves rounds of `step` (`how`: measure's sync, sync_every, timed) until told
        to quit or the coordinator is gone."""
        card = CardUtil()
        self.ready = True
        info = {"name": self.name, "pid": os.getpid(), "t": uptime()}
        print("READY " + json.dumps(info), flush=True)
        if not self._say("READY", info):
            return
        while True:
            command = self.commands.get()
            if command is None or command[0] == "quit":
                return
            if command[0] != "round" or len(command) != 4:
                self._say("ERROR", {"command": command})
                continue
            self.cycle, seconds, lead_s = int(command[1]), float(command[2]), float(command[3])
            result = measure(step, seconds, lead_s=lead_s, card=card, stop=self.gone.is_set, **how)
            result.update(cycle=self.cycle, lead_s=lead_s)
            if self.gone.is_set():
                return  # cut short: not a round to count
            print(f"ROUND {self.cycle}", flush=True)
            print("RESULT " + json.dumps(result), flush=True)
            if not self._say("DONE", result):
                return


def main(step, argv, usage, one_shot_s=5.0, server=None, **how):
    """What decode.py, train.py and standin.py do with their arguments: `serve BASE`
    (with `server`, the Server they made before their start-up) serves rounds; `SECONDS`
    (default `one_shot_s`) measures one run and prints its RESULT line."""
    if server is not None:
        server.serve(step, **how)
        return
    if argv and argv[0] == "serve":
        raise SystemExit(usage)
    seconds = float(argv[0]) if argv else one_shot_s
    card = CardUtil()
    print("RESULT " + json.dumps(measure(step, seconds, card=card, **how)), flush=True)


def server_of(argv):
    """A Server when argv is `serve BASE` (made before any slow start-up), else None."""
    if len(argv) >= 2 and argv[0] == "serve":
        return Server(argv[1])
    return None

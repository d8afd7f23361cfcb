"""Whether a CUDA event recorded on an idle stream waits while another process has the
card (a card without MPS time-slices between contexts), on the real GPU.

The limiter's GPU clock (libcuda-shim/src/limiter/clock.rs) now believes a reference
event only when it is seen to fire within 20 us of its record, because a reference
taken as fired at its record placed every later event early on a time-sliced card (the
hypothesis from BENCHMARKS run 11); and the simulated driver makes such events wait
(`VGPU_SIM_EVENT_TURNS`, on by default). This probe says whether the card does:

  1. alone: 200 records of an event on an idle stream of this process, each polled
     until it fires (host microseconds from the record call to the first query that
     finds it fired);
  2. the same while a child process runs one long spinning kernel (torch.cuda._sleep)
     on the card.

Usage: event_turns.py            prints one JSON line: {"alone": {...}, "beside": {...}}
       event_turns.py --busy S   (the child) spins the card for about S seconds
"""
import json
import statistics
import subprocess
import sys
import time

import torch

TRIALS = 200
# What a sleeping kernel spins per second (H200 SM clock about 1.98 GHz; a lower clock
# only makes the child's kernel last longer).
CYCLES_PER_S = 1_980_000_000


def busy(seconds):
    torch.cuda.init()
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(int(seconds * CYCLES_PER_S))
    print("busy", flush=True)
    torch.cuda.synchronize()


def waits(stream, gap_s):
    """Microseconds from each record to the first query that found the event fired."""
    out = []
    for _ in range(TRIALS):
        event = torch.cuda.Event()
        began = time.perf_counter_ns()
        event.record(stream)
        while not event.query():
            pass
        out.append((time.perf_counter_ns() - began) / 1e3)
        time.sleep(gap_s)
    return out


def summary(values):
    values = sorted(values)
    at = lambda q: values[min(len(values) - 1, int(q * (len(values) - 1)))]  # noqa: E731
    return {
        "trials": len(values),
        "p50_us": round(statistics.median(values), 1),
        "p90_us": round(at(0.9), 1),
        "max_us": round(values[-1], 1),
        "over_20us": sum(v > 20 for v in values),
        "over_200us": sum(v > 200 for v in values),
    }


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--busy":
        busy(float(sys.argv[2]))
        return
    torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    alone = waits(stream, 0.002)
    child = subprocess.Popen([sys.executable, __file__, "--busy", "4"],
                             stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    beside = waits(stream, 0.005) if line.startswith("busy") else []
    child.kill()
    child.wait()
    print(json.dumps({"alone": summary(alone),
                      "beside": summary(beside) if beside else {"error": "no busy child"}}))


if __name__ == "__main__":
    main()

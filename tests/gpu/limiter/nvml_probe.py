"""What the real NVML says per process while work runs, asked from the host as the
host-side coordinator asks it (vgpu_common::cardmeter::NvmlMeter): the card's own
account beside the GPU suite's throughput shares.

Usage: nvml_probe.py SECONDS > PROBE.jsonl

Every 250 ms for SECONDS: the card's utilization, the PIDs with a context
(nvmlDeviceGetComputeRunningProcesses), and the per-process samples of
nvmlDeviceGetProcessUtilization of the last second; each poll as one JSON line, a
summary line last. (Samples asked "newer than the last one seen" read far higher for the
same timestamps on the H200, BENCHMARKS.md run 8: not asked.)

The readers of a probe file import this module: `samples(path)` and `mean(...)`.
"""
import json
import statistics
import sys
import time


def samples(path):
    """{pid: [(ts_us, sm_percent)]} of a probe file, each sample once, in time order;
    {} when the file cannot be read."""
    seen = {}
    try:
        for line in open(path):
            try:
                poll = json.loads(line)
            except json.JSONDecodeError:
                continue
            for sample in poll.get("window") or []:
                seen[(sample["pid"], sample["ts"])] = sample["sm"]
    except OSError:
        return {}
    by_pid = {}
    for (pid, ts), sm in sorted(seen.items(), key=lambda item: item[0][1]):
        by_pid.setdefault(pid, []).append((ts, sm))
    return by_pid


def mean(by_pid, pid, since_us, until_us=None):
    """Mean of `pid`'s samples stamped in [since_us, until_us], or None."""
    values = [sm for ts, sm in by_pid.get(pid, [])
              if ts >= since_us and (until_us is None or ts <= until_us)]
    return statistics.mean(values) if values else None


def main():
    import pynvml

    seconds = float(sys.argv[1])
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    polls = with_samples = 0
    errors = {}
    seen_pids = set()
    end = time.time() + seconds
    while time.time() < end:
        now_us = int(time.time() * 1e6)
        util = pynvml.nvmlDeviceGetUtilizationRates(handle).gpu
        try:
            running = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
        except pynvml.NVMLError as error:
            running = str(error)
        try:
            window = [{"pid": s.pid, "sm": s.smUtil, "ts": s.timeStamp}
                      for s in pynvml.nvmlDeviceGetProcessUtilization(handle, now_us - 1_000_000)]
            window_error = None
        except pynvml.NVMLError as error:
            window, window_error = [], str(error)
            errors[window_error] = errors.get(window_error, 0) + 1
        polls += 1
        with_samples += bool(window)
        seen_pids.update(s["pid"] for s in window)
        print(json.dumps({"now_us": now_us, "util": util, "running": running,
                          "window": window, "window_error": window_error}), flush=True)
        time.sleep(0.25)
    print(json.dumps({"summary": True, "polls": polls, "polls_with_samples": with_samples,
                      "errors": errors, "pids_seen": sorted(seen_pids)}), flush=True)


if __name__ == "__main__":
    main()

"""What the real NVML says per process while work runs, as the host-side coordinator
asks it: a diagnostic for the compute limiter's charge factor (tests/gpu/run.sh section
`probe`).

Usage: nvml_probe.py SECONDS [PID ...]

Every 250 ms for SECONDS, from this process's PID namespace: the card's utilization, the
PIDs with a context (nvmlDeviceGetComputeRunningProcesses), and the per-process samples
of nvmlDeviceGetProcessUtilization newer than one second ago (what
vgpu_common::cardmeter::NvmlMeter asks) and newer than the last seen sample; each as one
JSON line. The PIDs given are marked when they appear. Prints a summary line last.
"""
import json
import sys
import time

import pynvml


def samples_since(handle, since_us):
    try:
        return [
            {"pid": s.pid, "sm": s.smUtil, "ts": s.timeStamp}
            for s in pynvml.nvmlDeviceGetProcessUtilization(handle, since_us)
        ], None
    except pynvml.NVMLError as error:
        return [], str(error)


def main():
    seconds = float(sys.argv[1])
    watched = {int(pid) for pid in sys.argv[2:]}
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    last_seen = 0
    lines = 0
    with_samples = 0
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
        window, window_error = samples_since(handle, now_us - 1_000_000)
        newer, newer_error = samples_since(handle, last_seen)
        for sample in newer:
            last_seen = max(last_seen, sample["ts"])
        lines += 1
        with_samples += bool(window)
        for error in (window_error, newer_error):
            if error:
                errors[error] = errors.get(error, 0) + 1
        seen_pids.update(s["pid"] for s in window)
        print(json.dumps({
            "now_us": now_us, "util": util, "running": running,
            "window": window, "window_error": window_error,
            "newer": newer, "newer_error": newer_error,
        }), flush=True)
        time.sleep(0.25)
    print(json.dumps({
        "summary": True, "polls": lines, "polls_with_samples": with_samples,
        "errors": errors, "pids_seen": sorted(seen_pids),
        "watched_seen": sorted(watched & seen_pids),
    }), flush=True)


if __name__ == "__main__":
    main()

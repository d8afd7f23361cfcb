"""What train.py's step runs on the card, by the PyTorch profiler (CUPTI): for each
kernel, its launches a step, its mean and total GPU time a step and how many different
grids it was launched with; and the step's kernels' total against its wall time. Set
beside a limited run's trace (its `kernel` lines: what the limiter
learned each kernel costs), it says which kernels the limiter charges more than the card
ran. A diagnostic of the limiter's GPU section, not judged.

Usage: train_kernels.py [STEPS] [--by-grid]
Prints JSON lines: one per kernel (with --by-grid, one per kernel and grid, with its
blocks), then a total. Run under `vgpu run --cores N` with VGPU_LIMITER_TRACE set, its
--by-grid lines and that trace are what charge_by_kernel.py sets side by side.
"""
import collections
import json
import os
import sys
import tempfile
import time

import torch

import train

args = [arg for arg in sys.argv[1:] if arg != "--by-grid"]
by_grid = "--by-grid" in sys.argv[1:]
steps = int(args[0]) if args else 20
for _ in range(5):
    train.step()
torch.cuda.synchronize()
activities = [torch.profiler.ProfilerActivity.CUDA]
with torch.profiler.profile(activities=activities) as profile:
    began = time.perf_counter()
    for _ in range(steps):
        train.step()
    torch.cuda.synchronize()
    wall = time.perf_counter() - began
with tempfile.TemporaryDirectory() as folder:
    path = os.path.join(folder, "trace.json")
    profile.export_chrome_trace(path)
    with open(path) as file:
        events = json.load(file).get("traceEvents", [])
kernels = collections.defaultdict(lambda: {"launches": 0, "us": 0.0, "grids": set()})
for event in events:
    if event.get("cat") != "kernel":
        continue
    grid = event.get("args", {}).get("grid") or [1, 1, 1]
    blocks = 1
    for extent in grid:
        blocks *= int(extent)
    key = (event.get("name", "?"), blocks if by_grid else None)
    kernel = kernels[key]
    kernel["launches"] += 1
    kernel["us"] += float(event.get("dur", 0))
    kernel["grids"].add(blocks)
total_us = sum(k["us"] for k in kernels.values())
launches = sum(k["launches"] for k in kernels.values())
for (name, blocks), k in sorted(kernels.items(), key=lambda item: -item[1]["us"]):
    line = {"kernel": name[:160], "launches_per_step": k["launches"] / steps,
            "mean_us": round(k["us"] / k["launches"], 2),
            "us_per_step": round(k["us"] / steps, 1), "grids": len(k["grids"])}
    if by_grid:
        line["blocks"] = blocks
    print(json.dumps(line))
print(json.dumps({"steps": steps, "wall_ms_per_step": round(wall * 1000 / steps, 3),
                  "kernels_per_step": launches / steps,
                  "kernel_ms_per_step": round(total_us / 1000 / steps, 3),
                  "mean_kernel_us": round(total_us / max(launches, 1), 2)}))

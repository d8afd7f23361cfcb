"""A batch-1 decode loop for the compute limiter's GPU section: 24 small fp16 layers
(1024 wide, as a small language model's per-token work), one token at a time, each step
synchronised (the next token needs this one), for SECONDS.

Usage: decode.py SECONDS
Prints one line: RESULT {"steps_per_s", "p50_ms", "p99_ms", "max_ms", "steps", "t0",
"wall_s", "card_util"} (card_util: NVML's mean utilization meanwhile, see cardutil.py).
"""
import json
import sys
import time

import torch

from cardutil import CardUtil

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 5.0
torch.backends.cuda.matmul.allow_tf32 = False
layers = []
for _ in range(24):
    layers += [torch.nn.Linear(1024, 1024), torch.nn.GELU()]
model = torch.nn.Sequential(*layers).cuda().half().eval()
x = torch.randn(1, 1024, device="cuda", dtype=torch.float16)
with torch.inference_mode():
    for _ in range(50):
        model(x)
    torch.cuda.synchronize()
    steps = []
    t0 = float(open("/proc/uptime").read().split()[0])
    card = CardUtil()
    card.start()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        step = time.perf_counter()
        y = model(x)
        y[0, 0].item()  # the next token depends on this one
        steps.append(time.perf_counter() - step)
    wall = time.perf_counter() - start
    card_util = card.stop()
steps.sort()
pick = lambda q: steps[min(len(steps) - 1, int(q * len(steps)))] * 1e3
print("RESULT " + json.dumps({
    "steps_per_s": round(len(steps) / wall, 1), "p50_ms": round(pick(0.50), 3),
    "p99_ms": round(pick(0.99), 3), "max_ms": round(steps[-1] * 1e3, 3), "steps": len(steps), "t0": t0, "wall_s": round(wall, 3), "card_util": card_util}))

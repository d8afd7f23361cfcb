"""PyTorch inference loop for the limiter test: a small MLP at batch 1 for SECONDS.

Prints one JSON line: iterations per second (host-visible throughput under the limit).
"""
import json
import sys
import time

import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 6.0
torch.backends.cudnn.benchmark = False
model = torch.nn.Sequential(
    torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
    torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
    torch.nn.Linear(4096, 1024),
).cuda().eval()
x = torch.randn(1, 1024, device="cuda")
with torch.inference_mode():
    for _ in range(20):
        model(x)
    torch.cuda.synchronize()
    t0 = float(open("/proc/uptime").read().split()[0])
    start = time.monotonic()
    iterations = 0
    while time.monotonic() - start < seconds:
        y = model(x)
        iterations += 1
        if iterations % 8 == 0:
            y.sum().item()
    torch.cuda.synchronize()
    wall = time.monotonic() - start
print(json.dumps({"mode": "mlp", "iterations": iterations, "t0": t0, "wall_s": round(wall, 3), "it_per_s": round(iterations / wall, 1)}))

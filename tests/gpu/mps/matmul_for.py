"""A busy, compute-bound container for the MPS section: bf16 4096^3 matmuls in a loop.

Usage: matmul_for.py SECONDS [READY_FILE [WAIT_FILE...]]
Warms up, writes READY_FILE, waits (up to 60 s) until every WAIT_FILE exists, then runs
for SECONDS (or until the file env MATMUL_STOP_FILE names exists) and prints RESULT {"tflops", "iters", "seconds", "error", "error_after_s"}: a
CUDA error (a neighbour's fatal fault reaching this client) is caught and reported with
the time it came, never raised.
"""
import json
import os
import sys
import time

import torch

seconds = float(sys.argv[1])
ready = sys.argv[2] if len(sys.argv) > 2 else None
waits = sys.argv[3:]
n = 4096
res = {"pid": os.getpid(), "error": None}
try:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        a @ b
    torch.cuda.synchronize()
except Exception as err:  # noqa: BLE001 - reported, not raised
    res["error"] = "setup: " + str(err)[:300]
    print("RESULT " + json.dumps(res), flush=True)
    sys.exit(0)
if ready:
    open(ready, "w").write(str(os.getpid()))
deadline = time.time() + 60
while waits and not all(os.path.exists(w) for w in waits) and time.time() < deadline:
    time.sleep(0.01)
stop_file = os.environ.get("MATMUL_STOP_FILE")
iters = 0
start = time.perf_counter()
try:
    while time.perf_counter() - start < seconds and not (stop_file and os.path.exists(stop_file)):
        for _ in range(10):
            a @ b
        torch.cuda.synchronize()
        iters += 10
except Exception as err:  # noqa: BLE001
    res["error"] = str(err)[:300]
    res["error_after_s"] = round(time.perf_counter() - start, 3)
wall = time.perf_counter() - start
res.update({"iters": iters, "seconds": round(wall, 3),
            "tflops": round(2 * n**3 * iters / wall / 1e12, 1)})
print("RESULT " + json.dumps(res), flush=True)

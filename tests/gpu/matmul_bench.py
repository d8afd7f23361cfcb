"""bf16 8192^3 matmul loop: TFLOP/s from CUDA events (3 warm-ups, 30 timed)."""
import json, torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
iters = 30
start.record()
for _ in range(iters):
    a @ b
end.record()
torch.cuda.synchronize()
ms = start.elapsed_time(end) / iters
print("RESULT " + json.dumps({"what": "matmul", "ms": ms, "tflops": 2 * n**3 / ms / 1e9}))

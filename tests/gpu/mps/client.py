"""A new client after the fault: allocates and computes a little. RESULT {"ok", "sum"}."""
import json
import time

start = time.perf_counter()
res = {"ok": False}
try:
    import torch
    x = torch.ones(1 << 20, device="cuda")
    res["sum"] = float(x.sum().item())
    res["ok"] = res["sum"] == float(1 << 20)
except Exception as err:  # noqa: BLE001
    res["error"] = str(err)[:300]
res["seconds"] = round(time.perf_counter() - start, 2)
print("RESULT " + json.dumps(res), flush=True)

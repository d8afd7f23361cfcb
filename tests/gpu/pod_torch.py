"""PyTorch inside a pod: fills the container's memory quota in 64 MiB tensors until
torch raises OutOfMemoryError, then frees it all.

    python3 pod_torch.py QUOTA_BYTES

Prints `RESULT {json}`: total/free as torch sees them, the bytes held when the error
came, and whether it came. Exit 0 when OutOfMemoryError came with at most QUOTA_BYTES
held and at least half of it (the rest is the context and the allocator's own)."""
import json
import sys

import torch

quota = int(sys.argv[1])
chunk = 64 << 20
result = {"quota": quota}
free, total = torch.cuda.mem_get_info()
result.update(total=total, free=free)
held = []
result["oom"] = False
try:
    # Never more than 4x the quota, so a quota that does not hold ends the loop too.
    while len(held) * chunk < 4 * quota:
        tensor = torch.empty(chunk, dtype=torch.uint8, device="cuda")
        tensor.fill_(1)
        held.append(tensor)
except torch.OutOfMemoryError as err:
    result["oom"] = True
    result["error"] = str(err).splitlines()[0][:200]
result["held"] = len(held) * chunk
held.clear()
torch.cuda.empty_cache()
result["ok"] = result["oom"] and quota // 2 <= result["held"] <= quota
print("RESULT " + json.dumps(result), flush=True)
sys.exit(0 if result["ok"] else 1)

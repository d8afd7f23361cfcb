"""Memory quota seen by PyTorch: argv[1] names the allocator mode (default, expandable,
async: set through PYTORCH_CUDA_ALLOC_CONF by the caller). Checks mem_get_info, that a
3 GiB tensor fits and 2 GiB more raises torch.OutOfMemoryError, then holds the memory
while the outer script reads nvidia-smi (marker file argv[2])."""
import json, os, sys, time, torch

mode, marker = sys.argv[1], sys.argv[2]
free, total = torch.cuda.mem_get_info()
res = {"mode": mode, "pid": os.getpid(), "total": total, "free": free}
a = torch.empty(3 << 30, dtype=torch.uint8, device="cuda")
a.fill_(1)
res["fit_3g"] = True
try:
    b = torch.empty(2 << 30, dtype=torch.uint8, device="cuda")
    b.fill_(1)
    res["oom_2g"] = False
except torch.OutOfMemoryError:
    res["oom_2g"] = True
res["free_after"] = torch.cuda.mem_get_info()[0]
print("RESULT " + json.dumps(res), flush=True)
open(marker, "w").write(str(os.getpid()))
time.sleep(4)

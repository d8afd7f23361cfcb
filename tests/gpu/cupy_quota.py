"""Memory quota seen by CuPy: memGetInfo, 3 GiB fits, 2 GiB more raises OutOfMemoryError."""
import json, os, sys, time
import cupy as cp

marker = sys.argv[1]
free, total = cp.cuda.runtime.memGetInfo()
res = {"mode": "cupy", "pid": os.getpid(), "total": total, "free": free}
a = cp.empty(3 << 30, dtype=cp.uint8)
a.fill(1)
res["fit_3g"] = True
try:
    b = cp.empty(2 << 30, dtype=cp.uint8)
    b.fill(1)
    res["oom_2g"] = False
except cp.cuda.memory.OutOfMemoryError:
    res["oom_2g"] = True
print("RESULT " + json.dumps(res), flush=True)
open(marker, "w").write(str(os.getpid()))
time.sleep(4)

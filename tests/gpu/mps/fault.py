"""The faulting container of the MPS section: after DELAY seconds, a kernel writes
through a null pointer (an illegal address, a fatal fault). Prints RESULT {"error"}.

Usage: fault.py DELAY
"""
import json
import sys
import time

import cupy as cp

delay = float(sys.argv[1])
kernel = cp.RawKernel(r'''
extern "C" __global__ void bad(int *p) { p[threadIdx.x + 1024 * 1024 * 64] = 1; }
''', "bad")
cp.zeros(1, dtype=cp.int32)  # context up
time.sleep(delay)
res = {"error": None}
try:
    kernel((1,), (32,), (cp.int64(0),))  # a null int*
    cp.cuda.runtime.deviceSynchronize()
except Exception as err:  # noqa: BLE001
    res["error"] = str(err)[:300]
print("RESULT " + json.dumps(res), flush=True)

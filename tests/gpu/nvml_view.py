"""What pynvml sees inside the container: device count, memory, own processes."""
import json, os, pynvml
pynvml.nvmlInit()
n = pynvml.nvmlDeviceGetCount()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
m = pynvml.nvmlDeviceGetMemoryInfo(h)
procs = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
try:
    util = pynvml.nvmlDeviceGetUtilizationRates(h).gpu
except pynvml.NVMLError as e:
    util = str(e)
print("RESULT " + json.dumps({"count": n, "total": m.total, "used": m.used, "free": m.free, "procs": procs, "util": util}))

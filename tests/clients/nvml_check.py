"""NVIDIA's own nvidia-ml-py (pynvml) inside the container: device count, memory and
the processes it lists. Prints one `RESULT {json}` line."""
import json, os, pynvml

pynvml.nvmlInit()
count = pynvml.nvmlDeviceGetCount()
devices = []
for i in range(count):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    m = pynvml.nvmlDeviceGetMemoryInfo(h)
    procs = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    devices.append({"uuid": pynvml.nvmlDeviceGetUUID(h), "total": m.total, "used": m.used, "free": m.free, "pids": procs,
                    "index": pynvml.nvmlDeviceGetIndex(h)})
hidden = {}
for uuid in os.environ.get("HIDDEN_UUIDS", "").split():
    try:
        pynvml.nvmlDeviceGetHandleByUUID(uuid)
        hidden[uuid] = "visible"
    except pynvml.NVMLError as e:
        hidden[uuid] = str(e)
print("RESULT " + json.dumps({"count": count, "devices": devices, "hidden": hidden, "driver": pynvml.nvmlSystemGetDriverVersion()}))

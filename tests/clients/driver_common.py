"""What the cuda-bindings clients share: a result check, a first context, and the two
figures each step reports (what cuMemGetInfo says the container holds, and the
driver's own figure for this process from NVML's process list)."""
import os

from cuda.bindings import driver as cuda

OK = cuda.CUresult.CUDA_SUCCESS
MIB = 1 << 20


def check(result, what):
    """The values after the CUresult of a cuda-bindings call; exits on an error."""
    err = result[0] if isinstance(result, tuple) else result
    if err != OK:
        raise SystemExit(f"{what} failed: {err.name}")
    return result[1:] if isinstance(result, tuple) else ()


def context():
    """cuInit, then a context on device 0: (device count, device, context)."""
    check(cuda.cuInit(0), "cuInit")
    (count,) = check(cuda.cuDeviceGetCount(), "cuDeviceGetCount")
    (dev,) = check(cuda.cuDeviceGet(0), "cuDeviceGet")
    (ctx,) = check(cuda.cuCtxCreate(None, 0, dev), "cuCtxCreate")
    return count, dev, ctx


def used_mib():
    """What cuMemGetInfo says the container holds, MiB."""
    free, total = check(cuda.cuMemGetInfo(), "cuMemGetInfo")
    return round((int(total) - int(free)) / MIB, 1)


def driver_mib():
    """The driver's figure for this process: NVML's process list (PIDs as this PID
    namespace sees them), through whatever libnvidia-ml.so.1 the loader finds."""
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid():
                return round((proc.usedGpuMemory or 0) / MIB, 1)
        return 0
    except Exception as error:  # noqa: BLE001 - reported, never fatal
        return f"nvml: {error}"

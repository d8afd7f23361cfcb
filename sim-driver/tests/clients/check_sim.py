"""A real client nobody here wrote, against the simulated driver: NVIDIA's own
cuda-bindings (driver API) and nvidia-ml-py (pynvml), loaded through LD_LIBRARY_PATH
pointing at a folder whose libcuda.so.1 and libnvidia-ml.so.1 are the sim.

Expects VGPU_SIM_GPUS=2, VGPU_SIM_MEMORY=8GiB and VGPU_SIM_CONTEXT_OVERHEAD=256MiB.
Prints one line per check and exits non-zero on the first failure.
"""
import os
import sys

from cuda.bindings import driver as cu
import pynvml

MIB = 1 << 20
GIB = 1 << 30


def ok(result):
    """cuda-bindings returns (CUresult, values...); fail loudly on an error."""
    err = result[0]
    assert err == cu.CUresult.CUDA_SUCCESS, f"CUDA error {err}"
    rest = result[1:]
    return rest[0] if len(rest) == 1 else rest


def main():
    ok(cu.cuInit(0))
    version = ok(cu.cuDriverGetVersion())
    assert version == 13000, version
    count = ok(cu.cuDeviceGetCount())
    assert count == 2, count
    dev = ok(cu.cuDeviceGet(1))
    name = ok(cu.cuDeviceGetName(64, dev)).split(b"\0")[0].decode()
    assert name == "NVIDIA H200 (simulated)", name
    total = ok(cu.cuDeviceTotalMem(dev))
    assert total == 8 * GIB, total
    sms = ok(cu.cuDeviceGetAttribute(cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev))
    assert sms == 132, sms
    print(f"cuda: {count} devices, {name}, {total} bytes, {sms} SMs, driver {version}")

    ctx = ok(cu.cuCtxCreate(None, 0, dev))
    free, total = ok(cu.cuMemGetInfo())
    assert total == 8 * GIB and free == 8 * GIB - 256 * MIB, (free, total)
    ptr = ok(cu.cuMemAlloc(GIB))
    assert int(ptr) != 0
    free_after, _ = ok(cu.cuMemGetInfo())
    assert free - free_after == GIB, (free, free_after)
    print(f"cuda: context + 1 GiB allocation, free {free} -> {free_after}")

    pynvml.nvmlInit()
    assert pynvml.nvmlDeviceGetCount() == 2
    handle = pynvml.nvmlDeviceGetHandleByIndex(1)
    memory = pynvml.nvmlDeviceGetMemoryInfo(handle)
    assert memory.total == 8 * GIB, memory.total
    assert memory.used == GIB + 256 * MIB, memory.used
    assert memory.free == memory.total - memory.used
    assert pynvml.nvmlDeviceGetName(handle) == "NVIDIA H200 (simulated)"
    assert pynvml.nvmlDeviceGetUUID(handle) == "GPU-51d00000-0000-4000-8000-000000000002"
    processes = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
    mine = [p for p in processes if p.pid == os.getpid()]
    assert len(mine) == 1, processes
    assert mine[0].usedGpuMemory == GIB + 256 * MIB, mine[0].usedGpuMemory
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(pynvml.nvmlDeviceGetHandleByIndex(0)) == []
    print(f"nvml: used {memory.used}, processes {[(p.pid, p.usedGpuMemory) for p in processes]}")

    ok(cu.cuMemFree(ptr))
    free_end, _ = ok(cu.cuMemGetInfo())
    assert free_end == free, (free_end, free)
    assert pynvml.nvmlDeviceGetMemoryInfo(handle).used == 256 * MIB
    ok(cu.cuCtxDestroy(ctx))
    assert pynvml.nvmlDeviceGetComputeRunningProcesses(handle) == []
    pynvml.nvmlShutdown()
    print("check_sim: all checks passed")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as failure:
        print(f"check_sim: FAILED: {failure!r}", file=sys.stderr)
        raise

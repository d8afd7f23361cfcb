"""The memory patterns of issue 13 on a real GPU, through NVIDIA's cuda-bindings against
libcuda.so.1 (the shim under `vgpu run`). Usage:

  patterns.py MODE N MIB MARKER        MODE: vmm | pool-default | pool-new | hold

Writes its PID (as its own PID namespace sees it) to MARKER once its context exists,
waits 1.5 s so the caller can start sampling nvidia-smi for it, runs the pattern, holds
what it got for 2 s (env PATTERN_HOLD_S), and prints one `RESULT {json}` line: each allocation's result, and
at each step what cuMemGetInfo says the container holds (`used_mib`) and the driver's
figure for this process from NVML's process list (`driver_mib`).

  vmm           N x (cuMemCreate MIB, map, cuMemRelease while still mapped)
  pool-default  the device's default pool with release threshold UINT64_MAX,
                N x (cuMemAllocAsync MIB, cuMemFreeAsync, cuStreamSynchronize)
  pool-new      the same with a new pool (threshold UINT64_MAX) for each allocation
  hold          one cuMemAlloc of MIB (N ignored), for the NVML comparison
"""
import json, os, sys, time
from cuda.bindings import driver as cuda

OK = cuda.CUresult.CUDA_SUCCESS
MIB = 1 << 20
UINT64_MAX = (1 << 64) - 1


def check(result, what):
    err = result[0] if isinstance(result, tuple) else result
    if err != OK:
        raise SystemExit(f"{what} failed: {err.name}")
    return result[1:] if isinstance(result, tuple) else ()


def used_mib():
    free, total = check(cuda.cuMemGetInfo(), "cuMemGetInfo")
    return round((int(total) - int(free)) / MIB, 1)


def driver_mib():
    try:
        import pynvml
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid():
                return round((proc.usedGpuMemory or 0) / MIB, 1)
        return None
    except Exception as error:  # noqa: BLE001 - reported, never fatal
        return f"nvml: {error}"


mode, n, mib, marker = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
res = {"mode": mode, "pid": os.getpid(), "results": [], "steps": []}


def step(name):
    res["steps"].append({"step": name, "used_mib": used_mib(), "driver_mib": driver_mib()})


check(cuda.cuInit(0), "cuInit")
(dev,) = check(cuda.cuDeviceGet(0), "cuDeviceGet")
(ctx,) = check(cuda.cuCtxCreate(None, 0, dev), "cuCtxCreate")
step("context")
with open(marker, "w") as f:
    f.write(str(os.getpid()))
time.sleep(1.5)
size = mib * MIB
keep = []
if mode == "vmm":
    prop = cuda.CUmemAllocationProp()
    prop.type = cuda.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = int(dev)
    access = cuda.CUmemAccessDesc()
    access.location = prop.location
    access.flags = cuda.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    (granularity,) = check(cuda.cuMemGetAllocationGranularity(prop, cuda.CUmemAllocationGranularity_flags.CU_MEM_ALLOC_GRANULARITY_MINIMUM), "granularity")
    size = (size + int(granularity) - 1) // int(granularity) * int(granularity)
    for i in range(n):
        err, handle = cuda.cuMemCreate(size, prop, 0)
        res["results"].append(err.name)
        if err == OK:
            (va,) = check(cuda.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
            check(cuda.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
            check(cuda.cuMemSetAccess(va, size, [access], 1), "cuMemSetAccess")
            check(cuda.cuMemRelease(handle), "cuMemRelease")
            keep.append(va)
        step(f"vmm {i}")
elif mode in ("pool-default", "pool-new"):
    (stream,) = check(cuda.cuStreamCreate(0), "cuStreamCreate")
    threshold = cuda.cuuint64_t(UINT64_MAX)
    attribute = cuda.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD
    props = cuda.CUmemPoolProps()
    props.allocType = cuda.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = int(dev)
    if mode == "pool-default":
        (pool,) = check(cuda.cuDeviceGetDefaultMemPool(dev), "cuDeviceGetDefaultMemPool")
        check(cuda.cuMemPoolSetAttribute(pool, attribute, threshold), "cuMemPoolSetAttribute")
    for i in range(n):
        if mode == "pool-new":
            (pool,) = check(cuda.cuMemPoolCreate(props), "cuMemPoolCreate")
            check(cuda.cuMemPoolSetAttribute(pool, attribute, threshold), "cuMemPoolSetAttribute")
            keep.append(pool)
        err, ptr = cuda.cuMemAllocFromPoolAsync(size, pool, stream)
        res["results"].append(err.name)
        if err == OK:
            check(cuda.cuMemsetD8Async(ptr, 1, size, stream), "cuMemsetD8Async")
            check(cuda.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
        check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
        step(f"pool {i}")
elif mode == "hold":
    err, ptr = cuda.cuMemAlloc(size)
    res["results"].append(err.name)
    if err == OK:
        check(cuda.cuMemsetD8(ptr, 1, size), "cuMemsetD8")
    step("held")
else:
    raise SystemExit(f"unknown mode {mode}")
print("RESULT " + json.dumps(res), flush=True)
time.sleep(float(os.environ.get("PATTERN_HOLD_S", "2")))

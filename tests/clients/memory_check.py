"""Memory patterns that must stay within the quota, driven through NVIDIA's
cuda-bindings against libcuda.so.1 (the shim under `vgpu run`). Usage:
memory_check.py MODE [ARGS...]; prints one `RESULT {json}` line. Every step records
`driver_mib`, the driver's own figure for this process (NVML's process list), next to
`used_mib`, what cuMemGetInfo says the container holds.

  vmm N MiB          N x (cuMemCreate, map, cuMemRelease while mapped); then a retained
                     handle outliving its unmap; then everything unmapped
  pools N MiB        N pools with release threshold UINT64_MAX: N x (alloc, keep); free
                     and sync all (the pools keep it); then one cuMemAlloc that fits
                     only once the pools are trimmed
  pool-cycle N MiB   N x (alloc from a new pool with threshold UINT64_MAX, free, sync):
                     what the pools keep is counted, and trimmed before a refusal
  module MiB...      load a module (the driver takes device memory for it), then
                     allocate each size in turn (kept)
  getinfo            cuMemGetInfo only (after a context)
"""
import ctypes, json, os, sys
from cuda.bindings import driver as cuda
from driver_common import MIB, OK, check, context, driver_mib, used_mib

UINT64_MAX = (1 << 64) - 1


res = {"mode": sys.argv[1], "pid": os.getpid(), "steps": []}


def step(name, result=None):
    entry = {"step": name, "used_mib": used_mib(), "driver_mib": driver_mib()}
    if result is not None:
        entry["result"] = result
    res["steps"].append(entry)
    return entry


mode, args = sys.argv[1], sys.argv[2:]
if mode == "vmm":
    n, mib = int(args[0]), int(args[1])
    _, dev, _ = context()
    prop = cuda.CUmemAllocationProp()
    prop.type = cuda.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    prop.location.type = cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    prop.location.id = int(dev)
    access = cuda.CUmemAccessDesc()
    access.location = prop.location
    access.flags = cuda.CUmemAccess_flags.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
    size = mib * MIB
    mapped = []
    for i in range(n):
        err, handle = cuda.cuMemCreate(size, prop, 0)
        if err != OK:
            step(f"create {i}", err.name)
            continue
        (va,) = check(cuda.cuMemAddressReserve(size, 0, 0, 0), "cuMemAddressReserve")
        check(cuda.cuMemMap(va, size, 0, handle, 0), "cuMemMap")
        check(cuda.cuMemSetAccess(va, size, [access], 1), "cuMemSetAccess")
        check(cuda.cuMemRelease(handle), "cuMemRelease")
        mapped.append(va)
        step(f"create {i}", "CUDA_SUCCESS")
    res["created"] = len(mapped)
    if mapped:
        # A retained handle keeps the memory after its unmap, until it is released.
        (handle,) = check(cuda.cuMemRetainAllocationHandle(mapped[0]), "cuMemRetainAllocationHandle")
        check(cuda.cuMemUnmap(mapped[0], size), "cuMemUnmap")
        res["after_unmap_retained"] = step("unmapped, retained")
        check(cuda.cuMemRelease(handle), "cuMemRelease")
        res["after_release"] = step("released")
        check(cuda.cuMemAddressFree(mapped[0], size), "cuMemAddressFree")
    for va in mapped[1:]:
        check(cuda.cuMemUnmap(va, size), "cuMemUnmap")
        check(cuda.cuMemAddressFree(va, size), "cuMemAddressFree")
    res["after_all"] = step("all unmapped")
elif mode in ("pools", "pool-cycle"):
    n, mib = int(args[0]), int(args[1])
    _, dev, _ = context()
    (stream,) = check(cuda.cuStreamCreate(0), "cuStreamCreate")
    props = cuda.CUmemPoolProps()
    props.allocType = cuda.CUmemAllocationType.CU_MEM_ALLOCATION_TYPE_PINNED
    props.location.type = cuda.CUmemLocationType.CU_MEM_LOCATION_TYPE_DEVICE
    props.location.id = int(dev)
    keep = cuda.cuuint64_t(UINT64_MAX)
    pools, held = [], []
    for i in range(n):
        (pool,) = check(cuda.cuMemPoolCreate(props), "cuMemPoolCreate")
        check(cuda.cuMemPoolSetAttribute(pool, cuda.CUmemPool_attribute.CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, keep), "cuMemPoolSetAttribute")
        pools.append(pool)
        err, ptr = cuda.cuMemAllocFromPoolAsync(mib * MIB, pool, stream)
        if err == OK and mode == "pool-cycle":
            check(cuda.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
            check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
        elif err == OK:
            held.append(ptr)
        step(f"alloc {i}", err.name)
    for ptr in held:
        check(cuda.cuMemFreeAsync(ptr, stream), "cuMemFreeAsync")
    check(cuda.cuStreamSynchronize(stream), "cuStreamSynchronize")
    res["kept"] = step("freed and synchronised")
    reserved = []
    for pool in pools:
        (value,) = check(cuda.cuMemPoolGetAttribute(pool, cuda.CUmemPool_attribute.CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT), "cuMemPoolGetAttribute")
        reserved.append(int(value) / MIB)
    res["reserved_mib"] = reserved
    # What fits only when the pools give back what they keep.
    err, ptr = cuda.cuMemAlloc(n * mib * MIB // 2 + 1)
    res["after_trim"] = step("cuMemAlloc needing the kept memory", err.name)
elif mode == "module":
    context()
    ptx = b".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k()\n{\n ret;\n}\n\0"
    (module,) = check(cuda.cuModuleLoadData(ptx), "cuModuleLoadData")
    res["results"] = []
    kept = []
    for mib in args:
        err, ptr = cuda.cuMemAlloc(int(mib) * MIB)
        res["results"].append(err.name)
        if err == OK:
            kept.append(ptr)
    step("allocated")
elif mode == "getinfo":
    context()
    step("context")
else:
    raise SystemExit(f"unknown mode {mode}")
print("RESULT " + json.dumps(res))

"""A CUDA client nobody here wrote (NVIDIA's cuda-bindings), driving libcuda.so.1,
which is the shim under `vgpu run`. Usage: cuda_check.py MODE [ARGS...]; prints one
`RESULT {json}` line.

  basic                 cuInit, cuDeviceGet, cuCtxCreate, cuMemAlloc, cuMemGetInfo, cuMemFree
  sequence SIZE...      allocate each size in MiB in turn (kept), report each result
  procaddress SIZE...   the same through pointers from cuGetProcAddress_v2, called by ctypes
  hold MiB SECONDS MARK allocate, write MARK, hold, free
  stress SECONDS SEED   16 threads allocating and freeing at random
  devices MiB           every visible device: UUID, total, an allocation of MiB
  init-raw              cuInit and cuDeviceGetCount through ctypes, return codes only
  missing               call an export the simulated driver lacks
"""
import ctypes, json, os, random, sys, threading, time
from cuda.bindings import driver as cuda
from driver_common import MIB, OK, check, context

def mem_info():
    free, total = check(cuda.cuMemGetInfo(), "cuMemGetInfo")
    return int(free), int(total)


mode, args = sys.argv[1], sys.argv[2:]
res = {"mode": mode, "pid": os.getpid()}
if mode == "basic":
    count, dev, ctx = context()
    (ptr,) = check(cuda.cuMemAlloc(64 * MIB), "cuMemAlloc")
    res.update(count=count, pointer=int(ptr), mem_info=mem_info())
    check(cuda.cuMemFree(ptr), "cuMemFree")
    res["mem_info_after_free"] = mem_info()
elif mode == "sequence":
    res["count"], _, _ = context()
    res["total"] = mem_info()[1]
    res["results"], kept = [], []
    for mib in args:
        err, ptr = cuda.cuMemAlloc(int(mib) * MIB)
        res["results"].append(err.name)
        if err == OK:
            kept.append(ptr)
    res["mem_info"] = mem_info()
elif mode == "procaddress":
    context()
    get_info_ptr, alloc_ptr = [], []
    flags = cuda.CUdriverProcAddress_flags.CU_GET_PROC_ADDRESS_DEFAULT
    # cuda-bindings returns (err, pfn) or (err, pfn, symbolStatus) depending on version.
    pfn_alloc = check(cuda.cuGetProcAddress(b"cuMemAlloc", 12000, flags), "cuGetProcAddress(cuMemAlloc)")[0]
    pfn_info = check(cuda.cuGetProcAddress(b"cuMemGetInfo", 12000, flags), "cuGetProcAddress(cuMemGetInfo)")[0]
    alloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)(int(pfn_alloc))
    info = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))(int(pfn_info))
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    res["info_rc"] = info(ctypes.byref(free), ctypes.byref(total))
    res["total"] = total.value
    res["results"] = []
    for mib in args:
        p = ctypes.c_uint64()
        res["results"].append(int(alloc(ctypes.byref(p), int(mib) * MIB)))
    libcuda = ctypes.CDLL("libcuda.so.1")
    res["exported_alloc"] = ctypes.cast(libcuda.cuMemAlloc_v2, ctypes.c_void_p).value
    res["procaddress_alloc"] = int(pfn_alloc)
elif mode == "hold":
    mib, seconds, marker = int(args[0]), float(args[1]), args[2]
    context()
    err, ptr = cuda.cuMemAlloc(mib * MIB)
    res["alloc"] = err.name
    res["mem_info"] = mem_info()
    print("RESULT " + json.dumps(res), flush=True)
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    time.sleep(seconds)
    if err == OK:
        cuda.cuMemFree(ptr)
    sys.exit(0)
elif mode == "stress":
    seconds, seed = float(args[0]), int(args[1])
    _, _, ctx = context()
    deadline = time.monotonic() + seconds
    counts = {"ok": 0, "oom": 0, "free": 0}
    lock = threading.Lock()

    def worker(k):
        rng = random.Random(seed * 100 + k)
        check(cuda.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        held = []
        while time.monotonic() < deadline:
            if held and rng.random() < 0.5:
                check(cuda.cuMemFree(held.pop(rng.randrange(len(held)))), "cuMemFree")
                with lock:
                    counts["free"] += 1
            else:
                err, ptr = cuda.cuMemAlloc(rng.choice([1, 3, 17, 64, 100]) * MIB + rng.randrange(4096))
                with lock:
                    counts["ok" if err == OK else "oom"] += 1
                if err == OK:
                    held.append(ptr)
        for ptr in held:
            check(cuda.cuMemFree(ptr), "cuMemFree")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    res.update(counts)
elif mode == "devices":
    # Every visible device: its UUID, its quota as total, and an allocation of ARGS[0] MiB.
    check(cuda.cuInit(0), "cuInit")
    (count,) = check(cuda.cuDeviceGetCount(), "cuDeviceGetCount")
    res["count"] = count
    res["devices"] = []
    for ordinal in range(count):
        (dev,) = check(cuda.cuDeviceGet(ordinal), "cuDeviceGet")
        (uuid,) = check(cuda.cuDeviceGetUuid(dev), "cuDeviceGetUuid")
        (total_mem,) = check(cuda.cuDeviceTotalMem(dev), "cuDeviceTotalMem")
        (ctx,) = check(cuda.cuCtxCreate(None, 0, dev), "cuCtxCreate")
        free, total = mem_info()
        err, ptr = cuda.cuMemAlloc(int(args[0]) * MIB)
        res["devices"].append({"uuid": bytes(uuid.bytes).hex(), "total_mem": int(total_mem), "mem_info_total": total, "alloc": err.name})
        if err == OK:
            cuda.cuMemFree(ptr)
        check(cuda.cuCtxDestroy(ctx), "cuCtxDestroy")
    err, _ = cuda.cuDeviceGet(count)
    res["beyond"] = err.name
elif mode == "init-raw":
    # Straight through ctypes: cuda-bindings itself refuses to run without a driver.
    libcuda = ctypes.CDLL("libcuda.so.1")
    res["cuInit"] = libcuda.cuInit(0)
    count = ctypes.c_int(-1)
    res["cuDeviceGetCount"] = libcuda.cuDeviceGetCount(ctypes.byref(count))
elif mode == "missing":
    libcuda = ctypes.CDLL("libcuda.so.1")
    # A real 580 export that the simulated driver does not implement.
    res["rc"] = libcuda.cuGraphicsResourceGetMappedPointer_v2(None, None, None)
else:
    raise SystemExit(f"unknown mode {mode}")
print("RESULT " + json.dumps(res))

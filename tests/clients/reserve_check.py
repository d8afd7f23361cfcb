"""What the driver reserves on its own (issue 24), driven through NVIDIA's cuda-bindings
against libcuda.so.1 (the shim under `vgpu run`, over the sim driver in CI or the real
one on a GPU). Usage: reserve_check.py MODE [ARGS...]; prints one `RESULT {json}` line.
Every step records `used_mib` (what cuMemGetInfo says the container holds) and
`driver_mib` (the driver's own figure for this process, NVML's process list).

  module HOW IMAGE [KERNEL [ALLOC_MIB]]
      load IMAGE (HOW: data = cuModuleLoadData, file = cuModuleLoad, fatbin =
      cuModuleLoadFatBinary, library = cuLibraryLoadData), then take KERNEL (default
      `touch`), launch it once and synchronise, unload, and allocate ALLOC_MIB (kept)
      if given (after the launch, before the unload). IMAGE is a file, or
      gen-ptx:MIB, gen-cubin:MIB, gen-fatbin:MIB: an image whose static data is MIB
      MiB, made here (a `touch` kernel in each; gen-ptx:MIB:NAME names it NAME).
  loadtime N IMAGE KERNEL
      N x (cuModuleLoadData IMAGE, cuModuleGetFunction KERNEL, cuModuleUnload): the
      median milliseconds of each load and each first function.
  limit NAME VALUE [IMAGE KERNEL [KERNEL_ARG [ALLOC_MIB]]]
      cuCtxSetLimit(NAME, VALUE) (NAME: stack, printf, heap, sync-depth,
      pending-launches), cuCtxGetLimit after; then, if given, load IMAGE, launch KERNEL
      (with one 64-bit argument KERNEL_ARG), synchronise, and allocate ALLOC_MIB.
"""
import json, os, struct, sys, time
from cuda.bindings import driver as cuda
from driver_common import MIB, OK, check, context, driver_mib, used_mib

LIMITS = {
    "stack": cuda.CUlimit.CU_LIMIT_STACK_SIZE,
    "printf": cuda.CUlimit.CU_LIMIT_PRINTF_FIFO_SIZE,
    "heap": cuda.CUlimit.CU_LIMIT_MALLOC_HEAP_SIZE,
    "sync-depth": cuda.CUlimit.CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH,
    "pending-launches": cuda.CUlimit.CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT,
}


res = {"mode": sys.argv[1], "pid": os.getpid(), "steps": []}


def step(name, result=None, **extra):
    entry = {"step": name, "used_mib": used_mib(), "driver_mib": driver_mib(), **extra}
    if result is not None:
        entry["result"] = result
    res["steps"].append(entry)
    return entry


def ptx(mib, entry="touch"):
    return (
        ".version 8.0\n.target sm_90\n.address_size 64\n"
        f".visible .global .align 4 .b8 data[{mib * MIB}];\n"
        f".visible .entry {entry}()\n{{\n .reg .b64 %rd<2>;\n .reg .b32 %r<2>;\n"
        " mov.u64 %rd1, data;\n mov.u32 %r1, 1;\n st.global.u32 [%rd1], %r1;\n ret;\n}\n"
    ).encode() + b"\0"


def cubin(mib):
    """An ELF64 whose section table declares `.text.touch` and a `.nv.global` of MIB."""
    sections = [(".text.touch", 1, 16), (".nv.global", 8, mib * MIB)]
    names = b"\0"
    offsets = []
    for name, _, _ in sections + [(".shstrtab", 3, 0)]:
        offsets.append(len(names))
        names += name.encode() + b"\0"
    table_at = (64 + len(names) + 7) // 8 * 8
    count = len(sections) + 2
    header = bytearray(64)
    header[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", header, 0x28, table_at)
    struct.pack_into("<HHH", header, 0x3A, 64, count, count - 1)
    image = bytes(header) + names + b"\0" * (table_at - 64 - len(names)) + b"\0" * 64
    for (name, kind, size), offset in zip(sections, offsets):
        image += struct.pack("<IIQQQQ", offset, kind, 0, 0, 0, size) + b"\0" * 24
    image += struct.pack("<IIQQQQ", offsets[-1], 3, 0, 0, 64, len(names)) + b"\0" * 24
    return image


def fatbin(mib):
    """A fatbin holding one uncompressed ELF entry (kind 2)."""
    payload = cubin(mib)
    entry = bytearray(64)
    struct.pack_into("<HHIQ", entry, 0, 2, 0, 64, len(payload))
    body = bytes(entry) + payload
    return struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body


def image_bytes(spec):
    if spec.startswith("gen-"):
        kind, mib, *entry = spec[4:].split(":")
        if entry:
            return ptx(int(mib), entry[0])
        return {"ptx": ptx, "cubin": cubin, "fatbin": fatbin}[kind](int(mib))
    with open(spec, "rb") as f:
        data = f.read()
    return data if not spec.endswith(".ptx") else data + b"\0"


def launch(function, arg=None):
    params = 0 if arg is None else ((arg,), (ctypes_u64(),))
    err = cuda.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, 0, params, 0)[0]
    if err == OK:
        err = cuda.cuCtxSynchronize()[0]
    return err.name


def ctypes_u64():
    import ctypes
    return ctypes.c_uint64


def load(how, spec):
    """(error name, handle, seconds) of loading `spec` the way `how` says."""
    if how == "file":
        path = spec
        if spec.startswith("gen-"):
            path = f"/tmp/reserve-check-{os.getpid()}.bin"
            with open(path, "wb") as f:
                f.write(image_bytes(spec))
        started = time.perf_counter()
        err, handle = cuda.cuModuleLoad(path.encode())
        return err.name, handle, time.perf_counter() - started
    image = image_bytes(spec)
    started = time.perf_counter()
    if how == "data":
        err, handle = cuda.cuModuleLoadData(image)
    elif how == "fatbin":
        err, handle = cuda.cuModuleLoadFatBinary(image)
    elif how == "library":
        err, handle = cuda.cuLibraryLoadData(image, None, None, 0, None, None, 0)
    else:
        raise SystemExit(f"unknown load {how}")
    return err.name, handle, time.perf_counter() - started


def function_of(how, handle, kernel):
    if how == "library":
        err, k = cuda.cuLibraryGetKernel(handle, kernel.encode())
        if err != OK:
            return err.name, None
        err, f = cuda.cuKernelGetFunction(k)
        return err.name, f
    err, f = cuda.cuModuleGetFunction(handle, kernel.encode())
    return err.name, f


def unload(how, handle):
    if how == "library":
        return cuda.cuLibraryUnload(handle)[0].name
    return cuda.cuModuleUnload(handle)[0].name


def allocate(mib):
    err, _ptr = cuda.cuMemAlloc(int(mib) * MIB)
    return err.name


mode, args = sys.argv[1], sys.argv[2:]
context()
step("context")
if mode == "module":
    how, spec = args[0], args[1]
    kernel = args[2] if len(args) > 2 else "touch"
    result, handle, seconds = load(how, spec)
    res["load"] = result
    res["load_ms"] = round(seconds * 1000, 3)
    step("loaded", result)
    if result == "CUDA_SUCCESS":
        err, function = function_of(how, handle, kernel)
        res["function"] = err
        step("function", err)
        if function is not None:
            res["launch"] = launch(function)
            step("launched", res["launch"])
        if len(args) > 3:
            res["alloc"] = allocate(args[3])
            step("allocated", res["alloc"])
        res["unload"] = unload(how, handle)
        step("unloaded", res["unload"])
elif mode == "limit":
    name, value = args[0], int(args[1])
    limit = LIMITS[name]
    def get_limit():
        err, current = cuda.cuCtxGetLimit(limit)
        return int(current) if err == OK else err.name
    res["before"] = get_limit()
    res["set"] = cuda.cuCtxSetLimit(limit, value)[0].name
    res["after"] = get_limit()
    step("set", res["set"], limit=res["after"])
    if len(args) > 3:
        result, handle, _ = load("data", args[2])
        res["load"] = result
        if result == "CUDA_SUCCESS":
            err, function = function_of("data", handle, args[3])
            arg = int(args[4]) if len(args) > 4 else None
            res["launch"] = launch(function, arg) if function is not None else err
            step("launched", res["launch"])
        if len(args) > 5:
            res["alloc"] = allocate(args[5])
            step("allocated", res["alloc"])
elif mode == "loadtime":
    import statistics
    count, spec, kernel = int(args[0]), args[1], args[2]
    loads, functions = [], []
    for _ in range(count):
        result, handle, seconds = load("data", spec)
        if result != "CUDA_SUCCESS":
            raise SystemExit(f"load failed: {result}")
        loads.append(seconds * 1000)
        started = time.perf_counter()
        err, _f = function_of("data", handle, kernel)
        functions.append((time.perf_counter() - started) * 1000)
        unload("data", handle)
    res["load_ms_median"] = round(statistics.median(loads), 4)
    res["function_ms_median"] = round(statistics.median(functions), 4)
    step("after")
else:
    raise SystemExit(f"unknown mode {mode}")
res["peak_driver_mib"] = max((s["driver_mib"] for s in res["steps"] if isinstance(s["driver_mib"], (int, float))), default=None)
print("RESULT " + json.dumps(res))

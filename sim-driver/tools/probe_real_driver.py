"""Probe a real NVIDIA driver (libcuda.so.1 / libnvidia-ml.so.1) with ctypes and print
JSON facts the simulated driver imitates: error names and strings, device attributes,
cuGetProcAddress version rules, context overhead, allocation granularity, event/stream
query semantics and NVML strings. Run on a machine with a GPU: python3 probe_real_driver.py SYMBOL_LIST [OUT.json]
"""
import ctypes as C
import json
import sys

out = {}


def dump():
    """Rewrites the partial result (argv[2]) so a crash in a later probe keeps what came before."""
    if len(sys.argv) > 2:
        with open(sys.argv[2], "w") as f:
            json.dump(out, f, indent=1)

cu = C.CDLL("libcuda.so.1")
cu.cuGetErrorName.argtypes = [C.c_int, C.POINTER(C.c_char_p)]
cu.cuGetErrorString.argtypes = [C.c_int, C.POINTER(C.c_char_p)]
errors = {}
for code in range(0, 1001):
    name = C.c_char_p()
    if cu.cuGetErrorName(code, C.byref(name)) == 0:
        text = C.c_char_p()
        cu.cuGetErrorString(code, C.byref(text))
        errors[code] = [name.value.decode(), text.value.decode() if text.value else None]
out["errors"] = errors
bad = C.c_char_p(b"x")
out["errname_unknown_rc"] = cu.cuGetErrorName(12345, C.byref(bad))
out["errname_unknown_ptr_null"] = bad.value is None
out["pre_init_count_rc"] = cu.cuDeviceGetCount(C.byref(C.c_int()))
out["init_bad_flags_rc"] = cu.cuInit(1)
out["init_rc"] = cu.cuInit(0)
v = C.c_int()
cu.cuDriverGetVersion(C.byref(v))
out["driver_version"] = v.value
attrs = {}
for a in range(0, 160):
    val = C.c_int()
    rc = cu.cuDeviceGetAttribute(C.byref(val), a, 0)
    attrs[a] = val.value if rc == 0 else ("rc", rc)
out["attrs"] = attrs
dump()
name = C.create_string_buffer(256)
cu.cuDeviceGetName(name, 256, 0)
out["name"] = name.value.decode()
out["bad_device_attr_rc"] = cu.cuDeviceGetAttribute(C.byref(C.c_int()), 16, 99)
out["bad_attr_rc"] = cu.cuDeviceGetAttribute(C.byref(C.c_int()), 9999, 0)
bus = C.create_string_buffer(64)
cu.cuDeviceGetPCIBusId(bus, 64, 0)
out["pci_bus_id"] = bus.value.decode()
total = C.c_size_t()
cu.cuDeviceTotalMem_v2(C.byref(total), 0)
out["total_mem"] = total.value

# cuGetProcAddress rules: which exported symbol does each (name, version, flags) give?
lib_syms = [l.strip() for l in open(sys.argv[1])] if len(sys.argv) > 1 else []
addr_of = {}
for s in lib_syms:
    try:
        addr_of[C.cast(getattr(cu, s), C.c_void_p).value] = s
    except AttributeError:
        pass
gpa = cu.cuGetProcAddress_v2
gpa.argtypes = [C.c_char_p, C.POINTER(C.c_void_p), C.c_int, C.c_uint64, C.POINTER(C.c_int)]
rules = {}
names = ["cuMemAlloc", "cuMemFree", "cuMemGetInfo", "cuCtxCreate", "cuCtxDestroy", "cuGetProcAddress",
         "cuDeviceGetUuid", "cuStreamDestroy", "cuEventDestroy", "cuCtxPushCurrent", "cuCtxPopCurrent",
         "cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset", "cuDevicePrimaryCtxSetFlags",
         "cuMemcpyHtoD", "cuMemsetD8", "cuLaunchKernel", "cuStreamSynchronize", "cuEventRecord",
         "cuMemAllocAsync", "cuStreamWaitEvent", "cuDeviceTotalMem", "cuMemAllocPitch", "cuArrayCreate",
         "cuMemGetAddressRange", "cuStreamQuery", "cuModuleGetGlobal", "cuLaunchKernelEx", "cuInit",
         "cuMemcpyHtoD_v2", "cuMemAlloc_v2", "cuNoSuchThing", "cuMemFreeAsync", "cuLaunchCooperativeKernel",
         "cuStreamCreate", "cuEventQuery", "cuDeviceGetCount", "cuMemcpyDtoH", "cuMemsetD32", "cuArray3DCreate",
         "cuGraphInstantiate", "cuStreamBeginCapture", "cuStreamGetCaptureInfo", "cuMemcpy", "cuMemcpyAsync"]
for n in names:
    for ver in [2000, 3000, 3020, 4000, 6000, 7000, 10000, 11000, 11020, 11040, 12000, 12050, 12080, 13000]:
        for flags in [0, 1, 2]:
            p = C.c_void_p()
            st = C.c_int(-1)
            rc = gpa(n.encode(), C.byref(p), ver, flags, C.byref(st))
            rules[f"{n}/{ver}/{flags}"] = [rc, st.value, addr_of.get(p.value, hex(p.value) if p.value else None)]
out["proc_rules"] = rules
dump()
p = C.c_void_p(1)
st = C.c_int(-1)
ctx = C.c_void_p()
free0 = C.c_size_t(); tot = C.c_size_t()
prim = C.c_void_p()
out["primary_retain_rc"] = cu.cuDevicePrimaryCtxRetain(C.byref(prim), 0)
cu.cuCtxSetCurrent(prim)
cu.cuMemGetInfo_v2(C.byref(free0), C.byref(tot))
out["free_after_primary"] = free0.value
flags = C.c_uint(); active = C.c_int()
cu.cuDevicePrimaryCtxGetState(0, C.byref(flags), C.byref(active))
out["primary_state"] = [flags.value, active.value]
api = C.c_uint()
cu.cuCtxGetApiVersion(prim, C.byref(api))
out["api_version"] = api.value
ptrs = []
for size in [1, 100, 256, 513, 4096, 1 << 20, 3 << 20]:
    d = C.c_uint64()
    rc = cu.cuMemAlloc_v2(C.byref(d), C.c_size_t(size))
    base = C.c_uint64(); rsize = C.c_size_t()
    cu.cuMemGetAddressRange_v2(C.byref(base), C.byref(rsize), d)
    f = C.c_size_t(); t = C.c_size_t()
    cu.cuMemGetInfo_v2(C.byref(f), C.byref(t))
    ptrs.append([size, rc, hex(d.value), rsize.value, free0.value - f.value])
out["allocs"] = ptrs
d = C.c_uint64()
out["alloc0_rc"] = cu.cuMemAlloc_v2(C.byref(d), C.c_size_t(0))
out["alloc_huge_rc"] = cu.cuMemAlloc_v2(C.byref(d), C.c_size_t(1 << 50))
out["free_bogus_rc"] = cu.cuMemFree_v2(C.c_uint64(0x1234))
out["free_null_rc"] = cu.cuMemFree_v2(C.c_uint64(0))
ev = C.c_void_p(); ev2 = C.c_void_p()
cu.cuEventCreate(C.byref(ev), 0)
cu.cuEventCreate(C.byref(ev2), 0)
out["event_query_unrecorded"] = cu.cuEventQuery(ev)
out["event_sync_unrecorded"] = cu.cuEventSynchronize(ev)
ms = C.c_float()
out["elapsed_unrecorded"] = cu.cuEventElapsedTime(C.byref(ms), ev, ev2)
cu.cuEventRecord(ev, None)
out["elapsed_one_unrecorded"] = cu.cuEventElapsedTime(C.byref(ms), ev, ev2)
evnt = C.c_void_p()
cu.cuEventCreate(C.byref(evnt), 2)
cu.cuEventRecord(evnt, None)
cu.cuCtxSynchronize()
out["elapsed_disable_timing"] = cu.cuEventElapsedTime(C.byref(ms), ev, evnt)
gran = C.c_size_t()
prop = (C.c_ubyte * 32)()
C.cast(prop, C.POINTER(C.c_int))[0] = 1  # pinned
C.cast(prop, C.POINTER(C.c_int))[2] = 1  # location device
C.cast(prop, C.POINTER(C.c_int))[3] = 0
out["gran_rc"] = cu.cuMemGetAllocationGranularity(C.byref(gran), prop, 0)
out["gran_min"] = gran.value
cu.cuMemGetAllocationGranularity(C.byref(gran), prop, 1)
out["gran_rec"] = gran.value
h = C.c_uint64()
out["memcreate_unaligned_rc"] = cu.cuMemCreate(C.byref(h), C.c_size_t(4096), prop, C.c_uint64(0))
pool = C.c_void_p()
cu.cuDeviceGetDefaultMemPool(C.byref(pool), 0)
thr = C.c_uint64()
cu.cuMemPoolGetAttribute(pool, 4, C.byref(thr))
out["default_release_threshold"] = thr.value
da = C.c_uint64()
out["alloc_async_rc"] = cu.cuMemAllocAsync(C.byref(da), C.c_size_t(5 << 20), None)
r = C.c_uint64(); u = C.c_uint64()
cu.cuMemPoolGetAttribute(pool, 5, C.byref(r)); cu.cuMemPoolGetAttribute(pool, 7, C.byref(u))
out["pool_after_alloc"] = [r.value, u.value]
cu.cuMemFreeAsync(da, None)
cu.cuMemPoolGetAttribute(pool, 5, C.byref(r)); cu.cuMemPoolGetAttribute(pool, 7, C.byref(u))
out["pool_after_free"] = [r.value, u.value]
cu.cuStreamSynchronize(None)
cu.cuMemPoolGetAttribute(pool, 5, C.byref(r)); cu.cuMemPoolGetAttribute(pool, 7, C.byref(u))
out["pool_after_sync"] = [r.value, u.value]
out["pool_attr_bad_rc"] = cu.cuMemPoolGetAttribute(pool, 99, C.byref(r))
dump()
out["export_table_rc"] = cu.cuGetExportTable(C.byref(C.c_void_p()), C.c_char_p(b"0123456789abcdef"))
out["stream_query_null"] = cu.cuStreamQuery(None)
out["module_load_missing_rc"] = cu.cuModuleLoad(C.byref(C.c_void_p()), b"/nonexistent.cubin")
ptx = b""".version 8.0\n.target sm_90\n.address_size 64\n.visible .entry k_100us()\n{\n ret;\n}\n\0"""
mod = C.c_void_p()
out["ptx_load_rc"] = cu.cuModuleLoadData(C.byref(mod), ptx)
fn = C.c_void_p()
out["get_missing_function_rc"] = cu.cuModuleGetFunction(C.byref(fn), mod, b"nope")
out["get_function_rc"] = cu.cuModuleGetFunction(C.byref(fn), mod, b"k_100us")
fa = {}
for a in range(0, 20):
    val = C.c_int()
    rc = cu.cuFuncGetAttribute(C.byref(val), a, fn)
    fa[a] = val.value if rc == 0 else ("rc", rc)
out["func_attrs"] = fa
dump()
out["launch_zero_grid_rc"] = cu.cuLaunchKernel(fn, 0, 1, 1, 1, 1, 1, 0, None, None, None)
out["launch_big_block_rc"] = cu.cuLaunchKernel(fn, 1, 1, 1, 2048, 1, 1, 0, None, None, None)
out["launch_rc"] = cu.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, None, None, None)
attr = C.c_int()
out["ptr_attr_host_rc"] = cu.cuPointerGetAttribute(C.byref(attr), 9, C.c_uint64(C.addressof(attr)))
desc = (C.c_size_t * 3)(64, 64, 0)
arr_desc = (C.c_ubyte * 24)()
C.memmove(arr_desc, desc, 16)
C.cast(C.byref(arr_desc, 16), C.POINTER(C.c_uint))[0] = 0x20
C.cast(C.byref(arr_desc, 20), C.POINTER(C.c_uint))[0] = 4
arr = C.c_void_p()
f1 = C.c_size_t(); cu.cuMemGetInfo_v2(C.byref(f1), C.byref(tot))
out["array_rc"] = cu.cuArrayCreate_v2(C.byref(arr), arr_desc)
f2 = C.c_size_t(); cu.cuMemGetInfo_v2(C.byref(f2), C.byref(tot))
out["array_64x64_float4_charge"] = f1.value - f2.value
dump()

nv = C.CDLL("libnvidia-ml.so.1")
nv.nvmlErrorString.restype = C.c_char_p
out["nvml_errors"] = {c: nv.nvmlErrorString(c).decode() for c in list(range(0, 40)) + [999, 12345]}
out["nvml_pre_init_count_rc"] = nv.nvmlDeviceGetCount_v2(C.byref(C.c_uint()))
nv.nvmlInit_v2()
buf = C.create_string_buffer(96)
nv.nvmlSystemGetDriverVersion(buf, 96); out["nvml_driver"] = buf.value.decode()
nv.nvmlSystemGetNVMLVersion(buf, 96); out["nvml_version"] = buf.value.decode()
cv = C.c_int(); nv.nvmlSystemGetCudaDriverVersion_v2(C.byref(cv)); out["nvml_cuda_version"] = cv.value
dev = C.c_void_p(); nv.nvmlDeviceGetHandleByIndex_v2(0, C.byref(dev))
out["nvml_small_buf_rc"] = nv.nvmlDeviceGetName(dev, buf, 2)
nv.nvmlDeviceGetName(dev, buf, 96); out["nvml_name"] = buf.value.decode()
nv.nvmlDeviceGetUUID(dev, buf, 96); out["nvml_uuid"] = buf.value.decode()
out["nvml_serial_rc"] = nv.nvmlDeviceGetSerial(dev, buf, 96); out["nvml_serial"] = buf.value.decode()
mem2 = (C.c_uint64 * 5)()
out["mem_v2_badver_rc"] = nv.nvmlDeviceGetMemoryInfo_v2(dev, mem2)
C.cast(mem2, C.POINTER(C.c_uint))[0] = 40 | (2 << 24)
out["mem_v2_rc"] = nv.nvmlDeviceGetMemoryInfo_v2(dev, mem2)
out["mem_v2"] = list(mem2)
mem1 = (C.c_uint64 * 3)(); nv.nvmlDeviceGetMemoryInfo(dev, mem1); out["mem_v1"] = list(mem1)
bar = (C.c_uint64 * 3)(); nv.nvmlDeviceGetBAR1MemoryInfo(dev, bar); out["bar1"] = list(bar)
pci = (C.c_ubyte * 68)(); nv.nvmlDeviceGetPciInfo_v3(dev, pci)
out["pci_raw"] = bytes(pci).hex()
cnt = C.c_uint(0)
out["procs_null_rc"] = nv.nvmlDeviceGetComputeRunningProcesses_v3(dev, C.byref(cnt), None)
out["procs_count"] = cnt.value
procs = (C.c_ubyte * (24 * 8))(); cnt = C.c_uint(8)
out["procs_rc"] = nv.nvmlDeviceGetComputeRunningProcesses_v3(dev, C.byref(cnt), procs)
out["procs_raw"] = bytes(procs)[: 24 * cnt.value].hex()
for fn_name, args in [("nvmlDeviceGetTemperature", 1), ("nvmlDeviceGetPowerUsage", 0), ("nvmlDeviceGetEnforcedPowerLimit", 0),
                      ("nvmlDeviceGetPowerManagementLimit", 0), ("nvmlDeviceGetFanSpeed", 0), ("nvmlDeviceGetPerformanceState", 0),
                      ("nvmlDeviceGetPersistenceMode", 0), ("nvmlDeviceGetComputeMode", 0), ("nvmlDeviceGetDisplayMode", 0),
                      ("nvmlDeviceGetDisplayActive", 0), ("nvmlDeviceGetArchitecture", 0), ("nvmlDeviceGetBrand", 0),
                      ("nvmlDeviceGetCurrPcieLinkGeneration", 0), ("nvmlDeviceGetCurrPcieLinkWidth", 0), ("nvmlDeviceGetMinorNumber", 0)]:
    val = C.c_uint()
    rc = getattr(nv, fn_name)(dev, 0, C.byref(val)) if args else getattr(nv, fn_name)(dev, C.byref(val))
    out[fn_name] = [rc, val.value]
for clk in range(4):
    val = C.c_uint(); rc = nv.nvmlDeviceGetClockInfo(dev, clk, C.byref(val)); out[f"clock{clk}"] = [rc, val.value]
    rc = nv.nvmlDeviceGetMaxClockInfo(dev, clk, C.byref(val)); out[f"maxclock{clk}"] = [rc, val.value]
a = C.c_uint(); b = C.c_uint()
out["ecc"] = [nv.nvmlDeviceGetEccMode(dev, C.byref(a), C.byref(b)), a.value, b.value]
out["mig"] = [nv.nvmlDeviceGetMigMode(dev, C.byref(a), C.byref(b)), a.value, b.value]
x = C.c_int(); y = C.c_int(); nv.nvmlDeviceGetCudaComputeCapability(dev, C.byref(x), C.byref(y)); out["cc"] = [x.value, y.value]
ut = (C.c_uint * 2)(); out["util_rc"] = nv.nvmlDeviceGetUtilizationRates(dev, ut); out["util"] = list(ut)
cnt = C.c_uint(0)
out["proc_util_null_rc"] = nv.nvmlDeviceGetProcessUtilization(dev, None, C.byref(cnt), C.c_uint64(0)); out["proc_util_count"] = cnt.value
out["handle_bad_uuid_rc"] = nv.nvmlDeviceGetHandleByUUID(b"GPU-nope", C.byref(C.c_void_p()))
out["handle_bad_index_rc"] = nv.nvmlDeviceGetHandleByIndex_v2(99, C.byref(C.c_void_p()))
nv.nvmlSystemGetProcessName(C.c_uint(__import__("os").getpid()), buf, 96); out["process_name"] = buf.value.decode()
dump()
print(json.dumps(out, indent=1))

"""cuGetProcAddress_v2 against the real driver, through the shim: for every hooked
export's base name, at CUDA 13.0 and 12.0, with default and per-thread-stream flags, is
the pointer handed out the shim's hook? Prints RESULT {"checked": N, "escapes": [...]}.
Run under `vgpu run --memory ...` (hooks are only swapped in when a quota applies)."""
import ctypes, json, os, re, sys

root = sys.argv[1]
hooked = set()
for f in os.listdir(os.path.join(root, "libcuda-shim/src/hooks")):
    if f.endswith(".rs"):
        hooked |= set(re.findall(r"\bfn (cu[A-Z]\w*)\s*\(", open(os.path.join(root, "libcuda-shim/src/hooks", f)).read()))
lib = ctypes.CDLL("libcuda.so.1")
assert lib.cuInit(0) == 0
addr = {name: ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in hooked}
hook_addrs = set(addr.values())
gpa = lib.cuGetProcAddress_v2
gpa.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int)]
bases = sorted({re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", h) for h in hooked})
checked, escapes, not_found = 0, [], []
for base in bases:
    for version in (13000, 12000):
        for flags in (0, 2):
            p, status = ctypes.c_void_p(), ctypes.c_int()
            rc = gpa(base.encode(), ctypes.byref(p), version, flags, ctypes.byref(status))
            if rc != 0 or not p.value:
                not_found.append(f"{base}@{version}/{flags}:{rc}")
                continue
            checked += 1
            if p.value not in hook_addrs:
                escapes.append(f"{base}@{version}/{flags}")
print("RESULT " + json.dumps({"hooked": len(hooked), "checked": checked, "escapes": escapes, "not_found": not_found}))

"""PTX through the driver's JIT, as a pod gets it: cuModuleLoadData with PTX text (the
real libcuda compiles it with libnvidia-ptxjitcompiler, a helper it dlopens by name, so
it fails with CUDA_ERROR_JIT_COMPILER_NOT_FOUND when the container's loader cannot find
that name), then one launch of its kernel, which stores a value; with --verify (a real
GPU) the value is read back and compared.

    python3 ptx_module.py [--verify]

Prints one line `RESULT {json}`: "load" is the name cuModuleLoadData returned; exit 0
only when every step succeeded. Importable: run(verify) returns the same dict."""
import ctypes
import json
import sys

KERNEL = "vgpu_pod_store"
VALUE = 0x5EED
PTX = r"""
.version 8.0
.target sm_90
.address_size 64

.visible .entry vgpu_pod_store(.param .u64 out, .param .u32 value)
{
    .reg .b32 %r<2>;
    .reg .b64 %rd<3>;

    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [value];
    cvta.to.global.u64 %rd2, %rd1;
    st.global.u32 [%rd2], %r1;
    ret;
}
"""


class Failed(Exception):
    pass


def run(verify):
    from cuda.bindings import driver as cu

    result = {"ok": False}

    def call(answer, what):
        err = answer[0] if isinstance(answer, tuple) else answer
        if err != cu.CUresult.CUDA_SUCCESS:
            result["failed"] = f"{what}: {err.name}"
            raise Failed(what)
        rest = answer[1:] if isinstance(answer, tuple) else ()
        return rest[0] if len(rest) == 1 else rest

    try:
        call(cu.cuInit(0), "cuInit")
        device = call(cu.cuDeviceGet(0), "cuDeviceGet")
        context = call(cu.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
        call(cu.cuCtxSetCurrent(context), "cuCtxSetCurrent")
        err, module = cu.cuModuleLoadData(PTX.encode() + b"\0")
        result["load"] = err.name
        result["load_code"] = int(err)
        if err != cu.CUresult.CUDA_SUCCESS:
            result["failed"] = f"cuModuleLoadData(PTX): {err.name}"
            return result
        function = call(cu.cuModuleGetFunction(module, KERNEL.encode()), "cuModuleGetFunction")
        out = call(cu.cuMemAlloc(4), "cuMemAlloc")
        out_arg = ctypes.c_uint64(int(out))
        value_arg = ctypes.c_uint32(VALUE)
        params = (ctypes.c_void_p * 2)(ctypes.addressof(out_arg), ctypes.addressof(value_arg))
        call(cu.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, 0, ctypes.addressof(params), 0), "cuLaunchKernel")
        call(cu.cuCtxSynchronize(), "cuCtxSynchronize")
        result["launched"] = True
        if verify:
            host = ctypes.c_uint32(0)
            call(cu.cuMemcpyDtoH(ctypes.addressof(host), out, 4), "cuMemcpyDtoH")
            result["value"] = host.value
            if host.value != VALUE:
                result["failed"] = f"the kernel stored {host.value:#x}, not {VALUE:#x}"
                return result
        call(cu.cuMemFree(out), "cuMemFree")
        result["ok"] = True
    except Failed:
        pass
    return result


if __name__ == "__main__":
    outcome = run("--verify" in sys.argv[1:])
    print("RESULT " + json.dumps(outcome), flush=True)
    sys.exit(0 if outcome["ok"] else 1)

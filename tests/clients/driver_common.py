"""What the cuda-bindings clients share: a result check and a first context."""
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

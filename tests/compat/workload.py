"""One row of the compatibility matrix: the fixed workload, run by one CUDA client.

Owns the clients (a CUDA runtime from a wheel through ctypes, cuda-bindings, PyTorch,
CuPy, JAX, numba-cuda, nvidia-ml-py) behind one small interface, and the workload
itself: query the quota, fill it (3 GiB, then 256 MiB steps until refused, then one more
that must be refused too), show nvidia-smi's view at the peak, free, allocate again, and
time a loop of kernels. It only measures; `compat.py` judges.

Usage: workload.py CLIENT [--phase all|launch] [--warm S] [--measure S]
                          [--hold-marker FILE --release FILE]
CLIENT: cudart:/path/to/libcudart.so.N | cuda-bindings | torch | cupy | jax | numba |
        nvidia-ml-py

After every phase it prints `RESULT {json}` (cumulative), so a crash or a timeout still
leaves what was measured before it. Nothing here raises past main: every failure becomes
a recorded error string.
"""
import argparse
import ctypes
import json
import os
import shlex
import subprocess
import sys
import time
import traceback

MIB = 1 << 20
GIB = 1 << 30
FIRST_ALLOCATION = 3 * GIB
STEP = 256 * MIB
MAX_STEPS = 32  # 8 GiB of steps: far past a 4 GiB quota, so a missing refusal shows
SPIN_ITERATIONS = 100_000
BLOCK_THREADS = 256
BLOCKS_PER_SM = 8
# The kernel's name ends in a duration, which the simulated driver reads as how long the
# kernel takes (sim-driver/src/clock.rs); a real driver just runs the loop.
SPIN_KERNEL = "vgpu_compat_spin_2ms"
SPIN_PTX = r"""
.version 7.0
.target sm_75
.address_size 64

.visible .entry vgpu_compat_spin_2ms(.param .u64 out, .param .u32 iterations)
{
    .reg .pred %p<3>;
    .reg .b32 %r<4>;
    .reg .f32 %f<2>;
    .reg .b64 %rd<3>;

    ld.param.u64 %rd1, [out];
    ld.param.u32 %r1, [iterations];
    mov.u32 %r2, %tid.x;
    cvt.rn.f32.u32 %f1, %r2;
    mov.u32 %r3, 0;
LOOP:
    fma.rn.f32 %f1, %f1, 0f3F7FFFFE, 0f3A83126F;
    add.u32 %r3, %r3, 1;
    setp.lt.u32 %p1, %r3, %r1;
    @%p1 bra LOOP;
    setp.eq.f32 %p2, %f1, 0f7F800000;
    @!%p2 bra DONE;
    cvta.to.global.u64 %rd2, %rd1;
    st.global.f32 [%rd2], %f1;
DONE:
    ret;
}
"""

# The same loop in CUDA C, for CuPy's RawKernel (compiled by NVRTC, as CuPy's own kernels are).
CUPY_SPIN_SOURCE = r"""
extern "C" __global__ void vgpu_compat_spin_2ms(float *out, unsigned int iterations) {
    float x = (float)threadIdx.x;
    for (unsigned int i = 0; i < iterations; ++i) x = fmaf(x, 0.9999999f, 0.001f);
    if (x > 3.0e38f) out[0] = x;
}
"""


class OutOfMemory(Exception):
    """The client refused an allocation with its out-of-memory error (the name kept)."""


class Unavailable(Exception):
    """The client cannot do this step at all (not an error of the shim): n/a."""


def looks_like_oom(error):
    """Whether a framework exception is its out-of-memory error."""
    text = f"{type(error).__name__} {error}"
    markers = ("OutOfMemory", "OUT_OF_MEMORY", "RESOURCE_EXHAUSTED", "out of memory", "Out of memory",
               "cudaErrorMemoryAllocation")
    return any(m in text for m in markers) or getattr(error, "code", None) == 2


def short(error):
    """One line naming an exception, for a footnote."""
    text = " ".join(str(error).split())
    return f"{type(error).__name__}: {text[:300]}"


class DriverApi:
    """libcuda.so.1 through ctypes (the shim under `vgpu run`): driver version, and the
    PTX spin kernel launched in whatever context is current."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.lib.cuGetErrorName.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        self.function = None

    def error_name(self, code):
        name = ctypes.c_char_p()
        if self.lib.cuGetErrorName(code, ctypes.byref(name)) == 0 and name.value:
            return name.value.decode()
        return f"CUresult {code}"

    def check(self, code, what):
        if code != 0:
            raise RuntimeError(f"{what}: {self.error_name(code)}")

    def version(self):
        version = ctypes.c_int(0)
        self.check(self.lib.cuDriverGetVersion(ctypes.byref(version)), "cuDriverGetVersion")
        return version.value

    def prepare(self, out_pointer):
        ctx = ctypes.c_void_p()
        self.check(self.lib.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            raise RuntimeError("no current context after the runtime's initialization")
        module = ctypes.c_void_p()
        image = ctypes.create_string_buffer(SPIN_PTX.encode())
        self.check(self.lib.cuModuleLoadData(ctypes.byref(module), image), "cuModuleLoadData(PTX)")
        function = ctypes.c_void_p()
        self.check(self.lib.cuModuleGetFunction(ctypes.byref(function), module, SPIN_KERNEL.encode()), "cuModuleGetFunction")
        device = ctypes.c_int()
        self.check(self.lib.cuCtxGetDevice(ctypes.byref(device)), "cuCtxGetDevice")
        sms = ctypes.c_int()
        self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(sms), 16, device), "cuDeviceGetAttribute(MULTIPROCESSOR_COUNT)")
        self.function = function
        self.grid = max(1, sms.value) * BLOCKS_PER_SM
        self.out_arg = ctypes.c_uint64(out_pointer)
        self.iterations_arg = ctypes.c_uint32(SPIN_ITERATIONS)
        self.params = (ctypes.c_void_p * 2)(ctypes.addressof(self.out_arg), ctypes.addressof(self.iterations_arg))
        self.lib.cuLaunchKernel.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        return f"{SPIN_KERNEL} (PTX via cuModuleLoadData), {self.grid}x{BLOCK_THREADS}"

    def launch(self, count):
        for _ in range(count):
            self.check(self.lib.cuLaunchKernel(self.function, self.grid, 1, 1, BLOCK_THREADS, 1, 1, 0, None,
                                               ctypes.cast(self.params, ctypes.c_void_p), None), "cuLaunchKernel")

    def sync(self):
        self.check(self.lib.cuCtxSynchronize(), "cuCtxSynchronize")


class CudartClient:
    """A CUDA runtime (libcudart.so.N from a PyPI wheel) driven through ctypes; kernels go
    through the driver API in the runtime's own primary context (a cudart launch needs a
    registered fatbin, which a wheel cannot give)."""

    def __init__(self, path):
        self.rt = ctypes.CDLL(path)
        self.rt.cudaGetErrorName.restype = ctypes.c_char_p
        self.rt.cudaGetErrorName.argtypes = [ctypes.c_int]
        self.rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.rt.cudaFree.argtypes = [ctypes.c_void_p]
        self.driver = DriverApi()
        self.path = path

    def error_name(self, code):
        name = self.rt.cudaGetErrorName(code)
        return name.decode() if name else f"cudaError {code}"

    def check(self, code, what):
        if code != 0:
            raise RuntimeError(f"{what}: {self.error_name(code)}")

    def versions(self):
        runtime, driver = ctypes.c_int(0), ctypes.c_int(0)
        self.check(self.rt.cudaRuntimeGetVersion(ctypes.byref(runtime)), "cudaRuntimeGetVersion")
        self.check(self.rt.cudaDriverGetVersion(ctypes.byref(driver)), "cudaDriverGetVersion")
        return {"runtime": runtime.value, "driver": driver.value, "library": os.path.basename(self.path)}

    def init(self):
        self.check(self.rt.cudaFree(None), "cudaFree(0) (context creation)")

    def mem_info(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check(self.rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "cudaMemGetInfo")
        return free.value, total.value, "cudaMemGetInfo"

    def alloc(self, size):
        pointer = ctypes.c_void_p()
        code = self.rt.cudaMalloc(ctypes.byref(pointer), size)
        if code == 2:
            raise OutOfMemory(self.error_name(code))
        self.check(code, "cudaMalloc")
        return pointer.value

    def free(self, handle):
        self.check(self.rt.cudaFree(handle), "cudaFree")

    def release_cached(self):
        self.check(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def prepare_kernels(self):
        self.scratch = self.alloc(MIB)
        return self.driver.prepare(self.scratch)

    def launch(self, count):
        self.driver.launch(count)

    def sync(self):
        self.driver.sync()


class CudaBindingsClient:
    """NVIDIA's cuda-bindings, driver API: primary context, cuMemAlloc, the PTX kernel."""

    def __init__(self):
        from cuda.bindings import driver
        self.cu = driver
        import cuda.bindings
        self.bindings_version = getattr(cuda.bindings, "__version__", "?")

    def call(self, result, what):
        err = result[0] if isinstance(result, tuple) else result
        if err != self.cu.CUresult.CUDA_SUCCESS:
            if err == self.cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
                raise OutOfMemory(err.name)
            raise RuntimeError(f"{what}: {err.name}")
        rest = result[1:] if isinstance(result, tuple) else ()
        return rest[0] if len(rest) == 1 else rest

    def versions(self):
        return {"cuda-bindings": self.bindings_version, "driver": int(self.call(self.cu.cuDriverGetVersion(), "cuDriverGetVersion"))}

    def init(self):
        self.call(self.cu.cuInit(0), "cuInit")
        self.device = self.call(self.cu.cuDeviceGet(0), "cuDeviceGet")
        self.ctx = self.call(self.cu.cuDevicePrimaryCtxRetain(self.device), "cuDevicePrimaryCtxRetain")
        self.call(self.cu.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def mem_info(self):
        free, total = self.call(self.cu.cuMemGetInfo(), "cuMemGetInfo")
        return int(free), int(total), "cuMemGetInfo"

    def alloc(self, size):
        return self.call(self.cu.cuMemAlloc(size), "cuMemAlloc")

    def free(self, handle):
        self.call(self.cu.cuMemFree(handle), "cuMemFree")

    def release_cached(self):
        self.sync()

    def prepare_kernels(self):
        self.scratch = self.alloc(MIB)
        module = self.call(self.cu.cuModuleLoadData(SPIN_PTX.encode() + b"\0"), "cuModuleLoadData(PTX)")
        self.function = self.call(self.cu.cuModuleGetFunction(module, SPIN_KERNEL.encode()), "cuModuleGetFunction")
        attribute = self.cu.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
        sms = self.call(self.cu.cuDeviceGetAttribute(attribute, self.device), "cuDeviceGetAttribute")
        self.grid = max(1, int(sms)) * BLOCKS_PER_SM
        self.out_arg = ctypes.c_uint64(int(self.scratch))
        self.iterations_arg = ctypes.c_uint32(SPIN_ITERATIONS)
        self.params = (ctypes.c_void_p * 2)(ctypes.addressof(self.out_arg), ctypes.addressof(self.iterations_arg))
        return f"{SPIN_KERNEL} (PTX via cuModuleLoadData), {self.grid}x{BLOCK_THREADS}"

    def launch(self, count):
        for _ in range(count):
            self.call(self.cu.cuLaunchKernel(self.function, self.grid, 1, 1, BLOCK_THREADS, 1, 1, 0, 0,
                                             ctypes.addressof(self.params), 0), "cuLaunchKernel")

    def sync(self):
        self.call(self.cu.cuCtxSynchronize(), "cuCtxSynchronize")


class TorchClient:
    """PyTorch: mem_get_info, its caching allocator, a 4096² fp32 matmul loop."""

    def __init__(self):
        import torch
        self.torch = torch

    def versions(self):
        return {"torch": self.torch.__version__, "runtime": self.torch.version.cuda}

    def init(self):
        if not self.torch.cuda.is_available():
            raise RuntimeError("torch.cuda.is_available() is False")
        self.torch.cuda.init()

    def mem_info(self):
        free, total = self.torch.cuda.mem_get_info()
        return int(free), int(total), "torch.cuda.mem_get_info"

    def alloc(self, size):
        try:
            return self.torch.empty(size, dtype=self.torch.uint8, device="cuda")
        except self.torch.OutOfMemoryError as error:
            raise OutOfMemory(f"torch.OutOfMemoryError ({str(error).splitlines()[0][:120]})") from None

    def free(self, handle):
        del handle

    def release_cached(self):
        self.torch.cuda.synchronize()
        self.torch.cuda.empty_cache()

    def prepare_kernels(self):
        self.a = self.torch.randn(4096, 4096, device="cuda")
        self.c = self.torch.empty_like(self.a)
        self.torch.matmul(self.a, self.a, out=self.c)
        self.sync()
        return "torch.matmul 4096x4096 fp32"

    def launch(self, count):
        for _ in range(count):
            self.torch.matmul(self.a, self.a, out=self.c)

    def sync(self):
        self.torch.cuda.synchronize()


class CupyClient:
    """CuPy: runtime.memGetInfo, its memory pool, a 4096² fp32 matmul loop (cuBLAS)."""

    def __init__(self):
        import cupy
        import numpy
        self.cp, self.np = cupy, numpy

    def versions(self):
        return {"cupy": self.cp.__version__, "runtime": int(self.cp.cuda.runtime.runtimeGetVersion())}

    def init(self):
        self.cp.cuda.Device(0).use()
        self.cp.cuda.runtime.free(0)

    def mem_info(self):
        free, total = self.cp.cuda.runtime.memGetInfo()
        return int(free), int(total), "cupy.cuda.runtime.memGetInfo"

    def alloc(self, size):
        try:
            return self.cp.empty(size, dtype=self.cp.uint8)
        except self.cp.cuda.memory.OutOfMemoryError as error:
            raise OutOfMemory(f"cupy OutOfMemoryError ({str(error)[:120]})") from None

    def free(self, handle):
        del handle

    def release_cached(self):
        self.sync()
        self.cp.get_default_memory_pool().free_all_blocks()

    def prepare_kernels(self):
        self.kernel = self.cp.RawKernel(CUPY_SPIN_SOURCE, SPIN_KERNEL)
        self.out = self.cp.zeros(1, dtype=self.cp.float32)
        sms = self.cp.cuda.Device(0).attributes["MultiProcessorCount"]
        self.grid = max(1, int(sms)) * BLOCKS_PER_SM
        self.launch(1)
        self.sync()
        return f"cupy.RawKernel spin (NVRTC), {self.grid}x{BLOCK_THREADS}"

    def launch(self, count):
        iterations = self.np.uint32(SPIN_ITERATIONS)
        for _ in range(count):
            self.kernel((self.grid,), (BLOCK_THREADS,), (self.out, iterations))

    def sync(self):
        self.cp.cuda.Device(0).synchronize()


class JaxClient:
    """JAX: the BFC allocator's limit (memory_stats bytes_limit over
    XLA_PYTHON_CLIENT_MEM_FRACTION, which XLA computed from cuMemGetInfo), arrays from
    jnp.zeros, a jitted 4096² matmul loop."""

    def __init__(self):
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp

    def versions(self):
        import jaxlib
        return {"jax": self.jax.__version__, "jaxlib": getattr(jaxlib, "__version__", "?")}

    def init(self):
        devices = self.jax.devices()
        if not devices or devices[0].platform != "gpu":
            raise RuntimeError(f"JAX sees no GPU: {devices}")
        self.device = devices[0]

    def mem_info(self):
        stats = self.device.memory_stats() or {}
        if "bytes_limit" not in stats:
            raise Unavailable(f"memory_stats() has no bytes_limit: {sorted(stats)}")
        fraction = float(os.environ.get("XLA_CLIENT_MEM_FRACTION") or os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION") or "0.75")
        total = round(stats["bytes_limit"] / fraction)
        return total - int(stats.get("bytes_in_use", 0)), total, f"memory_stats bytes_limit / {fraction}"

    def alloc(self, size):
        try:
            # 32-bit words keep the element count under 2**31 for XLA's kernels.
            array = self.jnp.zeros((size // 4,), dtype=self.jnp.uint32)
            array.block_until_ready()
            return array
        except Exception as error:  # JAX raises its runtime error type for RESOURCE_EXHAUSTED
            if looks_like_oom(error):
                raise OutOfMemory(f"RESOURCE_EXHAUSTED ({str(error).splitlines()[0][:120]})") from None
            raise

    def free(self, handle):
        handle.delete()

    def release_cached(self):
        pass

    def prepare_kernels(self):
        self.a = self.jnp.ones((4096, 4096), dtype=self.jnp.float32)
        self.step = self.jax.jit(lambda a: a @ a)
        self.last = self.step(self.a)
        self.sync()
        return "jax.jit(a @ a) 4096x4096 fp32"

    def launch(self, count):
        for _ in range(count):
            self.last = self.step(self.a)

    def sync(self):
        self.last.block_until_ready()


class NumbaClient:
    """numba-cuda: get_memory_info, device_array, a @cuda.jit spin kernel."""

    def __init__(self):
        import numpy
        from numba import cuda
        self.np, self.cuda = numpy, cuda

    def versions(self):
        import numba
        versions = {"numba": numba.__version__}
        try:
            import numba_cuda
            versions["numba-cuda"] = getattr(numba_cuda, "__version__", "?")
        except ImportError:
            pass
        return versions

    def init(self):
        if not self.cuda.is_available():
            raise RuntimeError("numba.cuda.is_available() is False")
        self.context = self.cuda.current_context()

    def mem_info(self):
        free, total = self.context.get_memory_info()
        return int(free), int(total), "numba context.get_memory_info"

    def alloc(self, size):
        try:
            return self.cuda.device_array(size, dtype=self.np.uint8)
        except Exception as error:
            if looks_like_oom(error):
                raise OutOfMemory(f"CudaAPIError ({str(error)[:120]})") from None
            raise

    def free(self, handle):
        del handle

    def release_cached(self):
        self.context.deallocations.clear()
        self.cuda.synchronize()

    def prepare_kernels(self):
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        from numba_spin import vgpu_compat_spin_2ms

        self.kernel = vgpu_compat_spin_2ms
        self.out = self.cuda.device_array(1, dtype=self.np.float32)
        sms = self.cuda.get_current_device().MULTIPROCESSOR_COUNT
        self.grid = max(1, int(sms)) * BLOCKS_PER_SM
        self.kernel[self.grid, BLOCK_THREADS](self.out, SPIN_ITERATIONS)
        self.sync()
        return f"@cuda.jit spin, {self.grid}x{BLOCK_THREADS}"

    def launch(self, count):
        for _ in range(count):
            self.kernel[self.grid, BLOCK_THREADS](self.out, SPIN_ITERATIONS)

    def sync(self):
        self.cuda.synchronize()


class NvmlClient:
    """nvidia-ml-py: NVML's memory info of device 0; it neither allocates nor launches."""

    def __init__(self):
        import pynvml
        self.nvml = pynvml

    def versions(self):
        return {"nvml_driver": self.nvml.nvmlSystemGetDriverVersion(), "driver": self.nvml.nvmlSystemGetCudaDriverVersion()}

    def init(self):
        self.nvml.nvmlInit()
        self.handle = self.nvml.nvmlDeviceGetHandleByIndex(0)

    def mem_info(self):
        info = self.nvml.nvmlDeviceGetMemoryInfo(self.handle)
        return int(info.free), int(info.total), "nvmlDeviceGetMemoryInfo"

    def alloc(self, size):
        raise Unavailable("NVML does not allocate")

    def prepare_kernels(self):
        raise Unavailable("NVML does not launch kernels")


def make_client(spec):
    if spec.startswith("cudart:"):
        return CudartClient(spec[len("cudart:"):])
    factories = {"cuda-bindings": CudaBindingsClient, "torch": TorchClient, "cupy": CupyClient, "jax": JaxClient,
                 "numba": NumbaClient, "nvidia-ml-py": NvmlClient}
    if spec not in factories:
        raise SystemExit(f"unknown client {spec!r}: one of cudart:PATH, {', '.join(factories)}")
    return factories[spec]()


class Workload:
    def __init__(self, client, args):
        self.client, self.args = client, args
        self.res = {"pid": os.getpid()}

    def emit(self):
        print("RESULT " + json.dumps(self.res), flush=True)

    def step(self, key, function):
        """Runs one phase, recording its result or its error under `key`; True on success."""
        try:
            self.res[key] = function()
            return True
        except Unavailable as reason:
            self.record_failure(key, "na", str(reason))
        except Exception as error:
            self.record_failure(key, "error", short(error))
            if os.environ.get("VGPU_COMPAT_TRACE"):
                traceback.print_exc()
        finally:
            self.emit()
        return False

    def record_failure(self, key, kind, text):
        """Keeps what a phase already recorded (memory records as it goes) beside why it stopped."""
        existing = self.res.get(key)
        if isinstance(existing, dict):
            existing[kind] = text
        else:
            self.res[key] = {kind: text}

    def quota(self):
        free, total, source = self.client.mem_info()
        return {"free": free, "total": total, "source": source}

    def try_alloc(self, size, held):
        try:
            held.append((self.client.alloc(size), size))
            return "ok"
        except OutOfMemory as oom:
            return f"OOM: {oom}"

    def memory(self):
        held, out = [], {}
        out["first"] = {"size": FIRST_ALLOCATION, "result": self.try_alloc(FIRST_ALLOCATION, held)}
        steps = []
        for _ in range(MAX_STEPS):
            result = self.try_alloc(STEP, held)
            steps.append(result)
            if result != "ok":
                break
        out["steps"] = steps
        out["refused"] = bool(steps) and steps[-1] != "ok"
        out["held_bytes"] = sum(size for _, size in held)
        out["again"] = self.try_alloc(STEP, held) if out["refused"] else "not tried: nothing was refused"
        out["held_bytes"] = sum(size for _, size in held)
        try:
            free, total, _ = self.client.mem_info()
            out["peak_mem_info"] = [free, total]
        except Exception as error:
            out["peak_mem_info"] = {"error": short(error)}
        self.res["memory"] = out
        self.res["smi"] = self.smi()
        self.emit()
        self.hold()
        for handle, _ in held:
            self.client.free(handle)
        held.clear()
        self.client.release_cached()
        try:
            free, total, _ = self.client.mem_info()
            out["after_free_mem_info"] = [free, total]
        except Exception as error:
            out["after_free_mem_info"] = {"error": short(error)}
        out["realloc"] = self.try_alloc(FIRST_ALLOCATION, held)
        for handle, _ in held:
            self.client.free(handle)
        held.clear()
        self.client.release_cached()
        return out

    def smi(self):
        command = os.environ.get("COMPAT_SMI", "nvidia-smi")
        argv = shlex.split(command) + ["--query-gpu=memory.total,memory.used", "--format=csv,noheader,nounits"]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=20)
        except FileNotFoundError:
            return {"na": f"{argv[0]} is not installed"}
        except subprocess.TimeoutExpired:
            return {"error": f"{command} did not answer in 20 s"}
        return {"command": command, "rc": done.returncode, "stdout": done.stdout.strip()[:300], "stderr": done.stderr.strip()[-300:]}

    def hold(self):
        """At the peak: tell the caller (marker file: our PID) and wait for its release
        file, so it can read the card's own view of this process. Never longer than 15 s."""
        if not self.args.hold_marker:
            return
        with open(self.args.hold_marker + ".tmp", "w") as marker:
            marker.write(str(os.getpid()))
        os.replace(self.args.hold_marker + ".tmp", self.args.hold_marker)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not os.path.exists(self.args.release):
            time.sleep(0.05)

    def launch(self):
        out = {"kernel": self.client.prepare_kernels()}
        batch, started = 1, time.monotonic()
        # Warm-up: also picks a batch that takes at least 20 ms between synchronizations.
        while time.monotonic() - started < self.args.warm:
            t0 = time.monotonic()
            self.client.launch(batch)
            self.client.sync()
            if time.monotonic() - t0 < 0.02 and batch < 256:
                batch *= 2
        count, started = 0, time.monotonic()
        while time.monotonic() - started < self.args.measure:
            self.client.launch(batch)
            self.client.sync()
            count += batch
        elapsed = time.monotonic() - started
        out.update(count=count, seconds=round(elapsed, 4), rate=count / elapsed, batch=batch,
                   per_kernel_ms=1000 * elapsed / max(count, 1))
        return out

    def run(self):
        # Versions are informative; some need the library initialized (NVML, cudart 11),
        # so a failure before init is retried after it.
        versions_first = self.step("versions", self.client.versions)
        if not self.step("init", lambda: self.client.init() or "ok"):
            return
        if not versions_first:
            self.step("versions", self.client.versions)
        if self.args.phase == "all":
            self.step("quota", self.quota)
            self.step("memory", self.memory)
            if "smi" not in self.res:
                self.res["smi"] = self.smi()
                self.emit()
        self.step("launch", self.launch)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("client")
    parser.add_argument("--phase", choices=["all", "launch"], default="all")
    parser.add_argument("--warm", type=float, default=0.5)
    parser.add_argument("--measure", type=float, default=2.0)
    parser.add_argument("--hold-marker")
    parser.add_argument("--release")
    args = parser.parse_args()
    if bool(args.hold_marker) != bool(args.release):
        parser.error("--hold-marker and --release go together")
    try:
        client = make_client(args.client)
    except ImportError as error:
        print("RESULT " + json.dumps({"pid": os.getpid(), "init": {"na": f"not installed: {short(error)}"}}), flush=True)
        return
    except Exception as error:
        print("RESULT " + json.dumps({"pid": os.getpid(), "init": {"error": short(error)}}), flush=True)
        return
    Workload(client, args).run()


if __name__ == "__main__":
    main()

"""Run inside a container built from a real Allocate response (runc_e2e, podman_cdi):
prints one line per fact for the test to check.

  CONFIG <the container config, newlines as |>
  ENV <VGPU_CONFIG> <NVIDIA_VISIBLE_DEVICES> <LD_LIBRARY_PATH>
  LIB <folder> <sha256 of libcuda.so.1> <sha256 of libnvidia-ml.so.1>   (each shim folder)
  HELPER <path the loader found for libnvidia-ptxjitcompiler.so.1, by name>
  NODE <path> <c|b|-> <major> <minor>                                    (each /dev/nvidia*)
  TOTAL <total memory pynvml reports>                                    (CHECK_NVML=1)
  PTX_MISSING <what cuModuleLoadData says with the helper's name unknown>
  PTX <what cuModuleLoadData says with the helper the layout provides>

The PTX lines need the simulated driver with VGPU_SIM_PTX_JIT_LIBRARY (which makes it
dlopen a JIT helper by name, as the real libcuda does)."""
import ctypes
import glob
import hashlib
import os
import stat
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "gpu"))
sys.path.insert(0, os.environ.get("VGPU_TESTS_GPU", "/vgpu-tests/gpu"))


def digest(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


print("CONFIG", open("/etc/vgpu/vgpu.yaml").read().replace("\n", "|"))
print("ENV", os.environ.get("VGPU_CONFIG"), os.environ.get("NVIDIA_VISIBLE_DEVICES"), os.environ.get("LD_LIBRARY_PATH"))
for d in ["/usr/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/local/nvidia/lib64"]:
    print("LIB", d, digest(d + "/libcuda.so.1"), digest(d + "/libnvidia-ml.so.1"))
helper = "libnvidia-ptxjitcompiler.so.1"
try:
    ctypes.CDLL(helper)
    found = [line.split()[-1] for line in open("/proc/self/maps") if line.rstrip().endswith(helper)]
    print("HELPER", found[0] if found else "?")
except OSError as err:
    print("HELPER none", err)
for node in sorted(glob.glob("/dev/nvidia*")):
    mode = os.stat(node)
    kind = "c" if stat.S_ISCHR(mode.st_mode) else "b" if stat.S_ISBLK(mode.st_mode) else "-"
    print("NODE", node, kind, os.major(mode.st_rdev), os.minor(mode.st_rdev))
if os.environ.get("CHECK_NVML") == "1":
    import pynvml

    pynvml.nvmlInit()
    print("COUNT", pynvml.nvmlDeviceGetCount())
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    print("TOTAL", pynvml.nvmlDeviceGetMemoryInfo(handle).total)
if os.environ.get("VGPU_SIM_PTX_JIT_LIBRARY"):
    import ptx_module

    wanted = os.environ["VGPU_SIM_PTX_JIT_LIBRARY"]
    os.environ["VGPU_SIM_PTX_JIT_LIBRARY"] = "libnvidia-not-in-the-layout.so.1"
    print("PTX_MISSING", ptx_module.run(False).get("load"))
    os.environ["VGPU_SIM_PTX_JIT_LIBRARY"] = wanted
    outcome = ptx_module.run(False)
    print("PTX", outcome.get("load"), "launched" if outcome.get("launched") else outcome.get("failed"))

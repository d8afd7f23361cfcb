"""A stand-in for decode.py and train.py without PyTorch, for testing run_limiter.sh's
part `torch` (rounds.py's serving, interleave.py's rounds, judge.py's per-cycle ratios)
over the simulated driver (TORCH_STANDIN=1 with SIMULATE=1): the same steps through the
CUDA driver API (ctypes, whatever libcuda.so.1 the loader finds: under `vgpu run` the
shim, and behind it the sim), so the limiter holds it and writes its trace.

Usage: standin.py decode|train SECONDS | standin.py decode|train serve BASE
  decode: a step is DECODE_KERNELS 100 us kernels on one stream, waited for;
  train: a step is TRAIN_KERNELS of them, queued, waited for every 4 steps.
Output as decode.py's and train.py's.

STANDIN_FAULTS (space-separated NAME:FAULT, NAME the run's name, BASE's last part) makes a
run misbehave, for the hostile tests: `exit` (fails before it starts serving), `hang`
(never gets ready), `die@N` (dies at the start of cycle N's round), `stall@N` (cycle N's
round never ends by itself: its step waits until the coordinator gives up on it).
"""
import ctypes
import os
import sys
import time

import rounds

DECODE_KERNELS = 4
TRAIN_KERNELS = 12
PTX = (b".version 7.8\n.target sm_80\n.address_size 64\n"
       b".visible .entry spin_100us(.param .u64 ns)\n"
       b"{\n .reg .u64 %t0, %t1, %d, %n;\n .reg .pred %p;\n ld.param.u64 %n, [ns];\n"
       b" mov.u64 %t0, %globaltimer;\nLOOP:\n mov.u64 %t1, %globaltimer;\n"
       b" sub.u64 %d, %t1, %t0;\n setp.lt.u64 %p, %d, %n;\n @%p bra LOOP;\n ret;\n}\n\0")

if len(sys.argv) < 2 or sys.argv[1] not in ("decode", "train"):
    raise SystemExit(__doc__)
kind, args = sys.argv[1], sys.argv[2:]
name = os.path.basename(args[1]) if len(args) >= 2 and args[0] == "serve" else None
faults = dict(f.split(":", 1) for f in os.environ.get("STANDIN_FAULTS", "").split() if ":" in f)
fault = faults.get(name, "") if name else ""
if fault == "exit":
    raise SystemExit(f"standin {name}: told to fail before it starts")
server = rounds.server_of(args)
if fault == "hang":
    while True:  # as a start-up stuck in the driver: ended by the coordinator giving up
        time.sleep(60)

cuda = ctypes.CDLL("libcuda.so.1")


def check(rc, what):
    if rc != 0:
        raise SystemExit(f"standin: {what}: CUDA error {rc}")


check(cuda.cuInit(0), "cuInit")
device, context = ctypes.c_int(), ctypes.c_void_p()
check(cuda.cuDeviceGet(ctypes.byref(device), 0), "cuDeviceGet")
check(cuda.cuDevicePrimaryCtxRetain(ctypes.byref(context), device), "cuDevicePrimaryCtxRetain")
check(cuda.cuCtxSetCurrent(context), "cuCtxSetCurrent")
module, function = ctypes.c_void_p(), ctypes.c_void_p()
check(cuda.cuModuleLoadData(ctypes.byref(module), ctypes.c_char_p(PTX)), "cuModuleLoadData")
check(cuda.cuModuleGetFunction(ctypes.byref(function), module, b"spin_100us"), "cuModuleGetFunction")
ns = ctypes.c_uint64(100_000)
params = (ctypes.c_void_p * 1)(ctypes.cast(ctypes.byref(ns), ctypes.c_void_p))
kernels = DECODE_KERNELS if kind == "decode" else TRAIN_KERNELS
die_at = int(fault[4:]) if fault.startswith("die@") else None
stall_at = int(fault[6:]) if fault.startswith("stall@") else None


def sync():
    check(cuda.cuStreamSynchronize(None), "cuStreamSynchronize")


def step():
    if server is not None and server.cycle is not None:
        if server.cycle == die_at:
            os._exit(7)  # as a crash: no exit handlers
        if server.cycle == stall_at:
            server.gone.wait(600)
    for _ in range(kernels):
        check(cuda.cuLaunchKernel(function, 1, 1, 1, 32, 1, 1, 0, None, params, None), "cuLaunchKernel")
    if kind == "decode":
        sync()


for _ in range(20):
    step()
sync()
if kind == "decode":
    rounds.main(step, args, __doc__, server=server)
else:
    rounds.main(step, args, __doc__, one_shot_s=6.0, server=server, sync=sync, sync_every=4, timed=False)

#!/usr/bin/env bash
# The GPU machine's facts that a run's figures depend on, printed for its env.txt
# (tests/gpu/run.sh, tests/gpu/limiter/calls.sh): the time, the cards and driver, the
# frameworks' versions, the host's CPU, and which clocksource the kernel reads (the
# limiter's fast path reads the time-stamp counter only where it is `tsc`:
# libcuda-shim/src/limiter/fast_clock.rs). Anything missing prints its error, never fails.
SMI=$(command -v nvidia-smi || echo nvidia-smi)
date -u
"$SMI" -L
"$SMI" --query-gpu=driver_version --format=csv,noheader
python3 -c 'import torch, cupy, jax; print("torch", torch.__version__, "cupy", cupy.__version__, "jax", jax.__version__)'
lscpu | grep -E '^Model name|^CPU\(s\)'
echo "clocksource $(cat /sys/devices/system/clocksource/clocksource0/current_clocksource 2>/dev/null)"
exit 0

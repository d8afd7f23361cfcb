# Sourced by run_limiter.sh and contention.sh after OUT is set: with SIMULATE=1, SIM
# holds `vgpu run`'s --simulate and the dry run gets a simulated card of its own
# (VGPU_SIM_STATE under OUT, unless the caller chose one): no slots left in the default
# state file by other runs (a killed process's stays live there until slots run out).
SIM=()
if [ "${SIMULATE:-0}" = 1 ]; then
    SIM=(--simulate)
    export VGPU_SIM_STATE="${VGPU_SIM_STATE:-$OUT/sim/state}"
fi

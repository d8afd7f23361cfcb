# Sourced by run_limiter.sh and contention.sh: PIN, the prefix that keeps every
# launch-cost run on the same two CPUs (LAUNCH_CPUS, default "2,3"). Unpinned, runs of
# one kind spread 3.26-4.29 us in run 11 on the H200, more than the limiter's whole
# cost. Empty where taskset is missing or cannot pin those CPUs (a 2-core machine).
PIN=""
if command -v taskset >/dev/null && taskset -c "${LAUNCH_CPUS:-2,3}" true 2>/dev/null; then
    PIN="taskset -c ${LAUNCH_CPUS:-2,3}"
fi

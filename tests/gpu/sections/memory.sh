# GPU suite section `memory` (issue 13, memory quota with no hole): sourced by
# tests/gpu/run.sh, which defines VGPU, SMI, OUT, WORK, HERE, ROOT, PREFIX and the
# helpers record, result_of, gpu_mem_of, host_pid. About 90 s on the H200.
#
#   memory vmm-*     VMM create+map+release-while-mapped 4 x 300 MiB under 1 GiB
#   memory pool-*    a pool keeping what it frees (threshold UINT64_MAX), 4 x (alloc 300
#                    MiB, free, sync): the default pool and new pools, in the host PID
#                    namespace (--host-pid) and in a new one (vgpu run's default)
#                    -> PASS: the first fits, the rest fit or are refused, and the
#                    driver's figure for the process (nvidia-smi outside, by host PID,
#                    sampled every 0.2 s) never passes 1024 MiB
#   memory nvml-sum  two processes in one PID namespace under 4 GiB: nvidia-smi inside
#                    says the container uses the sum of their NVML figures, within 2 MiB
#   memory torch, cupy   fill a 4 GiB quota in the PID namespace: OutOfMemoryError

MEMORY_QUOTA_MIB=1024

# memory_wait FILE SECONDS JOB: until FILE is non-empty; gives up early when JOB ended.
memory_wait() {
    local i
    for i in $(seq 1 $(( $2 * 10 ))); do
        [ -s "$1" ] && return 0
        kill -0 "$3" 2>/dev/null || { [ -s "$1" ]; return; }
        sleep 0.1
    done
    return 1
}

# memory_sample JOB HOST_PID FILE: the driver's figure for HOST_PID every 0.2 s while JOB runs.
memory_sample() {
    : > "$3"
    while kill -0 "$1" 2>/dev/null; do gpu_mem_of "$2" >> "$3"; sleep 0.2; done
}

# memory_peak FILE: the largest sample, or null.
memory_peak() { local p; p=$(grep -E '^[0-9.]+$' "$1" 2>/dev/null | sort -n | tail -1); echo "${p:-null}"; }

# memory_pattern NAME [VGPU RUN ARGS...] -- MODE N MIB
memory_pattern() {
    local name=$1; shift
    local args=()
    while [ "$1" != "--" ]; do args+=("$1"); shift; done
    shift
    local marker=$WORK/memory-$name.pid samples=$WORK/memory-$name.samples
    rm -f "$marker"
    timeout 60 "$VGPU" run --memory "${MEMORY_QUOTA_MIB}MiB" "${args[@]}" -- \
        python3 "$HERE/memory/patterns.py" "$@" "$marker" > "$OUT/memory-$name.txt" 2>&1 &
    local job=$! host=""
    if memory_wait "$marker" 40 "$job"; then host=$(host_pid "$(cat "$marker")" "$job"); fi
    [ -n "$host" ] && memory_sample "$job" "$host" "$samples"
    wait "$job"; local rc=$?
    record memory "$name" "$(python3 "$HERE/memory/judge.py" pattern "$rc" "$(memory_peak "$samples")" "$MEMORY_QUOTA_MIB" "$(result_of "$OUT/memory-$name.txt")")"
}

# memory_nvml_sum: two processes of one container (one PID namespace) under 4 GiB.
memory_nvml_sum() {
    local a=$WORK/memory-sum-a.pid b=$WORK/memory-sum-b.pid done=$WORK/memory-sum.done
    rm -f "$a" "$b" "$done"
    PATTERN_HOLD_S=8 timeout 90 "$VGPU" run --memory 4GiB -- bash -c "
        python3 '$HERE/memory/patterns.py' hold 1 256 '$a' > '$OUT/memory-sum-a.txt' 2>&1 &
        python3 '$HERE/memory/patterns.py' hold 1 512 '$b' > '$OUT/memory-sum-b.txt' 2>&1 &
        for i in \$(seq 1 400); do grep -q RESULT '$OUT/memory-sum-a.txt' && grep -q RESULT '$OUT/memory-sum-b.txt' && break; sleep 0.1; done
        sleep 0.5
        '$SMI' --query-gpu=memory.used --format=csv,noheader,nounits > '$OUT/memory-sum-smi.txt' 2>&1
        '$SMI' --query-compute-apps=pid,used_memory --format=csv,noheader,nounits > '$OUT/memory-sum-apps-inside.txt' 2>&1
        echo done > '$done'
        wait
    " > "$OUT/memory-sum-run.txt" 2>&1 &
    local job=$! host_a="" host_b=""
    if memory_wait "$a" 40 "$job" && memory_wait "$b" 40 "$job"; then
        host_a=$(host_pid "$(cat "$a")" "$job"); host_b=$(host_pid "$(cat "$b")" "$job")
    fi
    memory_wait "$done" 40 "$job"
    local fig_a fig_b
    fig_a=$(gpu_mem_of "${host_a:-0}"); fig_b=$(gpu_mem_of "${host_b:-0}")
    wait "$job"; local rc=$?
    record memory nvml-sum "$(python3 "$HERE/memory/judge.py" sum "$rc" "$(head -1 "$OUT/memory-sum-smi.txt")" "${fig_a:-null}" "${fig_b:-null}"), \"apps_inside\": \"$(tr '\n' ';' < "$OUT/memory-sum-apps-inside.txt")\""
}

# memory_framework NAME SCRIPT ARGS...: quota.sh's PyTorch/CuPy checks, in the PID namespace.
memory_framework() {
    local name=$1; shift
    local marker=$WORK/memory-$name.pid samples=$WORK/memory-$name.samples
    rm -f "$marker"
    timeout 120 "$VGPU" run --memory 4GiB -- python3 "$@" "$marker" > "$OUT/memory-$name.txt" 2>&1 &
    local job=$! host=""
    if memory_wait "$marker" 100 "$job"; then host=$(host_pid "$(cat "$marker")" "$job"); fi
    [ -n "$host" ] && memory_sample "$job" "$host" "$samples"
    wait "$job"; local rc=$?
    record memory "$name" "$(python3 "$HERE/memory/judge.py" framework "$rc" "$(memory_peak "$samples")" 4096 "$(result_of "$OUT/memory-$name.txt")")"
}

section_memory() {
    log "memory: VMM and pools under 1 GiB, NVML sum in a PID namespace, PyTorch and CuPy under 4 GiB"
    memory_pattern vmm-pidns -- vmm 4 300
    memory_pattern vmm-hostpid --host-pid -- vmm 4 300
    memory_pattern pool-default-hostpid --host-pid -- pool-default 4 300
    memory_pattern pool-default-pidns -- pool-default 4 300
    memory_pattern pool-new-hostpid --host-pid -- pool-new 4 300
    memory_pattern pool-new-pidns -- pool-new 4 300
    memory_nvml_sum
    memory_framework torch "$HERE/torch_quota.py" default
    memory_framework cupy "$HERE/cupy_quota.py"
}

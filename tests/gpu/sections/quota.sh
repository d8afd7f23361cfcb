# GPU suite section `quota`: sourced by tests/gpu/run.sh, which defines VGPU, SMI, OUT,
# WORK, HERE, ROOT, PREFIX and the helpers record, result_of, wait_marker, gpu_mem_of, host_pid, median.

# quota_case NAME ENV-ASSIGNMENT SCRIPT ARGS...: run under --memory 4GiB, read the
# process's usage from nvidia-smi outside the namespace while it holds its memory.
quota_case() {
    local name=$1 envset=$2; shift 2
    local marker=$WORK/marker-$name
    rm -f "$marker"
    timeout 120 "$VGPU" run --memory 4GiB -- env $envset python3 "$@" "$marker" > "$OUT/quota-$name.txt" 2>&1 &
    local job=$!
    local outside=null
    if wait_marker "$marker" 90; then outside=$(gpu_mem_of "$(host_pid "$(cat "$marker")" "$job")"); fi
    wait $job; local rc=$?
    record quota "$name" "\"rc\": $rc, \"outside_mib\": ${outside:-null}, \"result\": $(result_of "$OUT/quota-$name.txt")"
}

section_quota() {
    log "quota: PyTorch, CuPy, JAX under --memory 4GiB"
    quota_case torch-default "VGPU_CASE=default" "$HERE/torch_quota.py" default
    quota_case torch-expandable "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" "$HERE/torch_quota.py" expandable
    quota_case torch-async "PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync" "$HERE/torch_quota.py" async
    quota_case cupy "VGPU_CASE=cupy" "$HERE/cupy_quota.py"
    quota_case jax "XLA_PYTHON_CLIENT_PREALLOCATE=true" "$HERE/jax_quota.py"
    timeout 60 "$VGPU" run --memory 4GiB -- "$VGPU" probe --alloc 3GiB --alloc 2GiB --json > "$OUT/probe.txt" 2>&1
    record quota probe-driver-api "\"rc\": $?, \"result\": $(tail -1 "$OUT/probe.txt" | grep '^{' || echo '{}')"
    timeout 60 "$VGPU" run --memory 4GiB -- "$VGPU" probe --proc-address --alloc 3GiB --alloc 2GiB --json > "$OUT/probe-procaddress.txt" 2>&1
    record quota probe-proc-address "\"rc\": $?, \"result\": $(tail -1 "$OUT/probe-procaddress.txt" | grep '^{' || echo '{}')"
    timeout 60 "$VGPU" run --memory 4GiB -- python3 "$HERE/procaddress_diag.py" "$ROOT" > "$OUT/procaddress.txt" 2>&1
    record quota procaddress-map "\"rc\": $?, \"result\": $(result_of "$OUT/procaddress.txt")"
}

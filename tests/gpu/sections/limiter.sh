# GPU suite section `limiter`: sourced by tests/gpu/run.sh, which defines VGPU, SMI, OUT,
# WORK, HERE, ROOT, PREFIX and the helpers record, result_of, wait_marker, gpu_mem_of, median.

section_limiter() {
    if [ -x "$HERE/limiter/run_limiter.sh" ]; then
        log "limiter"
        timeout 290 "$HERE/limiter/run_limiter.sh" "$PREFIX" "$OUT" > "$OUT/limiter-run.txt" 2>&1
        record limiter run "\"rc\": $?"
        tail -25 "$OUT/limiter-run.txt" >&2
    else
        record limiter run "\"skipped\": \"tests/gpu/limiter/run_limiter.sh missing\""
    fi
}

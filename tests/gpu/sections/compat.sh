# GPU suite section `compat`: sourced by tests/gpu/run.sh, which defines VGPU, SMI, OUT,
# WORK, HERE, ROOT, PREFIX and the helpers record, result_of, wait_marker, gpu_mem_of, median.

section_compat() {
    if [ -x "$ROOT/tests/compat/run.sh" ]; then
        log "compat"
        timeout 240 "$ROOT/tests/compat/run.sh" "$PREFIX" "$OUT" > "$OUT/compat-run.txt" 2>&1
        record compat run "\"rc\": $?"
        tail -25 "$OUT/compat-run.txt" >&2
    else
        record compat run "\"skipped\": \"tests/compat/run.sh missing\""
    fi
}

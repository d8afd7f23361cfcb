# GPU suite section `limiter`: sourced by tests/gpu/run.sh, which defines VGPU, SMI, OUT,
# WORK, HERE, ROOT, PREFIX and the helpers record, result_of, wait_marker, gpu_mem_of, median.
#
# Issue 14's figures in one call (about 300 s on an H100 in run 20, before the host-bound
# loops ran in two rounds, which added about 60 s; now in interleaved rounds of eight
# persistent processes, about 100 s for the loops, see run_limiter.sh; budget 420):
# concurrent streams at 30 and 70, one container's two processes, launch cost, the
# decode loop and training (also without a limit), the single-stream, graph,
# two-container and soft-mode checks. tests/gpu/limiter/run_limiter.sh
# does the runs and judges them; each of its checks becomes one record here. Then issue
# 25's (about 140 s on an H100 in run 21, with the unlimited pairs; budget 170): hard containers beside soft and unlimited neighbours on
# spin and fixed-work kernels, two containers at 30/60 and 50/50, the decode loop beside a
# busy neighbour, a hostile tenant beside a busy hard 30 (tests/gpu/limiter/contention.sh),
# records `limiter contention-*`.
section_limiter() {
    local dir="$OUT/limiter"
    if [ ! -x "$HERE/limiter/run_limiter.sh" ]; then
        record limiter run '"verdict": "SKIP", "figure": "tests/gpu/limiter/run_limiter.sh missing"'
        return
    fi
    log "limiter"
    mkdir -p "$dir"
    timeout -k 10 420 "$HERE/limiter/run_limiter.sh" "$PREFIX" "$dir" > "$dir/run.txt" 2>&1
    local rc=$?
    if [ ! -s "$dir/records.tsv" ]; then
        record limiter run "\"verdict\": \"FAIL\", \"figure\": \"run_limiter.sh rc=$rc, no records (see $dir/run.txt)\""
        tail -25 "$dir/run.txt" >&2
        return
    fi
    local name fragment
    while IFS=$'\t' read -r name fragment; do
        record limiter "$name" "$fragment"
    done < "$dir/records.tsv"
    tail -40 "$dir/run.txt" >&2
    section_limiter_contention
}

section_limiter_contention() {
    local dir="$OUT/limiter-contention" name fragment
    mkdir -p "$dir"
    timeout -k 10 170 "$HERE/limiter/contention.sh" "$PREFIX" "$dir" > "$dir/run.txt" 2>&1
    local rc=$?
    if [ ! -s "$dir/records.tsv" ]; then
        record limiter contention "\"verdict\": \"FAIL\", \"figure\": \"contention.sh rc=$rc, no records (see $dir/run.txt)\""
        tail -25 "$dir/run.txt" >&2
        return
    fi
    while IFS=$'\t' read -r name fragment; do
        record limiter "contention-$name" "$fragment"
    done < "$dir/records.tsv"
    tail -30 "$dir/run.txt" >&2
}

# GPU suite section `mps`: sourced by tests/gpu/run.sh, which defines VGPU, SMI, OUT,
# WORK, HERE, ROOT, PREFIX and the helpers record, result_of, wait_marker, gpu_mem_of, median.
#
# Issue 28's figures for the MPS sharing mode in one call (about 150 s; budget 240): the
# decode loop beside a busy neighbour under `vgpu run --mps` against its alone figure,
# throughput shares at 30 and 70, the memory quota and nvidia-smi view for PyTorch and
# CuPy, MPS's pinned limit alone, the fault experiment, the daemon's stop.
# tests/gpu/mps/run_mps.sh does the runs, judge.py judges them; each check is one record.
section_mps() {
    local dir="$OUT/mps"
    if ! command -v nvidia-cuda-mps-control > /dev/null; then
        record mps run '"verdict": "SKIP", "figure": "no nvidia-cuda-mps-control on PATH"'
        return
    fi
    log "mps"
    mkdir -p "$dir"
    timeout -k 10 240 bash "$HERE/mps/run_mps.sh" "$PREFIX" "$dir" > "$dir/run.txt" 2>&1
    local rc=$?
    if [ ! -s "$dir/records.tsv" ]; then
        record mps run "\"verdict\": \"FAIL\", \"figure\": \"run_mps.sh rc=$rc, no records (see $dir/run.txt)\""
        tail -25 "$dir/run.txt" >&2
        return
    fi
    local name fragment
    while IFS=$'\t' read -r name fragment; do
        record mps "$name" "$fragment"
    done < "$dir/records.tsv"
}

# GPU suite section `nvml`: sourced by tests/gpu/run.sh, which defines VGPU, SMI, OUT,
# WORK, HERE, ROOT, PREFIX and the helpers record, result_of, wait_marker, gpu_mem_of, median.

section_nvml() {
    log "nvml: the container's view with a PyTorch process holding 1 GiB under --memory 4GiB"
    local marker=$WORK/hold-marker
    rm -f "$marker"
    timeout 150 "$VGPU" run --memory 4GiB -- bash -c "
        python3 '$HERE/hold.py' 40 '$marker' & holder=\$!
        for i in \$(seq 1 600); do [ -s '$marker' ] && break; sleep 0.1; done
        '$SMI' > '$OUT/nvml-smi.txt' 2>&1
        '$SMI' -q > '$OUT/nvml-smi-q.txt' 2>&1
        '$SMI' --query-gpu=memory.total,memory.used,memory.free --format=csv > '$OUT/nvml-smi-csv.txt' 2>&1
        python3 '$HERE/nvml_view.py' > '$OUT/nvml-pynvml.txt' 2>&1
        '$VGPU' smi > '$OUT/nvml-vgpu-smi.txt' 2>&1
        '$VGPU' smi --query-gpu=memory.total,memory.used,memory.free --format=csv > '$OUT/nvml-vgpu-smi-csv.txt' 2>&1
        kill \$holder; wait \$holder 2>/dev/null; true
    " > "$OUT/nvml-run.txt" 2>&1
    local rc=$?
    "$SMI" -q > "$OUT/nvml-smi-q-bare.txt" 2>&1
    diff "$OUT/nvml-smi-q-bare.txt" "$OUT/nvml-smi-q.txt" > "$OUT/nvml-smi-q.diff"
    local fnf; fnf=$(cat "$OUT"/nvml-*.txt | grep -c "Function Not Found")
    local total; total=$(grep -c -E '/ +4096MiB' "$OUT/nvml-smi.txt")
    record nvml view "\"rc\": $rc, \"function_not_found\": $fnf, \"smi_shows_4096\": $total, \"csv\": \"$(tail -1 "$OUT/nvml-smi-csv.txt")\", \"vgpu_smi_csv\": \"$(tail -1 "$OUT/nvml-vgpu-smi-csv.txt")\", \"pynvml\": $(result_of "$OUT/nvml-pynvml.txt")"
}

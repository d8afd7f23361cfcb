# GPU suite section `forward`: sourced by tests/gpu/run.sh, which defines VGPU, SMI, OUT,
# WORK, HERE, ROOT, PREFIX and the helpers record, result_of, wait_marker, gpu_mem_of, median.

section_forward() {
    log "forward: frameworks through the shim, no quota"
    timeout 180 "$VGPU" run -- python3 "$HERE/forwarding.py" > "$OUT/forwarding.txt" 2>&1
    record forward frameworks "\"rc\": $?, \"result\": $(result_of "$OUT/forwarding.txt")"
    timeout 30 "$SMI" > "$OUT/smi-bare.txt" 2>&1
    timeout 30 "$VGPU" run -- "$SMI" > "$OUT/smi-shim.txt" 2>&1; local rc=$?
    timeout 30 "$SMI" -q > "$OUT/smi-q-bare.txt" 2>&1
    timeout 30 "$VGPU" run -- "$SMI" -q > "$OUT/smi-q-shim.txt" 2>&1; local rcq=$?
    local fnf; fnf=$(cat "$OUT"/smi-shim.txt "$OUT"/smi-q-shim.txt | grep -c "Function Not Found")
    local qdiff; qdiff=$(diff <(grep -v -E 'Timestamp|Power Draw|Temp|Clocks Event|SM  |Graphics  |Memory  |Video  |Fan|Throughput' "$OUT/smi-q-bare.txt") <(grep -v -E 'Timestamp|Power Draw|Temp|Clocks Event|SM  |Graphics  |Memory  |Video  |Fan|Throughput' "$OUT/smi-q-shim.txt") | grep -c '^[<>]')
    record forward nvidia-smi "\"rc\": $rc, \"rc_q\": $rcq, \"function_not_found\": $fnf, \"q_lines_differing\": $qdiff"

    log "forward: benchmarks (interleaved bare / shim)"
    if ! nvcc -O2 -arch=sm_90 -o "$WORK/bench" "$HERE/bench.cu" -lcuda > "$OUT/nvcc.txt" 2>&1; then
        record forward bench "\"error\": \"nvcc failed\""; return
    fi
    local bl=() sl=() ql=() ba=() sa=() bm=() sm=()
    for _ in 1 2 3; do
        bl+=("$(timeout 60 "$WORK/bench" launch 200000 | grep RESULT | sed 's/.*per_op_us": //; s/}//')")
        sl+=("$(timeout 60 "$VGPU" run -- "$WORK/bench" launch 200000 | grep RESULT | sed 's/.*per_op_us": //; s/}//')")
        ql+=("$(timeout 60 "$VGPU" run --memory 8GiB -- "$WORK/bench" launch 200000 | grep RESULT | sed 's/.*per_op_us": //; s/}//')")
        ba+=("$(timeout 60 "$WORK/bench" alloc 100000 | grep RESULT | sed 's/.*per_op_us": //; s/}//')")
        sa+=("$(timeout 60 "$VGPU" run --memory 8GiB -- "$WORK/bench" alloc 100000 | grep RESULT | sed 's/.*per_op_us": //; s/}//')")
    done
    for _ in 1 2; do
        bm+=("$(timeout 120 python3 "$HERE/matmul_bench.py" | grep RESULT | sed 's/.*tflops": //; s/}//')")
        sm+=("$(timeout 120 "$VGPU" run -- python3 "$HERE/matmul_bench.py" | grep RESULT | sed 's/.*tflops": //; s/}//')")
    done
    echo "launch bare ${bl[*]} shim ${sl[*]} quota ${ql[*]}; alloc bare ${ba[*]} shim ${sa[*]}; matmul bare ${bm[*]} shim ${sm[*]}" > "$OUT/bench.txt"
    record forward bench "\"launch_us_bare\": $(median "${bl[@]}"), \"launch_us_shim\": $(median "${sl[@]}"), \"launch_us_shim_quota\": $(median "${ql[@]}"), \"alloc_pair_us_bare\": $(median "${ba[@]}"), \"alloc_pair_us_shim\": $(median "${sa[@]}"), \"matmul_tflops_bare\": $(median "${bm[@]}"), \"matmul_tflops_shim\": $(median "${sm[@]}")"
}

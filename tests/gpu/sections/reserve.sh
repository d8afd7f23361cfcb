# GPU suite section `reserve` (issue 24, what the driver reserves on its own): sourced by
# tests/gpu/run.sh, which defines VGPU, SMI, OUT, WORK, HERE, ROOT, PREFIX and the
# helpers record, result_of, median, and the `memory` and `quota` sections' helpers
# (memory_framework, quota_case). About 150 s on the H200.
#
#   reserve static-*   a module whose static __device__ data is 1.5 GiB, as PTX
#                      (cuModuleLoadData), cubin (cuModuleLoad), fatbin
#                      (cuModuleLoadFatBinary) and library (cuLibraryLoadData), lazy
#                      (the default) and eager; then its kernel launched
#   reserve heap, stack, printf, pending, sync-depth
#                      cuCtxSetLimit to 1.5 GiB of heap, a 32 KiB stack, a 1.5 GiB
#                      printf FIFO, a million pending launches, sync depth 8; then a
#                      kernel that uses it (malloc, 16 KiB of local memory, printf)
#   reserve heap-default, stack-2k  what fits: the default heap and a malloc kernel, a
#                      2 KiB stack (264 MiB more on an H200), counted as the card says
#   reserve stack-launch  the default stack, then a kernel with 16 KiB of local memory
#                      (its launch would grow local memory for every resident thread)
#   reserve static-fits  300 MiB of static data: loads, is counted, 700 MiB more refused
#                      -> each run bare and under `vgpu run --memory 1024MiB`; PASS when
#                      the driver's figure for the process (NVML, at each step) stays
#                      at or under the quota under the shim; the bare figures beside
#   reserve torch, cupy, jax  fill a 4 GiB quota and meet their OOM
#   reserve loadtime   module load and first function, bare and under the shim
#   reserve launch     launch cost bare and under a quota (bench.cu), interleaved

RESERVE_QUOTA_MIB=1024

# reserve_pattern NAME ENV ARGS...: reserve_check.py ARGS bare and under the shim.
reserve_pattern() {
    local name=$1 envset=$2; shift 2
    local check=$ROOT/tests/clients/reserve_check.py
    timeout 60 env $envset python3 "$check" "$@" > "$OUT/reserve-$name-bare.txt" 2>&1; local bare_rc=$?
    timeout 60 "$VGPU" run --memory "${RESERVE_QUOTA_MIB}MiB" -- env $envset python3 "$check" "$@" > "$OUT/reserve-$name-shim.txt" 2>&1; local shim_rc=$?
    record reserve "$name" "$(python3 "$HERE/reserve/judge.py" pattern "$RESERVE_QUOTA_MIB" "$bare_rc" "$(result_of "$OUT/reserve-$name-bare.txt")" "$shim_rc" "$(result_of "$OUT/reserve-$name-shim.txt")")"
}

section_reserve() {
    log "reserve: module static data, heap, stack, printf FIFO, device runtime limits under 1 GiB"
    local W=$WORK/reserve
    mkdir -p "$W"
    if ! { nvcc -arch=sm_90 -ptx -o "$W/static.ptx" "$HERE/reserve/static.cu" \
        && nvcc -arch=sm_90 -cubin -o "$W/static.cubin" "$HERE/reserve/static.cu" \
        && nvcc -arch=sm_90 -fatbin -o "$W/static.fatbin" "$HERE/reserve/static.cu" \
        && nvcc -arch=sm_90 -DSTATIC_MIB=300 -ptx -o "$W/static300.ptx" "$HERE/reserve/static.cu" \
        && nvcc -arch=sm_90 -cubin -o "$W/kernels.cubin" "$HERE/reserve/kernels.cu"; } > "$OUT/reserve-nvcc.txt" 2>&1; then
        record reserve build "\"verdict\": \"FAIL\", \"figure\": \"nvcc failed\""; return
    fi
    reserve_pattern static-ptx "" module data "$W/static.ptx"
    reserve_pattern static-ptx-eager "CUDA_MODULE_LOADING=EAGER" module data "$W/static.ptx"
    reserve_pattern static-cubin "" module file "$W/static.cubin"
    reserve_pattern static-fatbin "" module fatbin "$W/static.fatbin"
    reserve_pattern static-library "" module library "$W/static.cubin"
    reserve_pattern heap "" limit heap 1610612736 "$W/kernels.cubin" use_heap 1048576
    reserve_pattern heap-default "" limit heap 8388608 "$W/kernels.cubin" use_heap 1048576
    reserve_pattern stack "" limit stack 32768 "$W/kernels.cubin" use_stack 1
    reserve_pattern stack-2k "" limit stack 2048
    reserve_pattern stack-launch "" limit stack 1024 "$W/kernels.cubin" use_stack 1
    reserve_pattern printf "" limit printf 1610612736 "$W/kernels.cubin" use_printf 1
    reserve_pattern pending "" limit pending-launches 1000000
    reserve_pattern sync-depth "" limit sync-depth 8
    reserve_pattern static-fits "" module data "$W/static300.ptx" touch 700

    local check=$ROOT/tests/clients/reserve_check.py
    timeout 60 python3 "$check" loadtime 200 "$W/kernels.cubin" touch > "$OUT/reserve-loadtime-bare.txt" 2>&1
    timeout 60 "$VGPU" run --memory 4GiB -- python3 "$check" loadtime 200 "$W/kernels.cubin" touch > "$OUT/reserve-loadtime-shim.txt" 2>&1
    record reserve loadtime "$(python3 "$HERE/reserve/judge.py" loadtime "$(result_of "$OUT/reserve-loadtime-bare.txt")" "$(result_of "$OUT/reserve-loadtime-shim.txt")")"

    if nvcc -O2 -arch=sm_90 -o "$W/bench" "$HERE/bench.cu" -lcuda >> "$OUT/reserve-nvcc.txt" 2>&1; then
        local bl=() ql=()
        for _ in 1 2 3; do
            bl+=("$(timeout 60 "$W/bench" launch 200000 | grep RESULT | sed 's/.*per_op_us": //; s/}//')")
            ql+=("$(timeout 60 "$VGPU" run --memory 8GiB -- "$W/bench" launch 200000 | grep RESULT | sed 's/.*per_op_us": //; s/}//')")
        done
        record reserve launch "\"verdict\": \"INFO\", \"figure\": \"launch us bare ${bl[*]}, shim+quota ${ql[*]}\", \"launch_us_bare\": $(median "${bl[@]}"), \"launch_us_shim_quota\": $(median "${ql[@]}")"
    fi

    memory_framework torch "$HERE/torch_quota.py" default
    memory_framework cupy "$HERE/cupy_quota.py"
    quota_case jax "XLA_PYTHON_CLIENT_PREALLOCATE=true" "$HERE/jax_quota.py"
}

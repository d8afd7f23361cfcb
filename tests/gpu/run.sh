#!/usr/bin/env bash
# The whole GPU suite, in one call on the H200 (device tool):
#   tests/gpu/run.sh [PREFIX] [SECTION...]      SECTION: forward quota nvml limiter compat (default: all)
# PREFIX is a `vgpu install` folder (default .carry/vgpu). Results go to $OUT (default
# /tmp/vgpu-gpu-out): results.jsonl (one JSON object per check), the raw outputs, and a
# short table printed last. Every step runs under `timeout`; a failed step is recorded,
# never fatal, and nothing here can hang the call.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PREFIX=${1:-$ROOT/.carry/vgpu}
shift || true
SECTIONS=${*:-forward quota nvml limiter compat}
OUT=${OUT:-/tmp/vgpu-gpu-out}
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
: > "$RESULTS"
VGPU=$PREFIX/bin/vgpu
export PATH=/usr/local/nvidia/bin:$PATH PYTHONUNBUFFERED=1
WORK=$(mktemp -d /tmp/vgpu-gpu.XXXXXX)
SMI=$(command -v nvidia-smi)

log() { echo "== $*" >&2; }
# record SECTION NAME JSON-FRAGMENT
record() { echo "{\"section\": \"$1\", \"name\": \"$2\", $3}" >> "$RESULTS"; }
# result_of FILE: the JSON after the last "RESULT " line, or {}
result_of() { local r; r=$(grep '^RESULT ' "$1" 2>/dev/null | tail -1 | cut -c8-); echo "${r:-{\}}"; }
# wait_marker FILE SECONDS
wait_marker() { for _ in $(seq 1 $(( $2 * 10 ))); do [ -s "$1" ] && return 0; sleep 0.1; done; return 1; }
# gpu_mem_of PID: MiB the process holds, as nvidia-smi outside any namespace sees it
gpu_mem_of() { "$SMI" --query-compute-apps=pid,used_memory --format=csv,noheader,nounits | awk -F', *' -v p="$1" '$1==p {print $2}'; }
median() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

log "environment"
{ date -u; "$SMI" -L; "$SMI" --query-gpu=driver_version --format=csv,noheader; python3 -c 'import torch, cupy, jax; print("torch", torch.__version__, "cupy", cupy.__version__, "jax", jax.__version__)'; } > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >&2

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

# quota_case NAME ENV-ASSIGNMENT SCRIPT ARGS...: run under --memory 4GiB, read the
# process's usage from nvidia-smi outside the namespace while it holds its memory.
quota_case() {
    local name=$1 envset=$2; shift 2
    local marker=$WORK/marker-$name
    rm -f "$marker"
    timeout 120 "$VGPU" run --memory 4GiB -- env $envset python3 "$@" "$marker" > "$OUT/quota-$name.txt" 2>&1 &
    local job=$!
    local outside=null
    if wait_marker "$marker" 90; then outside=$(gpu_mem_of "$(cat "$marker")"); fi
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

for s in $SECTIONS; do "section_$s"; done
rm -rf "$WORK"
python3 "$HERE/summarize.py" "$RESULTS"

#!/usr/bin/env bash
# Issue 28's figures for the MPS sharing mode, on one GPU (card 0), in about 150 s:
#   run_mps.sh PREFIX OUTDIR
# PREFIX is a `vgpu install` folder; OUTDIR gets every raw output and records.tsv (one
# check per line: NAME <tab> JSON fragment, judged by judge.py). In priority order:
#  1. the decode loop and a bf16 matmul alone, bare (no MPS, no shims): the alone figures;
#  2. `vgpu mps` keeps card 0's daemon; a first client proves it is served;
#  3. the decode loop at 50 beside a busy matmul neighbour at 50, both `vgpu run --mps`;
#  4. the fault: a client writes through a null pointer while a neighbour runs; what the
#     neighbour sees, the daemon's state, and a new client afterwards;
#  5. throughput shares: two matmul containers at 30 and 70 at the same time;
#  6. the memory quota and the nvidia-smi view under MPS, PyTorch and CuPy (4 GiB), our
#     quota alone (MPS's limit set above it) and MPS's pinned limit alone (no quota of ours);
#  7. the keeper stops: no daemon, no server left, the pipe folder empty.
# Every step runs under `timeout`; nothing here can hang the call.
set -u
PREFIX=${1:?PREFIX}
D=${2:?OUTDIR}
HERE=$(cd "$(dirname "$0")" && pwd)
GPU=$(cd "$HERE/.." && pwd)
VGPU=$PREFIX/bin/vgpu
MPS_DIR=/tmp/vgpu-mps
WORK=$(mktemp -d /tmp/vgpu-mps-work.XXXXXX)
export PATH=/usr/local/nvidia/bin:$PATH PYTHONUNBUFFERED=1 PYTHONPATH=$GPU/limiter
mkdir -p "$D"
T0=$(date +%s)
log() { echo "== $(( $(date +%s) - T0 ))s $*" >&2; }
# left: whether the budget (MPS_BUDGET seconds, default 200) still allows a step; the
# stop and the judging always run.
left() { [ $(( $(date +%s) - T0 )) -lt "${MPS_BUDGET:-200}" ] || { log "budget spent: skipped"; return 1; }; }
RUN_ARGS=()
ctl() { echo "$1" | CUDA_MPS_PIPE_DIRECTORY=$MPS_DIR/0/pipe timeout 10 nvidia-cuda-mps-control 2>&1; }
# mps_run CORES ARGS... -- CMD: one `vgpu run --mps` container (at most RUN_TIMEOUT s, default 60)
mps_run() {
    local cores=$1; shift
    timeout "${RUN_TIMEOUT:-60}" "$VGPU" run ${RUN_ARGS[@]+"${RUN_ARGS[@]}"} --mps --mps-dir "$MPS_DIR" --cores "$cores" "$@"
}
# wait_file FILE SECONDS [PID]: until FILE has content, SECONDS pass, or PID has ended
wait_file() {
    for _ in $(seq 1 $(( $2 * 10 ))); do
        [ -s "$1" ] && return 0
        [ -n "${3:-}" ] && ! kill -0 "$3" 2> /dev/null && return 1
        sleep 0.1
    done
    return 1
}
KEEPER=""
trap '[ -n "$KEEPER" ] && kill -TERM "$KEEPER" 2> /dev/null' EXIT

log "environment"
{ date -u; nvidia-smi -L; nvidia-smi --query-gpu=driver_version,compute_mode --format=csv,noheader;
  echo "--- nvidia-cuda-mps-control -h"; timeout 5 nvidia-cuda-mps-control -h < /dev/null 2>&1 | head -30; } > "$D/env.txt" 2>&1

log "1. alone, bare"
timeout 40 python3 "$GPU/limiter/decode.py" 4 > "$D/decode-alone.txt" 2>&1
timeout 40 python3 "$HERE/matmul_for.py" 4 > "$D/matmul-alone.txt" 2>&1

log "2. keeper and a first client"
"$VGPU" mps --card 0 --dir "$MPS_DIR" --interval 1 2> "$D/keeper.txt" &
KEEPER=$!
for _ in $(seq 1 150); do ctl get_server_list > /dev/null 2>&1 && break; sleep 0.1; done
RUN_TIMEOUT=35 mps_run 50 --memory 8GiB -- python3 "$HERE/client.py" > "$D/preflight.txt" 2>&1
{ echo "servers: $(ctl get_server_list | tr '\n' ' ')"; } > "$D/preflight-servers.txt"
if ! grep -q '"ok": true' "$D/preflight.txt"; then
    log "first client failed with the card's own /dev/shm: trying the host's"
    kill -TERM "$KEEPER"; wait "$KEEPER"
    export VGPU_MPS_HOST_SHM=1
    "$VGPU" mps --card 0 --dir "$MPS_DIR" --interval 1 2>> "$D/keeper.txt" &
    KEEPER=$!
    for _ in $(seq 1 150); do ctl get_server_list > /dev/null 2>&1 && break; sleep 0.1; done
    RUN_TIMEOUT=35 mps_run 50 --memory 8GiB -- python3 "$HERE/client.py" > "$D/preflight-hostshm.txt" 2>&1
    if ! grep -q '"ok": true' "$D/preflight-hostshm.txt"; then
        log "and with the host's PID namespace"
        RUN_ARGS=(--host-pid)
        RUN_TIMEOUT=35 mps_run 50 --memory 8GiB -- python3 "$HERE/client.py" > "$D/preflight-hostpid.txt" 2>&1
    fi
fi

if left; then
    log "3. decode at 50 beside a busy neighbour at 50"
    rm -f "$WORK/n.ready" "$WORK/n.stop"
    MATMUL_STOP_FILE=$WORK/n.stop mps_run 50 --memory 16GiB -- python3 "$HERE/matmul_for.py" 40 "$WORK/n.ready" > "$D/neighbour.txt" 2>&1 &
    N=$!
    if wait_file "$WORK/n.ready" 30 "$N"; then
        sleep 0.5
        nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv > "$D/smi-apps.txt" 2>&1
        mps_run 50 --memory 8GiB -- python3 "$GPU/limiter/decode.py" 4 > "$D/decode-mps.txt" 2>&1
    fi
    touch "$WORK/n.stop"
    wait "$N"

fi
if left; then
    log "4. fault"
    rm -f "$WORK/f.ready" "$WORK/f.stop"
    MATMUL_STOP_FILE=$WORK/f.stop mps_run 50 --memory 16GiB -- python3 "$HERE/matmul_for.py" 40 "$WORK/f.ready" > "$D/fault-neighbour.txt" 2>&1 &
    N=$!
    if wait_file "$WORK/f.ready" 30 "$N"; then
        mps_run 50 --memory 4GiB -- python3 "$HERE/fault.py" 1 > "$D/fault.txt" 2>&1
        sleep 2
    fi
    touch "$WORK/f.stop"
    wait "$N"
    { echo "servers: $(ctl get_server_list | tr '\n' ' ')";
      for s in $(ctl get_server_list); do echo "status $s: $(ctl "get_server_status $s")"; done; } > "$D/fault-daemon.txt" 2>&1
    mps_run 50 --memory 4GiB -- python3 "$HERE/client.py" > "$D/fault-after.txt" 2>&1
    if ! grep -q '"ok": true' "$D/fault-after.txt"; then
        sleep 3
        mps_run 50 --memory 4GiB -- python3 "$HERE/client.py" > "$D/fault-after-retry.txt" 2>&1
    fi

fi
if left; then
    log "5. shares at 30 and 70"
    rm -f "$WORK/a.ready" "$WORK/b.ready"
    mps_run 30 --memory 8GiB -- python3 "$HERE/matmul_for.py" 5 "$WORK/a.ready" "$WORK/a.ready" "$WORK/b.ready" > "$D/share-30.txt" 2>&1 &
    A=$!
    mps_run 70 --memory 8GiB -- python3 "$HERE/matmul_for.py" 5 "$WORK/b.ready" "$WORK/a.ready" "$WORK/b.ready" > "$D/share-70.txt" 2>&1 &
    B=$!
    wait "$A" "$B"

fi
if left; then
    log "6. memory under MPS"
    for fw in torch cupy; do
        script=$GPU/torch_quota.py; args="default"
        [ "$fw" = cupy ] && { script=$GPU/cupy_quota.py; args=""; }
        rm -f "$WORK/$fw.marker"
        mps_run 50 --memory 4GiB -- sh -c "python3 $script $args $WORK/$fw.marker & for i in \$(seq 400); do [ -s $WORK/$fw.marker ] && break; sleep 0.1; done; echo INSIDE; nvidia-smi --query-gpu=memory.total,memory.used --format=csv,noheader; nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader; wait" > "$D/memory-$fw.txt" 2>&1 &
        J=$!
        if wait_file "$WORK/$fw.marker" 40 "$J"; then
            nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader > "$D/memory-$fw-outside.txt" 2>&1
        fi
        wait "$J"
    done
    # Our quota alone refusing: MPS's limit set above it (8 GiB) for this one client.
    rm -f "$WORK/ours.marker"
    mps_run 50 --memory 4GiB -- env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M python3 "$GPU/torch_quota.py" default "$WORK/ours.marker" > "$D/memory-ours-first.txt" 2>&1
    rm -f "$WORK/fence.marker"
    mps_run 50 -- env CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=4096M python3 "$GPU/torch_quota.py" default "$WORK/fence.marker" > "$D/memory-mps-fence-only.txt" 2>&1

fi
log "7. stop"
kill -TERM "$KEEPER"
timeout 20 tail --pid="$KEEPER" -f /dev/null
wait "$KEEPER"; KEEPER_RC=$?; KEEPER=""
{ echo "keeper rc: $KEEPER_RC";
  echo "left in pipe: $(ls -A "$MPS_DIR/0/pipe" 2>/dev/null | tr '\n' ' ')";
  echo "mps processes: $(pgrep -fa nvidia-cuda-mps | tr '\n' ';')"; } > "$D/stop.txt" 2>&1
cp -r "$MPS_DIR/0/log" "$D/mps-log" 2>/dev/null
python3 "$HERE/judge.py" "$D" > "$D/records.tsv"
cat "$D/records.tsv" >&2
log "done"
rm -rf "$WORK"

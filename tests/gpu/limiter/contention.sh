#!/usr/bin/env bash
# The compute limiter beside neighbours on a real GPU (issue 25), in one call:
#   tests/gpu/limiter/contention.sh PREFIX OUT
#
# PREFIX holds bin/vgpu (a `vgpu install` folder). OUT receives logs/, contention.json
# (every figure) and records.tsv ("NAME<TAB>JSON fragment" per check, for
# tests/gpu/sections/limiter.sh). PARTS (default "pairs two decode hostile") picks what runs:
#   pairs   a hard container at 30, 40 and 60 beside a soft 30 (default ceiling) and
#           beside an unlimited container (a memory quota only), each on spin kernels
#           (f1ms: they end on the GPU's clock, so a time-sliced one still ends on time)
#           and on fixed-work kernels (w1ms: a time-sliced one takes longer); judged per
#           100 ms window against the same kernel bare in this call: the hard container's
#           worst 1 s never above its limit + 2, and both busy, each within 5 of its share;
#           the card's own per-process account (NVML, asked from the host) beside it;
#   two     two unlimited containers (what the card gives two busy neighbours: time
#           slices cost work), then two hard ones at 30 / 60 and at 50 / 50 (fixed
#           work, and spin), each within 5 of its limit's part of that;
#   decode  the batch-1 decode loop (decode.py, PyTorch) beside a busy full-card
#           neighbour: both bare (the card time-slicing), at 50 / 50 and at 70 / 30
#           (decode / neighbour); max step never above twice the bare pair's;
#   launch  launch cost bare, under a memory quota only (the shim forwarding inside
#           `vgpu run`, its coordinator running) and under --cores 99, five interleaved
#           triples, driver API (streams.c): the limiter's own cost is --cores 99 against
#           the quota-only run; and one traced run (what the limiter did per launch);
#   cudart  the same through the runtime API (bench.cu, when nvcc is there);
#   hostile a hard 30 that teaches its 100 us kernel and then launches it with ten times
#           the work (a loop count in its parameter, the same grid) into an idle stream
#           (streams.c h1ms), beside a busy hard 30
#           (w1ms): charged a tenth of what it runs until the host's coordinator sees it
#           on the card (twice what it counted, for 2 s: coordinator.rs `escape_ratio`);
#           judged from 5 s in (spin kernels: the card's per-process figure beside):
#           its worst 1 s within its limit + 2, the neighbour within 5 of 30.
# Parts run in the order pairs, launch, decode, two, hostile. About 100 s for the default
# parts on an H200, 60 s more for launch, 12 s for hostile. SIMULATE=1 runs it
# over the simulated driver (no decode, no NVML, no cudart).
set -u
PREFIX=${1:?usage: contention.sh PREFIX OUT}
OUT=${2:?usage: contention.sh PREFIX OUT}
PARTS=${PARTS:-pairs two decode hostile}
PAIR_S=${PAIR_S:-3}
HERE=$(cd "$(dirname "$0")" && pwd)
VGPU="$PREFIX/bin/vgpu"
LOGS="$OUT/logs"
mkdir -p "$LOGS"
export PYTHONUNBUFFERED=1
export VGPU_HOST_DIR="$OUT/host"
export VGPU_COORDINATOR_TRACE="$LOGS/coordinator.trace"
# shellcheck source=sim.sh
. "$HERE/sim.sh"
has() { case " $PARTS " in *" $1 "*) return 0 ;; esac; return 1; }

if [ ! -x "$VGPU" ]; then echo "no $VGPU" >&2; exit 2; fi
STREAMS="$OUT/streams"
if ! timeout 60 cc -O2 -o "$STREAMS" "$HERE/streams.c" -ldl -lpthread >"$LOGS/cc.log" 2>&1; then
    echo "cc streams.c failed" >&2; cat "$LOGS/cc.log" >&2; exit 2
fi
if has cudart && [ "${SIMULATE:-0}" != 1 ] && command -v nvcc >/dev/null; then
    ( timeout 120 nvcc -O2 -arch=sm_90 -o "$OUT/bench" "$HERE/../bench.cu" -lcuda >"$LOGS/nvcc.log" 2>&1 ) &
    NVCC=$!
fi
HAVE_TORCH=0
[ "${SIMULATE:-0}" != 1 ] && python3 -c "import torch; assert torch.cuda.is_available()" >/dev/null 2>&1 && HAVE_TORCH=1
HAVE_NVML=0
[ "${SIMULATE:-0}" != 1 ] && python3 -c "import pynvml" 2>/dev/null && HAVE_NVML=1

# as NAME LIMIT bare|unlimited|CORES[:soft] CMD...: CMD bare (over the sim: through the
# shim, forwarding only), as a container with a memory quota only, or limited (hard, or
# soft with the default ceiling), into logs/NAME.out/.err/.rc; its host PID (for the
# card's per-process account) into logs/pids.txt.
as() {
    local name=$1 limit=$2 how=$3; shift 3
    local wrap=()
    case "$how" in
        bare) [ "${SIMULATE:-0}" = 1 ] && wrap=("$VGPU" run --simulate --) ;;
        unlimited) wrap=("$VGPU" run "${SIM[@]}" --memory 8GiB --) ;;
        *:soft) wrap=("$VGPU" run "${SIM[@]}" --memory 8GiB --cores "${how%:soft}" --core-mode soft --) ;;
        *) wrap=("$VGPU" run "${SIM[@]}" --memory 8GiB --cores "$how" --) ;;
    esac
    timeout -k 5 "$limit" "${wrap[@]}" "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.err" &
    local pid=$!
    if [ "$HAVE_NVML" = 1 ]; then
        ( for _ in $(seq 1 40); do
              found=$(python3 "$HERE/../host_pid.py" --argv "$(basename "$1")" "${@:2}" "$pid")
              [ -n "$found" ] && { echo "$name $found" >> "$LOGS/pids.txt"; break; }
              sleep 0.1
          done ) &
    fi
    wait "$pid"
    echo $? >"$LOGS/$name.rc"
}
# probe NAME SECONDS: the card's per-process account meanwhile (NVML, from the host)
probe() {
    [ "$HAVE_NVML" = 1 ] || return 0
    ( timeout $(( $2 + 10 )) python3 "$HERE/nvml_probe.py" "$2" >"$LOGS/$1.nvml.jsonl" 2>&1 ) &
}
limit_s=$(( ${PAIR_S%.*} + 30 ))
# shellcheck source=pin.sh
. "$HERE/pin.sh"

if has pairs || has two || has hostile; then
    echo "== bare baselines" >&2
    as bare-f1ms "$limit_s" bare "$STREAMS" run f1ms "$PAIR_S"
    as bare-w1ms "$limit_s" bare "$STREAMS" run w1ms "$PAIR_S"
fi

# pair NAME KERNEL HOW_A HOW_B: two containers side by side, both busy, with windows
pair() {
    local name=$1 kernel=$2 a=$3 b=$4
    probe "$name" $(( ${PAIR_S%.*} + 1 ))
    ( as "$name-a" "$limit_s" "$a" "$STREAMS" run "$kernel" "$PAIR_S" windows ) &
    ( as "$name-b" "$limit_s" "$b" "$STREAMS" run "$kernel" "$PAIR_S" windows ) &
    wait
}

if has pairs; then
    echo "== hard beside soft and unlimited neighbours" >&2
    for L in 30 40 60; do
        for K in f1ms w1ms; do
            pair "hard$L-soft30-$K" "$K" "$L" 30:soft
            pair "hard$L-unlimited-$K" "$K" "$L" unlimited
        done
    done
fi
if has launch; then
    echo "== launch cost" >&2
    for i in 1 2 3 4 5; do
        as "launch-bare-$i" 60 bare $PIN "$STREAMS" launch 200000
        as "launch-quota-$i" 60 unlimited $PIN "$STREAMS" launch 200000
        as "launch-99-$i" 60 99 $PIN "$STREAMS" launch 200000
    done
    VGPU_LIMITER_TRACE="$LOGS/launch-99-trace.trace.%p" as launch-99-trace 60 99 "$STREAMS" launch 200000
fi
if [ -n "${NVCC:-}" ]; then
    # (A `wait` with no PID above may have reaped it already.)
    wait "$NVCC" 2>/dev/null
    if [ -x "$OUT/bench" ]; then
        echo "== launch cost, runtime API" >&2
        for i in 1 2 3 4 5; do
            as "cudart-bare-$i" 60 bare $PIN "$OUT/bench" launch 200000
            as "cudart-quota-$i" 60 unlimited $PIN "$OUT/bench" launch 200000
            as "cudart-99-$i" 60 99 $PIN "$OUT/bench" launch 200000
        done
        VGPU_LIMITER_TRACE="$LOGS/cudart-99-trace.trace.%p" as cudart-99-trace 60 99 "$OUT/bench" launch 200000
    fi
fi

if has decode && [ "$HAVE_TORCH" = 1 ]; then
    echo "== decode beside a busy neighbour" >&2
    for split in bare:bare 50:50 70:30; do
        d=${split%:*} n=${split#*:}
        # The limiter's traces of both (longest wait, charges, learned costs).
        ( VGPU_LIMITER_TRACE="$LOGS/decode-$d-$n-neighbour.trace.%p" \
              as "decode-$d-$n-neighbour" 60 "$n" "$STREAMS" run f1ms 12 ) &
        sleep 1.5
        VGPU_LIMITER_TRACE="$LOGS/decode-$d-$n.trace.%p" as "decode-$d-$n" 60 "$d" python3 "$HERE/decode.py" 4
        wait
    done
fi
if has two; then
    echo "== two containers" >&2
    for K in w1ms f1ms; do
        pair "two-bare-$K" "$K" unlimited unlimited
        pair "two30-60-$K" "$K" 30 60
        pair "two50-50-$K" "$K" 50 50
    done
fi
if has hostile; then
    echo "== a hostile tenant beside a busy hard 30" >&2
    probe hostile30-hard30 11
    # Both clocks at once: the windows count on the monotonic one, NVML stamps its
    # samples on the wall clock.
    python3 -c 'import time; print(time.time(), time.monotonic())' > "$LOGS/hostile30-hard30.clocks"
    ( as hostile30-hard30-b 45 30 "$STREAMS" run w1ms 10 windows ) &
    sleep 0.5
    # Over the sim, a kernel's duration is per wave only with VGPU_SIM_WAVES=1.
    ( VGPU_SIM_WAVES=1 as hostile30-hard30-a 45 30 "$STREAMS" run h1ms 9 windows ) &
    wait
fi
timeout 60 python3 "$HERE/contention.py" "$OUT" "$PARTS"

#!/usr/bin/env bash
# The compute limiter's GPU figures (issue 25's table and the suite's limiter checks) in
# two device calls, each inside the tool's 600 s a call, where the suite's `limiter`
# section and the pod section together take longer than one:
#   tests/gpu/limiter/calls.sh PREFIX neighbours|alone|launch
#   tests/gpu/limiter/calls.sh PREFIX compare OLD
#
#   neighbours  launch cost through the driver and the runtime API (run_limiter.sh's
#               launch and cudart parts, about 60-90 s), the hard containers beside
#               soft and unlimited neighbours, the decode loop beside a busy one and the
#               hostile tenant (contention.sh, about 140 s), then two runc pods at 30 /
#               60 and 50 / 50 (run.sh's pod section, about 120 s);
#   alone       run_limiter.sh's streams, pair, two and torch parts (about 220 s);
#   launch      the launch and cudart parts alone (about 80 s): the launch cost of
#               another host, whose pace moves it (BENCHMARKS.md run 26);
#   compare     the same parts for PREFIX and then for OLD, another `vgpu install`
#               folder (compare_launch.sh, about 200 s): a change to the launch path
#               judged against the build before it on one host. OLD needs only bin/vgpu
#               and lib64/ (the carry's 64 MiB hold one whole pack and such a slim one).
#
# PREFIX is a folder tests/gpu/pack.sh made (the pod section needs its runc where the
# machine has none). Results go under $OUT (default /tmp/vgpu-calls): each part's
# output (NAME.txt), the machine's facts (env.txt) and every part's folder packed into
# parts.tgz (without the compiled tools and the traces where that would pass 15 MB,
# the tool's limit on a file brought back). Each part runs under `timeout`; one that
# fails is reported and the next still runs.
set -u
USAGE="usage: calls.sh PREFIX neighbours|alone|launch, or calls.sh PREFIX compare OLD"
PREFIX=$(cd "${1:?$USAGE}" && pwd)
CALL=${2:?$USAGE}
case $CALL in
    neighbours|alone|launch) ;;
    compare)
        if [ ! -x "${3:-}/bin/vgpu" ]; then
            echo "calls.sh: compare needs OLD, a folder with bin/vgpu (got '${3:-}')" >&2
            exit 2
        fi
        OLD=$(cd "$3" && pwd) ;;
    *) echo "calls.sh: no call '$CALL' (neighbours, alone, launch or compare)" >&2; exit 2 ;;
esac
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/vgpu-calls}
WORK=$(mktemp -d /tmp/vgpu-calls.XXXXXX)
mkdir -p "$OUT"
export PATH=/usr/local/nvidia/bin:$PATH:$PREFIX/bin PYTHONUNBUFFERED=1
started=$(date +%s)

bash "$HERE/../facts.sh" > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

# part NAME SECONDS CMD...: CMD under timeout, its output in $OUT/NAME.txt, its records
# (a records.tsv under $WORK/NAME, or the suite's results.jsonl) printed after it.
part() {
    local name=$1 limit=$2 rc
    shift 2
    mkdir -p "$WORK/$name"
    timeout -k 5 "$limit" "$@" > "$OUT/$name.txt" 2>&1
    rc=$?
    echo "== $name: rc $rc at $(( $(date +%s) - started )) s"
    if [ "$name" = compare ]; then
        # Both builds' launch checks, named by build (compare_launch.sh's records).
        grep -E '^(launch-cost|cudart)' "$WORK/$name/records.tsv" 2>/dev/null | sort | cut -c1-220
        return
    fi
    find "$WORK/$name" -maxdepth 2 \( -name records.tsv -o -name results.jsonl \) \
        -exec cat {} + | cut -c1-220
}

# The launch and cudart parts of run_limiter.sh (five pairs of each API and the rest).
launch_part() {
    part launch 180 env PARTS="launch cudart" "$HERE/run_limiter.sh" "$PREFIX" "$WORK/launch"
}

case $CALL in
neighbours)
    launch_part
    part contention 175 "$HERE/contention.sh" "$PREFIX" "$WORK/contention"
    part pod 210 env OUT="$WORK/pod" bash "$HERE/../run.sh" "$PREFIX" pod
    ;;
alone)
    part alone 340 env PARTS="streams pair two torch" "$HERE/run_limiter.sh" "$PREFIX" "$WORK/alone"
    ;;
launch)
    launch_part
    ;;
compare)
    part compare 420 env ROUNDS=1 "$HERE/compare_launch.sh" "$OLD" "$PREFIX" "$WORK/compare"
    ;;
esac

tar czf "$OUT/parts.tgz" --exclude=bench --exclude=streams -C "$WORK" . 2>/dev/null
if [ "$(stat -c %s "$OUT/parts.tgz")" -gt 15000000 ]; then
    tar czf "$OUT/parts.tgz" --exclude=bench --exclude=streams --exclude='*.trace' -C "$WORK" .
fi
rm -rf "$WORK"
echo "== $CALL done in $(( $(date +%s) - started )) s; $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"

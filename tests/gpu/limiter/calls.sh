#!/usr/bin/env bash
# The compute limiter's GPU figures (issue 25's table and the suite's limiter checks) in
# two device calls, each inside the tool's 600 s a call, where the suite's `limiter`
# section and the pod section together take longer than one:
#   tests/gpu/limiter/calls.sh PREFIX neighbours|alone|launch
#
#   neighbours  launch cost through the driver and the runtime API (run_limiter.sh's
#               launch and cudart parts, about 60-90 s), the hard containers beside
#               soft and unlimited neighbours, the decode loop beside a busy one and the
#               hostile tenant (contention.sh, about 140 s), then two runc pods at 30 /
#               60 and 50 / 50 (run.sh's pod section, about 120 s);
#   alone       run_limiter.sh's streams, pair, two and torch parts (about 220 s);
#   launch      the launch and cudart parts alone (about 80 s): the launch cost of
#               another host, whose pace moves it (BENCHMARKS.md run 26).
#
# PREFIX is a folder tests/gpu/pack.sh made (the pod section needs its runc where the
# machine has none). Results go under $OUT (default /tmp/vgpu-calls): each part's
# output (NAME.txt), the machine's facts (env.txt) and every part's folder packed into
# parts.tgz (without the compiled tools and the traces where that would pass 15 MB,
# the tool's limit on a file brought back). Each part runs under `timeout`; one that
# fails is reported and the next still runs.
set -u
PREFIX=$(cd "${1:?usage: calls.sh PREFIX neighbours|alone|launch}" && pwd)
CALL=${2:?usage: calls.sh PREFIX neighbours|alone|launch}
case $CALL in
    neighbours|alone|launch) ;;
    *) echo "calls.sh: no call '$CALL' (neighbours, alone or launch)" >&2; exit 2 ;;
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
    find "$WORK/$name" -maxdepth 2 \( -name records.tsv -o -name results.jsonl \) \
        -exec cat {} + | cut -c1-220
}

case $CALL in
neighbours)
    part launch 150 env PARTS="launch cudart" "$HERE/run_limiter.sh" "$PREFIX" "$WORK/launch"
    part contention 175 "$HERE/contention.sh" "$PREFIX" "$WORK/contention"
    part pod 210 env OUT="$WORK/pod" bash "$HERE/../run.sh" "$PREFIX" pod
    ;;
alone)
    part alone 340 env PARTS="streams pair two torch" "$HERE/run_limiter.sh" "$PREFIX" "$WORK/alone"
    ;;
launch)
    part launch 150 env PARTS="launch cudart" "$HERE/run_limiter.sh" "$PREFIX" "$WORK/launch"
    ;;
esac

tar czf "$OUT/parts.tgz" --exclude=bench --exclude=streams -C "$WORK" . 2>/dev/null
if [ "$(stat -c %s "$OUT/parts.tgz")" -gt 15000000 ]; then
    tar czf "$OUT/parts.tgz" --exclude=bench --exclude=streams --exclude='*.trace' -C "$WORK" .
fi
rm -rf "$WORK"
echo "== $CALL done in $(( $(date +%s) - started )) s; $OUT: $(cd "$OUT" && ls | tr '\n' ' ')"

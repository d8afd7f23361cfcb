#!/usr/bin/env bash
# The whole GPU suite, in one call on the H200 (device tool):
#   tests/gpu/run.sh [PREFIX] [SECTION...]      SECTION: a file in sections/ (default: forward quota nvml memory reserve limiter compat)
# PREFIX is a `vgpu install` folder (default .carry/vgpu; tests/gpu/pack.sh makes one with
# what the sections need beside it). Results go to $OUT (default
# /tmp/vgpu-gpu-out): results.jsonl (one JSON object per check), the raw outputs, and a
# short table printed last. PACK=FILE also packs all of $OUT into one archive at the end
# (the device tool brings back only a few files of a folder: give it FILE, e.g.
# `OUT=/tmp/suite PACK=$OUT/suite.tgz`, where $OUT is the tool's folder). Every step runs under `timeout`; a failed step is recorded,
# never fatal, and nothing here can hang the call.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
PREFIX=${1:-$ROOT/.carry/vgpu}
shift || true
SECTIONS=${*:-forward quota nvml memory reserve limiter compat}
OUT=${OUT:-/tmp/vgpu-gpu-out}
mkdir -p "$OUT"
RESULTS=$OUT/results.jsonl
: > "$RESULTS"
VGPU=$PREFIX/bin/vgpu
# $PREFIX/bin last: what tests/gpu/pack.sh packs beside the install (runc) where the
# machine has none.
export PATH=/usr/local/nvidia/bin:$PATH:$PREFIX/bin PYTHONUNBUFFERED=1
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
# host_pid NS_PID ANCESTOR: the host PID of ANCESTOR's descendant that is NS_PID in its own
# PID namespace (vgpu run gives its command a new one; markers hold the PID it sees)
host_pid() { python3 "$HERE/host_pid.py" "$1" "$2"; }
median() { python3 -c 'import sys,statistics; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

log "environment"
bash "$HERE/facts.sh" > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt" >&2

# Each section is a function `section_<name>` in sections/<name>.sh.
for f in "$HERE"/sections/*.sh; do . "$f"; done

for s in $SECTIONS; do
    if declare -F "section_$s" > /dev/null; then "section_$s"; else record "$s" missing "\"error\": \"no section $s\""; fi
done
rm -rf "$WORK"
python3 "$HERE/summarize.py" "$RESULTS"
if [ -n "${PACK:-}" ]; then
    # Packed outside $OUT first: a PACK inside it changes the folder tar is reading
    # (run 12: "file changed as we read it", and no archive).
    packed=$(mktemp /tmp/vgpu-gpu-pack.XXXXXX)
    { tar czf "$packed" -C "$OUT" --exclude=bench --exclude=streams --exclude=costs \
          --exclude="$(basename "$PACK")" . && mv "$packed" "$PACK"; } \
        || { rm -f "$packed"; echo "PACK: could not pack $OUT into $PACK" >&2; }
fi

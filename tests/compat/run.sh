#!/usr/bin/env bash
# The CUDA version compatibility matrix (issue 7), in one call on the GPU machine:
#   tests/compat/run.sh PREFIX OUT [compat.py options...]
# PREFIX is a `vgpu install --prefix` folder; the cudart rows come from the wheels in
# .whl/ (see docs/compatibility.md). Writes OUT/compat.json, OUT/compat.md and the raw
# outputs under OUT/compat/, and prints the matrix. Every row runs under a timeout and
# the whole script under 4 minutes; `--simulate` runs the rows the sim driver can.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
if [ $# -lt 2 ]; then
    echo "usage: $0 PREFIX OUT [--simulate] [--rows ROW...]" >&2
    exit 2
fi
PREFIX=$1 OUT=$2
shift 2
mkdir -p "$OUT"
export PATH=$PATH:/usr/local/nvidia/bin PYTHONUNBUFFERED=1
# compat.py keeps to its own 225 s budget; this is only the backstop.
timeout -k 5 235 python3 "$HERE/compat.py" --prefix "$PREFIX" --out "$OUT" "$@"
rc=$?
if [ ! -s "$OUT/compat.md" ]; then
    echo "compat.py ended with $rc before writing $OUT/compat.md" >&2
fi
exit $rc

#!/usr/bin/env bash
# Launch cost of two builds on one machine: tests/gpu/limiter/compare_launch.sh OLD NEW OUT
#
# OLD and NEW are `vgpu install` folders. A host's own launch time varies (bare launches
# took 2.41-3.37 us on the H100s of runs 19-21), and the limiter's cost is judged as a
# ratio to it, so a change to the fast path is measured against the build before it on
# the same machine, not against another run's figure. For each of ROUNDS (default 1),
# runs run_limiter.sh's launch parts (PARTS="launch cudart": the driver API by process
# pairs and in one process, the runtime API when nvcc is there) for NEW, then OLD, into
# OUT/<build>-<round>/. OUT/records.tsv gets every run's records with the check's name
# suffixed by "@<build>-<round>", and the launch checks are printed side by side.
# About 80 s a build and round on an H100 with the five separate-process pairs of run 24;
# with the interleaved pairs of persistent processes (pairs.py) the launch part took 33 s
# over the sim against 46 before, and is not yet timed on a card. SIMULATE=1 runs it over
# the simulated driver.
set -u
OLD=${1:?usage: compare_launch.sh OLD NEW OUT}
NEW=${2:?usage: compare_launch.sh OLD NEW OUT}
OUT=${3:?usage: compare_launch.sh OLD NEW OUT}
HERE=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT"
: >"$OUT/records.tsv"
for round in $(seq 1 "${ROUNDS:-1}"); do
    for build in new old; do
        prefix=$NEW
        [ "$build" = old ] && prefix=$OLD
        run="$OUT/$build-$round"
        PARTS="launch cudart" bash "$HERE/run_limiter.sh" "$prefix" "$run" >"$run.log" 2>&1
        echo "$build-$round: run_limiter.sh rc=$?"
        sed "s/^\([^\t]*\)\t/\1@$build-$round\t/" "$run/records.tsv" >>"$OUT/records.tsv"
    done
done
grep -E '^(launch-cost|cudart)' "$OUT/records.tsv" | sort | cut -c1-400

# GPU suite section `pod`: sourced by tests/gpu/run.sh, which defines VGPU, SMI, OUT,
# WORK, HERE, ROOT, PREFIX and the helpers record, result_of, wait_marker, gpu_mem_of, median.
#
# A real pod layout on the GPU machine, in about 90 s (budget 150):
#   1. `vgpu-ldconfig prepare` from the machine's driver (/usr/local/nvidia/lib64, /lib,
#      nvidia-smi from PATH) into a temp folder;
#   2. the real plugin against the stand-in kubelet (pod_harness: real gRPC) admits and
#      starts two containers, q30 (30 cores, 10 x 256MiB) and p60 (60 cores, 8 x 256MiB),
#      and writes an OCI bundle from each one's merged Allocate responses;
#   3. runc runs them on the machine's own / as rootfs (an overlay: the host is never
#      written), with the machine's driver libraries hidden in it, as an image has none;
#   4. inside q30: nvidia-smi from the prepared folder shows 2560 MiB, PyTorch fills the
#      quota then gets OutOfMemoryError, a PTX module loads (cuModuleLoadData, PTX text)
#      and its kernel's store reads back; then q30 and p60 run the limiter's workload
#      (tests/gpu/limiter/streams.c, one stream of full-card 1 ms kernels) for 10 s at
#      once and each reports its busy share of the card (30 and 60, +-5 points: the
#      plugin's host-side compute coordinator corrects each one's charges by what the
#      card, time-slicing between them, says it ran).
#
# Needs beside $PREFIX/bin/vgpu: `vgpu-ldconfig` and `pod_harness` (from
# target/release/ and target/release/examples/; looked up in $PREFIX/bin first), runc,
# a C compiler, PyTorch, cuda-bindings. A dry run over the sim sets POD_DRIVER_DIRS (where
# prepare looks: Debian's 535 libraries), POD_AFTER_PREPARE (a command run in the
# prepared lib64: puts the sim in the real driver's place), POD_VERIFY=0 (the sim runs
# no kernels) and POD_EXTRA_ENV (the sim's knobs).

# pod_record NAME VERDICT FIGURE [JSON-FRAGMENT]
pod_record() {
    local figure
    figure=$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$3")
    record pod "$1" "\"verdict\": \"$2\", \"figure\": $figure${4:+, $4}"
}

# pod_find NAME: the binary in $PREFIX/bin, else target/release(/examples)
pod_find() {
    local candidate
    for candidate in "$PREFIX/bin/$1" "$ROOT/target/release/$1" "$ROOT/target/release/examples/$1"; do
        [ -x "$candidate" ] && { echo "$candidate"; return 0; }
    done
    return 1
}

# pod_rootfs DIR NAME: the machine's / under an overlay at DIR/roots/NAME (upper on a
# tmpfs), its NVIDIA driver libraries hidden (whiteouts in the upper, never touching
# the host) and its loader cache rebuilt without them.
pod_rootfs() {
    local root=$1/roots/$2 layer=$1/layers/$2
    mkdir -p "$root" "$layer" || return 1
    mount -t tmpfs tmpfs "$layer" || return 1
    mkdir -p "$layer/upper" "$layer/work"
    mount -t overlay overlay -o "lowerdir=/,upperdir=$layer/upper,workdir=$layer/work" "$root" || return 1
    mountpoint -q "$root" || return 1
    local dir path
    for dir in lib lib64 usr/lib usr/lib64 usr/lib/x86_64-linux-gnu usr/local/nvidia; do
        path=$root/$dir
        # Only real folders inside the overlay: a link could lead out of it.
        [ -d "$path" ] && [ ! -L "$path" ] || continue
        case "$(readlink -f "$path")" in "$root"/*) ;; *) continue ;; esac
        if [ "$dir" = usr/local/nvidia ]; then
            rm -rf "$path"
        else
            find "$path" -maxdepth 1 \( -name 'libcuda.so*' -o -name 'libnvidia-*.so*' -o -name 'libnvcuvid.so*' \
                -o -name 'libcudadebugger.so*' \) -delete 2>/dev/null
        fi
    done
    ldconfig -r "$root" 2>/dev/null
    return 0
}

pod_cleanup() {
    local p=$1 name
    for name in q30 p60; do
        runc delete --force "vgpu-pod-$name-$$" >/dev/null 2>&1
        mountpoint -q "$p/roots/$name" && umount "$p/roots/$name"
        mountpoint -q "$p/layers/$name" && umount "$p/layers/$name"
    done
}

section_pod() {
    log "pod: runc containers from real Allocate responses over the machine's prepared driver"
    # $B is the one host folder the containers write (outputs, the go marker); they
    # also read the streams binary and their command from it.
    local P=$WORK/pod B=$WORK/pod/bundles
    mkdir -p "$P/state" "$B"
    local LDC HARNESS
    if ! LDC=$(pod_find vgpu-ldconfig) || ! HARNESS=$(pod_find pod_harness); then
        pod_record setup FAIL "vgpu-ldconfig or pod_harness missing from $PREFIX/bin and target/release"
        return
    fi
    if ! command -v runc >/dev/null; then
        pod_record setup FAIL "runc is not installed"
        return
    fi
    # The pair's workload (driver API, PTX the driver compiles), built while the driver
    # folder is prepared.
    ( timeout 60 cc -O2 -o "$B/streams" "$ROOT/tests/gpu/limiter/streams.c" -ldl -lpthread > "$OUT/pod-cc.txt" 2>&1 ) &
    local cc_job=$!

    # 1. The driver folder.
    local extra=() dir
    for dir in ${POD_DRIVER_DIRS:-/usr/local/nvidia/lib64 /lib /usr/lib/x86_64-linux-gnu}; do extra+=(--extra-dir "$dir"); done
    timeout 60 "$LDC" prepare --dest "$P/driver" --shim-dir "$PREFIX/lib64" "${extra[@]}" > "$OUT/pod-prepare.txt" 2>&1
    local rc=$?
    [ -n "${POD_AFTER_PREPARE:-}" ] && (cd "$P/driver/current/lib64" && eval "$POD_AFTER_PREPARE")
    timeout 10 "$LDC" layout --host-driver-dir "$P/driver" > "$OUT/pod-layout.txt" 2>&1
    local helpers
    helpers=$(grep '^mount ' "$OUT/pod-layout.txt" | grep '=> /usr/lib/x86_64-linux-gnu/' | sed 's#.*/##; s/ (ro)//' \
        | grep -v -e '^libcuda.so.1$' -e '^libnvidia-ml.so.1$' | tr '\n' ' ')
    if [ $rc = 0 ] && [ -e "$P/driver/current/lib64/libcuda.so.1" ] && [ -x "$P/driver/current/bin/nvidia-smi" ]; then
        pod_record prepare PASS "$(tail -1 "$OUT/pod-prepare.txt"); helpers mounted by SONAME: ${helpers:-none}"
    else
        pod_record prepare FAIL "rc=$rc: $(tail -1 "$OUT/pod-prepare.txt")"
        wait $cc_job
        return
    fi

    # 2. Admission, PreStart and the bundles. Host folders the rootfs overlay cannot show
    # (python's, on mounts of their own) are bound read-only at the same path.
    local binds=(--bind "$ROOT")
    while read -r dir; do [ -n "$dir" ] && binds+=(--bind "$dir"); done < <(python3 - "$WORK" <<'PY'
import os, sys
mounts = [line.split()[4] for line in open("/proc/self/mountinfo")]
wanted = {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}
wanted.add(os.path.realpath(sys.prefix))
def mount_of(path):
    return max((m for m in mounts if path == m or path.startswith(m.rstrip("/") + "/")), key=len)
skip = ("/proc", "/sys", "/dev", "/usr/local/nvidia", sys.argv[1])
found = {mount_of(p) for p in wanted} - {"/"}
print("\n".join(sorted(m for m in found if not m.startswith(skip))))
PY
)
    local envs=(--env "PATH=$PATH" --env PYTHONUNBUFFERED=1 --env HOME=/root)
    for dir in ${POD_EXTRA_ENV:-}; do envs+=(--env "$dir"); done
    rm -f "$P/harness.in"; mkfifo "$P/harness.in"
    timeout 140 "$HARNESS" --driver-dir "$P/driver" --state-dir "$P/state" --bundles "$P/bundles" \
        --rootfs-dir "$P/roots" "${binds[@]}" "${envs[@]}" --container q30:30:10 --container p60:60:8 \
        < "$P/harness.in" > "$OUT/pod-harness.txt" 2> "$OUT/pod-harness.err" &
    local harness=$!
    local keep
    exec {keep}> "$P/harness.in"
    local ready=0
    for _ in $(seq 1 300); do
        grep -q '^READY' "$OUT/pod-harness.txt" 2>/dev/null && { ready=1; break; }
        kill -0 $harness 2>/dev/null || break
        sleep 0.1
    done
    if [ $ready = 1 ]; then
        pod_record allocate PASS "q30 (30 cores, 10 x 256MiB) and p60 (60, 8 x 256MiB): Allocate + PreStart, $(grep -c container_path "$P/bundles/q30.response.json") mounts/devices"
    else
        pod_record allocate FAIL "$(tail -2 "$OUT/pod-harness.err" | tr '\n' ' ')"
        exec {keep}>&-
        wait $harness; wait $cc_job
        return
    fi
    wait $cc_job
    [ -x "$B/streams" ] || log "pod: cc streams.c failed: $(tail -2 "$OUT/pod-cc.txt")"

    # 3. The containers' commands.
    local verify=--verify
    [ "${POD_VERIFY:-1}" = 0 ] && verify=
    cat > "$B/q30.sh" <<SH
nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits > $B/q30-smi.txt 2>&1
echo "rc \$?" >> $B/q30-smi.txt
python3 $ROOT/tests/gpu/pod_torch.py $((2560 << 20)) > $B/q30-torch.txt 2>&1
python3 $ROOT/tests/gpu/ptx_module.py $verify > $B/q30-ptx.txt 2>&1
: > $B/go
[ -x $B/streams ] && $B/streams run f1ms 10 > $B/q30-spin.txt 2>&1
exit 0
SH
    cat > "$B/p60.sh" <<SH
for i in \$(seq 1 900); do [ -e $B/go ] && break; sleep 0.1; done
[ -x $B/streams ] && $B/streams run f1ms 10 > $B/p60-spin.txt 2>&1
exit 0
SH
    local name ok=1
    for name in q30 p60; do
        pod_rootfs "$P" "$name" || { ok=0; pod_record rootfs FAIL "cannot build the overlay rootfs of $name"; }
    done
    if [ $ok = 1 ]; then
        timeout 110 runc run --bundle "$P/bundles/p60" "vgpu-pod-p60-$$" > "$OUT/pod-p60.txt" 2>&1 &
        local p60=$!
        timeout 100 runc run --bundle "$P/bundles/q30" "vgpu-pod-q30-$$" > "$OUT/pod-q30.txt" 2>&1 &
        local q30=$!
        # Once both spin: the card's own per-process account of them, from the host, shown
        # beside their throughput (spinning kernels end on time even when time-sliced).
        local i
        for i in $(seq 1 900); do [ -e "$B/go" ] && break; sleep 0.1; done
        sleep 0.5
        : > "$OUT/pod-pids.txt"
        local name_pid
        for name_pid in "q30 $q30" "p60 $p60"; do
            local found
            found=$(python3 "$HERE/host_pid.py" --argv streams run f1ms "${name_pid#* }")
            [ -n "$found" ] && echo "${name_pid% *} $found" >> "$OUT/pod-pids.txt"
        done
        timeout 20 python3 "$ROOT/tests/gpu/limiter/nvml_probe.py" 10 > "$OUT/pod-nvml.jsonl" 2>&1
        wait $q30
        local q30_rc=$?
        : > "$B/go"
        wait $p60
        local p60_rc=$?
        cp "$B"/q30-*.txt "$B"/p60-*.txt "$OUT/" 2>/dev/null

        # 4. The checks.
        local total
        total=$(head -1 "$B/q30-smi.txt" 2>/dev/null | tr -d ' ')
        if [ "$total" = 2560 ]; then
            pod_record nvidia-smi-quota PASS "nvidia-smi (prepared folder, in the container) memory.total ${total} MiB"
        else
            pod_record nvidia-smi-quota FAIL "memory.total '${total}' (runc rc=$q30_rc): $(tail -2 "$B/q30-smi.txt" 2>/dev/null | tr '\n' ' ')"
        fi
        local torch
        torch=$(result_of "$B/q30-torch.txt")
        python3 - "$torch" <<'PY' > "$P/torch.verdict"
import json, sys
r = json.loads(sys.argv[1])
ok = bool(r.get("ok"))
held = r.get("held", 0) / (1 << 30)
quota = r.get("quota", 0) / (1 << 30)
print(("PASS" if ok else "FAIL") + "\t" + (f"held {held:.2f} GiB of {quota:.2f} GiB, then OutOfMemoryError" if r.get("oom") else f"no OutOfMemoryError: {r}"))
PY
        pod_record torch-oom "$(cut -f1 "$P/torch.verdict")" "$(cut -f2 "$P/torch.verdict")" "\"result\": $torch"
        local ptx
        ptx=$(result_of "$B/q30-ptx.txt")
        if python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1]).get("ok") else 1)' "$ptx"; then
            pod_record ptx-module PASS "cuModuleLoadData(PTX text) CUDA_SUCCESS, kernel launched${verify:+, its store read back}" "\"result\": $ptx"
        else
            pod_record ptx-module FAIL "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r.get("failed") or r)' "$ptx")" "\"result\": $ptx"
        fi
        python3 - "$B/q30-spin.txt" "$B/p60-spin.txt" "$OUT/pod-pids.txt" "$OUT/pod-nvml.jsonl" "$HERE/limiter" <<'PY' > "$P/share.verdict"
import json, sys
sys.path.insert(0, sys.argv[5])
import nvml_probe
def card_shares(pids_path, probe_path):
    """Per container, the mean of NVML's per-process samples of the last second (asked
    as the coordinator asks), from 1 s after the first."""
    try:
        pids = {int(pid): name for name, pid in (line.split() for line in open(pids_path))}
    except (OSError, ValueError):
        return {}
    by_pid = {pid: found for pid, found in nvml_probe.samples(probe_path).items() if pid in pids}
    if not by_pid:
        return {}
    since = min(found[0][0] for found in by_pid.values()) + 1_000_000
    shares = {pids[pid]: nvml_probe.mean(by_pid, pid, since) for pid in by_pid}
    return {name: share for name, share in shares.items() if share is not None}
def busy(path):
    """streams.c's line: completions per second x each one's work, as a share of the
    card (full-card kernels: one fits at a time)."""
    try:
        for line in open(path):
            if line.startswith("{"):
                r = json.loads(line)
                return r["per_s"] * r["work_s"] / r["fit"] * 100.0
    except (OSError, KeyError, ValueError, ZeroDivisionError):
        pass
    return None
b30, b60 = busy(sys.argv[1]), busy(sys.argv[2])
card = card_shares(sys.argv[3], sys.argv[4])
c30, c60 = card.get("q30"), card.get("p60")
if b30 is None or b60 is None:
    print(f"FAIL\tno spin result (q30: {b30}, p60: {b60})")
else:
    ok = abs(b30 - 30) <= 5 and abs(b60 - 60) <= 5
    shown = "-" if c30 is None or c60 is None else f"{c30:.1f}% / {c60:.1f}%"
    print(("PASS" if ok else "FAIL") + f"\tbusy share at once: 30 -> {b30:.1f}%, 60 -> {b60:.1f}% (target +-5 points); "
          f"the card's per-process figures {shown} (NVML, from 1 s in)")
PY
        pod_record share-30-60 "$(cut -f1 "$P/share.verdict")" "$(cut -f2 "$P/share.verdict")" "\"rc\": [$q30_rc, $p60_rc]"
    fi
    exec {keep}>&-
    wait $harness
    pod_cleanup "$P"
}

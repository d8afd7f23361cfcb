# GPU suite section `pod`: sourced by tests/gpu/run.sh, which defines VGPU, SMI, OUT,
# WORK, HERE, ROOT, PREFIX and the helpers record, result_of, wait_marker, gpu_mem_of, median.
#
# A real pod layout on the GPU machine, in about 120 s (budget 200):
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
#      card, time-slicing between them, says it ran);
#   5. a second pair the same way, in a fresh plugin of its own (its state folder: the
#      card has room for one pair's cores at a time), a50 and b50 at 50 cores each: the
#      same spin for 10 s at once, each 50 +-5.
#
# Needs beside $PREFIX/bin/vgpu: `vgpu-ldconfig` and `pod_harness` (from
# target/release/ and target/release/examples/; looked up in $PREFIX/bin first), runc,
# a C compiler, PyTorch, cuda-bindings. A dry run over the sim (tests/tests/
# gpu_pod_dry_run.rs) sets POD_DRIVER_DIRS (where prepare looks: Debian's 535 libraries),
# Debian's nvidia-smi folder first on PATH (prepare takes the tool from PATH),
# POD_AFTER_PREPARE (a command run in the prepared lib64: puts the sim in the real
# driver's place, and vgpu in Debian's nvidia-smi's, which cannot run over the sim),
# POD_VERIFY=0 (the sim runs no kernels) and POD_EXTRA_ENV (the sim's knobs; a
# container's /tmp is a tmpfs of its own, so a VGPU_SIM_STATE there is its own card).

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

# pod_cleanup DIR NAME...
pod_cleanup() {
    local p=$1 name
    shift
    for name in "$@"; do
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
    mkdir -p "$B"
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

    # 2. Host folders the rootfs overlay cannot show (python's, on mounts of their own)
    # are bound read-only at the same path.
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
    wait $cc_job
    [ -x "$B/streams" ] || log "pod: cc streams.c failed: $(tail -2 "$OUT/pod-cc.txt")"

    # 3-4. The 30/60 pair, with the quota checks in q30; 5. the 50/50 pair.
    pod_pair "$P" "$B" q30 30 10 p60 60 8
    pod_pair "$P" "$B" a50 50 8 b50 50 8
}

# pod_pair DIR BUNDLES A CORES_A UNITS_A B CORES_B UNITS_B: admits containers A and B in
# a plugin of their own, runs both with runc (A first checks the quota when it is q30),
# spins both for 10 s at once and records `share-CORES_A-CORES_B` (each within +-5).
pod_pair() {
    local P=$1 B=$2 a=$3 a_cores=$4 a_units=$5 b=$6 b_cores=$7 b_units=$8
    local pair="$a_cores-$b_cores" state="$1/state-$3-$6"
    mkdir -p "$state"
    rm -f "$P/harness.in"; mkfifo "$P/harness.in"
    timeout 140 "$HARNESS" --driver-dir "$P/driver" --state-dir "$state" --bundles "$B" \
        --rootfs-dir "$P/roots" "${binds[@]}" "${envs[@]}" \
        --container "$a:$a_cores:$a_units" --container "$b:$b_cores:$b_units" \
        < "$P/harness.in" > "$OUT/pod-harness-$pair.txt" 2> "$OUT/pod-harness-$pair.err" &
    local harness=$!
    local keep
    exec {keep}> "$P/harness.in"
    # Up to 60 s for READY (a busy 2-core CI machine starts the debug harness slowly);
    # a harness that died ends the wait at once.
    local ready=0
    for _ in $(seq 1 600); do
        grep -q '^READY' "$OUT/pod-harness-$pair.txt" 2>/dev/null && { ready=1; break; }
        kill -0 $harness 2>/dev/null || break
        sleep 0.1
    done
    if [ $ready = 1 ]; then
        pod_record "allocate-$pair" PASS "$a ($a_cores cores, $a_units x 256MiB) and $b ($b_cores, $b_units x 256MiB): Allocate + PreStart, $(grep -c container_path "$B/$a.response.json") mounts/devices"
    else
        pod_record "allocate-$pair" FAIL "$(tail -2 "$OUT/pod-harness-$pair.err" | tr '\n' ' ')"
        exec {keep}>&-
        wait $harness
        return
    fi

    # The containers' commands: A signals `go-PAIR` when its checks are done and both spin.
    local verify=--verify
    [ "${POD_VERIFY:-1}" = 0 ] && verify=
    local go="$B/go-$pair"
    rm -f "$go"
    {
        if [ "$a" = q30 ]; then
            cat <<SH
nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits > $B/q30-smi.txt 2>&1
echo "rc \$?" >> $B/q30-smi.txt
python3 $ROOT/tests/gpu/pod_torch.py $((a_units * 256 << 20)) > $B/q30-torch.txt 2>&1
python3 $ROOT/tests/gpu/ptx_module.py $verify > $B/q30-ptx.txt 2>&1
SH
        fi
        cat <<SH
: > $go
[ -x $B/streams ] && $B/streams run f1ms 10 > $B/$a-spin.txt 2>&1
exit 0
SH
    } > "$B/$a.sh"
    cat > "$B/$b.sh" <<SH
for i in \$(seq 1 900); do [ -e $go ] && break; sleep 0.1; done
[ -x $B/streams ] && $B/streams run f1ms 10 > $B/$b-spin.txt 2>&1
exit 0
SH
    # One record for the pair, however many of its rootfs failed.
    local name failed=
    for name in "$a" "$b"; do
        pod_rootfs "$P" "$name" || failed="$failed $name"
    done
    if [ -n "$failed" ]; then
        pod_record "rootfs-$pair" FAIL "cannot build the overlay rootfs of$failed"
    else
        timeout 110 runc run --bundle "$B/$b" "vgpu-pod-$b-$$" > "$OUT/pod-$b.txt" 2>&1 &
        local b_job=$!
        timeout 100 runc run --bundle "$B/$a" "vgpu-pod-$a-$$" > "$OUT/pod-$a.txt" 2>&1 &
        local a_job=$!
        # Once both spin: the card's own per-process account of them, from the host, shown
        # beside their throughput (spinning kernels end on time even when time-sliced).
        local i
        for i in $(seq 1 900); do [ -e "$go" ] && break; sleep 0.1; done
        sleep 0.5
        : > "$OUT/pod-pids-$pair.txt"
        local name_pid
        for name_pid in "$a $a_job" "$b $b_job"; do
            local found
            found=$(python3 "$HERE/host_pid.py" --argv streams run f1ms "${name_pid#* }")
            [ -n "$found" ] && echo "${name_pid% *} $found" >> "$OUT/pod-pids-$pair.txt"
        done
        timeout 20 python3 "$ROOT/tests/gpu/limiter/nvml_probe.py" 10 > "$OUT/pod-nvml-$pair.jsonl" 2>&1
        wait $a_job
        local a_rc=$?
        : > "$go"
        wait $b_job
        local b_rc=$?
        cp "$B/$a"-*.txt "$B/$b"-*.txt "$OUT/" 2>/dev/null
        [ "$a" = q30 ] && pod_quota_checks "$B" "$a_rc" "$verify"
        python3 - "$B/$a-spin.txt" "$B/$b-spin.txt" "$OUT/pod-pids-$pair.txt" "$OUT/pod-nvml-$pair.jsonl" "$HERE/limiter" \
            "$a" "$a_cores" "$b" "$b_cores" <<'PY' > "$P/share-$pair.verdict"
import json, sys
sys.path.insert(0, sys.argv[5])
import nvml_probe
a, a_cores, b, b_cores = sys.argv[6], float(sys.argv[7]), sys.argv[8], float(sys.argv[9])
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
busy_a, busy_b = busy(sys.argv[1]), busy(sys.argv[2])
card = card_shares(sys.argv[3], sys.argv[4])
card_a, card_b = card.get(a), card.get(b)
if busy_a is None or busy_b is None:
    print(f"FAIL\tno spin result ({a}: {busy_a}, {b}: {busy_b})")
else:
    ok = abs(busy_a - a_cores) <= 5 and abs(busy_b - b_cores) <= 5
    shown = "-" if card_a is None or card_b is None else f"{card_a:.1f}% / {card_b:.1f}%"
    print(("PASS" if ok else "FAIL") + f"\tbusy share at once: {a_cores:g} -> {busy_a:.1f}%, {b_cores:g} -> {busy_b:.1f}% "
          f"(target +-5 points); the card's per-process figures {shown} (NVML, from 1 s in)")
PY
        pod_record "share-$pair" "$(cut -f1 "$P/share-$pair.verdict")" "$(cut -f2 "$P/share-$pair.verdict")" "\"rc\": [$a_rc, $b_rc]"
    fi
    exec {keep}>&-
    wait $harness
    pod_cleanup "$P" "$a" "$b"
}

# pod_quota_checks BUNDLES RC VERIFY: records what q30 found inside: nvidia-smi's
# memory.total, PyTorch's OutOfMemoryError at the quota, a PTX module's kernel.
pod_quota_checks() {
    local B=$1 q30_rc=$2 verify=$3 total
    total=$(head -1 "$B/q30-smi.txt" 2>/dev/null | tr -d ' ')
    if [ "$total" = 2560 ]; then
        pod_record nvidia-smi-quota PASS "nvidia-smi (prepared folder, in the container) memory.total ${total} MiB"
    else
        pod_record nvidia-smi-quota FAIL "memory.total '${total}' (runc rc=$q30_rc): $(tail -2 "$B/q30-smi.txt" 2>/dev/null | tr '\n' ' ')"
    fi
    local torch
    torch=$(result_of "$B/q30-torch.txt")
    python3 - "$torch" <<'PY' > "$B/torch.verdict"
import json, sys
r = json.loads(sys.argv[1])
ok = bool(r.get("ok"))
held = r.get("held", 0) / (1 << 30)
quota = r.get("quota", 0) / (1 << 30)
print(("PASS" if ok else "FAIL") + "\t" + (f"held {held:.2f} GiB of {quota:.2f} GiB, then OutOfMemoryError" if r.get("oom") else f"no OutOfMemoryError: {r}"))
PY
    pod_record torch-oom "$(cut -f1 "$B/torch.verdict")" "$(cut -f2 "$B/torch.verdict")" "\"result\": $torch"
    local ptx
    ptx=$(result_of "$B/q30-ptx.txt")
    if python3 -c 'import json,sys; sys.exit(0 if json.loads(sys.argv[1]).get("ok") else 1)' "$ptx"; then
        pod_record ptx-module PASS "cuModuleLoadData(PTX text) CUDA_SUCCESS, kernel launched${verify:+, its store read back}" "\"result\": $ptx"
    else
        pod_record ptx-module FAIL "$(python3 -c 'import json,sys; r=json.loads(sys.argv[1]); print(r.get("failed") or r)' "$ptx")" "\"result\": $ptx"
    fi
}

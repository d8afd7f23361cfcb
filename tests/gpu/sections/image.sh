# GPU suite section `image` (issue 11): `vgpu-ldconfig prepare` against this machine's
# real driver, the way the DaemonSet's init container runs it. Sourced by
# tests/gpu/run.sh, which defines VGPU, SMI, OUT, WORK, HERE, ROOT, PREFIX, log and
# record. Budget: 40 s. Expect about 15 s; the timeouts cap it at 44 s: the version
# query 5 s, four preparations of 7 s at most (three copy the driver's files, well
# under 1 GB; the re-run copies nothing), nvidia-smi 5 s, two export checks 3 s each.
#
# Records (section `image`):
#   prepare-auto       discovery from `/` as the host root, nothing named
#   prepare-rerun      the same again: nothing rewritten, and how long it took
#   prepare-flags      --driver-root / --cache --extra-dir /usr/local/nvidia/lib64 --tool-dir /usr/local/nvidia/bin
#   prepare-host-root  `/` bind-mounted read-only elsewhere and given as --host-root (the /host view)
#   prepared-nvidia-smi  the prepared bin/nvidia-smi runs on the prepared lib64 (-L lists the GPUs)
#   export-check       `vgpu-ldconfig check` of each deployed shim against the prepared real library
# IMAGE_HOST_ROOT and IMAGE_DRIVER_VERSION replace `/` and nvidia-smi's version for a
# dry run off the GPU machine.

section_image() {
    log "image: vgpu-ldconfig prepare against the real driver"
    local ldc="$PREFIX/bin/vgpu-ldconfig"
    [ -x "$ldc" ] || ldc="$ROOT/target/release/vgpu-ldconfig"
    if [ ! -x "$ldc" ]; then
        record image prepare-auto '"verdict": "FAIL", "figure": "no vgpu-ldconfig in PREFIX/bin or target/release"'
        return
    fi
    local root=${IMAGE_HOST_ROOT:-/}
    local want=${IMAGE_DRIVER_VERSION:-$(timeout 5 "$SMI" --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)}
    local shims=$PREFIX/lib64 dest=$WORK/image rc start seconds
    mkdir -p "$dest"
    # `image_prepare NAME MODE ARGS...`: one run, judged by image_check.py (MODE prepare
    # or rerun), recorded as NAME.
    image_prepare() {
        local name=$1 mode=$2
        shift 2
        start=$(date +%s.%N)
        timeout 7 "$@" > "$OUT/image-$name.json" 2> "$OUT/image-$name.err"
        rc=$?
        seconds=$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$start" "$(date +%s.%N)")
        record image "$name" "$(python3 "$HERE/image_check.py" "$mode" "$OUT/image-$name.json" "$want" "$rc" "$seconds")"
    }

    image_prepare prepare-auto prepare "$ldc" prepare --host-root "$root" --dest "$dest/auto" --shim-dir "$shims" --json
    image_prepare prepare-rerun rerun "$ldc" prepare --host-root "$root" --dest "$dest/auto" --shim-dir "$shims" --json

    local flags=(--host-root "$root" --driver-root / --extra-dir /usr/local/nvidia/lib64 --tool-dir /usr/local/nvidia/bin)
    [ -f "$root/etc/ld.so.cache" ] && flags+=(--cache "$root/etc/ld.so.cache")
    image_prepare prepare-flags prepare "$ldc" prepare "${flags[@]}" --dest "$dest/flags" --shim-dir "$shims" --json

    # The init container's view: the host's / mounted read-only at another path.
    local mnt=$WORK/image-host
    mkdir -p "$mnt"
    image_prepare prepare-host-root prepare unshare -m sh -c \
        'mount --rbind "$1" "$2" && mount -o remount,bind,ro "$2" && exec "$3" prepare --host-root "$2" --dest "$4" --shim-dir "$5" --json' \
        sh "$root" "$mnt" "$ldc" "$dest/host-root" "$shims"

    # In the prepared folder: its nvidia-smi on its own copies of the libraries.
    local prepared=$dest/auto/current
    LD_DEBUG=libs LD_LIBRARY_PATH=$prepared/lib64 timeout 5 "$prepared/bin/nvidia-smi" -L \
        > "$OUT/image-smi.txt" 2> "$OUT/image-smi-ld.txt"
    rc=$?
    local gpus nvml_from
    gpus=$(grep -c '^GPU ' "$OUT/image-smi.txt")
    nvml_from=$(grep -o 'calling init: [^ ]*libnvidia-ml[^ ]*' "$OUT/image-smi-ld.txt" | head -1 | cut -d' ' -f3)
    local verdict=FAIL
    [ "$rc" = 0 ] && [ "$gpus" -ge 1 ] && case "$nvml_from" in "$prepared"/* | "$dest"/auto/*) verdict=PASS ;; esac
    record image prepared-nvidia-smi "\"verdict\": \"$verdict\", \"figure\": \"rc $rc, $gpus GPU(s) listed, NVML from ${nvml_from:-unknown}\", \"rc\": $rc, \"gpus\": $gpus"

    local cuda_rc nvml_rc
    timeout 3 "$ldc" check --real "$prepared/lib64/libcuda.so.1" --shim "$prepared/shim/libcuda_shim.so" > "$OUT/image-check-cuda.txt" 2>&1
    cuda_rc=$?
    timeout 3 "$ldc" check --real "$prepared/lib64/libnvidia-ml.so.1" --shim "$prepared/shim/libnvml_shim.so" > "$OUT/image-check-nvml.txt" 2>&1
    nvml_rc=$?
    verdict=FAIL
    [ "$cuda_rc" = 0 ] && [ "$nvml_rc" = 0 ] && verdict=PASS
    local summary
    summary=$(cat "$OUT/image-check-cuda.txt" "$OUT/image-check-nvml.txt" | grep -c 'exports all')
    record image export-check "\"verdict\": \"$verdict\", \"figure\": \"$summary of 2 shims export every name of the prepared driver\", \"rc_cuda\": $cuda_rc, \"rc_nvml\": $nvml_rc"
}

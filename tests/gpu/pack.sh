#!/usr/bin/env bash
# Packs what a device call carries to the GPU machine, from this checkout's build:
#   tests/gpu/pack.sh DEST [PROFILE_DIR]
#
# DEST becomes a `vgpu install` folder (bin/vgpu, lib64/ with the shims, sim/) that the
# GPU suite takes as its PREFIX (tests/gpu/run.sh DEST ...), plus what the suite's
# sections look up beside it and the GPU machine lacks:
#   bin/vgpu-ldconfig, bin/pod_harness  the pod section's (sections/pod.sh);
#   bin/runc, lib/                      this machine's runc, with the libraries it needs
#                                       beyond glibc in lib/ and a run path to them
#                                       ($ORIGIN/../lib), as the GPU machine has no runc.
# Every ELF file is stripped; what it packed and its size are printed last. DEST must be
# a folder git ignores (.carry/ is), named in the device call's `carry` (64 MiB in all
# with the checkout).
#
# PROFILE_DIR (default target/release) holds the binaries, built first with
#   cargo build --release -p libcuda-shim -p libnvml-shim -p vgpu-sim-driver -p vgpu \
#       -p vgpu-ldconfig && cargo build --release -p vgpu-plugin --example pod_harness
# Needs runc, patchelf and strip (binutils) on this machine.
set -euo pipefail
DEST=${1:?usage: tests/gpu/pack.sh DEST [PROFILE_DIR]}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PROFILE=${2:-$ROOT/target/release}
fail() { echo "pack.sh: $*" >&2; exit 1; }

[ -x "$PROFILE/vgpu" ] || fail "no $PROFILE/vgpu: build first (see this script's header)"
[ -x "$PROFILE/vgpu-ldconfig" ] || fail "no $PROFILE/vgpu-ldconfig: build it first"
[ -x "$PROFILE/examples/pod_harness" ] || fail "no $PROFILE/examples/pod_harness: build it first"
RUNC=$(command -v runc) || fail "no runc on PATH (apt-get install runc)"
command -v patchelf > /dev/null || fail "no patchelf (apt-get install patchelf)"
command -v strip > /dev/null || fail "no strip (apt-get install binutils)"

rm -rf "$DEST"
"$PROFILE/vgpu" install --prefix "$DEST" > /dev/null
cp "$PROFILE/vgpu-ldconfig" "$PROFILE/examples/pod_harness" "$DEST/bin/"
# The plugins run on a node, not in the suite: they only add size.
rm -f "$DEST/bin/vgpu-plugin" "$DEST/bin/vgpu-dra-plugin"

# runc and what it links beyond the C library (Debian's: libseccomp), found by the
# loader here; a run path relative to the binary finds them there.
mkdir -p "$DEST/lib"
cp "$(readlink -f "$RUNC")" "$DEST/bin/runc"
ldd "$DEST/bin/runc" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    case $(basename "$lib") in
        libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;
        *) cp -L "$lib" "$DEST/lib/" ;;
    esac
done

# Stripped before the run path is set: patchelf's edit is the last.
find "$DEST" -type f -print0 | while IFS= read -r -d '' file; do
    if [ "$(head -c 4 "$file" | od -An -tx1 | tr -d ' \n')" = 7f454c46 ]; then
        strip "$file" 2>/dev/null || true
    fi
done
patchelf --set-rpath '$ORIGIN/../lib' "$DEST/bin/runc"
"$DEST/bin/runc" --version > /dev/null || fail "the packed runc does not run"
(cd "$DEST" && find . -type f | sort)
size_mib=$(( $(du -sk "$DEST" | cut -f1) / 1024 ))
echo "packed ${size_mib} MiB"
# A device call carries 64 MiB in all, the checkout's tracked files included.
[ "$size_mib" -le 56 ] || echo "pack.sh: $DEST is ${size_mib} MiB: with the checkout it may pass the 64 MiB a call carries" >&2

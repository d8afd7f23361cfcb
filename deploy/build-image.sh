#!/usr/bin/env bash
# Builds the image the DaemonSet runs, with podman, from nothing but this checkout and
# Debian's package archive (no registry pull):
#
#   deploy/build-image.sh                  build it; the image reference is the last line
#   deploy/build-image.sh --context DIR    only assemble the build context in DIR (for
#                                          docker or buildah elsewhere; see deploy/README.md)
#   deploy/build-image.sh --print-ref      print the reference it would build, nothing else
#
# Steps: (1) cargo-zigbuild builds vgpu-plugin, vgpu-ldconfig, vgpu, the two shims and
# the simulated driver for x86_64 glibc 2.17, so the shims load in every tenant image
# from CentOS 7 and UBI 7 on; (2) `vgpu install` lays them out in the context under
# usr/local/vgpu (bin/, lib64/, sim/, plus shim/ with the shims' built names, which
# `vgpu-ldconfig prepare --shim-dir` reads); (3) unless VGPU_BASE_IMAGE names a base,
# debootstrap makes a minimal Debian of this machine's release from this machine's own
# mirror, cached in target/image/base, and `podman import` turns it into a local base
# image; (4) `podman build` with the Containerfile, tagged with the workspace version.
#
# Environment: VGPU_IMAGE (repository, default vgpu-shim/vgpu-plugin), VGPU_BASE_IMAGE
# (a base image to build FROM instead of the debootstrapped one), VGPU_COMMIT (the
# commit recorded in the binaries and labels; default git HEAD), VGPU_IMAGE_WORK (work
# folder, default target/image). Progress goes to stderr; stdout is the reference only.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${VGPU_IMAGE_WORK:-$ROOT/target/image}
REPOSITORY=${VGPU_IMAGE:-vgpu-shim/vgpu-plugin}
TARGET=x86_64-unknown-linux-gnu
GLIBC=2.17

log() { echo "build-image: $*" >&2; }

# The workspace version: Cargo.toml's [workspace.package] version.
VERSION=$(awk '
    /^\[/ { section = $0 }
    section == "[workspace.package]" && $1 == "version" { gsub(/[" ]/, "", $3); print $3; exit }
' "$ROOT/Cargo.toml")
[ -n "$VERSION" ] || { log "no [workspace.package] version in Cargo.toml"; exit 1; }
# podman names an image without a registry localhost/NAME (a first component with a
# dot or a colon, or localhost, is a registry, as docker reads names).
FIRST=${REPOSITORY%%/*}
if [ "$FIRST" != "$REPOSITORY" ] && { [ "$FIRST" = localhost ] || [[ $FIRST == *.* || $FIRST == *:* ]]; }; then
    REFERENCE="$REPOSITORY:$VERSION"
else
    REFERENCE="localhost/$REPOSITORY:$VERSION"
fi

MODE=build
CONTEXT=$WORK/context
case "${1:-}" in
    --print-ref) echo "$REFERENCE"; exit 0 ;;
    --context) MODE=context; CONTEXT=${2:?--context needs a folder} ;;
    "") ;;
    *) log "usage: $0 [--context DIR | --print-ref]"; exit 2 ;;
esac

COMMIT=${VGPU_COMMIT:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}
export VGPU_COMMIT=$COMMIT

# 1. The binaries, for glibc 2.17 (zig from PyPI's ziglang links them).
zigbuild() {
    if command -v cargo-zigbuild >/dev/null; then
        cargo-zigbuild zigbuild "$@"
    else
        local scripts
        scripts=$(python3 -c 'import sysconfig; print(sysconfig.get_path("scripts"))')
        [ -x "$scripts/cargo-zigbuild" ] || {
            log "cargo-zigbuild not found: python3 -m pip install ziglang cargo-zigbuild"
            exit 1
        }
        "$scripts/cargo-zigbuild" zigbuild "$@"
    fi
}
log "building $VERSION (commit $COMMIT) for $TARGET, glibc $GLIBC"
(cd "$ROOT" && CARGO_TARGET_DIR=$WORK/cargo zigbuild --release --target "$TARGET.$GLIBC" \
    -p vgpu-plugin -p vgpu-dra -p vgpu-ldconfig -p vgpu -p libcuda-shim -p libnvml-shim -p vgpu-sim-driver) >&2
BUILT=$WORK/cargo/$TARGET/release

# 2. The build context.
rm -rf "$CONTEXT"
mkdir -p "$CONTEXT"
PREFIX=$CONTEXT/usr/local/vgpu
"$BUILT/vgpu" install --prefix "$PREFIX" >&2
for binary in vgpu-plugin vgpu-ldconfig; do
    [ -x "$PREFIX/bin/$binary" ] || { log "vgpu install left out $binary"; exit 1; }
done
mkdir -p "$PREFIX/shim"
for shim in libcuda_shim.so libnvml_shim.so; do
    install -m 0644 "$BUILT/$shim" "$PREFIX/shim/$shim"
done
cp "$ROOT/Containerfile" "$CONTEXT/Containerfile"
printf 'version=%s\ncommit=%s\n' "$VERSION" "$COMMIT" > "$PREFIX/BUILD-INFO"
if [ "$MODE" = context ]; then
    log "context ready: $CONTEXT (build it with: docker build --build-arg BASE=<a glibc image> --build-arg VERSION=$VERSION --build-arg COMMIT=$COMMIT -t $REPOSITORY:$VERSION $CONTEXT)"
    echo "$CONTEXT"
    exit 0
fi

# 3. The base: a minimal Debian, made here.
BASE=${VGPU_BASE_IMAGE:-}
if [ -z "$BASE" ]; then
    CODENAME=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$CODENAME" ] || { log "cannot tell this machine's Debian release; set VGPU_BASE_IMAGE"; exit 1; }
    BASE=localhost/vgpu-shim/base:$CODENAME
    TARBALL=$WORK/base/debian-$CODENAME-minbase.tar
    if ! podman image exists "$BASE"; then
        if [ ! -s "$TARBALL" ]; then
            MIRROR=$(bash "$ROOT/deploy/debian-sources.sh" mirror)
            log "making the base with debootstrap ($CODENAME${MIRROR:+ from $MIRROR})"
            rm -rf "$WORK/base/rootfs"
            mkdir -p "$WORK/base"
            debootstrap --variant=minbase "$CODENAME" "$WORK/base/rootfs" ${MIRROR:+"$MIRROR"} >&2
            rm -rf "$WORK/base/rootfs/var/cache/apt/archives/"*.deb "$WORK/base/rootfs/var/lib/apt/lists/"*
            tar --numeric-owner -C "$WORK/base/rootfs" -cf "$TARBALL.tmp" .
            mv "$TARBALL.tmp" "$TARBALL"
            rm -rf "$WORK/base/rootfs"
        fi
        log "importing the base as $BASE"
        podman import --change 'CMD ["/bin/bash"]' "$TARBALL" "$BASE" >&2
    fi
fi

# 4. The image.
log "building $REFERENCE from $BASE"
podman build --quiet --build-arg "BASE=$BASE" --build-arg "VERSION=$VERSION" \
    --build-arg "COMMIT=$COMMIT" -t "$REFERENCE" -f "$CONTEXT/Containerfile" "$CONTEXT" >&2
echo "$REFERENCE"

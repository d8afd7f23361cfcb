#!/usr/bin/env bash
# The test suite, from a clean checkout on Debian 12 (run as root: `vgpu run`, the runc
# and podman tests need mount namespaces). Installs what the tests need, builds the
# whole workspace (the shims, the sim driver and the binaries the tests drive), then
# runs every test. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# From Debian: runc and podman run real OCI containers (podman also builds the image,
# from a base that debootstrap makes); binutils gives nm and objdump; libc-bin's
# ldconfig writes the fake hosts' loader caches. Debian's non-free NVIDIA 535 packages
# give real export tables and a real nvidia-smi, used as data (they load without a GPU).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # The non-free component, on the Debian sources this machine already uses.
    nonfree=$(bash deploy/debian-sources.sh nonfree)
    if [ -n "$nonfree" ]; then
        printf '%s' "$nonfree" > /etc/apt/sources.list.d/vgpu-nonfree.sources
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        runc podman debootstrap binutils libc-bin gcc python3 python3-pip >/dev/null
    # The version the checked-in export lists (symbols/*.535.261.03.txt) were made from.
    export VGPU_DEBIAN_DEBS=${VGPU_DEBIAN_DEBS:-$PWD/target/debian-debs}
    mkdir -p "$VGPU_DEBIAN_DEBS"
    nvidia=(libcuda1=535.261.03-1 libnvidia-ml1=535.261.03-1 nvidia-smi=535.261.03-1)
    (cd "$VGPU_DEBIAN_DEBS" && apt-get download "${nvidia[@]}" >/dev/null 2>&1 || apt-get download "${nvidia[@]}")
fi

# From PyPI: clients nobody here wrote (NVIDIA's cuda-bindings and nvidia-ml-py), and
# the toolchain of the image build: zig (package ziglang) links the shims and binaries
# against glibc 2.17 through cargo-zigbuild.
python3 -m pip install --quiet --disable-pip-version-check "cuda-bindings>=13,<14" nvidia-ml-py ziglang cargo-zigbuild

# No incremental caches: CI builds once, and they doubled the disk the build takes.
export CARGO_INCREMENTAL=0
cargo build --workspace --all-targets
cargo test --workspace --no-fail-fast

# The Helm chart without a cluster: lint and template of both modes, deploy/ equal to the
# chart's output, each mode's rendered config through the daemon's own parser.
bash tests/k8s/chart.sh

# A real single-node Kubernetes cluster (etcd, kube-apiserver, controller-manager,
# scheduler, containerd with CDI, kubelet on runc) built from Go modules by
# tests/k8s/build.sh (cached by version in /root/.cache/vgpu-k8s; Go's build cache makes
# a rebuild cheap), then the seed's deploy and verify steps in both modes against it.
# Its closing line is `N passed, N failed`.
if [ "$(id -u)" = 0 ] && command -v go >/dev/null; then
    k8s_start=$SECONDS
    bash tests/k8s/build.sh
    echo "tests/k8s/build.sh: $((SECONDS - k8s_start)) s"
    bash tests/k8s/test.sh all
else
    echo "real-cluster tests skipped: they need root and Go" >&2
    [ -z "${CI:-}" ] || exit 1
fi

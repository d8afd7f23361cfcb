#!/usr/bin/env bash
# The test suite, from a clean checkout on Debian 12 (run as root: `vgpu run`, the runc
# and podman tests need mount namespaces). Installs what the tests need, checks the
# code (rustfmt, clippy and rustdoc, warnings denied), builds the whole workspace (the
# shims, the sim driver and the binaries the tests drive), runs every test, then fuzzes
# each parser of hostile input for a bounded time. .ci/run calls exactly this.
#
# CI sets CI=true: then a test whose prerequisite is missing fails instead of skipping
# (vgpu-test-support's policy), so everything installed here really runs.
set -euo pipefail
cd "$(dirname "$0")/.."

# From Debian: runc and podman run real OCI containers (podman also builds the image,
# from a base that debootstrap makes); binutils gives nm and objdump; libc-bin's
# ldconfig writes the fake hosts' loader caches; patchelf gives the runc that
# tests/gpu/pack.sh packs for the GPU machine a run path to its libraries. Debian's
# non-free NVIDIA 535 packages give real export tables and a real nvidia-smi, used as
# data (they load without a GPU).
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    # The non-free component, on the Debian sources this machine already uses.
    nonfree=$(bash deploy/debian-sources.sh nonfree)
    if [ -n "$nonfree" ]; then
        printf '%s' "$nonfree" > /etc/apt/sources.list.d/vgpu-nonfree.sources
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        runc podman debootstrap binutils libc-bin gcc g++ python3 python3-pip strace patchelf >/dev/null
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

# The code checks, first: they fail in a minute where the tests take many.
cargo fmt --all --check
(cd fuzz && cargo fmt --all --check)
cargo clippy --workspace --all-targets -- -D warnings
RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps

cargo build --workspace --all-targets
cargo test --workspace --no-fail-fast

# The Helm chart without a cluster: lint and template of both modes, deploy/ equal to the
# chart's output, each mode's rendered config through the daemon's own parser.
bash tests/k8s/chart.sh

# Each cargo-fuzz target for 45 s (g++ above builds libFuzzer).
bash tests/fuzz.sh 45

# A real single-node Kubernetes cluster (etcd, kube-apiserver, controller-manager,
# scheduler, containerd with CDI, kubelet on runc) built from Go modules by
# tests/k8s/build.sh (cached by version in /root/.cache/vgpu-k8s; Go's build cache makes
# a rebuild cheap), then the seed's deploy and verify steps in both modes against it
# (tests/k8s/test.sh prints each component's version first). Its closing line is
# `N passed, N failed`. It needs root and Go: in CI a missing one fails the run; elsewhere
# it is skipped with a line saying so. VGPU_K8S_TESTS=0 leaves it out.
if [ "${VGPU_K8S_TESTS:-1}" != 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v go >/dev/null; then
        k8s_start=$SECONDS
        bash tests/k8s/build.sh
        echo "tests/k8s/build.sh: $((SECONDS - k8s_start)) s"
        k8s_start=$SECONDS
        bash tests/k8s/test.sh all
        echo "tests/k8s/test.sh all: $((SECONDS - k8s_start)) s"
    elif [ "${CI:-}" = true ]; then
        echo "real-cluster tests: need root and Go (go on PATH); VGPU_K8S_TESTS=0 leaves them out" >&2
        exit 1
    else
        echo "SKIPPED real-cluster tests: need root and Go (VGPU_K8S_TESTS=0 leaves them out)" >&2
    fi
fi

#!/usr/bin/env bash
# The test suite, from a clean checkout on Debian 12 (run as root: `vgpu run` and the
# runc end-to-end test need mount namespaces). Installs what the tests need, builds the
# whole workspace (the shims, the sim driver and the binaries the tests drive), then
# runs every test. .ci/run calls exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian's non-free NVIDIA 535 packages: real export tables and a real nvidia-smi, used
# as data (they load without a GPU); runc runs real OCI containers, podman (4.3) real
# containers from CDI specs; binutils gives nm.
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    if ! grep -rqs "non-free" /etc/apt/sources.list /etc/apt/sources.list.d/; then
        cat > /etc/apt/sources.list.d/vgpu-nonfree.sources <<'SRC'
Types: deb
URIs: http://deb.debian.org/debian
Suites: bookworm bookworm-updates
Components: non-free
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends runc podman binutils gcc python3 python3-pip >/dev/null
    export VGPU_DEBIAN_DEBS=${VGPU_DEBIAN_DEBS:-$PWD/target/debian-debs}
    mkdir -p "$VGPU_DEBIAN_DEBS"
    (cd "$VGPU_DEBIAN_DEBS" && apt-get download libcuda1 libnvidia-ml1 nvidia-smi >/dev/null 2>&1 || apt-get download libcuda1 libnvidia-ml1 nvidia-smi)
fi

# Clients nobody here wrote: NVIDIA's cuda-bindings and nvidia-ml-py.
python3 -m pip install --quiet --disable-pip-version-check "cuda-bindings>=13,<14" nvidia-ml-py

cargo build --workspace --all-targets
cargo test --workspace --no-fail-fast

#!/usr/bin/env bash
# Builds (or reuses) the tools of the real-cluster tests, each pinned at one version and
# cached by version outside the checkout, so a warm machine rebuilds nothing:
#
#   tests/k8s/build.sh [TOOL...]      TOOL: kubebin etcd containerd crictl helm debian
#                                     (no TOOL: all of them)
#   tests/k8s/build.sh --print-path   only the PATH entries, colon-separated (builds nothing)
#
# Each Go tool lands in $VGPU_K8S_CACHE/<tool>-<version>/bin (default cache
# /root/.cache/vgpu-k8s); a folder whose .done marker exists is reused as it is. Go
# modules come through the Go module proxy go is set up with, and the Go build cache
# (GOCACHE) is shared, so even a changed pin rebuilds only what changed.
#   kubebin     tests/k8s/kubebin: kube-apiserver, kube-controller-manager, kube-scheduler,
#               kubelet and kubectl as links to one multi-call binary (k8s.io/kubernetes
#               at the version its go.mod requires; the cache key adds a hash of the
#               module's files, so an edit to main.go rebuilds)
#   etcd        tests/k8s/etcd: etcd's server (go.etcd.io/etcd/server/v3's etcdmain), a
#               module of ours because etcd's own main module replaces its siblings locally
#   containerd  containerd, containerd-shim-runc-v2 and ctr (containerd v2: CDI on by default)
#   crictl      sigs.k8s.io/cri-tools
#   helm        helm.sh/helm/v4
#   debian      runc, the CNI plugins (bridge, host-local, loopback), openssl, iproute2,
#               curl, podman, debootstrap and a C compiler from Debian's archive (apt-get, as root)
# The last line printed is `PATH=<the tools' folders>`; progress goes to stderr.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${VGPU_K8S_CACHE:-/root/.cache/vgpu-k8s}

# The pins. kubebin's and etcd's versions are their go.mod's requirements.
HELM_VERSION=v4.3.2
CONTAINERD_VERSION=v2.2.9
CRICTL_VERSION=v1.37.0
# Debian's CNI plugins live here.
CNI_BIN=/usr/lib/cni

log() { echo "k8s-build: $*" >&2; }

required_version() { # module go.mod -> the version go.mod requires
    awk -v m="$1" '$1 == "require" { $1 = ""; $0 = $0 } $1 == m && $2 ~ /^v/ { print $2; exit }' "$2"
}

module_hash() { # folder -> short hash of its go.mod, go.sum and Go files
    (cd "$1" && cat go.mod go.sum ./*.go | sha256sum | cut -c1-12)
}

kubebin_dir() {
    echo "$CACHE/kubebin-$(required_version k8s.io/kubernetes "$HERE/kubebin/go.mod")-$(module_hash "$HERE/kubebin")"
}
etcd_dir() {
    echo "$CACHE/etcd-$(required_version go.etcd.io/etcd/server/v3 "$HERE/etcd/go.mod")-$(module_hash "$HERE/etcd")"
}
containerd_dir() { echo "$CACHE/containerd-$CONTAINERD_VERSION"; }
crictl_dir() { echo "$CACHE/crictl-$CRICTL_VERSION"; }
helm_dir() { echo "$CACHE/helm-$HELM_VERSION"; }

# Runs "$@" (a build into $dir/bin) unless $dir is complete; marks it complete after.
cached() {
    local name=$1 dir=$2
    shift 2
    if [ -e "$dir/.done" ]; then
        log "$name: reusing $dir"
        return
    fi
    log "$name: building into $dir"
    rm -rf "$dir"
    mkdir -p "$dir/bin"
    local start=$SECONDS
    "$@"
    touch "$dir/.done"
    log "$name: built in $((SECONDS - start)) s"
}

# `go install MODULE/PKG@VERSION` into $1/bin.
go_install() {
    local dir=$1
    shift
    GOBIN=$dir/bin GOFLAGS=-buildvcs=false nice -n 10 go install "$@"
}

build_helm() {
    local dir
    dir=$(helm_dir)
    cached helm "$dir" go_install "$dir" \
        -ldflags "-X helm.sh/helm/v4/internal/version.version=$HELM_VERSION" \
        "helm.sh/helm/v4/cmd/helm@$HELM_VERSION"
}

build_crictl() {
    local dir
    dir=$(crictl_dir)
    cached crictl "$dir" go_install "$dir" \
        -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
        "sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
}

build_containerd() {
    local dir
    dir=$(containerd_dir)
    # no_btrfs: the btrfs snapshotter needs C headers this machine lacks (overlayfs is used).
    cached containerd "$dir" go_install "$dir" -tags no_btrfs \
        -ldflags "-X github.com/containerd/containerd/v2/version.Version=$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/v2/cmd/containerd@$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$CONTAINERD_VERSION" \
        "github.com/containerd/containerd/v2/cmd/ctr@$CONTAINERD_VERSION"
}

go_build_module() { # folder output [go build flags...] -> go build of our own module
    local folder=$1 output=$2
    shift 2
    (cd "$folder" && GOFLAGS=-buildvcs=false nice -n 10 go build "$@" -o "$output" .)
}

build_kubebin() {
    local dir version
    dir=$(kubebin_dir)
    version=$(required_version k8s.io/kubernetes "$HERE/kubebin/go.mod")
    link_kubebin() {
        go_build_module "$HERE/kubebin" "$dir/bin/kubebin" \
            -ldflags "-X k8s.io/component-base/version.gitVersion=$version"
        local component
        for component in kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl; do
            ln -sf kubebin "$dir/bin/$component"
        done
    }
    cached kubebin "$dir" link_kubebin
}

build_etcd() {
    local dir
    dir=$(etcd_dir)
    cached etcd "$dir" go_build_module "$HERE/etcd" "$dir/bin/etcd"
}

install_debian() {
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        log "debian: not root on Debian; runc, CNI plugins, iptables must already be installed"
        return
    fi
    local packages=(runc containernetworking-plugins openssl iproute2 curl podman debootstrap gcc libc6-dev)
    local missing=()
    local package
    for package in "${packages[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'ok installed' || missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        log "debian: installing ${missing[*]}"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    else
        log "debian: ${packages[*]} installed"
    fi
}

print_path() {
    local dirs=()
    [ -d "$HERE/kubebin" ] && dirs+=("$(kubebin_dir)/bin")
    [ -d "$HERE/etcd" ] && dirs+=("$(etcd_dir)/bin")
    dirs+=("$(containerd_dir)/bin" "$(crictl_dir)/bin" "$(helm_dir)/bin")
    local IFS=:
    echo "${dirs[*]}"
}

if [ "${1:-}" = --print-path ]; then
    print_path
    exit 0
fi
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(debian helm crictl containerd etcd kubebin)
for tool in "${tools[@]}"; do
    case "$tool" in
        helm) build_helm ;;
        crictl) build_crictl ;;
        containerd) build_containerd ;;
        etcd) build_etcd ;;
        kubebin) build_kubebin ;;
        debian) install_debian ;;
        *) log "unknown tool '$tool' (kubebin etcd containerd crictl helm debian)"; exit 2 ;;
    esac
done
echo "PATH=$(print_path)"

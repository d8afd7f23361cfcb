#!/usr/bin/env bash
# A real single-node Kubernetes cluster on this machine, as root, for the cluster tests
# and for people:
#
#   tests/k8s/cluster.sh up [device-plugin|dra]   build or reuse the tools, start etcd,
#                                                 kube-apiserver, kube-controller-manager,
#                                                 kube-scheduler, containerd (CDI on) and a
#                                                 kubelet on runc; load the image; install
#                                                 the mode (default device-plugin)
#   tests/k8s/cluster.sh down                     stop it and remove every trace
#   tests/k8s/cluster.sh env                      the two export lines of a running cluster
#   tests/k8s/cluster.sh restart-kubelet          stop the kubelet and start it again
#
# `up` ends with two lines, `export KUBECONFIG=...` and `export PATH=...`, so that
# `eval "$(tests/k8s/cluster.sh up | tail -2)"` leaves kubectl, helm and crictl working
# against it. Progress goes to stderr, logs to $STATE/logs/<component>.log.
#
# The node ("vgpu-node") is this machine. Its GPUs are the simulated driver's four cards:
# /run/nvidia/driver holds a driver root made of Debian's 535 packages (libcuda1,
# libnvidia-ml1, nvidia-smi) with vgpu's simulated driver in the real libraries' place,
# laid out as the GPU Operator's driver container lays it, where the DaemonSets' init
# container finds it through the host's / at /host. The sim keeps the cards' state in a
# file where a real driver keeps it in the kernel; VGPU_SIM_STATE names it for processes
# that must share it (tests/k8s/test.sh).
#
# Addresses: etcd, the controller-manager, the scheduler and the kubelet's healthz listen
# on 127.0.0.1. The node has a bridge of its own, vgpuk8s0, with no route out and no NAT:
# 10.244.0.1/24 is the pod network's gateway and the kubelet's address (a kubelet refuses
# a loopback node IP), 10.96.0.1 the API server's (the `kubernetes` Service's ClusterIP,
# so pods reach it without kube-proxy).
#
# Environment: VGPU_K8S_STATE (state folder, default /var/lib/vgpu-k8s), VGPU_K8S_CACHE
# (tools, tests/k8s/build.sh), VGPU_IMAGE_REF (an image already built; default: run
# deploy/build-image.sh), VGPU_K8S_INSTALL (helm|kubectl|none: how `up` installs the
# mode; default helm when deploy/helm/vgpu-shim exists, else kubectl), VGPU_DEBIAN_DEBS
# (the 535 .debs, default target/debian-debs, downloaded with apt-get when missing).
set -euo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
STATE=${VGPU_K8S_STATE:-/var/lib/vgpu-k8s}
RUN_DIR=/run/vgpu-k8s
NODE=vgpu-node
BRIDGE=vgpuk8s0
NODE_IP=10.244.0.1
POD_CIDR=10.244.0.0/24
API_IP=10.96.0.1
SERVICE_CIDR=10.96.0.0/24
API_PORT=443
ETCD_PORT=12379
ETCD_PEER_PORT=12380
DRIVER_ROOT=/run/nvidia/driver
DRIVER_VERSION=535.261.03
CONTAINERD_SOCKET=$RUN_DIR/containerd.sock
# Folders of the node that the kubelet, the DaemonSets and the runtime use at fixed
# paths; `down` removes those that `up` created.
NODE_DIRS=(/var/lib/kubelet /var/lib/vgpu /var/run/cdi /etc/cdi /var/log/pods /var/log/containers /run/nvidia)

log() { echo "cluster: $*" >&2; }
die() {
    log "$*"
    exit 1
}

tools_path() { bash "$HERE/build.sh" --print-path; }

kubectl() { command kubectl --kubeconfig "$STATE/admin.kubeconfig" "$@"; }

# --- tools -------------------------------------------------------------------------

build_tools() {
    bash "$HERE/build.sh" >&2
    PATH=$(tools_path):$PATH
    export PATH
    local tool
    for tool in etcd kube-apiserver kubelet kubectl containerd containerd-shim-runc-v2 ctr crictl helm runc openssl; do
        command -v "$tool" >/dev/null || die "$tool is missing after tests/k8s/build.sh"
    done
    [ -x /usr/lib/cni/bridge ] || die "no CNI plugins in /usr/lib/cni (Debian's containernetworking-plugins)"
}

versions() {
    log "versions:"
    {
        echo "  etcd: $(etcd --version | head -1)"
        echo "  kube-apiserver: $(kube-apiserver --version)"
        echo "  kubelet: $(kubelet --version)"
        echo "  kubectl: $(kubectl version --client 2>/dev/null | head -1)"
        echo "  containerd: $(containerd --version)"
        echo "  runc: $(runc --version | head -1)"
        echo "  crictl: $(crictl --version)"
        echo "  helm: $(helm version --short 2>/dev/null)"
        echo "  cni: $(/usr/lib/cni/bridge --version 2>&1 | head -1)"
    } >&2
}

# --- certificates --------------------------------------------------------------------

# cert NAME SUBJECT [SAN]: a key and a certificate signed by the cluster CA.
cert() {
    local name=$1 subject=$2 san=${3:-}
    local dir=$STATE/pki
    [ -s "$dir/$name.crt" ] && return
    openssl genrsa -out "$dir/$name.key" 2048 2>/dev/null
    openssl req -new -key "$dir/$name.key" -subj "$subject" -out "$dir/$name.csr" 2>/dev/null
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        if [ -n "$san" ]; then
            echo "extendedKeyUsage=serverAuth,clientAuth"
            echo "subjectAltName=$san"
        else
            echo "extendedKeyUsage=clientAuth"
        fi
    } > "$dir/$name.ext"
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" -CAcreateserial \
        -days 30 -sha256 -extfile "$dir/$name.ext" -out "$dir/$name.crt" 2>/dev/null
    rm -f "$dir/$name.csr" "$dir/$name.ext"
}

# kubeconfig NAME: $STATE/NAME.kubeconfig with pki/NAME's certificate.
kubeconfig() {
    local name=$1
    cat > "$STATE/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: vgpu
    cluster:
      server: https://$API_IP:$API_PORT
      certificate-authority: $STATE/pki/ca.crt
users:
  - name: $name
    user:
      client-certificate: $STATE/pki/$name.crt
      client-key: $STATE/pki/$name.key
contexts:
  - name: vgpu
    context: { cluster: vgpu, user: $name }
current-context: vgpu
EOF
}

make_pki() {
    local dir=$STATE/pki
    mkdir -p "$dir"
    if [ ! -s "$dir/ca.crt" ]; then
        openssl genrsa -out "$dir/ca.key" 2048 2>/dev/null
        openssl req -x509 -new -key "$dir/ca.key" -subj "/CN=vgpu-k8s-ca" -days 30 -sha256 \
            -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
            -out "$dir/ca.crt" 2>/dev/null
    fi
    [ -s "$dir/sa.key" ] || {
        openssl genrsa -out "$dir/sa.key" 2048 2>/dev/null
        openssl rsa -in "$dir/sa.key" -pubout -out "$dir/sa.pub" 2>/dev/null
    }
    cert apiserver "/CN=kube-apiserver" \
        "IP:$API_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
    cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client"
    cert admin "/O=system:masters/CN=kubernetes-admin"
    cert controller-manager "/CN=system:kube-controller-manager"
    cert scheduler "/CN=system:kube-scheduler"
    cert kubelet "/O=system:nodes/CN=system:node:$NODE"
    cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE" "IP:$NODE_IP,IP:127.0.0.1,DNS:$NODE"
    local name
    for name in admin controller-manager scheduler kubelet; do kubeconfig "$name"; done
}

# --- processes -----------------------------------------------------------------------

# start NAME COMMAND...: runs COMMAND in the background, its own session, logging to
# logs/NAME.log; the pid goes to pids/NAME.
start() {
    local name=$1
    shift
    mkdir -p "$STATE/logs" "$STATE/pids"
    setsid "$@" >> "$STATE/logs/$name.log" 2>&1 < /dev/null &
    echo $! > "$STATE/pids/$name"
}

running() { # NAME
    local pid
    pid=$(cat "$STATE/pids/$1" 2>/dev/null) || return 1
    kill -0 "$pid" 2>/dev/null
}

stop() { # NAME: SIGTERM, then SIGKILL after 20 s
    local pid i
    pid=$(cat "$STATE/pids/$1" 2>/dev/null) || return 0
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid" 2>/dev/null || true
        for i in $(seq 1 200); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.1
        done
        kill -9 "$pid" 2>/dev/null || true
    fi
    rm -f "$STATE/pids/$1"
}

# wait_for WHAT SECONDS COMMAND...: until COMMAND succeeds.
wait_for() {
    local what=$1 seconds=$2
    shift 2
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if [ $SECONDS -ge $deadline ]; then
            log "timed out after ${seconds}s waiting for $what"
            return 1
        fi
        sleep 1
    done
}

tail_log() { # NAME: the last lines of its log, on stderr
    log "--- last lines of $STATE/logs/$1.log"
    tail -n 30 "$STATE/logs/$1.log" >&2 || true
}

# --- the node's network --------------------------------------------------------------

make_network() {
    if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
        ip link add "$BRIDGE" type bridge
    fi
    ip addr replace "$NODE_IP/24" dev "$BRIDGE"
    ip addr replace "$API_IP/32" dev "$BRIDGE"
    ip link set "$BRIDGE" up
    mkdir -p "$STATE/cni/net.d" "$STATE/cni/ipam"
    cat > "$STATE/cni/net.d/10-vgpu.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "vgpu-k8s",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "dataDir": "$STATE/cni/ipam",
        "ranges": [[{ "subnet": "$POD_CIDR", "rangeStart": "10.244.0.10", "gateway": "$NODE_IP" }]]
      }
    },
    { "type": "loopback" }
  ]
}
EOF
}

# --- the driver root -----------------------------------------------------------------

# The 535 .debs, as tests/run.sh downloads them.
debian_debs() {
    local debs=${VGPU_DEBIAN_DEBS:-$ROOT/target/debian-debs}
    if ! ls "$debs"/libcuda1_*.deb "$debs"/libnvidia-ml1_*.deb "$debs"/nvidia-smi_*.deb >/dev/null 2>&1; then
        log "downloading Debian's $DRIVER_VERSION packages into $debs"
        mkdir -p "$debs"
        local nonfree
        nonfree=$(bash "$ROOT/deploy/debian-sources.sh" nonfree)
        if [ -n "$nonfree" ] && [ ! -e /etc/apt/sources.list.d/vgpu-nonfree.sources ]; then
            printf '%s' "$nonfree" > /etc/apt/sources.list.d/vgpu-nonfree.sources
            apt-get update -qq
        fi
        (cd "$debs" && apt-get download libcuda1=$DRIVER_VERSION-1 libnvidia-ml1=$DRIVER_VERSION-1 nvidia-smi=$DRIVER_VERSION-1 >&2)
    fi
    echo "$debs"
}

# A driver root as the GPU Operator's driver container lays one out at /run/nvidia/driver:
# Debian's 535 libcuda1, libnvidia-ml1 and nvidia-smi, with the simulated driver in the
# real libraries' place (there is no GPU here), vgpu in nvidia-smi's, and a loader cache
# that names them.
make_driver_root() {
    local sim=$1 vgpu=$2 debs deb
    local root=$STATE/driver-root
    debs=$(debian_debs)
    rm -rf "$root"
    mkdir -p "$root"
    for deb in "$debs"/libcuda1_*.deb "$debs"/libnvidia-ml1_*.deb "$debs"/nvidia-smi_*.deb; do
        dpkg -x "$deb" "$root"
    done
    local lib=$root/usr/lib/x86_64-linux-gnu/nvidia/current
    [ -e "$lib/libcuda.so.$DRIVER_VERSION" ] || die "no libcuda.so.$DRIVER_VERSION in $debs"
    install -m 0755 "$sim" "$lib/libcuda.so.$DRIVER_VERSION"
    install -m 0755 "$sim" "$lib/libnvidia-ml.so.$DRIVER_VERSION"
    # Debian's nvidia-smi asks NVML for its private export table before anything else,
    # which the sim (the public NVML API only) cannot serve ("Mismatch in versions
    # between nvidia-smi and NVML"): the node's nvidia-smi is vgpu's, which runs as
    # `vgpu smi` under that name. The sim reports the driver version of its file name.
    local smi
    for smi in "$root"/usr/lib/nvidia/current/nvidia-smi "$root"/usr/bin/nvidia-smi; do
        if [ -f "$smi" ] && [ ! -L "$smi" ]; then
            install -m 0755 "$vgpu" "$smi"
        fi
    done
    mkdir -p "$root/etc"
    echo /usr/lib/x86_64-linux-gnu/nvidia/current > "$root/etc/ld.so.conf"
    ldconfig -r "$root"
    mkdir -p "$DRIVER_ROOT"
    mountpoint -q "$DRIVER_ROOT" || mount --bind "$root" "$DRIVER_ROOT"
}

# --- the image -----------------------------------------------------------------------

image_ref() {
    if [ -n "${VGPU_IMAGE_REF:-}" ]; then
        echo "$VGPU_IMAGE_REF"
        return
    fi
    CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/tests/podman-containers.conf} bash "$ROOT/deploy/build-image.sh" | tail -1
}

# The pause image: tests/k8s/pause/pause.c, static, alone in an image.
make_pause_image() {
    local work=$STATE/pause
    mkdir -p "$work/rootfs"
    cc -static -O2 -o "$work/rootfs/pause" "$HERE/pause/pause.c"
    tar -C "$work/rootfs" -cf "$work/pause.tar" pause
    CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/tests/podman-containers.conf} \
        podman import --quiet --change 'ENTRYPOINT ["/pause"]' "$work/pause.tar" localhost/vgpu-k8s/pause:1 >/dev/null
}

ctr_() { ctr --address "$CONTAINERD_SOCKET" --namespace k8s.io "$@"; }

# load REF NAME...: podman's image REF into containerd, tagged NAME... too.
load_image() {
    local ref=$1
    shift
    local archive=$STATE/images/$(echo "$ref" | tr '/:' '__').tar
    mkdir -p "$STATE/images"
    rm -f "$archive"
    CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/tests/podman-containers.conf} \
        podman save --format docker-archive -o "$archive" "$ref" >/dev/null
    ctr_ images import --no-unpack "$archive" >/dev/null
    ctr_ images import "$archive" >/dev/null
    rm -f "$archive"
    local name
    for name in "$@"; do
        ctr_ images tag --force "$ref" "$name" >/dev/null
    done
}

# --- the components ------------------------------------------------------------------

start_etcd() {
    running etcd && return
    start etcd etcd --name vgpu-k8s --data-dir "$STATE/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "vgpu-k8s=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
        --quota-backend-bytes 1073741824
    wait_for etcd 60 curl -sf "http://127.0.0.1:$ETCD_PORT/health" || { tail_log etcd; return 1; }
}

start_apiserver() {
    running kube-apiserver && return
    local pki=$STATE/pki
    start kube-apiserver kube-apiserver \
        --bind-address "$API_IP" --secure-port "$API_PORT" --advertise-address "$API_IP" \
        --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
        --service-cluster-ip-range "$SERVICE_CIDR" \
        --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
        --client-ca-file "$pki/ca.crt" \
        --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
        --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
        --kubelet-certificate-authority "$pki/ca.crt" \
        --kubelet-preferred-address-types InternalIP \
        --service-account-issuer https://kubernetes.default.svc.cluster.local \
        --service-account-key-file "$pki/sa.pub" --service-account-signing-key-file "$pki/sa.key" \
        --allow-privileged=true --profiling=false --endpoint-reconciler-type none
    wait_for kube-apiserver 180 kubectl get --raw /readyz || { tail_log kube-apiserver; return 1; }
}

start_controller_manager() {
    running kube-controller-manager && return
    start kube-controller-manager kube-controller-manager \
        --kubeconfig "$STATE/controller-manager.kubeconfig" \
        --authentication-kubeconfig "$STATE/controller-manager.kubeconfig" \
        --authorization-kubeconfig "$STATE/controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --leader-elect=false --use-service-account-credentials \
        --service-account-private-key-file "$STATE/pki/sa.key" --root-ca-file "$STATE/pki/ca.crt" \
        --cluster-signing-cert-file "$STATE/pki/ca.crt" --cluster-signing-key-file "$STATE/pki/ca.key" \
        --controllers '*,-node-ipam-controller'
}

start_scheduler() {
    running kube-scheduler && return
    start kube-scheduler kube-scheduler \
        --kubeconfig "$STATE/scheduler.kubeconfig" \
        --authentication-kubeconfig "$STATE/scheduler.kubeconfig" \
        --authorization-kubeconfig "$STATE/scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --leader-elect=false
}

start_containerd() {
    running containerd && return
    mkdir -p "$RUN_DIR" "$STATE/containerd"
    cat > "$STATE/containerd.toml" <<EOF
version = 3
root = "$STATE/containerd/root"
state = "$RUN_DIR/containerd"

[grpc]
  address = "$CONTAINERD_SOCKET"

[ttrpc]
  address = "$CONTAINERD_SOCKET.ttrpc"

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "localhost/vgpu-k8s/pause:1"

[plugins.'io.containerd.cri.v1.runtime']
  # This machine's root lacks CAP_SYS_RESOURCE: no process may lower its
  # oom_score_adj, which runc does for the kubelet's sandboxes (-998) and critical pods.
  restrict_oom_score_adj = true
  enable_cdi = true
  cdi_spec_dirs = ["/etc/cdi", "/var/run/cdi"]
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "$(command -v runc)"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$STATE/cni/net.d"
EOF
    start containerd containerd --config "$STATE/containerd.toml"
    wait_for containerd 60 crictl --runtime-endpoint "unix://$CONTAINERD_SOCKET" info || { tail_log containerd; return 1; }
}

start_kubelet() {
    running kubelet && return
    mkdir -p /var/lib/kubelet "$STATE/kubelet"
    cat > "$STATE/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This machine has cgroup v1 (a hybrid hierarchy) and no systemd.
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$CONTAINERD_SOCKET
address: $NODE_IP
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
authentication:
  anonymous: { enabled: false }
  webhook: { enabled: true }
  x509: { clientCAFile: $STATE/pki/ca.crt }
authorization:
  mode: Webhook
tlsCertFile: $STATE/pki/kubelet-serving.crt
tlsPrivateKeyFile: $STATE/pki/kubelet-serving.key
failSwapOn: false
resolvConf: /etc/resolv.conf
clusterDomain: cluster.local
# A shared development machine: the disk is what it is.
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
    start kubelet kubelet --config "$STATE/kubelet/config.yaml" \
        --kubeconfig "$STATE/kubelet.kubeconfig" --hostname-override "$NODE" --node-ip "$NODE_IP" \
        --root-dir /var/lib/kubelet --v 2
}

node_ready() {
    kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' | grep -qx True
}

# --- install -------------------------------------------------------------------------

install_mode() {
    local mode=$1 how=${VGPU_K8S_INSTALL:-}
    if [ -z "$how" ]; then
        if [ -d "$ROOT/deploy/helm/vgpu-shim" ]; then how=helm; else how=kubectl; fi
    fi
    [ "$how" = none ] && return
    case "$mode" in
        device-plugin) kubectl label node "$NODE" nvidia-device-enable=enable --overwrite >&2 ;;
        dra) kubectl label node "$NODE" vgpu-shim.io/mode=dra --overwrite >&2 ;;
    esac
    case "$how" in
        helm)
            [ -e "$ROOT/deploy/namespace.yaml" ] && kubectl apply -f "$ROOT/deploy/namespace.yaml" >&2
            helm --kubeconfig "$STATE/admin.kubeconfig" upgrade --install vgpu-shim "$ROOT/deploy/helm/vgpu-shim" \
                --namespace vgpu-system --create-namespace --set mode="$mode" >&2
            ;;
        kubectl)
            local files=()
            [ -e "$ROOT/deploy/namespace.yaml" ] && files+=(-f "$ROOT/deploy/namespace.yaml")
            case "$mode" in
                device-plugin) files+=(-f "$ROOT/deploy/vgpu-plugin.yaml") ;;
                dra) files+=(-f "$ROOT/deploy/dra/device-class.yaml" -f "$ROOT/deploy/dra/vgpu-dra-plugin.yaml") ;;
            esac
            kubectl apply "${files[@]}" >&2
            ;;
        *) die "VGPU_K8S_INSTALL=$how: helm, kubectl or none" ;;
    esac
    local daemonset=vgpu-plugin
    [ "$mode" = dra ] && daemonset=vgpu-dra-plugin
    sim_patch "$daemonset"
    kubectl -n vgpu-system rollout status "daemonset/$daemonset" --timeout 5m >&2
}

# What a node with the simulated driver needs beyond a GPU node, applied to the installed
# DaemonSet (vgpu-plugin or vgpu-dra-plugin): VGPU_SIM_STATE in the daemon. The sim keeps
# the cards' shared state in a file (a real driver keeps it in the kernel);
# /var/lib/vgpu is already the daemon's host folder. (The init container needs no
# --allow-missing-exports: vgpu-ldconfig judges each shim on its own API's names, and the
# sim, one library in both real libraries' place, exports both.)
SIM_STATE=/var/lib/vgpu/sim/state
sim_patch() { # DAEMONSET
    local daemonset=$1
    kubectl -n vgpu-system set env "daemonset/$daemonset" -c "$daemonset" "VGPU_SIM_STATE=$SIM_STATE" >&2
}

print_env() {
    echo "export KUBECONFIG=$STATE/admin.kubeconfig"
    echo "export PATH=$(tools_path):\$PATH"
}

# --- up and down ---------------------------------------------------------------------

up() {
    local mode=${1:-device-plugin}
    case "$mode" in device-plugin | dra) ;; *) die "mode: device-plugin or dra, not '$mode'" ;; esac
    [ "$(id -u)" = 0 ] || die "needs root"
    local start_time=$SECONDS
    mkdir -p "$STATE"
    # The node folders this run creates, for `down`.
    local dir
    for dir in "${NODE_DIRS[@]}"; do
        if [ ! -e "$dir" ]; then
            mkdir -p "$dir"
            grep -qxF "$dir" "$STATE/created" 2>/dev/null || echo "$dir" >> "$STATE/created"
        fi
    done
    # The DaemonSets mount the host's / with HostToContainer propagation, which the
    # runtime allows only from a shared or slave mount: systemd makes / shared on every
    # node; this machine has no systemd and a private /. `down` puts it back.
    if [ "$(findmnt -n -o PROPAGATION /)" = private ]; then
        mount --make-rshared /
        touch "$STATE/root-was-private"
    fi
    build_tools
    versions
    local ref
    ref=$(image_ref) || die "no image (deploy/build-image.sh failed)"
    log "image: $ref"
    # The simulated driver and vgpu (the node's nvidia-smi, below) from the image.
    local sim=$STATE/libvgpu_sim.so vgpu=$STATE/vgpu container
    container=$(CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/tests/podman-containers.conf} podman create "$ref" true)
    CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/tests/podman-containers.conf} podman cp "$container:/usr/local/vgpu/sim/lib64/libvgpu_sim.so" "$sim"
    CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/tests/podman-containers.conf} podman cp "$container:/usr/local/vgpu/bin/vgpu" "$vgpu"
    CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/tests/podman-containers.conf} podman rm "$container" >/dev/null
    make_driver_root "$sim" "$vgpu"
    make_pki
    make_network
    make_pause_image
    start_etcd
    start_apiserver
    start_controller_manager
    start_scheduler
    start_containerd
    load_image localhost/vgpu-k8s/pause:1
    # The manifests name vgpu-shim/vgpu-plugin:<version>; the seed's example pod names
    # nvidia/cuda, which no registry serves here: the image stands in for it (its
    # nvidia-smi is the driver's, which the plugin mounts).
    local version=${ref##*:}
    load_image "$ref" "docker.io/vgpu-shim/vgpu-plugin:$version" docker.io/nvidia/cuda:12.4.1-base-ubuntu22.04
    start_kubelet
    wait_for "node $NODE Ready" 180 node_ready || { tail_log kubelet; tail_log containerd; return 1; }
    install_mode "$mode"
    log "up in $((SECONDS - start_time)) s ($mode)"
    print_env
}

# Every mount under PREFIX, deepest first.
mounts_under() {
    awk -v p="$1" '$2 == p || index($2, p "/") == 1 { print $2 }' /proc/self/mounts | sort -r
}

down() {
    [ "$(id -u)" = 0 ] || die "needs root"
    local path
    PATH=$(tools_path):$PATH
    # Pods first, while the kubelet and containerd still run: the runtime tears down
    # their network namespaces and mounts.
    if running kubelet; then stop kubelet; fi
    if running containerd; then
        crictl --runtime-endpoint "unix://$CONTAINERD_SOCKET" rmp --all --force >/dev/null 2>&1 || true
    fi
    stop containerd
    # The shims outlive containerd; they are ours when their binary is ours.
    local shim pid
    shim=$(command -v containerd-shim-runc-v2 || true)
    if [ -n "$shim" ]; then
        for pid in $(ls /proc | grep -E '^[0-9]+$'); do
            [ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$shim" ] && kill -9 "$pid" 2>/dev/null || true
        done
    fi
    local name
    for name in kube-scheduler kube-controller-manager kube-apiserver etcd; do stop "$name"; done
    # Containers' processes, if any survived their shims: the kubelet's cgroups.
    local controller
    for controller in /sys/fs/cgroup/*/; do
        [ -d "${controller}kubepods" ] || continue
        find "${controller}kubepods" -name cgroup.procs -exec cat {} + 2>/dev/null | while read -r pid; do
            kill -9 "$pid" 2>/dev/null || true
        done
    done
    sleep 1
    for path in /var/lib/kubelet "$STATE" "$RUN_DIR" "$DRIVER_ROOT" /run/netns /var/run/netns; do
        for mount in $(mounts_under "$path"); do
            case "$mount" in
                /run/netns/* | /var/run/netns/*) [[ $mount == */cni-* ]] || continue ;;
            esac
            umount -l "$mount" 2>/dev/null || true
        done
    done
    rm -f /run/netns/cni-* 2>/dev/null || true
    # The kubelet's and the runtime's cgroups, deepest first.
    for controller in /sys/fs/cgroup/*/; do
        [ -d "${controller}kubepods" ] || continue
        find "${controller}kubepods" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    done
    if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE"; fi
    # The node folders `up` created; the driver root's mount point.
    if [ -f "$STATE/created" ]; then
        while read -r path; do
            [ -n "$path" ] && rm -rf --one-file-system "$path"
        done < "$STATE/created"
    fi
    rm -rf "$RUN_DIR"
    [ -e "$STATE/root-was-private" ] && mount --make-rprivate /
    rm -rf --one-file-system "$STATE"
    CONTAINERS_CONF=${CONTAINERS_CONF:-$ROOT/tests/podman-containers.conf} podman rmi localhost/vgpu-k8s/pause:1 >/dev/null 2>&1 || true
    log "down: nothing left"
}

# Sourced (by a test that wants its functions), it only defines them.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    case "${1:-}" in
        up) up "${2:-device-plugin}" ;;
        down) down ;;
        env) print_env ;;
        restart-kubelet)
            PATH=$(tools_path):$PATH
            stop kubelet
            start_kubelet
            wait_for "node $NODE Ready" 120 node_ready
            ;;
        versions)
            PATH=$(tools_path):$PATH
            versions
            ;;
        sim-patch)
            PATH=$(tools_path):$PATH
            sim_patch "${2:?sim-patch DAEMONSET}"
            ;;
        *) die "usage: $0 up [device-plugin|dra] | down | env | restart-kubelet | versions" ;;
    esac
fi

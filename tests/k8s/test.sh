#!/usr/bin/env bash
# The real-cluster tests: the seed's deploy and verify steps on a real single-node
# cluster (tests/k8s/cluster.sh), in both modes.
#
#   tests/k8s/test.sh [all|device-plugin|dra]      (default all)
#
# `all` brings a cluster up once and runs, in order: the device plugin installed with
# Helm (when deploy/helm/vgpu-shim exists), the device plugin installed with
# `kubectl apply -f deploy/vgpu-plugin.yaml`, then DRA on the same cluster with no device
# plugin left on the node; it takes the cluster down at the end (VGPU_K8S_KEEP=1 leaves
# it running). Each check prints `ok NAME` or `FAILED NAME` with what it saw; the last
# line is `N passed, N failed`, and the exit status is non-zero when any failed.
#
# The node's GPUs are the simulated driver's four cards (tests/k8s/cluster.sh says how
# they get there): every figure below is the sim's, not a GPU's. The sim keeps the
# cards' shared state in a file where a real driver keeps it in the kernel, so the pods
# that must share a card's timeline (the compute check) mount that file and name it in
# VGPU_SIM_STATE, and so does the plugin for that check.
set -uo pipefail
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
MODE=${1:-all}
NODE=vgpu-node
NS=vgpu-system
CARDS=4
# The sim's default card: 143771 MiB, so 561 units of 256 MiB.
CARD_UNITS=$((143771 / 256))
IMAGE=vgpu-shim/vgpu-plugin:$(awk '/^\[/ { s = $0 } s == "[workspace.package]" && $1 == "version" { gsub(/[" ]/, "", $3); print $3; exit }' "$ROOT/Cargo.toml")
WORK=$(mktemp -d /tmp/vgpu-k8s-test.XXXXXX)
PASSED=0
FAILED=0
FAILURES=()

say() { echo "k8s-test: $*"; }

# check NAME FUNCTION [ARGS...]: runs FUNCTION, which prints what it saw and returns
# non-zero on failure.
check() {
    local name=$1
    shift
    local out start=$SECONDS
    # errexit inside: a check stops at its first failing step.
    out=$(set -e; "$@" 2>&1)
    local rc=$?
    if [ $rc = 0 ]; then
        PASSED=$((PASSED + 1))
        echo "ok $name ($((SECONDS - start)) s)${out:+: $(echo "$out" | tail -1)}"
    else
        FAILED=$((FAILED + 1))
        FAILURES+=("$name")
        echo "FAILED $name ($((SECONDS - start)) s)"
        echo "$out" | tail -40 | sed 's/^/    /'
    fi
    return 0
}

# known NAME WHY FUNCTION [ARGS...]: a check that fails today because of a product bug
# or a limit of the simulated driver named in WHY. It still runs: a failure is counted
# as skipped and says WHY; a pass is a failure ("fixed: take it off the known list").
KNOWN=0
known() {
    local name=$1 why=$2
    shift 2
    local out start=$SECONDS
    out=$(set -e; "$@" 2>&1)
    if [ $? = 0 ]; then
        FAILED=$((FAILED + 1))
        FAILURES+=("$name")
        echo "FAILED $name: it passes now; take it off the known list ($why)"
    else
        KNOWN=$((KNOWN + 1))
        echo "known-failing $name ($((SECONDS - start)) s): $why"
        echo "$out" | tail -8 | sed 's/^/    /'
    fi
    return 0
}

fail() {
    echo "$*"
    return 1
}

# wait_until SECONDS COMMAND...: polls COMMAND every second.
wait_until() {
    local deadline=$((SECONDS + $1))
    shift
    until "$@" >/dev/null 2>&1; do
        [ $SECONDS -lt $deadline ] || return 1
        sleep 1
    done
}

phase() { kubectl get pod "$1" -o jsonpath='{.status.phase}' 2>/dev/null; }
phase_is() { [ "$(phase "$1")" = "$2" ]; }

# pod_done NAME: Succeeded or Failed.
pod_done() { case "$(phase "$1")" in Succeeded | Failed) return 0 ;; *) return 1 ;; esac; }

# The card a device-plugin pod's container was given: its config's card UUID.
card_of() { kubectl exec "$1" -- sh -c 'cat /etc/vgpu/vgpu.yaml' 2>/dev/null | awk '/uuid/ { gsub(/[",]/, "", $NF); print $NF; exit }'; }

describe_pod() {
    kubectl describe pod "$1" 2>&1 | tail -25
}

# A device-plugin pod: pod NAME CORES MEMORY_UNITS COMMAND...
dp_pod() {
    local name=$1 cores=$2 memory=$3
    shift 3
    local command
    command=$(printf '"%s",' "$@")
    kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $name
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: cuda
      image: $IMAGE
      command: [${command%,}]
      resources:
        limits:
          tencent.com/vcuda-core: $cores
          tencent.com/vcuda-memory: $memory
EOF
}

# --- the cluster ---------------------------------------------------------------------

cluster_up() {
    local out
    out=$(VGPU_K8S_INSTALL=none bash "$HERE/cluster.sh" up device-plugin) || return 1
    eval "$(echo "$out" | tail -2)"
    export KUBECONFIG PATH
    kubectl version
    kubectl get node "$NODE" -o wide
}

# --- device-plugin mode ----------------------------------------------------------------

dp_label() {
    kubectl label node "$NODE" nvidia-device-enable=enable --overwrite
}

dp_install() { # helm|kubectl
    case "$1" in
        helm)
            [ -e "$ROOT/deploy/namespace.yaml" ] && { kubectl apply -f "$ROOT/deploy/namespace.yaml" || return 1; }
            helm install vgpu-shim "$ROOT/deploy/helm/vgpu-shim" --namespace "$NS" --create-namespace \
                --set mode=device-plugin || return 1
            ;;
        kubectl)
            local files=()
            [ -e "$ROOT/deploy/namespace.yaml" ] && files+=(-f "$ROOT/deploy/namespace.yaml")
            kubectl apply "${files[@]}" -f "$ROOT/deploy/vgpu-plugin.yaml" || return 1
            ;;
    esac
    # The simulated driver's need (cluster.sh says why).
    bash "$HERE/cluster.sh" sim-patch vgpu-plugin || return 1
    kubectl -n "$NS" rollout status daemonset/vgpu-plugin --timeout 300s || {
        kubectl -n "$NS" describe pods -l app=vgpu-plugin | tail -30
        kubectl -n "$NS" logs -l app=vgpu-plugin --all-containers --tail 30
        return 1
    }
}

# `helm upgrade` with a changed plugin config (policy: spread): the DaemonSet rolls
# (its pods carry the config's checksum), the new config is the plugin's, and the
# release's history has the new revision.
dp_helm_upgrade() {
    local before after
    before=$(kubectl -n "$NS" get pods -l app=vgpu-plugin -o jsonpath='{.items[0].metadata.name}')
    helm upgrade vgpu-shim "$ROOT/deploy/helm/vgpu-shim" --namespace "$NS" --reuse-values \
        --set devicePlugin.config.policy=spread || return 1
    bash "$HERE/cluster.sh" sim-patch vgpu-plugin || return 1
    kubectl -n "$NS" rollout status daemonset/vgpu-plugin --timeout 300s || return 1
    after=$(kubectl -n "$NS" get pods -l app=vgpu-plugin -o jsonpath='{.items[0].metadata.name}')
    [ "$before" != "$after" ] || fail "the plugin's pod did not roll ($before)"
    kubectl -n "$NS" get configmap -o yaml | grep -q 'policy: spread' || fail "the config map does not say policy: spread"
    helm history vgpu-shim --namespace "$NS" | tail -2
    [ "$(helm status vgpu-shim --namespace "$NS" -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["version"])')" -ge 2 ] \
        || fail "no second revision"
    wait_until 120 allocatable_is vcuda-core $((CARDS * 100)) || fail "vcuda-core allocatable: $(allocatable vcuda-core)"
    echo "upgraded: $before -> $after, policy spread"
}

dp_uninstall() { # helm|kubectl
    case "$1" in
        helm) helm uninstall vgpu-shim --namespace "$NS" --wait --timeout 2m || return 1 ;;
        kubectl) kubectl delete -f "$ROOT/deploy/vgpu-plugin.yaml" --wait --timeout 120s || return 1 ;;
    esac
    wait_until 120 sh -c "! kubectl -n $NS get pods -l app=vgpu-plugin -o name | grep -q ."
}

capacity() { kubectl get node "$NODE" -o jsonpath="{.status.capacity['tencent\.com/$1']}"; }
allocatable() { kubectl get node "$NODE" -o jsonpath="{.status.allocatable['tencent\.com/$1']}"; }
allocatable_is() { [ "$(allocatable "$1")" = "$2" ]; }

# `kubectl describe node | grep tencent`: 100 cores per card, memory in 256 MiB units.
dp_describe_node() {
    wait_until 120 allocatable_is vcuda-core $((CARDS * 100))
    wait_until 30 allocatable_is vcuda-memory $((CARDS * CARD_UNITS))
    local text
    text=$(kubectl describe node "$NODE" | grep tencent.com/)
    echo "$text"
    echo "$text" | grep -Eq "tencent.com/vcuda-core: +$((CARDS * 100))$" || fail "vcuda-core is not $CARDS x 100"
    echo "$text" | grep -Eq "tencent.com/vcuda-memory: +$((CARDS * CARD_UNITS))$" || fail "vcuda-memory is not $CARDS x $CARD_UNITS (143771 MiB / 256 MiB)"
}

# The seed's example pod, deploy/example-pod.yaml as it is: nvidia-smi in it shows 2560 MiB.
dp_example_pod() {
    kubectl apply -f "$ROOT/deploy/example-pod.yaml" || return 1
    wait_until 180 pod_done vcuda-example || { describe_pod vcuda-example; fail "vcuda-example did not finish"; }
    local logs
    logs=$(kubectl logs vcuda-example)
    echo "$logs"
    phase_is vcuda-example Succeeded || { describe_pod vcuda-example; fail "vcuda-example: $(phase vcuda-example)"; }
    echo "$logs" | grep -q '2560MiB' || fail "nvidia-smi does not show 2560MiB"
    kubectl delete pod vcuda-example --wait --timeout 60s >/dev/null
    echo "nvidia-smi: $(echo "$logs" | grep -o '[0-9]*MiB / *[0-9]*MiB' | head -1)"
}

# The example pod's quota (30 cores, 10 x 256 MiB, ceiling annotation 50) through the
# shims: `vgpu probe` sees 2560 MiB, and an allocation past it gets CUDA_ERROR_OUT_OF_MEMORY.
dp_example_quota() {
    kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: quota
  annotations:
    tencent.com/vcuda-core-limit: "50"
spec:
  restartPolicy: Never
  containers:
    - name: cuda
      image: $IMAGE
      command: ["vgpu", "probe", "--json", "--alloc", "1GiB", "--alloc", "2GiB"]
      resources:
        requests: { tencent.com/vcuda-core: 30, tencent.com/vcuda-memory: 10 }
        limits: { tencent.com/vcuda-core: 30, tencent.com/vcuda-memory: 10 }
EOF
    wait_until 180 pod_done quota || { describe_pod quota; fail "quota did not finish"; }
    local json
    json=$(kubectl logs quota)
    echo "$json"
    kubectl delete pod quota --wait --timeout 60s >/dev/null
    python3 - "$json" <<'PY'
import json, sys
report = json.loads(sys.argv[1].strip().splitlines()[-1])
mib = 1 << 20
total = report["devices"][0]["total_mem"]
assert report["device_count"] == 1, f"{report['device_count']} devices, not one card"
assert total == 2560 * mib, f"total_mem {total / mib} MiB, not 2560"
assert report["mem_get_info"][1] == 2560 * mib, f"cuMemGetInfo total {report['mem_get_info']}"
results = [a["result"] for a in report["allocations"]]
assert results[0] == "CUDA_SUCCESS", results
assert results[1] == "CUDA_ERROR_OUT_OF_MEMORY", results
print(f"2560 MiB seen; 1 GiB: {results[0]}, 2 GiB more: {results[1]}")
PY
}

# A pod no card can hold is refused with a reason or stays Pending, never runs.
dp_impossible_pods() {
    # More cores than the node has: the scheduler keeps it Pending and says why.
    dp_pod toobig 500 1 sleep 1 >/dev/null || return 1
    # Fewer memory units than the node has, more than any one card: the scheduler sees
    # the node's total; the kubelet's Allocate must refuse it, saying why.
    dp_pod toowide 10 $((CARD_UNITS + 1)) sleep 1 >/dev/null || return 1
    wait_until 60 sh -c "kubectl get events --field-selector involvedObject.name=toobig -o jsonpath='{.items[*].message}' | grep -q 'Insufficient tencent.com/vcuda-core'" \
        || { describe_pod toobig; fail "toobig: no 'Insufficient tencent.com/vcuda-core' event"; }
    wait_until 90 sh -c "[ \"\$(kubectl get pod toowide -o jsonpath='{.status.phase}')\" = Failed ] || kubectl get events --field-selector involvedObject.name=toowide -o jsonpath='{.items[*].message}' | grep -q Insufficient" \
        || true
    local toobig toowide reason
    toobig=$(phase toobig)
    toowide=$(phase toowide)
    reason=$(kubectl get pod toowide -o jsonpath='{.status.reason}: {.status.message}' | cut -c1-300)
    echo "toobig: $toobig; toowide: $toowide ($reason)"
    [ "$toobig" = Pending ] || fail "toobig is $toobig"
    case "$toowide" in
        Pending) ;;
        Failed) echo "$reason" | grep -qi 'card\|memory\|vcuda' || fail "toowide refused without a reason: $reason" ;;
        *) describe_pod toowide; fail "toowide is $toowide: admitted" ;;
    esac
    kubectl delete pod toobig toowide --wait --timeout 60s >/dev/null
}

# A container of memory alone is refused when the kubelet admits it, saying why (the pod
# fails with UnexpectedAdmissionError); it never runs into CreateContainerError.
dp_memory_alone_refused() {
    kubectl apply -f - >/dev/null <<EOF || return 1
apiVersion: v1
kind: Pod
metadata:
  name: memonly
spec:
  restartPolicy: Never
  containers:
    - name: cuda
      image: $IMAGE
      command: [sleep, infinity]
      resources:
        limits: { tencent.com/vcuda-memory: 4 }
EOF
    wait_until 120 phase_is memonly Failed || {
        describe_pod memonly
        kubectl delete pod memonly --wait=false >/dev/null 2>&1
        fail "memonly is $(phase memonly), not refused at admission"
    }
    local reason message
    reason=$(kubectl get pod memonly -o jsonpath='{.status.reason}')
    message=$(kubectl get pod memonly -o jsonpath='{.status.message}')
    kubectl delete pod memonly --wait --timeout 60s >/dev/null
    echo "$reason: $message"
    [ "$reason" = UnexpectedAdmissionError ] || fail "reason $reason"
    echo "$message" | grep -q 'memory alone is not supported' || fail "the message does not say why"
}

# The refusal of a pod that asks for more memory than one card has names a few device
# IDs, not all 562 (the kubelet copies it into the pod's status).
dp_refusal_is_short() {
    dp_pod wide 10 $((CARD_UNITS + 1)) sleep 1 >/dev/null || return 1
    wait_until 120 phase_is wide Failed || {
        describe_pod wide
        kubectl delete pod wide --wait=false >/dev/null 2>&1
        fail "wide is $(phase wide)"
    }
    local message
    message=$(kubectl get pod wide -o jsonpath='{.status.message}')
    kubectl delete pod wide --wait --timeout 60s >/dev/null
    echo "${#message} characters: $message"
    [ ${#message} -lt 700 ] || fail "the message is ${#message} characters long"
    echo "$message" | grep -q 'more' || fail "the message lists every ID"
}

# Issue 27: a container refused memory past its quota gets a GPUMemoryQuotaRefused Event
# (events.k8s.io/v1, from the plugin), seen by `kubectl get events` and
# `kubectl describe pod`.
dp_quota_refusal_event() {
    dp_pod refused 30 10 sh -c 'vgpu probe --json --alloc 2GiB --alloc 1GiB; sleep infinity' >/dev/null || return 1
    wait_until 180 phase_is refused Running || { describe_pod refused; fail "refused: $(phase refused)"; }
    wait_until 120 sh -c "kubectl get events --field-selector involvedObject.name=refused,reason=GPUMemoryQuotaRefused -o name | grep -q ." || {
        kubectl logs refused | tail -3
        kubectl get events --field-selector involvedObject.name=refused
        kubectl delete pod refused --wait=false >/dev/null 2>&1
        fail "no GPUMemoryQuotaRefused Event"
    }
    local described
    described=$(kubectl describe pod refused)
    kubectl delete pod refused --wait --timeout 60s >/dev/null
    echo "$described" | grep GPUMemoryQuotaRefused || fail "kubectl describe pod does not show the Event"
}

# holder_pod NAME CORES [MEMORY]: one container per card, each with CORES cores and
# MEMORY units (none when not given).
holder_pod() {
    local containers="" i limits="tencent.com/vcuda-core: $2"
    [ -z "${3:-}" ] || limits+=", tencent.com/vcuda-memory: $3"
    for i in $(seq 1 $CARDS); do
        containers+="
    - name: c$i
      image: $IMAGE
      command: [sleep, infinity]
      resources:
        limits: { $limits }"
    done
    kubectl apply -f - <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $1
spec:
  terminationGracePeriodSeconds: 1
  containers:$containers
EOF
}

# Every card's cores taken (one whole card's cores per container, no memory), a pod that
# needs any stays Pending; delete the holder and it runs at once: the scheduler's count
# and the plugin's own are both freed (the plugin releases a deleted pod's devices when
# kubelet offers them again, not at its garbage collection).
dp_delete_frees() {
    holder_pod holder 100 >/dev/null || return 1
    wait_until 180 phase_is holder Running || {
        describe_pod holder
        kubectl delete pod holder --wait=false >/dev/null 2>&1
        fail "holder is $(phase holder)"
    }
    dp_pod next 10 4 sleep infinity >/dev/null || return 1
    # The scheduler says why it waits.
    wait_until 120 sh -c "kubectl get events --field-selector involvedObject.name=next -o jsonpath='{.items[*].message}' | grep -q 'Insufficient tencent.com/vcuda-core'" || true
    [ "$(phase next)" = Pending ] || {
        describe_pod next
        kubectl delete pod holder next --wait=false >/dev/null 2>&1
        fail "next is $(phase next) while every card's cores are held"
    }
    kubectl delete pod holder --wait --timeout 60s >/dev/null || return 1
    wait_until 120 phase_is next Running || { describe_pod next; fail "next is $(phase next) after holder is gone"; }
    echo "next ran once holder was deleted (card $(card_of next))"
    kubectl delete pod next --wait --timeout 60s >/dev/null
}

# A pod of one container per card, each with 10 cores and a whole card's memory, fits
# the node; the plugin places each container's cores where its memory can follow.
dp_containers_with_cores_and_a_cards_memory() {
    holder_pod cardfuls 10 "$CARD_UNITS" >/dev/null || return 1
    wait_until 120 phase_is cardfuls Running || {
        kubectl get events --field-selector involvedObject.name=cardfuls -o jsonpath='{range .items[*]}{.message}{"\n"}{end}' | grep -i precondition | tail -2 | cut -c1-400
        kubectl delete pod cardfuls --wait=false >/dev/null 2>&1
        fail "cardfuls is $(phase cardfuls)"
    }
    kubectl delete pod cardfuls --wait --timeout 60s >/dev/null
}

# Two pods on one card: binpack puts 30 and 60 cores on one card; a third of 20 must go
# elsewhere (90 + 20 > 100). Leaves q30 and p60 running for the restart checks.
dp_two_pods_one_card() {
    dp_pod q30 30 8 sleep infinity >/dev/null || return 1
    wait_until 120 phase_is q30 Running || { describe_pod q30; fail "q30: $(phase q30)"; }
    dp_pod p60 60 8 sleep infinity >/dev/null || return 1
    wait_until 120 phase_is p60 Running || { describe_pod p60; fail "p60: $(phase p60)"; }
    local a b
    a=$(card_of q30)
    b=$(card_of p60)
    echo "q30 on $a, p60 on $b"
    [ -n "$a" ] && [ "$a" = "$b" ] || fail "q30 and p60 are not on one card"
    echo "$a" > "$WORK/shared-card"
}

# The device IDs kubelet's checkpoint records for pod UID $1 (one per line, sorted).
checkpoint_ids() {
    python3 - "$1" /var/lib/kubelet/device-plugins/kubelet_internal_checkpoint <<'PY'
import json, sys
uid, path = sys.argv[1], sys.argv[2]
entries = json.load(open(path))["Data"]["PodDeviceEntries"] or []
ids = {i for e in entries if e["PodUID"] == uid for v in e["DeviceIDs"].values() for i in v}
for i in sorted(ids):
    print(i)
PY
}

# Issue 29: kubelet v1.37 rejects a pod when one of its Allocate calls fails after the
# calls before it succeeded; its checkpoint keeps those IDs until its next admission or
# PodResources List (UpdateAllocatedDevices) frees them, without a word to the plugin,
# and binpack hands them to the next pod. The plugin must release every record of the
# rejected pod, of both resources, before it picks or books for the next pod: the next
# pod, a whole card here, runs on that card unthrottled, and no record of the rejected
# pod is left (the old plugin kept its memory half booked under the whole card).
dp_rejected_pods_ids_are_the_next_pods() {
    kubectl apply -f - >/dev/null <<EOF || return 1
apiVersion: v1
kind: Pod
metadata:
  name: rejected
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
    - name: first
      image: $IMAGE
      command: [sleep, infinity]
      resources:
        limits: { tencent.com/vcuda-core: 10, tencent.com/vcuda-memory: 4 }
    - name: second
      image: $IMAGE
      command: [sleep, infinity]
      resources:
        limits: { tencent.com/vcuda-core: 10, tencent.com/vcuda-memory: $((CARD_UNITS + 1)) }
EOF
    wait_until 120 phase_is rejected Failed || { describe_pod rejected; fail "rejected is $(phase rejected)"; }
    local uid held
    uid=$(kubectl get pod rejected -o jsonpath='{.metadata.uid}')
    checkpoint_ids "$uid" > "$WORK/rejected-ids"
    held=$(wc -l < "$WORK/rejected-ids")
    echo "rejected: $(kubectl get pod rejected -o jsonpath='{.status.reason}'); kubelet's checkpoint still holds $held of its IDs"
    [ "$held" -ge 14 ] || fail "kubelet holds $held IDs of the rejected pod, not its first container's 10 cores and 4 memory units"
    dp_pod after-rejected 100 0 sleep infinity >/dev/null || return 1
    wait_until 120 phase_is after-rejected Running || { describe_pod after-rejected; fail "after-rejected is $(phase after-rejected)"; }
    local config reused left
    config=$(kubectl exec after-rejected -- cat /etc/vgpu/vgpu.yaml)
    checkpoint_ids "$(kubectl get pod after-rejected -o jsonpath='{.metadata.uid}')" > "$WORK/after-ids"
    reused=$(comm -12 "$WORK/rejected-ids" "$WORK/after-ids" | wc -l)
    left=$(checkpoint_ids "$uid" | wc -l)
    echo "after-rejected's config: $(echo "$config" | grep -E 'uuid|_limit' | tr -s ' \n' ' ')"
    echo "after-rejected (a whole card) got $reused of the rejected pod's IDs; kubelet holds $left for the rejected pod now"
    [ "$reused" -gt 0 ] || fail "after-rejected got none of the rejected pod's IDs: not the case under test"
    echo "$config" | grep -q 'uuid: GPU-' || fail "after-rejected runs with its GPU hidden"
    ! echo "$config" | grep -q '_limit:' || fail "after-rejected's whole card is limited"
    ! grep -q '"pod": *"rejected"' /var/lib/vgpu/plugin-state.json || {
        grep -o '"pod": *"rejected"[^}]*' /var/lib/vgpu/plugin-state.json | head -3
        fail "the plugin still books the rejected pod"
    }
    kubectl delete pod rejected after-rejected --wait --timeout 60s >/dev/null
}

# After a restart (of the kubelet or of the plugin), nothing is lost: the capacity is
# back, q30 and p60 still run, and a new pod of 20 cores is not put on their card (10
# cores are left there). The kubelet walks the new pod's limits, a Go map, in random
# order: whichever resource comes first, both land on one card.
nothing_lost() { # NAME [NOTE]
    local name=$1 note=${2:-}
    wait_until 120 allocatable_is vcuda-core $((CARDS * 100)) || fail "vcuda-core allocatable: $(allocatable vcuda-core)"
    phase_is q30 Running || fail "q30: $(phase q30)"
    phase_is p60 Running || fail "p60: $(phase p60)"
    dp_pod "$name" 20 4 sleep infinity >/dev/null || return 1
    wait_until 120 phase_is "$name" Running || { describe_pod "$name"; fail "$name: $(phase "$name")"; }
    local shared card
    shared=$(cat "$WORK/shared-card" 2>/dev/null || cat /tmp/shared-card)
    card=$(card_of "$name")
    echo "$name on $card; q30 and p60 on $shared$note"
    [ -n "$card" ] && [ "$card" != "$shared" ] || fail "$name was put on the card q30 and p60 fill (double-booked)"
    kubectl delete pod "$name" --wait --timeout 60s >/dev/null
}

# A kubelet metric's value (the first series whose line has all of PATTERNS), 0 if none.
kubelet_metric() { # NAME PATTERN...
    local name=$1
    shift
    kubectl get --raw "/api/v1/nodes/$NODE/proxy/metrics" 2>/dev/null | awk -v name="$name" -v patterns="$*" '
        BEGIN { n = split(patterns, want, " ") }
        index($1, name "{") == 1 { ok = 1; for (i = 1; i <= n; i++) if (!index($0, want[i])) ok = 0; if (ok) { print $2; found = 1; exit } }
        END { if (!found) print 0 }'
}

# The node's Ready heartbeat: a kubelet posts it with each node status.
heartbeat() { kubectl get node "$NODE" -o jsonpath='{.status.conditions[?(@.type=="Ready")].lastHeartbeatTime}'; }

# How many times the running kubelet took our Register for tencent.com/RESOURCE (its
# metrics, through the API server; a restarted kubelet counts from 0).
kubelet_registrations() { kubelet_metric kubelet_device_plugin_registration_total "\"tencent.com/$1\""; }

# The restarted kubelet can admit our pods: it took both registrations, and a node
# status it posted since its start says the whole node's cores are allocatable (a
# kubelet's allocatable counts only devices a plugin listed to it; until then the API
# still shows the old kubelet's figure, and a pod sent now is rejected with
# "no healthy devices present").
kubelet_serves_our_resources() { # HEARTBEAT_BEFORE
    [ "$(kubelet_registrations vcuda-core)" -ge 1 ] && [ "$(kubelet_registrations vcuda-memory)" -ge 1 ] &&
        [ "$(heartbeat)" != "$1" ] && allocatable_is vcuda-core $((CARDS * 100))
}

# Kubelet's restart deletes the plugin's sockets; the plugin serves and registers again
# as soon as the new kubelet.sock appears (an inotify wake-up: the figure printed is
# from kubelet's log, its registration server's start to our Register).
dp_kubelet_restart() {
    local before start_line started registered
    before=$(heartbeat)
    bash "$HERE/cluster.sh" restart-kubelet || return 1
    wait_until 120 kubelet_serves_our_resources "$before" ||
        fail "the restarted kubelet does not serve our resources: registrations $(kubelet_registrations vcuda-core)/$(kubelet_registrations vcuda-memory), allocatable $(allocatable vcuda-core)"
    local log=${VGPU_K8S_STATE:-/var/lib/vgpu-k8s}/logs/kubelet.log latency=""
    if [ -r "$log" ]; then
        start_line=$(grep -n 'Starting device plugin registration server' "$log" | tail -1 | cut -d: -f1)
        [ -n "$start_line" ] || start_line=1
        started=$(sed -n "${start_line}p" "$log" | awk '{ print $2 }')
        registered=$(tail -n +"$start_line" "$log" | grep -m1 'Registered client' | awk '{ print $2 }')
        latency=$(echo "$started $registered" | awk '
            function ms(t, p) { split(t, p, ":"); return (p[1] * 3600 + p[2] * 60 + p[3]) * 1000 }
            NF == 2 { printf "; registered %d ms after the new kubelet.sock", ms($2) - ms($1) }')
    fi
    nothing_lost after-kubelet "$latency"
}

dp_plugin_restart() {
    local old
    old=$(kubectl -n "$NS" get pods -l app=vgpu-plugin -o jsonpath='{.items[0].metadata.name}')
    kubectl -n "$NS" delete pod "$old" --wait --timeout 60s || return 1
    kubectl -n "$NS" rollout status daemonset/vgpu-plugin --timeout 180s || {
        # Why the new pod is not available (a local CI run of f2e5f2a timed out here once,
        # with nothing to say why): its phase, its events, and what it printed.
        kubectl -n "$NS" get pods -l app=vgpu-plugin -o wide
        kubectl -n "$NS" describe pods -l app=vgpu-plugin | tail -18
        kubectl -n "$NS" logs -l app=vgpu-plugin --all-containers --tail 12
        return 1
    }
    nothing_lost after-plugin
}

# can_i SA VERB RESOURCE yes|no
can_i() {
    local sa=$1 verb=$2 resource=$3 want=$4 got
    got=$(kubectl auth can-i "$verb" "$resource" --as "system:serviceaccount:$NS:$sa" 2>/dev/null)
    if [ "$got" != "$want" ]; then
        echo "$sa $verb $resource: $got, want $want"
        return 1
    fi
}

# What the plugin does: get a pod (the ceiling annotation, the quota Event's pod UID),
# list this node's pods (which container the kubelet is admitting), create an
# events.k8s.io Event (a quota refusal), nothing else.
dp_rbac() {
    local bad=0 verb
    can_i vgpu-plugin get pods yes || bad=1
    can_i vgpu-plugin list pods yes || bad=1
    for verb in watch create update patch delete; do can_i vgpu-plugin "$verb" pods no || bad=1; done
    can_i vgpu-plugin create events.events.k8s.io yes || bad=1
    for verb in get list patch update delete; do can_i vgpu-plugin "$verb" events.events.k8s.io no || bad=1; done
    can_i vgpu-plugin create events no || bad=1
    can_i vgpu-plugin get nodes no || bad=1
    can_i vgpu-plugin patch nodes no || bad=1
    can_i vgpu-plugin get secrets no || bad=1
    can_i vgpu-plugin list configmaps no || bad=1
    can_i vgpu-plugin create resourceslices.resource.k8s.io no || bad=1
    [ $bad = 0 ] && echo "vgpu-plugin: get and list pods, create events.k8s.io events, nothing more"
}

dp_cleanup() {
    kubectl delete pod q30 p60 vcuda-example quota toobig toowide memonly wide refused holder next cardfuls after-kubelet after-plugin rejected after-rejected \
        --ignore-not-found --wait --timeout 60s >/dev/null
}

# The whole set with `kubectl apply`; with Helm the install, the seed's pod, an upgrade,
# RBAC and the uninstall (the rest is the same DaemonSet).
device_plugin_run() { # helm|kubectl
    local how=$1
    say "device-plugin mode, installed with $how"
    check "dp[$how] label node nvidia-device-enable=enable" dp_label
    check "dp[$how] install" dp_install "$how"
    check "dp[$how] describe node shows vcuda-core 100 per card, vcuda-memory in 256MiB units" dp_describe_node
    check "dp[$how] the seed's example pod: nvidia-smi shows 2560MiB" dp_example_pod
    kubectl delete pod vcuda-example --ignore-not-found --wait --timeout 60s >/dev/null
    check "dp[$how] the example quota: 2560MiB through the shims, OOM past it" dp_example_quota
    if [ "$how" = helm ]; then
        check "dp[helm] upgrade" dp_helm_upgrade
        check "dp[helm] RBAC: what the plugin does and nothing more" dp_rbac
        dp_cleanup
        check "dp[helm] uninstall" dp_uninstall helm
        return
    fi
    check "dp[$how] a pod no card holds is Pending or refused with a reason" dp_impossible_pods
    check "dp[$how] memory alone is refused at admission, saying why" dp_memory_alone_refused
    check "dp[$how] a refusal names a few device IDs, not all" dp_refusal_is_short
    check "dp[$how] a quota refusal is a GPUMemoryQuotaRefused Event on the pod" dp_quota_refusal_event
    check "dp[$how] two pods share one card" dp_two_pods_one_card
    check "dp[$how] a kubelet restart loses nothing" dp_kubelet_restart
    check "dp[$how] a plugin restart loses nothing" dp_plugin_restart
    check "dp[$how] RBAC: what the plugin does and nothing more" dp_rbac
    dp_cleanup
    check "dp[$how] deleting a pod frees its share at once" dp_delete_frees
    kubectl delete pod holder next --ignore-not-found --wait --timeout 60s >/dev/null
    check "dp[$how] four containers of 10 cores and a card's memory each run" \
        dp_containers_with_cores_and_a_cards_memory
    kubectl delete pod cardfuls --ignore-not-found --wait --timeout 60s >/dev/null
    check "dp[$how] a pod rejected after its first Allocate: its IDs are the next pod's, a whole card" \
        dp_rejected_pods_ids_are_the_next_pods
    kubectl delete pod rejected after-rejected --ignore-not-found --wait --timeout 60s >/dev/null
    check "dp[$how] uninstall" dp_uninstall "$how"
}

# --- DRA mode --------------------------------------------------------------------------

dra_install() {
    kubectl label node "$NODE" nvidia-device-enable- vgpu-shim.io/mode=dra --overwrite || return 1
    local files=()
    [ -e "$ROOT/deploy/namespace.yaml" ] && files+=(-f "$ROOT/deploy/namespace.yaml")
    kubectl apply "${files[@]}" -f "$ROOT/deploy/dra/device-class.yaml" -f "$ROOT/deploy/dra/vgpu-dra-plugin.yaml" || return 1
    bash "$HERE/cluster.sh" sim-patch vgpu-dra-plugin || return 1
    kubectl -n "$NS" rollout status daemonset/vgpu-dra-plugin --timeout 300s || {
        kubectl -n "$NS" describe pods -l app=vgpu-dra-plugin | tail -30
        kubectl -n "$NS" logs -l app=vgpu-dra-plugin --all-containers --tail 30
        return 1
    }
}

# The real API server accepts the slices: one per node (or pool), four cards, each with
# 100 cores and its memory.
dra_slices() {
    wait_until 120 sh -c "kubectl get resourceslices -o name | grep -q ." || fail "no ResourceSlice"
    local json
    json=$(kubectl get resourceslices -o json)
    python3 - "$json" "$NODE" "$CARDS" <<'PY'
import json, sys
slices, node, cards = json.loads(sys.argv[1])["items"], sys.argv[2], int(sys.argv[3])
ours = [s for s in slices if s["spec"]["driver"] == "gpu.vgpu-shim.io"]
assert ours, "no slice of gpu.vgpu-shim.io"
devices = [d for s in ours for d in s["spec"].get("devices", [])]
for s in ours:
    assert s["spec"].get("nodeName") == node, s["spec"].get("nodeName")
assert len(devices) == cards, f"{len(devices)} devices"
for d in devices:
    capacity = d.get("capacity", {})
    assert capacity.get("cores", {}).get("value") == "100", capacity
    assert "memory" in capacity, capacity
    assert d.get("allowMultipleAllocations") is True, d
print(f"{len(ours)} slice(s), {len(devices)} devices: " + ", ".join(d["name"] for d in devices))
PY
}

dra_pod() { # NAME CORES MEMORY COMMAND...
    local name=$1 cores=$2 memory=$3
    shift 3
    local command
    command=$(printf '"%s",' "$@")
    kubectl apply -f - <<EOF
apiVersion: resource.k8s.io/v1
kind: ResourceClaimTemplate
metadata:
  name: $name
spec:
  spec:
    devices:
      requests:
        - name: gpu
          exactly:
            deviceClassName: gpu.vgpu-shim.io
            capacity:
              requests:
                cores: "$cores"
                memory: $memory
---
apiVersion: v1
kind: Pod
metadata:
  name: $name
spec:
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  resourceClaims:
    - name: gpu
      resourceClaimTemplateName: $name
  containers:
    - name: cuda
      image: $IMAGE
      command: [${command%,}]
      resources:
        claims:
          - name: gpu
EOF
}

claim_of() { kubectl get pod "$1" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}'; }
device_of() { kubectl get resourceclaim "$(claim_of "$1")" -o jsonpath='{.status.allocation.devices.results[0].device}'; }

claim_allocated() { [ -n "$(device_of "$1")" ]; }

# The stock scheduler places claims of 60 and 50 cores on two different cards.
dra_two_claims() {
    dra_pod c60 60 4Gi sleep infinity >/dev/null || return 1
    dra_pod c50 50 2560Mi sleep infinity >/dev/null || return 1
    wait_until 120 claim_allocated c60 || { describe_pod c60; fail "c60's claim is not allocated"; }
    wait_until 120 claim_allocated c50 || { describe_pod c50; fail "c50's claim is not allocated"; }
    local a b
    a=$(device_of c60)
    b=$(device_of c50)
    echo "c60 on $a, c50 on $b"
    [ -n "$a" ] && [ -n "$b" ] && [ "$a" != "$b" ] || fail "60 + 50 cores on one card"
}

# The kubelet registers the driver and calls NodePrepareResources: both pods run.
dra_pods_run() {
    wait_until 180 phase_is c60 Running || { describe_pod c60; fail "c60: $(phase c60)"; }
    wait_until 180 phase_is c50 Running || { describe_pod c50; fail "c50: $(phase c50)"; }
    echo "c60 and c50 run"
}

# NodePrepareResources ran and containerd applied the CDI spec: the container's config
# says 50 cores and 2560 MiB, and vgpu probe sees 2560 MiB.
dra_quota_in_container() {
    local config
    config=$(kubectl exec c50 -- cat /etc/vgpu/vgpu.yaml) || fail "no /etc/vgpu/vgpu.yaml in c50"
    echo "$config"
    local probe
    probe=$(kubectl exec c50 -- vgpu probe --json --alloc 1GiB --alloc 2GiB) || fail "vgpu probe failed in c50"
    echo "$probe"
    python3 - "$probe" <<'PY'
import json, sys
report = json.loads(sys.argv[1].strip().splitlines()[-1])
mib = 1 << 20
total = report["devices"][0]["total_mem"]
assert total == 2560 * mib, f"total_mem {total / mib} MiB, not 2560"
results = [a["result"] for a in report["allocations"]]
assert results == ["CUDA_SUCCESS", "CUDA_ERROR_OUT_OF_MEMORY"], results
print("c50 sees 2560 MiB; past it: CUDA_ERROR_OUT_OF_MEMORY")
PY
}

# Issue 27 in DRA mode: c50's refusal above becomes a GPUMemoryQuotaRefused Event on
# the pod its claim is reserved for, seen by `kubectl describe pod`.
dra_quota_refusal_event() {
    wait_until 120 sh -c "kubectl get events --field-selector involvedObject.name=c50,reason=GPUMemoryQuotaRefused -o name | grep -q ." || {
        kubectl get events --field-selector involvedObject.name=c50
        fail "no GPUMemoryQuotaRefused Event on c50"
    }
    kubectl describe pod c50 | grep GPUMemoryQuotaRefused || fail "kubectl describe pod does not show the Event"
}

# The restarted kubelet's plugin manager registered our driver again (it finds the
# registration socket in plugins_registry). Its dra_resource_claims_in_use counts only
# claims it prepared itself, so it says 0 for pods that kept running across the restart.
dra_kubelet_has_us() {
    [ "$(kubelet_metric plugin_manager_total_plugins gpu.vgpu-shim.io 'state="actual_state_of_world"')" -ge 1 ]
}

# A kubelet restart loses nothing in DRA mode: the running pods keep their claims and
# quotas, and a new claim is prepared by the re-registered driver.
dra_kubelet_restart() {
    bash "$HERE/cluster.sh" restart-kubelet || return 1
    wait_until 120 dra_kubelet_has_us ||
        fail "the restarted kubelet did not register gpu.vgpu-shim.io"
    phase_is c60 Running || fail "c60: $(phase c60)"
    phase_is c50 Running || fail "c50: $(phase c50)"
    kubectl exec c50 -- cat /etc/vgpu/vgpu.yaml | grep -q "core_limit: 50" || fail "c50's config lost its 50 cores"
    dra_pod c40 40 2Gi sleep infinity >/dev/null || return 1
    wait_until 120 phase_is c40 Running || { describe_pod c40; fail "c40: $(phase c40)"; }
    kubectl exec c40 -- cat /etc/vgpu/vgpu.yaml | grep -q "core_limit: 40" || fail "c40's config does not say 40 cores"
    echo "c60 and c50 kept running with their claims; c40 prepared after the restart on $(device_of c40)"
    kubectl delete pod c40 --wait --timeout 60s >/dev/null
    kubectl delete resourceclaimtemplate c40 --ignore-not-found >/dev/null
}

# Deleting the pod unprepares its claim: the claim goes, its CDI spec goes.
dra_unprepare() {
    local claim uid
    claim=$(claim_of c50)
    uid=$(kubectl get resourceclaim "$claim" -o jsonpath='{.metadata.uid}')
    ls /var/run/cdi | grep -q "$uid" || fail "no CDI spec of claim $uid in /var/run/cdi: $(ls /var/run/cdi)"
    kubectl delete pod c50 --wait --timeout 60s || return 1
    wait_until 60 sh -c "! kubectl get resourceclaim $claim" || fail "claim $claim is still there"
    wait_until 60 sh -c "! ls /var/run/cdi | grep -q $uid" || fail "claim $uid's CDI spec is still there: $(ls /var/run/cdi)"
    echo "claim $claim unprepared: its CDI spec is gone"
    kubectl delete pod c60 --wait --timeout 60s >/dev/null
    kubectl delete resourceclaimtemplate c60 c50 --ignore-not-found >/dev/null
}

dra_cleanup() {
    kubectl delete pod c60 c50 c40 --ignore-not-found --wait --timeout 60s >/dev/null
    kubectl delete resourceclaimtemplate c60 c50 c40 --ignore-not-found >/dev/null
}

dra_rbac() {
    local bad=0 verb sa=vgpu-dra-plugin
    for verb in list watch create update delete; do can_i $sa "$verb" resourceslices.resource.k8s.io yes || bad=1; done
    can_i $sa get resourceclaims.resource.k8s.io yes || bad=1
    for verb in update patch delete create; do can_i $sa "$verb" resourceclaims.resource.k8s.io no || bad=1; done
    can_i $sa get pods yes || bad=1
    for verb in list watch create update delete; do can_i $sa "$verb" pods no || bad=1; done
    can_i $sa get nodes no || bad=1
    can_i $sa patch nodes no || bad=1
    can_i $sa get secrets no || bad=1
    can_i $sa create events.events.k8s.io yes || bad=1
    for verb in get list update delete; do can_i $sa "$verb" events.events.k8s.io no || bad=1; done
    can_i $sa create events no || bad=1
    [ $bad = 0 ] || return 1
    # The admission policy: a request as the plugin's account without a node in its token
    # may not write any slice.
    local out
    out=$(kubectl create --as "system:serviceaccount:$NS:$sa" -f - 2>&1 <<EOF || true
apiVersion: resource.k8s.io/v1
kind: ResourceSlice
metadata:
  name: not-our-node
spec:
  driver: gpu.vgpu-shim.io
  nodeName: some-other-node
  pool: { name: some-other-node, generation: 1, resourceSliceCount: 1 }
  devices: []
EOF
    )
    echo "$out"
    echo "$out" | grep -q "names no node\|may not change" || fail "the admission policy let it through"
    echo "vgpu-dra-plugin: slices, claims (get), pods (get), events.k8s.io events (create), nothing more; the policy holds"
}

dra_run() {
    say "DRA mode"
    check "dra install (no device plugin on the node)" dra_install
    check "dra the API server accepts our ResourceSlices" dra_slices
    check "dra the scheduler puts claims of 60 and 50 cores on two cards" dra_two_claims
    check "dra the kubelet registers the driver and the pods run" dra_pods_run
    check "dra NodePrepareResources + CDI: the container sees its quota" dra_quota_in_container
    check "dra a quota refusal is a GPUMemoryQuotaRefused Event on the pod" dra_quota_refusal_event
    check "dra a kubelet restart loses nothing" dra_kubelet_restart
    check "dra deleting the pod unprepares the claim" dra_unprepare
    dra_cleanup
    check "dra RBAC: what the driver does and nothing more" dra_rbac
}

# --- main ------------------------------------------------------------------------------

finish() {
    if [ "${VGPU_K8S_KEEP:-0}" != 1 ]; then
        bash "$HERE/cluster.sh" down || true
    fi
    rm -rf "$WORK"
    [ ${#FAILURES[@]} = 0 ] || printf 'failed: %s\n' "${FAILURES[@]}"
    echo "$PASSED passed, $FAILED failed, $KNOWN skipped"
    [ "$FAILED" = 0 ]
}

# Sourced, it only defines the checks (for running one against a cluster that is up).
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
    start=$SECONDS
    check "cluster up (etcd, apiserver, controller-manager, scheduler, containerd, kubelet)" cluster_up
    if [ "$FAILED" != 0 ]; then
        finish
        exit 1
    fi
    eval "$(bash "$HERE/cluster.sh" env)"
    bash "$HERE/cluster.sh" versions 2>&1
    case "$MODE" in
        all)
            [ -d "$ROOT/deploy/helm/vgpu-shim" ] && device_plugin_run helm
            device_plugin_run kubectl
            dra_run
            ;;
        device-plugin) device_plugin_run kubectl ;;
        dra) dra_run ;;
        *) say "mode: all, device-plugin or dra"; exit 2 ;;
    esac
    say "done in $((SECONDS - start)) s"
    finish
fi

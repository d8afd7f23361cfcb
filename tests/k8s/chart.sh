#!/usr/bin/env bash
# The Helm chart deploy/helm/vgpu-shim, without a cluster (tests/k8s/cluster.sh installs,
# upgrades and uninstalls it on a real one):
#   1. `helm lint --strict` of both modes, with every optional part on and off;
#   2. `helm template` of both modes;
#   3. the plain manifests of deploy/ equal the chart's output (deploy/render.sh --check);
#   4. dra/tests/chart.rs with this helm: each mode's rendered config parsed by the
#      daemon's own parser, for the defaults and for changed values; the mounts follow
#      the paths; values that would part the config from the mounts are refused; the
#      values schema admits exactly the keys the parsers accept.
# helm: $HELM, else the one tests/k8s/build.sh builds (cached by version), else `helm`
# on PATH. tests/run.sh runs this after the cargo tests.
set -euo pipefail
cd "$(dirname "$0")/../.."
CHART=deploy/helm/vgpu-shim

if [ -z "${HELM:-}" ]; then
    if [ -f tests/k8s/build.sh ]; then
        line=$(bash tests/k8s/build.sh helm | tail -n 1)
        export PATH="${line#PATH=}:$PATH"
    fi
    HELM=$(command -v helm) || { echo "chart.sh: no helm (tests/k8s/build.sh helm builds one)" >&2; exit 1; }
fi
export HELM
echo "chart.sh: $("$HELM" version --short 2>/dev/null || "$HELM" version)"

step() { echo "chart.sh: $*"; }

for mode in device-plugin dra; do
    for extra in "" "--set namespace.create=true --set metrics.serviceMonitor.enabled=true --set metrics.networkPolicy.enabled=true" \
                 "--set metrics.service=false --set priorityClassName= --set tolerations=null"; do
        step "helm lint --strict, mode $mode $extra"
        # shellcheck disable=SC2086 # $extra is a list of arguments
        "$HELM" lint --strict "$CHART" --namespace vgpu-system --set mode=$mode $extra
    done
    step "helm template, mode $mode"
    rendered=$("$HELM" template vgpu-shim "$CHART" --namespace vgpu-system --set mode=$mode)
    kinds="ServiceAccount ClusterRole ClusterRoleBinding ConfigMap DaemonSet"
    [ $mode = dra ] && kinds="$kinds DeviceClass ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding"
    for kind in $kinds; do
        grep -q "^kind: $kind\$" <<<"$rendered" || { echo "chart.sh: mode $mode renders no $kind" >&2; exit 1; }
    done
done

step "deploy/ is the chart's output (deploy/render.sh --check)"
bash deploy/render.sh --check

step "rendered configs through the daemons' parsers (dra/tests/chart.rs)"
VGPU_HELM=$(command -v "$HELM") nice -n 10 cargo test -p vgpu-dra --test chart

step "ok"

{{/*
Names and the daemons' configs, shared by the templates.
*/}}

{{/* The mode, checked: device-plugin or dra. */}}
{{- define "vgpu-shim.mode" -}}
{{- if not (has .Values.mode (list "device-plugin" "dra")) -}}
{{- fail (printf "mode: %q is neither device-plugin nor dra" .Values.mode) -}}
{{- end -}}
{{- .Values.mode -}}
{{- end -}}

{{/* The daemon's name: its DaemonSet, ServiceAccount, ClusterRole, ConfigMap. */}}
{{- define "vgpu-shim.name" -}}
{{- if eq (include "vgpu-shim.mode" .) "dra" -}}vgpu-dra-plugin{{- else -}}vgpu-plugin{{- end -}}
{{- end -}}

{{/* The config file's name in the ConfigMap and under /etc/vgpu. */}}
{{- define "vgpu-shim.configFile" -}}
{{- if eq (include "vgpu-shim.mode" .) "dra" -}}dra.yaml{{- else -}}plugin.yaml{{- end -}}
{{- end -}}

{{/* The metrics port of the mode; empty when metrics (and /healthz) are off. */}}
{{- define "vgpu-shim.metricsPort" -}}
{{- $port := ternary .Values.dra.metricsPort .Values.devicePlugin.metricsPort (eq (include "vgpu-shim.mode" .) "dra") -}}
{{- if $port }}{{ $port }}{{ end -}}
{{- end -}}

{{- define "vgpu-shim.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The selector label; a DaemonSet's selector never changes, so it is this alone. */}}
{{- define "vgpu-shim.selectorLabels" -}}
app: {{ include "vgpu-shim.name" . }}
{{- end -}}

{{- define "vgpu-shim.labels" -}}
{{ include "vgpu-shim.selectorLabels" . }}
app.kubernetes.io/name: {{ include "vgpu-shim.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/part-of: vgpu-shim
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
{{- end -}}

{{/* A host path without its trailing slash. */}}
{{- define "vgpu-shim.path" -}}
{{- if or (not (hasPrefix "/" .)) (eq . "/") -}}
{{- fail (printf "hostPaths: %q is not an absolute path below /" .) -}}
{{- end -}}
{{- trimSuffix "/" . -}}
{{- end -}}

{{/*
The config keys the chart sets from hostPaths and metricsPort (one source of truth:
the DaemonSet mounts the same paths). The driver paths are the layout
`vgpu-ldconfig prepare --dest=<state>/driver` writes: <version>/lib64, <version>/shim,
and the link `current` naming the version in use.
*/}}
{{- define "vgpu-shim.driverPaths" -}}
{{- $state := include "vgpu-shim.path" .Values.hostPaths.state -}}
host_driver_dir: {{ $state }}/driver
shim_dir: {{ $state }}/driver/current/shim
nvml_library: {{ $state }}/driver/current/lib64/libnvidia-ml.so.1
{{- end -}}

{{- define "vgpu-shim.pluginDerived" -}}
{{- $state := include "vgpu-shim.path" .Values.hostPaths.state -}}
{{- $devicePlugins := include "vgpu-shim.path" .Values.hostPaths.kubeletDevicePlugins -}}
device_plugin_dir: {{ $devicePlugins }}
pod_resources_socket: {{ include "vgpu-shim.path" .Values.hostPaths.kubeletPodResources }}/kubelet.sock
state_dir: {{ $state }}
{{ include "vgpu-shim.driverPaths" . }}
cdi_spec_dir: {{ include "vgpu-shim.path" .Values.hostPaths.cdi }}
host_proc: /proc
metrics_address: {{ if .Values.devicePlugin.metricsPort }}0.0.0.0:{{ .Values.devicePlugin.metricsPort }}{{ else }}null{{ end }}
{{- end -}}

{{- define "vgpu-shim.draDerived" -}}
{{- $state := include "vgpu-shim.path" .Values.hostPaths.state -}}
{{- $driver := .Values.dra.config.driver_name | default "gpu.vgpu-shim.io" -}}
plugins_registry_dir: {{ include "vgpu-shim.path" .Values.hostPaths.kubeletPluginsRegistry }}
plugin_dir: {{ include "vgpu-shim.path" .Values.hostPaths.kubeletPlugins }}/{{ $driver }}
state_dir: {{ $state }}/dra
cdi_dir: {{ include "vgpu-shim.path" .Values.hostPaths.cdi }}
{{ include "vgpu-shim.driverPaths" . }}
device_plugin_dir: {{ include "vgpu-shim.path" .Values.hostPaths.kubeletDevicePlugins }}
host_proc: /host/proc
{{- if .Values.dra.metricsPort }}
metrics_address: 0.0.0.0:{{ .Values.dra.metricsPort }}
{{- end }}
{{- end -}}

{{/*
The daemon's config file: the mode's `config` values with the derived keys added. A
derived key set in `config` is refused (it would part the config from the mounts).
*/}}
{{- define "vgpu-shim.config" -}}
{{- $dra := eq (include "vgpu-shim.mode" .) "dra" -}}
{{- $section := ternary "dra" "devicePlugin" $dra -}}
{{- $own := ternary .Values.dra.config .Values.devicePlugin.config $dra | default dict -}}
{{- $derived := ternary (include "vgpu-shim.draDerived" .) (include "vgpu-shim.pluginDerived" .) $dra | fromYaml -}}
{{- range $key, $_ := $derived -}}
{{- if hasKey $own $key -}}
{{- fail (printf "%s.config.%s: set from hostPaths and %s.metricsPort, not here" $section $key $section) -}}
{{- end -}}
{{- end -}}
{{- if hasKey $own "node_name" -}}
{{- fail "dra.config.node_name: each pod's node is its own (env NODE_NAME)" -}}
{{- end -}}
{{- toYaml (merge (deepCopy $derived) (deepCopy $own)) -}}
{{- end -}}

{{/* Whether the device plugin writes CDI specs (and so mounts hostPaths.cdi). */}}
{{- define "vgpu-shim.pluginWritesCdi" -}}
{{- $own := .Values.devicePlugin.config | default dict -}}
{{- if has ($own.device_list_strategy | default "mounts") (list "cdi" "both") -}}true{{- end -}}
{{- end -}}

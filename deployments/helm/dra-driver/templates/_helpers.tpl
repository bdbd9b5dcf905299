{{/* The chart's name, shortened to the 63 characters of a label value. */}}
{{- define "dra-driver.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* The release's name for its objects: the release name alone when it already contains
the chart's name (release "dra-driver" gives "dra-driver"), otherwise "<release>-<chart>".
Cluster-scoped objects carry it, so two releases do not collide. */}}
{{- define "dra-driver.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The namespace of the namespaced objects: the release's unless overridden. */}}
{{- define "dra-driver.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
{{- end }}

{{- define "dra-driver.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels shared by every object. */}}
{{- define "dra-driver.labels" -}}
helm.sh/chart: {{ include "dra-driver.chart" . }}
app.kubernetes.io/name: {{ include "dra-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The DaemonSet's selector: immutable, so nothing in it may change between releases. */}}
{{- define "dra-driver.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dra-driver.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: kubelet-plugin
{{- end }}

{{/* The metrics Service's name. A Service's name is a DNS-1035 label (at most 63
characters, no dots), unlike the other objects' names: the full name, cut to leave room for
the suffix. */}}
{{- define "dra-driver.metricsServiceName" -}}
{{- printf "%s-metrics" (include "dra-driver.fullname" . | replace "." "-" | trunc 55 | trimSuffix "-") }}
{{- end }}

{{/* The ServiceAccount name; also the user name the admission policy matches. */}}
{{- define "dra-driver.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "dra-driver.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "dra-driver.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The CEL selector of a device class for devices of one type. */}}
{{- define "dra-driver.typeSelector" -}}
device.driver == "{{ .driver }}" && device.attributes["{{ .driver }}"].type == "{{ .type }}"
{{- end }}

{{/* Refuse the extended-resource class unless the administrator acknowledged that the
NVIDIA device plugin does not run on the same nodes: both would hand out the same GPUs. */}}
{{- define "dra-driver.checkExtendedResource" -}}
{{- if and .Values.extendedResource.enabled (not .Values.extendedResource.acknowledgeNoDevicePlugin) }}
{{- fail "extendedResource.enabled=true serves the extended resource through DRA: the NVIDIA device plugin must not run on the same nodes (both would hand out the same GPUs). Set extendedResource.acknowledgeNoDevicePlugin=true to confirm." }}
{{- end }}
{{- end }}

{{/* The driver name: the NVIDIA DRA driver's with compat: nvidia, else driverName. */}}
{{- define "dra-driver.driverName" -}}
{{- if eq (toString .Values.compat) "nvidia" -}}
gpu.nvidia.com
{{- else if eq (toString (.Values.compat | default "")) "" -}}
{{ .Values.driverName }}
{{- else -}}
{{- fail (printf "compat: %q is not a compatibility mode; use \"nvidia\" or leave it empty" (toString .Values.compat)) -}}
{{- end -}}
{{- end }}

{{/* The MIG DeviceClass: the NVIDIA DRA driver's mig.nvidia.com with compat: nvidia, else
mig.<driverName>. */}}
{{- define "dra-driver.migClassName" -}}
{{- if eq (toString .Values.compat) "nvidia" -}}
mig.nvidia.com
{{- else -}}
mig.{{ include "dra-driver.driverName" . }}
{{- end -}}
{{- end }}

{{/* ComputeDomains (computeDomains.enabled). The names of the mode, as
dra_driver/computedomain/api.py states them: the API group of ComputeDomain objects, the DRA
driver name the node's IMEX devices are published under, and the DeviceClass names of its
channels and daemons. compat: nvidia takes the NVIDIA DRA driver's. */}}
{{- define "dra-driver.computeDomainGroup" -}}
{{- if eq (toString .Values.compat) "nvidia" }}resource.nvidia.com{{ else }}gpu.dra.dev{{ end }}
{{- end }}

{{- define "dra-driver.computeDomainDriver" -}}
{{- if eq (toString .Values.compat) "nvidia" }}compute-domain.nvidia.com{{ else }}compute-domain.gpu.dra.dev{{ end }}
{{- end }}

{{- define "dra-driver.computeDomainController" -}}
{{ include "dra-driver.fullname" . }}-compute-domain-controller
{{- end }}

{{/* The IMEX daemons' ServiceAccount: the controller names it in every daemon DaemonSet
(DaemonSettings.service_account in dra_driver/computedomain/objects.py), so it is fixed. */}}
{{- define "dra-driver.imexDaemonServiceAccount" -}}
dra-driver-imex-daemon
{{- end }}

{{/* The controller's Lease (leader election), also fixed in the controller. */}}
{{- define "dra-driver.computeDomainLease" -}}
dra-driver-compute-domain
{{- end }}

{{/* The names of a list of image pull secrets ({name: ...}), comma-separated. */}}
{{- define "dra-driver.pullSecretNames" -}}
{{- $names := list -}}
{{- range . -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- join "," $names -}}
{{- end }}

{{/*
The DaemonSet's update strategy. Kubernetes takes a surge or unavailable pods, not both,
and not neither: a non-zero maxUnavailable (the usual DaemonSet setting, given alone with
--set) turns the default surge off, and a surge turned off alone (maxSurge: 0) leaves
Kubernetes' own default, maxUnavailable: 1, instead of rendering an object the API server
refuses.
*/}}
{{- define "dra-driver.updateStrategy" -}}
type: {{ .type }}
{{- if eq .type "RollingUpdate" }}
{{- $rolling := .rollingUpdate | default dict }}
{{- $unavailable := $rolling.maxUnavailable | default 0 }}
{{- $surge := $rolling.maxSurge | default 0 }}
{{- $zero := list "0" "0%" }}
{{- if not (has (toString $unavailable) $zero) }}
{{- $surge = 0 }}
{{- else if has (toString $surge) $zero }}
{{- $unavailable = 1 }}
{{- end }}
rollingUpdate:
  maxSurge: {{ toYaml $surge }}
  maxUnavailable: {{ toYaml $unavailable }}
{{- end }}
{{- end -}}

{{/*
Environment variables of settings that values may lack: takes (list VALUES NAME KEY NAME KEY
...), a map of values (nil for none) and pairs of a variable's name and its value's key, and
renders each variable whose key is set. `helm upgrade --reuse-values` from an older chart
keeps that chart's values, without the keys this one added: such a key renders no variable
and the agent takes its own default, which is values.yaml's (tests/unit/test_helm_chart.py),
instead of an empty variable that it refuses (a number, a choice) or reads as another
setting (an empty DRA_IGNORED_XIDS ignores no Xid).
*/}}
{{- define "dra-driver.envFromValues" -}}
{{- $values := first . | default dict }}
{{- $pairs := rest . }}
{{- range $i := until (len $pairs) }}
{{- if eq (mod $i 2) 0 }}
{{- $value := index $values (index $pairs (add1 $i)) }}
{{- if not (kindIs "invalid" $value) }}
- name: {{ index $pairs $i }}
  value: {{ $value | quote }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/* "true" when computeDomains.enabled, else empty; a release of an older chart may lack the
whole computeDomains section, which is then off. */}}
{{- define "dra-driver.computeDomainsEnabled" -}}
{{- if (.Values.computeDomains | default dict).enabled }}true{{ end }}
{{- end }}

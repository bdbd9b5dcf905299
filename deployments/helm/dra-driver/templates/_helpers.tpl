{{/* Labels shared by every object. Deliberately no release or chart labels: the rendered
objects are the same as those of the kustomize base. */}}
{{- define "dra-driver.labels" -}}
app.kubernetes.io/name: dra-driver
{{- end }}

{{- define "dra-driver.selectorLabels" -}}
app.kubernetes.io/name: dra-driver
app.kubernetes.io/component: kubelet-plugin
{{- end }}

{{/* The ServiceAccount name; also the user name the admission policy matches. */}}
{{- define "dra-driver.serviceAccountName" -}}
dra-driver
{{- end }}

{{- define "dra-driver.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{/* The CEL selector of a device class for devices of one type. */}}
{{- define "dra-driver.typeSelector" -}}
device.driver == "{{ .driver }}" && device.attributes["{{ .driver }}"].type == "{{ .type }}"
{{- end }}

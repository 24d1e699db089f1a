{{/* Names and labels shared by every object of the chart. */}}

{{- define "gpuscope.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuscope.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "gpuscope.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "gpuscope.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "gpuscope.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "gpuscope.selectorLabels" -}}
app.kubernetes.io/name: {{ include "gpuscope.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- /* The daemon's pods only: calibration and rightsizing pods share the chart's name labels. */}}
{{- define "gpuscope.daemonSelectorLabels" -}}
{{ include "gpuscope.selectorLabels" . }}
app.kubernetes.io/component: exporter
{{- end }}

{{- define "gpuscope.labels" -}}
helm.sh/chart: {{ include "gpuscope.chart" . }}
{{ include "gpuscope.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: gpuscope
{{- end }}

{{- define "gpuscope.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "gpuscope.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "gpuscope.image" -}}
{{- $tag := default .Chart.AppVersion .image.tag -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ $tag }}
{{- end -}}
{{- end }}

{{- define "gpuscope.calibrationConfigMap" -}}
{{- default (printf "%s-calibration" (include "gpuscope.fullname" .)) .Values.calibration.configMapName }}
{{- end }}

{{- /* Security-scanner findings the Jobs accept on purpose, each with its reason. */}}
{{- define "gpuscope.jobCheckovSkips" -}}
checkov.io/skip1: CKV_K8S_38=the job writes its result into a ConfigMap through the API, so it needs its token
checkov.io/skip2: CKV_K8S_43=the image is referenced by tag by default; set the image digest value to pin it
checkov.io/skip3: CKV_K8S_15=IfNotPresent is right for a tagged release image
{{- end }}

{{- /* The collector flags of daemon.profile (exporter/config.py PROFILES, which a test holds
this to), then daemon.collectProcesses when set: a YAML list. */}}
{{- define "gpuscope.profileFlags" -}}
{{- $profiles := dict "lean" (list "--no-collector.pcie") "default" (list) "full" (list "--collector.processes" "--collector.nvlink") -}}
{{- $flags := list -}}
{{- range (get $profiles .profile) -}}
{{- if or (kindIs "invalid" $.collectProcesses) (not (contains "collector.processes" .)) -}}
{{- $flags = append $flags . -}}
{{- end -}}
{{- end -}}
{{- if not (kindIs "invalid" .collectProcesses) -}}
{{- $flags = append $flags (printf "--collector.processes=%t" .collectProcesses) -}}
{{- end -}}
{{- toYaml $flags -}}
{{- end }}

{{/* The release's name for every object, at most 63 characters. */}}
{{- define "sonicsite.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/* One component's name: <fullname>-<component>. */}}
{{- define "sonicsite.component" -}}
{{- printf "%s-%s" (include "sonicsite.fullname" .root) .component | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "sonicsite.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "sonicsite.selectorLabels" . }}
{{- end -}}

{{- define "sonicsite.selectorLabels" -}}
app.kubernetes.io/name: {{ .root.Chart.Name }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* The sonicsite image (operator, gateway, helm test, demo models). */}}
{{- define "sonicsite.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{/* Container security for every pod: non-root, no privilege escalation, no capabilities. */}}
{{- define "sonicsite.containerSecurity" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: {{ .readOnly }}
runAsNonRoot: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "sonicsite.podSecurity" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
fsGroup: {{ .uid }}
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{/* Service names other components use. */}}
{{- define "sonicsite.operatorHost" -}}
{{- printf "%s.%s.svc" (include "sonicsite.component" (dict "root" . "component" "operator")) .Release.Namespace -}}
{{- end -}}
{{- define "sonicsite.envoyHost" -}}
{{- printf "%s.%s.svc" (include "sonicsite.component" (dict "root" . "component" "envoy")) .Release.Namespace -}}
{{- end -}}
{{- define "sonicsite.tritonService" -}}
{{- include "sonicsite.component" (dict "root" . "component" "triton") -}}
{{- end -}}

{{/* The Prometheus that KEDA queries: given, or the chart's own. */}}
{{- define "sonicsite.prometheusAddress" -}}
{{- if .Values.monitoring.prometheusAddress -}}
{{- .Values.monitoring.prometheusAddress -}}
{{- else if .Values.monitoring.prometheus.enabled -}}
{{- printf "http://%s.%s.svc:9090" (include "sonicsite.component" (dict "root" . "component" "prometheus")) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The scaling metric: the monitoring recording rules' expression (files/rules links to
monitoring/rules), highest over models, so that KEDA and the rule compute one quantity. */}}
{{- define "sonicsite.scalingQuery" -}}
{{- $rules := .Files.Get "files/rules/autoscaling.rules.yaml" | fromYaml -}}
{{- $expr := "" -}}
{{- range (index $rules.groups 0).rules -}}
{{- if eq .record "sonicsite:model_queue_seconds_per_request:30s" -}}
{{- $expr = .expr -}}
{{- end -}}
{{- end -}}
{{- if not $expr -}}
{{- fail "files/rules/autoscaling.rules.yaml: no rule records sonicsite:model_queue_seconds_per_request:30s" -}}
{{- end -}}
{{- printf "max(%s)" (trim $expr) -}}
{{- end -}}


{{/* Every rule group of monitoring/rules (files/rules links to them), as one list. */}}
{{- define "sonicsite.ruleGroups" -}}
{{- $groups := list -}}
{{- range $path, $_ := .Files.Glob "files/rules/*.yaml" -}}
{{- $groups = concat $groups ($.Files.Get $path | fromYaml).groups -}}
{{- end -}}
{{- toYaml (dict "groups" $groups) -}}
{{- end -}}

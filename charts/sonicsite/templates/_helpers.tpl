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
{{- define "sonicsite.gatewayHost" -}}
{{- printf "%s.%s.svc" (include "sonicsite.component" (dict "root" . "component" "gateway")) .Release.Namespace -}}
{{- end -}}

{{- define "sonicsite.envoyHost" -}}
{{- printf "%s.%s.svc" (include "sonicsite.component" (dict "root" . "component" "envoy")) .Release.Namespace -}}
{{- end -}}
{{- define "sonicsite.tritonService" -}}
{{- include "sonicsite.component" (dict "root" . "component" "triton") -}}
{{- end -}}

{{/* Envoy's bootstrap as JSON, the same few lines as the local site's
(sonicsite/local/envoy.py): the admin port and where the operator is; listeners, routes,
clusters and endpoints come over xDS. The ConfigMap holds it; the Deployment's checksum
annotation rolls the pods when it changes. */}}
{{- define "sonicsite.envoyBootstrap" -}}
{{- $e := .Values.envoy -}}
{{- $rest := dict "resource_api_version" "V3" "api_config_source" (dict "api_type" "REST" "transport_api_version" "V3" "cluster_names" (list "sonicsite_operator") "refresh_delay" "0.5s") -}}
{{- $operator := dict "address" (include "sonicsite.operatorHost" .) "port_value" (int .Values.operator.port) -}}
{{- $bootstrap := dict
  "node" (dict "id" "sonicsite-envoy" "cluster" "sonicsite")
  "admin" (dict "address" (dict "socket_address" (dict "address" "127.0.0.1" "port_value" (int $e.adminPort))))
  "dynamic_resources" (dict "lds_config" $rest "cds_config" $rest)
  "static_resources" (dict "clusters" (list (dict
    "name" "sonicsite_operator"
    "type" "STRICT_DNS"
    "connect_timeout" "1s"
    "load_assignment" (dict "cluster_name" "sonicsite_operator" "endpoints" (list (dict "lb_endpoints" (list (dict "endpoint" (dict "address" (dict "socket_address" $operator))))))))))
-}}
{{- toJson $bootstrap -}}
{{- end -}}

{{/* The Secret holding the gateway's tokens: given, or the one the chart creates. */}}
{{- define "sonicsite.gatewayTokensSecret" -}}
{{- .Values.gateway.auth.existingSecret | default (printf "%s-tokens" (include "sonicsite.component" (dict "root" . "component" "gateway"))) -}}
{{- end -}}

{{/* The Secret holding the administrative key of Triton's restricted protocols. */}}
{{- define "sonicsite.adminKeySecret" -}}
{{- .Values.triton.adminKey.existingSecret | default (printf "%s-admin-key" (include "sonicsite.component" (dict "root" . "component" "triton"))) -}}
{{- end -}}

{{/* Every pod of the release, whatever its component (for NetworkPolicy peers). */}}
{{- define "sonicsite.releasePods" -}}
{{- toYaml (dict "app.kubernetes.io/instance" .Release.Name "app.kubernetes.io/name" .Chart.Name) -}}
{{- end -}}

{{/* A ServiceMonitor for prometheus-operator on a component's `http` Service port. */}}
{{- define "sonicsite.serviceMonitor" -}}
{{- $m := .root.Values.monitoring.prometheusOperator -}}
apiVersion: monitoring.coreos.com/v1
kind: ServiceMonitor
metadata:
  name: {{ include "sonicsite.component" . }}
  labels:
    {{- include "sonicsite.labels" . | nindent 4 }}
    {{- with $m.labels }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
spec:
  selector:
    matchLabels:
      {{- include "sonicsite.selectorLabels" . | nindent 6 }}
  endpoints:
    - port: http
      path: /metrics
      interval: {{ $m.interval }}
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

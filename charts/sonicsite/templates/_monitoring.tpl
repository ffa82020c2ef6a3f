{{/* Monitoring's helpers: the labels that make a series this release's, the queries and
rules scoped to it, the scrape targets that carry it, the Prometheus KEDA asks.

A release is one site. Every series of it carries `namespace` and `release` (the release's
namespace and name): the chart's own Prometheus adds them by relabelling, prometheus-operator
by the monitors' relabelings, and with annotation scraping the site's relabel config maps
them (values.yaml `monitoring.scrapeAnnotations`). Every query the chart ships selects them,
so that a Prometheus shared by several releases never sums one release with another. */}}

{{/* The PromQL matchers of this release's series: namespace="…",release="…". */}}
{{- define "sonicsite.releaseMatchers" -}}
{{- printf "namespace=%q,release=%q" .Release.Namespace .Release.Name -}}
{{- end -}}

{{/* An expression of monitoring/rules with this release's matchers on every series it reads:
Triton's (nv_inference_*), the operator's and the gateway's (sonicsite_*) and the recorded
ones (sonicsite:*). The rule files name their series bare (tests/chart checks it), so each
gets exactly one selector. Takes (dict "root" $ "expr" EXPR), and "matcher" (",model=~..."),
a pool's models (_triton.tpl sonicsite.poolMatcher), where given. */}}
{{- define "sonicsite.scopedExpr" -}}
{{- $matchers := printf "{%s%s}" (include "sonicsite.releaseMatchers" .root) (.matcher | default "") -}}
{{- regexReplaceAll `\b(nv_inference_[a-z_]+|sonicsite_[a-z_]+|sonicsite:[a-z0-9_:]+)\b` .expr (printf "${1}%s" $matchers) -}}
{{- end -}}

{{/* One rule file of files/rules (monitoring/rules links to them), every rule's expression
scoped to this release, as YAML. Takes (dict "root" $ "path" PATH). */}}
{{- define "sonicsite.ruleFile" -}}
{{- $root := .root -}}
{{- $groups := list -}}
{{- range ($root.Files.Get .path | fromYaml).groups -}}
{{- $rules := list -}}
{{- range .rules -}}
{{- $rules = append $rules (set (deepCopy .) "expr" (include "sonicsite.scopedExpr" (dict "root" $root "expr" .expr))) -}}
{{- end -}}
{{- $groups = append $groups (set (deepCopy .) "rules" $rules) -}}
{{- end -}}
{{- toYaml (dict "groups" $groups) -}}
{{- end -}}

{{/* Every rule group of monitoring/rules, scoped to this release, as one list. */}}
{{- define "sonicsite.ruleGroups" -}}
{{- $groups := list -}}
{{- range $path, $_ := .Files.Glob "files/rules/*.yaml" -}}
{{- $groups = concat $groups (include "sonicsite.ruleFile" (dict "root" $ "path" $path) | fromYaml).groups -}}
{{- end -}}
{{- toYaml (dict "groups" $groups) -}}
{{- end -}}

{{/* The scaling metric: the recording rule's expression (monitoring/rules, the one
definition in PromQL: queue time per request over the site's models) scoped to this release
(and a pool's models), so that KEDA and the rule compute one quantity, and only over this
release's servers; one series, its labels dropped. */}}
{{- define "sonicsite.scalingQuery" -}}
{{- $rules := .root.Files.Get "files/rules/autoscaling.rules.yaml" | fromYaml -}}
{{- $expr := "" -}}
{{- range (index $rules.groups 0).rules -}}
{{- if eq .record "sonicsite:queue_seconds_per_request:30s" -}}
{{- $expr = .expr -}}
{{- end -}}
{{- end -}}
{{- if not $expr -}}
{{- fail "files/rules/autoscaling.rules.yaml: no rule records sonicsite:queue_seconds_per_request:30s" -}}
{{- end -}}
{{- printf "max(%s)" (include "sonicsite.scopedExpr" (dict "root" .root "expr" (trim $expr) "matcher" .matcher)) -}}
{{- end -}}

{{/* KEDA's query for a pool: the scaling metric, no higher than the operator allows for the
work the clients declare (`sonicsite_autoscaler_declared_cap_seconds`, the target times the
servers that work keeps busy over those taking work; absent where queue time alone decides),
so that the HPA's ceil(servers × metric / target) starts no server the work would leave
idle: operator/autoscaler.py `scale_up_cap`, as the local autoscaler applies it. Takes (dict
"root" $ "matcher" MATCHER "pool" NAME "idle" ZERO): "idle" adds `or vector(0)` (a pool at
zero has no queue series). */}}
{{- define "sonicsite.kedaQuery" -}}
{{- $queue := include "sonicsite.scalingQuery" (dict "root" .root "matcher" .matcher) -}}
{{- if .idle }}{{ $queue = printf "(%s or vector(0))" $queue }}{{ end -}}
{{- $cap := include "sonicsite.scopedExpr" (dict "root" .root "expr" "max(sonicsite_autoscaler_declared_cap_seconds)" "matcher" (printf ",pool=%q" .pool)) -}}
{{- printf "min(label_replace(%s, \"limit\", \"queue\", \"\", \"\") or label_replace(%s, \"limit\", \"declared work\", \"\", \"\"))" $queue $cap -}}
{{- end -}}

{{/* prometheus-operator's relabelings that give a target this release's labels. */}}
{{- define "sonicsite.monitorRelabelings" -}}
- action: replace
  targetLabel: namespace
  replacement: {{ .Release.Namespace | quote }}
- action: replace
  targetLabel: release
  replacement: {{ .Release.Name | quote }}
{{- end -}}

{{/* The chart's own Prometheus: relabel_configs that give a target this release's labels. */}}
{{- define "sonicsite.scrapeRelabelConfigs" -}}
- target_label: namespace
  replacement: {{ .Release.Namespace | quote }}
- target_label: release
  replacement: {{ .Release.Name | quote }}
{{- end -}}

{{/* A ServiceMonitor for prometheus-operator on a component's `http` Service port: its
Service alone, not a headless twin (the gateway's `-pods`, labelled sonicsite.io/service),
which would scrape every pod twice. */}}
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
    matchExpressions:
      - key: sonicsite.io/service
        operator: DoesNotExist
  endpoints:
    - port: http
      path: /metrics
      interval: {{ $m.interval }}
      relabelings:
        {{- include "sonicsite.monitorRelabelings" .root | nindent 8 }}
{{- end -}}

{{/* Fails the render where the NetworkPolicy would block the scrapes of the site's
Prometheus, outside the release, that the chart relies on: the policy admits no pod outside
the release to the metrics ports but networkPolicy.metricsFrom (the chart's own Prometheus, a
release pod, is always admitted). Relied on: prometheus-operator's monitors (for the site's
Prometheus), and KEDA's query at monitoring.prometheusAddress (the site's Prometheus, whatever
its scraping: by annotation, a static job), empty without Triton's series, so that no server
is ever added; unless the chart's own Prometheus runs too (a site's Prometheus may read the
release's series from it, e.g. by federation, which the policy does not block). */}}
{{- define "sonicsite.metricsFromChecked" -}}
{{- $np := .Values.networkPolicy -}}
{{- $m := .Values.monitoring -}}
{{- $example := "[{namespaceSelector: {matchLabels: {kubernetes.io/metadata.name: monitoring}}, podSelector: {matchLabels: {app.kubernetes.io/name: prometheus}}}]" -}}
{{- if and $np.enabled (not $np.metricsFrom) -}}
{{- if $m.prometheusOperator.enabled -}}
{{- fail (printf "networkPolicy.metricsFrom: expected the site's Prometheus with monitoring.prometheusOperator.enabled, got none: the PodMonitor and ServiceMonitors are scraped by a Prometheus outside the release, which networkPolicy.enabled keeps off the metrics ports unless listed there; set networkPolicy.metricsFrom to its pods, e.g. %s (or networkPolicy.enabled false)" $example) -}}
{{- end -}}
{{- if and .Values.autoscaling.enabled $m.prometheusAddress (not $m.prometheus.enabled) -}}
{{- fail (printf "networkPolicy.metricsFrom: expected the site's Prometheus with autoscaling.enabled and monitoring.prometheusAddress (%s), got none: KEDA asks that Prometheus for Triton's queue time, and networkPolicy.enabled keeps it off the metrics ports unless listed there (it scrapes from outside the release, by monitoring.scrapeAnnotations or a job of its own), so KEDA's query would stay empty and never add a server; set networkPolicy.metricsFrom to its pods, e.g. %s (or networkPolicy.enabled false)" $m.prometheusAddress $example) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Prometheus that KEDA queries: given, or the chart's own. */}}
{{- define "sonicsite.prometheusAddress" -}}
{{- if .Values.monitoring.prometheusAddress -}}
{{- .Values.monitoring.prometheusAddress -}}
{{- else if .Values.monitoring.prometheus.enabled -}}
{{- printf "http://%s.%s.svc:9090" (include "sonicsite.component" (dict "root" . "component" "prometheus")) .Release.Namespace -}}
{{- end -}}
{{- end -}}

{{/* The TriggerAuthentication's name: KEDA's credentials for monitoring.prometheusAddress. */}}
{{- define "sonicsite.prometheusAuthName" -}}
{{- printf "%s-prometheus" (include "sonicsite.component" (dict "root" . "component" "triton")) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* A KEDA Prometheus trigger's authentication metadata (values monitoring.prometheusAuth). */}}
{{- define "sonicsite.kedaAuth" -}}
{{- $auth := .Values.monitoring.prometheusAuth -}}
{{- if $auth.modes }}
authModes: {{ join "," $auth.modes | quote }}
{{- end }}
{{- if $auth.unsafeSsl }}
unsafeSsl: "true"
{{- end }}
{{- end -}}

{{/* A KEDA trigger's authenticationRef, where monitoring.prometheusAuth has modes. */}}
{{- define "sonicsite.kedaAuthRef" -}}
{{- if .Values.monitoring.prometheusAuth.modes }}
authenticationRef:
  name: {{ include "sonicsite.prometheusAuthName" . }}
{{- end }}
{{- end -}}

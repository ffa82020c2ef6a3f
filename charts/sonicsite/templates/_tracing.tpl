{{/*
Tracing (values `tracing`): the OTLP/HTTP traces URL every part exports to, and each part's
arguments. Envoy gets its OpenTelemetry tracer from the operator over xDS
(operator/xds_tracing.py); Triton's trace settings are on its command line (the trace
protocol is restricted, nobody changes them at run time), as the local site sets them
(sonicsite/local/tracing.py).
*/}}
{{- define "sonicsite.tracesUrl" -}}
{{- $t := .Values.tracing -}}
{{- if $t.endpoint -}}
{{- printf "%s/v1/traces" (trimSuffix "/" $t.endpoint) -}}
{{- else if $t.collector.enabled -}}
{{- printf "http://%s.%s.svc:4318/v1/traces" (include "sonicsite.component" (dict "root" . "component" "otel-collector")) .Release.Namespace -}}
{{- else -}}
{{- fail "tracing.enabled: expected tracing.endpoint (the site's OTLP/HTTP endpoint) or tracing.collector.enabled (the chart's collector)" -}}
{{- end -}}
{{- end -}}

{{- define "sonicsite.tritonTraceArgs" -}}
{{- $t := .Values.tracing -}}
- --trace-config=mode=opentelemetry
- --trace-config=level={{ $t.tritonLevel }}
- --trace-config=rate={{ int64 $t.sampling.tritonRate }}
- --trace-config=count=-1
- --trace-config=opentelemetry,url={{ include "sonicsite.tracesUrl" . }}
- --trace-config=opentelemetry,resource=service.name=sonicsite-triton
{{- end -}}

{{- define "sonicsite.operatorTraceArgs" -}}
- --tracing-endpoint={{ include "sonicsite.tracesUrl" . }}
- --tracing-sampling={{ .Values.tracing.sampling.envoyPercent }}
- --tracing-service-name=sonicsite-envoy
{{- end -}}

{{- define "sonicsite.gatewayTraceArgs" -}}
- --tracing-endpoint={{ include "sonicsite.tracesUrl" . }}
- --tracing-sampling={{ .Values.tracing.sampling.gatewayRatio }}
- --tracing-service-name=sonicsite-gateway
{{- end -}}

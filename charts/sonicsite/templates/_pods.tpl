{{/* What every component's pod shares: probes on the chart's paths with the site's timings,
and placement (node selector, tolerations, affinity, priority class). */}}

{{/* One httpGet probe: the chart's path and port, the timings from values. */}}
{{- define "sonicsite.probe" -}}
httpGet:
  path: {{ .path }}
  port: {{ .port }}
{{- with .timing }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* A pod's placement from a component's values. */}}
{{- define "sonicsite.placement" -}}
{{- with .priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with .nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The Secret an Ingress's TLS uses: the site's, or the one cert-manager writes (""
when TLS is off). `.` is (dict "root" $ "component" name "ingress" values). */}}
{{- define "sonicsite.ingressTlsSecret" -}}
{{- $tls := .ingress.tls -}}
{{- if $tls.secretName -}}
{{- $tls.secretName -}}
{{- else if $tls.certManager.enabled -}}
{{- printf "%s-tls" (include "sonicsite.component" .) -}}
{{- end -}}
{{- end -}}

{{/* An Ingress for a component's Service port (Envoy's gRPC, the gateway's HTTP), with TLS
from a Secret or from cert-manager: its issuer annotations (ingress-shim), or a Certificate
(sonicsite.certificate). */}}
{{- define "sonicsite.ingress" -}}
{{- $i := .ingress -}}
{{- $where := printf "%s.ingress" .component -}}
{{- $host := required (printf "%s.host: expected a host name" $where) $i.host -}}
{{- $secret := include "sonicsite.ingressTlsSecret" . -}}
{{- $cm := $i.tls.certManager -}}
{{- $annotations := deepCopy ($i.annotations | default dict) -}}
{{- if and $cm.enabled (eq $cm.mode "annotation") -}}
{{- $issuer := required (printf "%s.tls.certManager.issuer.name: expected a cert-manager issuer" $where) $cm.issuer.name -}}
{{- if and (eq $cm.issuer.kind "ClusterIssuer") (eq $cm.issuer.group "cert-manager.io") -}}
{{- $_ := set $annotations "cert-manager.io/cluster-issuer" $issuer -}}
{{- else -}}
{{- $_ := set $annotations "cert-manager.io/issuer" $issuer -}}
{{- if ne $cm.issuer.kind "Issuer" -}}
{{- $_ := set $annotations "cert-manager.io/issuer-kind" $cm.issuer.kind -}}
{{- end -}}
{{- if ne $cm.issuer.group "cert-manager.io" -}}
{{- $_ := set $annotations "cert-manager.io/issuer-group" $cm.issuer.group -}}
{{- end -}}
{{- end -}}
{{- end -}}
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata:
  name: {{ include "sonicsite.component" . }}
  labels:
    {{- include "sonicsite.labels" . | nindent 4 }}
  {{- with $annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
  {{- end }}
spec:
  {{- with $i.className }}
  ingressClassName: {{ . }}
  {{- end }}
  {{- if $secret }}
  tls:
    - hosts: [{{ $host | quote }}]
      secretName: {{ $secret }}
  {{- end }}
  rules:
    - host: {{ $host | quote }}
      http:
        paths:
          - path: /
            pathType: Prefix
            backend:
              service:
                name: {{ include "sonicsite.component" . }}
                port:
                  name: {{ .port }}
{{- end -}}

{{/* cert-manager's Certificate for an Ingress's host (tls.certManager.mode certificate). */}}
{{- define "sonicsite.certificate" -}}
{{- $i := .ingress -}}
{{- $cm := $i.tls.certManager -}}
{{- $where := printf "%s.ingress" .component -}}
apiVersion: cert-manager.io/v1
kind: Certificate
metadata:
  name: {{ include "sonicsite.component" . }}
  labels:
    {{- include "sonicsite.labels" . | nindent 4 }}
spec:
  secretName: {{ include "sonicsite.ingressTlsSecret" . }}
  dnsNames:
    - {{ required (printf "%s.host: expected a host name" $where) $i.host | quote }}
  issuerRef:
    name: {{ required (printf "%s.tls.certManager.issuer.name: expected a cert-manager issuer" $where) $cm.issuer.name }}
    kind: {{ $cm.issuer.kind }}
    group: {{ $cm.issuer.group }}
  privateKey:
    rotationPolicy: Always
{{- end -}}

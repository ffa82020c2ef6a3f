{{/* The site's identity provider (envoy.jwt): checked once for every component that uses
it (Envoy through the operator's listener, the gateway: sonicsite.gatewayJwt). */}}
{{- define "sonicsite.jwtChecked" -}}
{{- $j := .Values.envoy.jwt -}}
{{- if or $j.enabled (and .Values.gateway.enabled .Values.gateway.auth.enabled .Values.gateway.auth.jwt) -}}
{{- $_ := required "envoy.jwt.issuer: expected the tokens' issuer" $j.issuer -}}
{{- if and $j.jwksUri $j.jwksSecret -}}
{{- fail "envoy.jwt: expected jwksUri or jwksSecret, not both" -}}
{{- end -}}
{{- if not (or $j.jwksUri $j.jwksSecret) -}}
{{- fail "envoy.jwt: expected the issuer's keys: jwksUri (fetched, rotated keys taken up) or jwksSecret (a Secret with key jwks.json)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Whether the gateway checks the identity provider's JWTs (envoy.jwt's issuer, audiences
and keys): always with envoy.jwt on, so that its HTTP port (KServe inference, REST through
Envoy) is no way around the JWTs Envoy asks for, as the local site's `up --jwt-*` hands both
the same settings (sonicsite/local/control_plane.py gateway_jwt_args); with envoy.jwt off, where
gateway.auth.jwt asks for them. */}}
{{- define "sonicsite.gatewayJwt" -}}
{{- $a := .Values.gateway.auth -}}
{{- if or .Values.envoy.jwt.enabled (and $a.enabled $a.jwt) }}true{{ end -}}
{{- end -}}

{{/* Whether the gateway reads bearer tokens from a file (the chart's Secret or the site's). */}}
{{- define "sonicsite.gatewayTokens" -}}
{{- $a := .Values.gateway.auth -}}
{{- if and $a.enabled (or $a.existingSecret $a.tokens) }}true{{ end -}}
{{- end -}}

{{/* The chart's name (values nameOverride, else the chart's): the app.kubernetes.io/name
label, and the fullname's suffix. */}}
{{- define "sonicsite.name" -}}
{{- .Values.nameOverride | default .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The release's name for every object, at most 63 characters, as community charts make it:
values fullnameOverride; else <release>-<name>, or the release's name alone where it already
contains the name (so that releases named hep and hep-sonicsite would share every name: one
of them sets fullnameOverride). Every object's name and every address of one is built from
it (sonicsite.component), never spelt out. */}}
{{- define "sonicsite.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "sonicsite.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* One component's name: <fullname>-<component><suffix> (a pool's "-<pool>", "-pods"), at
most 63 characters: only the fullname is shortened, the component and suffix are kept whole,
so that no two objects share a name however long the release's is (cutting the whole name
cut the component off, and from 46 characters Envoy's Services, then the Deployments, got
one name). */}}
{{- define "sonicsite.component" -}}
{{- $tail := printf "-%s%s" .component (.suffix | default "") -}}
{{- $full := include "sonicsite.fullname" .root | trunc (sub 63 (len $tail) | int) | trimSuffix "-" -}}
{{- printf "%s%s" $full $tail -}}
{{- end -}}

{{- define "sonicsite.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .root.Chart.Name .root.Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .root.Release.Service }}
app.kubernetes.io/version: {{ .root.Chart.AppVersion | quote }}
{{ include "sonicsite.selectorLabels" . }}
{{- end -}}

{{- define "sonicsite.selectorLabels" -}}
app.kubernetes.io/name: {{ include "sonicsite.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{/* A Deployment's pod template labels: the selector's alone, none that changes with the
chart's version (helm.sh/chart, app.kubernetes.io/version), so that an upgrade rolls only the
pods whose spec changed (a pool's Deployment adds its pool label). */}}
{{- define "sonicsite.podLabels" -}}
{{- include "sonicsite.selectorLabels" . -}}
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

{{/* Pod security for every pod: non-root as `uid` (its group too), and "groups" (a list,
optional) as supplementalGroups (Triton's triton.supplementalGroups: the nodes' GPU device
groups). */}}
{{- define "sonicsite.podSecurity" -}}
runAsNonRoot: true
runAsUser: {{ .uid }}
runAsGroup: {{ .uid }}
fsGroup: {{ .uid }}
{{- with .groups }}
supplementalGroups:
  {{- toYaml . | nindent 2 }}
{{- end }}
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
{{/* A pool's Deployment, headless Service and ScaledObject. Takes (dict "root" $ "pool" POOL),
POOL an entry of _triton.tpl sonicsite.tritonPools. */}}
{{- define "sonicsite.tritonPoolName" -}}
{{- include "sonicsite.component" (dict "root" .root "component" "triton" "suffix" .pool.suffix) -}}
{{- end -}}
{{/* The gateway's headless Service, one address per pod (for the chart's Prometheus). */}}
{{- define "sonicsite.gatewayPodsService" -}}
{{- include "sonicsite.component" (dict "root" . "component" "gateway" "suffix" "-pods") -}}
{{- end -}}

{{/* Envoy's headless Service of its stats port, one address per pod (for the chart's
Prometheus). */}}
{{- define "sonicsite.envoyMetricsService" -}}
{{- include "sonicsite.component" (dict "root" . "component" "envoy-metrics") -}}
{{- end -}}

{{/* Envoy's bootstrap as JSON, the same few lines as the local site's
(sonicsite/local/envoy.py): the admin port and where the operator's ADS stream is (gRPC over
HTTP/2); listeners, routes, clusters and endpoints come over that stream. The ConfigMap holds
it; the Deployment's checksum annotation rolls the pods when it changes. The node id here is
shared; each pod runs with its own name as its node id instead (`--service-node $(POD_NAME)`
in envoy-deployment.yaml, from the downward API). */}}
{{- define "sonicsite.envoyBootstrap" -}}
{{- $e := .Values.envoy -}}
{{- $ads := dict "ads" (dict) "resource_api_version" "V3" -}}
{{- $adsConfig := dict "api_type" "GRPC" "transport_api_version" "V3" "grpc_services" (list (dict "envoy_grpc" (dict "cluster_name" "sonicsite_operator" "retry_policy" (dict "retry_back_off" (dict "base_interval" "0.25s" "max_interval" "2s"))))) "set_node_on_first_message_only" true -}}
{{- $http2 := dict "envoy.extensions.upstreams.http.v3.HttpProtocolOptions" (dict "@type" "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions" "explicit_http_config" (dict "http2_protocol_options" (dict))) -}}
{{- $operator := dict "address" (include "sonicsite.operatorHost" .) "port_value" (int .Values.operator.xdsPort) -}}
{{- $bootstrap := dict
  "node" (dict "id" "sonicsite-envoy" "cluster" "sonicsite")
  "admin" (dict "address" (dict "socket_address" (dict "address" "127.0.0.1" "port_value" (int $e.adminPort))))
  "dynamic_resources" (dict "ads_config" $adsConfig "lds_config" $ads "cds_config" $ads)
  "static_resources" (dict "clusters" (list (dict
    "name" "sonicsite_operator"
    "type" "STRICT_DNS"
    "connect_timeout" "1s"
    "typed_extension_protocol_options" $http2
    "load_assignment" (dict "cluster_name" "sonicsite_operator" "endpoints" (list (dict "lb_endpoints" (list (dict "endpoint" (dict "address" (dict "socket_address" $operator))))))))))
-}}
{{- toJson $bootstrap -}}
{{- end -}}

{{/* Envoy's stats for Prometheus, merged into the bootstrap by the Deployment's
`--config-yaml` (so the bootstrap stays the local site's): a listener on the pod's network
(envoy.metricsPort) whose one route sends GET /stats/prometheus to the admin interface, which
stays on the loopback; every other path and method is a 404 from the listener itself, so no
other admin endpoint (config dumps, /quitquitquit, log levels) is reachable from outside the
pod. Static resources: the operator's xDS neither sees nor replaces them. */}}
{{- define "sonicsite.envoyStatsConfig" -}}
{{- $e := .Values.envoy -}}
{{- $admin := "sonicsite_envoy_admin" -}}
{{- $get := dict "name" ":method" "string_match" (dict "exact" "GET") -}}
{{- $routes := list
  (dict "match" (dict "path" "/stats/prometheus" "headers" (list $get)) "route" (dict "cluster" $admin))
  (dict "match" (dict "prefix" "/") "direct_response" (dict "status" 404 "body" (dict "inline_string" "Envoy's stats port serves GET /stats/prometheus only\n")))
-}}
{{- $hcm := dict
  "@type" "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"
  "stat_prefix" "sonicsite_stats"
  "route_config" (dict "name" "sonicsite_stats" "virtual_hosts" (list (dict "name" "stats" "domains" (list "*") "routes" $routes)))
  "http_filters" (list (dict "name" "envoy.filters.http.router" "typed_config" (dict "@type" "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router")))
-}}
{{- $listener := dict
  "name" "sonicsite_stats"
  "address" (dict "socket_address" (dict "address" "0.0.0.0" "port_value" (int $e.metricsPort)))
  "filter_chains" (list (dict "filters" (list (dict "name" "envoy.filters.network.http_connection_manager" "typed_config" $hcm))))
-}}
{{- $cluster := dict
  "name" $admin
  "type" "STATIC"
  "connect_timeout" "1s"
  "load_assignment" (dict "cluster_name" $admin "endpoints" (list (dict "lb_endpoints" (list (dict "endpoint" (dict "address" (dict "socket_address" (dict "address" "127.0.0.1" "port_value" (int $e.adminPort)))))))))
-}}
{{- toJson (dict "static_resources" (dict "listeners" (list $listener) "clusters" (list $cluster))) -}}
{{- end -}}

{{/* The Secret holding the gateway's tokens: given, or the one the chart creates. */}}
{{- define "sonicsite.gatewayTokensSecret" -}}
{{- .Values.gateway.auth.existingSecret | default (printf "%s-tokens" (include "sonicsite.component" (dict "root" . "component" "gateway"))) -}}
{{- end -}}

{{/* The Secret holding the administrative key of Triton's restricted protocols. */}}
{{- define "sonicsite.adminKeySecret" -}}
{{- .Values.triton.adminKey.existingSecret | default (printf "%s-admin-key" (include "sonicsite.component" (dict "root" . "component" "triton"))) -}}
{{- end -}}

{{/* The Secret holding the key of the admission passes (the operator's and the gateway's). */}}
{{- define "sonicsite.admissionKeySecret" -}}
{{- .Values.operator.admission.passKey.existingSecret | default (printf "%s-admission-key" (include "sonicsite.component" (dict "root" . "component" "operator"))) -}}
{{- end -}}

{{/* Every pod of the release, whatever its component (for NetworkPolicy peers). */}}
{{- define "sonicsite.releasePods" -}}
{{- toYaml (dict "app.kubernetes.io/instance" .Release.Name "app.kubernetes.io/name" (include "sonicsite.name" .)) -}}
{{- end -}}

{{/* A NetworkPolicy ingress rule admitting a LoadBalancer Service's allowed source ranges
(`loadBalancerSourceRanges`) to a container port; nothing unless the Service is a
LoadBalancer with ranges. The ranges are matched against the packets' source address, which
is the client's only with externalTrafficPolicy Local: with Cluster a node forwards the
connection with its own address as the source (SNAT), no range matches it, and every client
of the load balancer would be refused; so the render fails, naming the value. Takes (dict
"service" SERVICE-VALUES "port" PORT "where" "envoy.service"). */}}
{{- define "sonicsite.loadBalancerRule" -}}
{{- if and (eq .service.type "LoadBalancer") .service.loadBalancerSourceRanges -}}
{{- if ne .service.externalTrafficPolicy "Local" -}}
{{- fail (printf "%s.externalTrafficPolicy: expected Local with %s.loadBalancerSourceRanges and networkPolicy.clients, got %s: the NetworkPolicy admits the load balancer's clients by their source ranges, and with Cluster a node forwards each connection with its own address as the source, so every one of them would be refused; set %s.externalTrafficPolicy to Local (or leave networkPolicy.clients empty, which admits any source)" .where .where (.service.externalTrafficPolicy | default "unset") .where) -}}
{{- end -}}
- from:
    {{- range .service.loadBalancerSourceRanges }}
    - ipBlock:
        cidr: {{ . | quote }}
    {{- end }}
  ports:
    - port: {{ .port }}
{{- end -}}
{{- end -}}

{{/* Fails the render where a Service for clients outside the cluster (LoadBalancer,
NodePort) would admit none of them: with networkPolicy.clients the entry NetworkPolicy admits
those peers and the release's pods alone, so an outside client gets in only by its address,
a LoadBalancer's loadBalancerSourceRanges (sonicsite.loadBalancerRule) or an ipBlock among the
clients, and only where the Service keeps that address (externalTrafficPolicy Local). No rule
can admit "every outside client" without opening the port to every pod too (the chart does
not know the cluster's pod addresses), so the chart refuses rather than guess. Takes (dict
"service" SERVICE-VALUES "where" "envoy.service" "what" "Envoy" "clients" PEERS). */}}
{{- define "sonicsite.outsideClientsChecked" -}}
{{- $s := .service -}}
{{- if and .clients (has $s.type (list "LoadBalancer" "NodePort")) -}}
{{- $ranges := and (eq $s.type "LoadBalancer") $s.loadBalancerSourceRanges -}}
{{- $blocks := false -}}
{{- range .clients }}{{ if .ipBlock }}{{ $blocks = true }}{{ end }}{{ end -}}
{{- $admitted := "networkPolicy.clients and the release's pods alone" -}}
{{- if not (or $ranges $blocks) -}}
{{- if eq $s.type "LoadBalancer" -}}
{{- fail (printf "%s.type: LoadBalancer with networkPolicy.clients, and no address of the load balancer's clients admitted: the NetworkPolicy admits %s to %s, so every client from outside the cluster would be refused; set %s.loadBalancerSourceRanges to their address ranges (with %s.externalTrafficPolicy Local, which keeps their addresses), or list them in networkPolicy.clients as ipBlock peers, or leave networkPolicy.clients empty (any source)" .where $admitted .what .where .where) -}}
{{- else -}}
{{- fail (printf "%s.type: NodePort with networkPolicy.clients, and no address of its clients admitted: the NetworkPolicy admits %s to %s, so every client from outside the cluster would be refused; list their address ranges in networkPolicy.clients as ipBlock peers (with %s.externalTrafficPolicy Local, which keeps their addresses), or leave networkPolicy.clients empty (any source)" .where $admitted .what .where) -}}
{{- end -}}
{{- end -}}
{{- if and $blocks (not $ranges) (ne $s.externalTrafficPolicy "Local") -}}
{{- fail (printf "%s.externalTrafficPolicy: expected Local with %s.type %s and ipBlock peers in networkPolicy.clients, got %s: the NetworkPolicy admits the outside clients by their addresses, and with Cluster a node forwards each connection with its own address as the source, so every one of them would be refused; set %s.externalTrafficPolicy to Local (or leave networkPolicy.clients empty, which admits any source)" .where .where $s.type ($s.externalTrafficPolicy | default "unset") .where) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Fails the render when two ports of one pod or one Service are the same number: a
process cannot bind a port its pod already binds (Envoy's admin interface on the loopback
included: a listener on 0.0.0.0 cannot share its port), and the API server refuses a Service
that lists a port twice. Takes (dict "ports" (list (list VALUE-NAME PORT) ...) "why" WHY),
WHY saying what shares them; the first of a pair is the one named first. */}}
{{- define "sonicsite.distinctPorts" -}}
{{- $ports := .ports -}}
{{- range $i, $a := $ports -}}
{{- range $b := slice $ports (add $i 1 | int) -}}
{{- if eq (index $a 1 | int) (index $b 1 | int) -}}
{{- fail (printf "%s: expected a port of its own, not %v, which %s is too (%s): set %s or %s to another port" (index $a 0) (index $a 1) (index $b 0) $.why (index $a 0) (index $b 0)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A pod spec's imagePullSecrets (values imagePullSecrets), for every pod of the chart:
the registry's credentials cover the sonicsite image and the others alike. */}}
{{- define "sonicsite.imagePullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* A key the chart makes once and keeps: the one already in the release's Secret (kept
across upgrades, and by helm.sh/resource-policy past an uninstall), else 48 random
characters. Takes (dict "root" $ "secret" NAME "key" KEY). */}}
{{- define "sonicsite.persistentKey" -}}
{{- $found := lookup "v1" "Secret" .root.Release.Namespace .secret -}}
{{- if and $found $found.data (index $found.data .key) -}}
{{- index $found.data .key | b64dec -}}
{{- else -}}
{{- randAlphaNum 48 -}}
{{- end -}}
{{- end -}}

{{/* The prometheus.io/* annotations of a pod (monitoring.scrapeAnnotations), for a
Prometheus that discovers targets by them. Takes (dict "root" $ "port" PORT), and "path"
where it is not /metrics (Envoy's /stats/prometheus). */}}
{{- define "sonicsite.scrapeAnnotations" -}}
{{- if .root.Values.monitoring.scrapeAnnotations -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: {{ .path | default "/metrics" }}
{{- end -}}
{{- end -}}

{{/* A Kubernetes quantity (values' `$defs/quantity`: a number, or a string such as "500m",
"1.5", "4Gi", "1e3", "2G") as a float64 number of units, for comparing two quantities, never
for rendering one. A decimal suffix (m k M G T P E) is written as an exponent and parsed, so
that "1100m" and "1.1" are the same number, as they are to Kubernetes; a binary one (Ki Mi Gi
Ti Pi Ei) multiplies by a power of 1024, which is exact. Two quantities that differ by less
than a float64's precision (about 1 in 10^16) compare as equal. */}}
{{- define "sonicsite.quantityValue" -}}
{{- $q := .quantity -}}
{{- if not (kindIs "string" $q) -}}
{{- float64 $q -}}
{{- else -}}
{{- $decimal := dict "m" -3 "k" 3 "M" 6 "G" 9 "T" 12 "P" 15 "E" 18 -}}
{{- $binary := dict "Ki" 1 "Mi" 2 "Gi" 3 "Ti" 4 "Pi" 5 "Ei" 6 -}}
{{- $suffix := regexFind "(Ki|Mi|Gi|Ti|Pi|Ei|m|k|M|G|T|P|E)$" $q -}}
{{- $number := trimSuffix $suffix $q -}}
{{- if hasKey $binary $suffix -}}
{{- $value := float64 $number -}}
{{- range until (get $binary $suffix | int) }}{{ $value = mulf $value 1024 }}{{ end -}}
{{- $value -}}
{{- else if $suffix -}}
{{- float64 (printf "%se%d" $number (get $decimal $suffix | int)) -}}
{{- else -}}
{{- float64 $q -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* Fails the render where a container's request is above its limit for one resource
(cpu, memory, any other), which Kubernetes refuses only when the pod is created (the
Deployment is accepted and its ReplicaSet never makes a pod), naming the values path and
both quantities. A request with no limit, or a limit with no request, passes (Kubernetes
takes an unset request as the limit). Takes (dict "resources" RESOURCES "where"
"envoy.resources"). */}}
{{- define "sonicsite.resourcesChecked" -}}
{{- $r := .resources | default dict -}}
{{- $limits := $r.limits | default dict -}}
{{- range $resource, $asked := ($r.requests | default dict) -}}
{{- if hasKey $limits $resource -}}
{{- $limit := get $limits $resource -}}
{{- $a := include "sonicsite.quantityValue" (dict "quantity" $asked) | float64 -}}
{{- $l := include "sonicsite.quantityValue" (dict "quantity" $limit) | float64 -}}
{{- if gt $a $l -}}
{{- fail (printf "%s.requests.%s: expected at most %s.limits.%s (%v), got %v: Kubernetes refuses a container whose request is above its limit, only when it creates the pod (the Deployment is accepted, and no pod ever starts); lower the request or raise the limit" $.where $resource $.where $resource $limit $asked) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The models the `helm test` pod asks Envoy for, as YAML {models: [...], skipped: [{model,
pool}, ...]}: tests.models (default triton.models) less those of pools parked at 0 servers,
which have no server to answer, on purpose: replicas 0 without autoscaling (nothing starts
a server), minReplicas 0 with it (KEDA scales the pool to zero when idle; a request held for
it waits for a server to start and load the model, which may take longer than the hold).
A model that tests.models names in a pool KEDA scales from zero is asked all the same (the
site's choice: its request wakes the pool); one of a pool parked without autoscaling never
is (nothing would answer it). A pool's models are its pinned ones, or for the pool that
names none, every model no other pool names; without `pools`, every model is in the one
pool (default). */}}
{{- define "sonicsite.testModels" -}}
{{- $autoscaling := .Values.autoscaling.enabled -}}
{{- $owner := dict -}}
{{- range (include "sonicsite.tritonPools" . | fromYaml).pools -}}
{{- $parked := eq (ternary .minReplicas .replicas $autoscaling | int) 0 -}}
{{- $pool := . -}}
{{- range $.Values.triton.models -}}
{{- if or (has . $pool.models) (and (not $pool.models) (not (has . $pool.pinned))) -}}
{{- $_ := set $owner . (dict "pool" $pool.name "parked" $parked) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- $models := list -}}
{{- $skipped := list -}}
{{- range (.Values.tests.models | default .Values.triton.models) -}}
{{- $in := get $owner . | default dict -}}
{{- if and $in.parked (not (and $autoscaling (has . $.Values.tests.models))) -}}
{{- $skipped = append $skipped (dict "model" . "pool" $in.pool) -}}
{{- else -}}
{{- $models = append $models . -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "models" $models "skipped" $skipped) -}}
{{- end -}}

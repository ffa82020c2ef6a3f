{{/* Triton's model repositories (triton.modelRepositories) as one YAML object, computed once
for the Deployment: `args` (one --model-repository each), `volumes`, `mounts`, `envFrom` (the
S3 credentials), `demo` (the demo entry's volume and models, if any) and `cvmfsClaim` (the
claim the chart makes, if any). CVMFS repositories share one volume (cvmfs-csi's automount,
or a node's autofs /cvmfs), each mounted at /cvmfs/<repository> with HostToContainer
propagation, so that the configured repository is the one Triton reads; every other
repository gets a volume of its own at /models/<index>. */}}
{{- define "sonicsite.tritonRepositories" -}}
{{- $t := .Values.triton -}}
{{- $args := list -}}
{{- $volumes := list -}}
{{- $mounts := list -}}
{{- $cvmfs := list -}}
{{- $secrets := list -}}
{{- $demo := dict -}}
{{- range $i, $r := $t.modelRepositories -}}
{{- $where := printf "triton.modelRepositories[%d]" $i -}}
{{- $sub := trimAll "/" ($r.subPath | default "") -}}
{{- if has ".." (splitList "/" $sub) -}}
{{- fail (printf "%s.subPath: expected a path inside the volume, got %q" $where $r.subPath) -}}
{{- end -}}
{{- $path := "" -}}
{{- if eq $r.source "s3" -}}
{{- $path = $r.url -}}
{{- with $r.credentialsSecret }}{{ $secrets = append $secrets . | uniq }}{{ end -}}
{{- else if eq $r.source "cvmfs" -}}
{{- if not (has $r.repository $cvmfs) }}{{ $cvmfs = append $cvmfs $r.repository }}{{ end -}}
{{- $path = printf "/cvmfs/%s" $r.repository -}}
{{- else -}}
{{- $name := printf "models-%d" $i -}}
{{- $path = printf "/models/%d" $i -}}
{{- $volume := dict "name" $name -}}
{{- if eq $r.source "demo" -}}
{{- if $demo -}}
{{- fail (printf "%s: expected one demo repository at most" $where) -}}
{{- end -}}
{{- $_ := set $volume "emptyDir" dict -}}
{{- $known := include "sonicsite.demoModels" . | splitList " " -}}
{{- /* by default triton.models; beside other repositories, those of them it can build */ -}}
{{- $default := $t.models -}}
{{- if gt (len $t.modelRepositories) 1 -}}
{{- $default = list -}}
{{- range $t.models }}{{ if has . $known }}{{ $default = append $default . }}{{ end }}{{ end -}}
{{- end -}}
{{- $demo = dict "volume" $name "models" ($r.models | default $default) "framework" ($r.framework | default "onnx") "where" $where -}}
{{- range $demo.models }}{{ if not (has . $known) -}}
{{- fail (printf "%s: %s is not a demo model (its init container builds only %s); a site's own models come from another source" $where . (join ", " $known)) -}}
{{- end }}{{ end -}}
{{- else if eq $r.source "pvc" -}}
{{- $_ := set $volume "persistentVolumeClaim" (dict "claimName" $r.claimName "readOnly" true) -}}
{{- else if eq $r.source "nfs" -}}
{{- $_ := set $volume "nfs" (dict "server" $r.server "path" $r.path "readOnly" true) -}}
{{- else if eq $r.source "hostPath" -}}
{{- $_ := set $volume "hostPath" (dict "path" $r.path "type" "Directory") -}}
{{- end -}}
{{- $volumes = append $volumes $volume -}}
{{- $mounts = append $mounts (dict "name" $name "mountPath" $path "readOnly" (ne $r.source "demo")) -}}
{{- end -}}
{{- if and $sub (ne $r.source "s3") }}{{ $path = printf "%s/%s" $path $sub }}{{ end -}}
{{- $args = append $args (printf "--model-repository=%s" $path) -}}
{{- end -}}
{{- /* the demo repository as Triton's only one: every model Triton loads (triton.models, at
       start or by the operator on demand) must be among those its init container builds */ -}}
{{- if and $demo (eq (len $t.modelRepositories) 1) -}}
{{- $missing := list -}}
{{- range $t.models }}{{ if not (has . $demo.models) }}{{ $missing = append $missing . }}{{ end }}{{ end -}}
{{- if $missing -}}
{{- fail (printf "%s.models: expected every model of triton.models, got %s: the demo repository is Triton's only one and its init container builds these alone, so %s would be in no repository and never load; add them, or leave models out (default: triton.models)" $demo.where (join ", " $demo.models) (join ", " $missing)) -}}
{{- end -}}
{{- end -}}
{{- if gt (len $secrets) 1 -}}
{{- fail (printf "triton.modelRepositories: expected one credentialsSecret for every s3 repository (Triton reads one set of AWS_* variables), got %s" (join ", " $secrets)) -}}
{{- end -}}
{{- $claim := "" -}}
{{- if and $t.cvmfs.hostPath $t.cvmfs.existingClaim -}}
{{- fail (printf "triton.cvmfs: expected hostPath or existingClaim, not both (got hostPath %q and existingClaim %q): CVMFS comes from one volume, a node's autofs or a claim; leave the other empty" $t.cvmfs.hostPath $t.cvmfs.existingClaim) -}}
{{- end -}}
{{- if $cvmfs -}}
{{- $c := $t.cvmfs -}}
{{- if $c.hostPath -}}
{{- $volumes = append $volumes (dict "name" "cvmfs" "hostPath" (dict "path" $c.hostPath "type" "Directory")) -}}
{{- else -}}
{{- $claim = $c.existingClaim | default (include "sonicsite.component" (dict "root" . "component" "cvmfs")) -}}
{{- $volumes = append $volumes (dict "name" "cvmfs" "persistentVolumeClaim" (dict "claimName" $claim "readOnly" true)) -}}
{{- if $c.existingClaim }}{{ $claim = "" }}{{ end -}}
{{- end -}}
{{- range $cvmfs -}}
{{- $mounts = append $mounts (dict "name" "cvmfs" "mountPath" (printf "/cvmfs/%s" .) "subPath" . "readOnly" true "mountPropagation" "HostToContainer") -}}
{{- end -}}
{{- end -}}
{{- $envFrom := list -}}
{{- range $secrets }}{{ $envFrom = append $envFrom (dict "secretRef" (dict "name" .)) }}{{ end -}}
{{- toYaml (dict "args" $args "volumes" $volumes "mounts" $mounts "envFrom" $envFrom "demo" $demo "cvmfsClaim" $claim) -}}
{{- end -}}

{{/* The tritonserver arguments the chart sets from its own values: refused in
triton.extraArgs, so that model control stays explicit and the operator's, and the
restricted protocols stay keyed by the operator's key. */}}
{{- define "sonicsite.tritonOwnArgs" -}}
{{- $owned := dict
  "--model-repository" "set triton.modelRepositories instead"
  "--model-store" "set triton.modelRepositories instead"
  "--model-control-mode" "model control stays explicit, with the operator"
  "--load-model" "set triton.models instead"
  "--http-port" "set triton.ports.http instead"
  "--grpc-port" "set triton.ports.grpc instead"
  "--metrics-port" "set triton.ports.metrics instead"
  "--grpc-restricted-protocol" "set triton.restrictedProtocols instead"
  "--http-restricted-api" "set triton.restrictedProtocols instead"
  "--exit-timeout-secs" "set triton.exitTimeoutSeconds instead"
  "--strict-readiness" "readiness stays strict, for the probes and the operator"
  "--allow-http" "Envoy's REST cluster, the gateway and the probes need HTTP"
  "--allow-grpc" "Envoy sends inference over gRPC"
  "--allow-metrics" "the operator, the autoscaler and the dashboards read the metrics"
  "--http-address" "the probes, Envoy and the gateway reach the pod's address"
  "--grpc-address" "Envoy reaches the pod's address"
  "--metrics-address" "Prometheus and the operator reach the pod's address"
-}}
{{- range $i, $arg := .Values.triton.extraArgs -}}
{{- $flag := regexReplaceAll "=.*$" (toString $arg) "" -}}
{{- if hasKey $owned $flag -}}
{{- fail (printf "triton.extraArgs[%d]: %s is the chart's (%s)" $i $flag (get $owned $flag)) -}}
{{- end -}}
{{- end -}}
{{- range .Values.triton.extraEnv -}}
{{- if eq .name "SONICSITE_ADMIN_KEY" -}}
{{- fail "triton.extraEnv: SONICSITE_ADMIN_KEY is the chart's (the key of the restricted protocols, from triton.adminKey)" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The operator's placement options (values `placement`); the checks placement needs. */}}
{{- define "sonicsite.placementArgs" -}}
- --placement
- --admin-key-file=/etc/sonicsite/admin/admin-key
- --idle-unload-s={{ .idleUnloadSeconds }}
{{- if .budgetModels }}
- --budget-models={{ int64 .budgetModels }}
{{- end }}
- --placement-queue-ms={{ .queueMs }}
- --placement-pressure-s={{ .pressureSeconds }}
- --evict-idle-s={{ .evictIdleSeconds }}
- --min-resident-s={{ .minResidentSeconds }}
{{- if .keepWarm }}
- --keep-warm
{{- end }}
- --hold-deadline-s={{ .holdDeadlineSeconds }}
{{- range $model, $seconds := .holdDeadlines }}
- --hold-deadline-s={{ $model }}={{ $seconds }}
{{- end }}
{{- end -}}

{{/* Fails the render when placement is on without what it needs. */}}
{{- define "sonicsite.placementChecks" -}}
{{- $p := .Values.placement -}}
{{- if $p.enabled -}}
{{- if not (has "model-repository" .Values.triton.restrictedProtocols) -}}
{{- fail "placement.enabled: expected triton.restrictedProtocols to include model-repository (the operator alone loads and unloads models)" -}}
{{- end -}}
{{- if not .Values.gateway.enabled -}}
{{- fail "placement.enabled: expected gateway.enabled (the gateway holds requests for a model no server holds)" -}}
{{- end -}}
{{- range $p.preload -}}
{{- if not (has . $.Values.triton.models) -}}
{{- fail (printf "placement.preload: %s is not one of triton.models (the catalogue)" .) -}}
{{- end -}}
{{- end -}}
{{- range $model, $seconds := $p.holdDeadlines -}}
{{- if not (has $model $.Values.triton.models) -}}
{{- fail (printf "placement.holdDeadlines: %s is not one of triton.models (the catalogue)" $model) -}}
{{- end -}}
{{- end -}}
{{- else if and .Values.autoscaling.enabled (eq (int .Values.autoscaling.minReplicas) 0) -}}
{{- fail "autoscaling.minReplicas: 0 needs placement.enabled (a request for a pool at zero is held by the gateway until a server has started and loaded its model)" -}}
{{- end -}}
{{- end -}}

{{/* Triton's pools, as YAML {pools: [...]}: one entry per pool, each with `name`, `suffix`
(what its Deployment, Service and ScaledObject add to the triton component's name: "" for the
single pool of a release without `pools`, so that its objects keep their names across
upgrades), `models` (pinned; [] for the pool of every model no other pool names), `pinned`
(every model some pool names), `labels` (what its pods and selector add), `preload` (the
placement.preload models this pool holds), and its `replicas`, `minReplicas`, `maxReplicas`
(with `minReplicasFrom` and `maxReplicasFrom`, the value each came from, for messages),
`gpu`, `nodeSelector`, `tolerations`, `resources` (with `resourcesFrom`, likewise),
`runtimeClassName`, `supplementalGroups` and `rollingUpdate` (each defaulting to triton's or
autoscaling's; gpu and rollingUpdate key by key). */}}
{{- define "sonicsite.tritonPools" -}}
{{- $t := .Values.triton -}}
{{- $a := .Values.autoscaling -}}
{{- $p := .Values.placement -}}
{{- $given := .Values.pools -}}
{{- $pinned := list -}}
{{- range $given }}{{ $pinned = concat $pinned (.models | default list) }}{{ end -}}
{{- if not $given -}}
{{- $given = list (dict "name" "default") -}}
{{- end -}}
{{- $pools := list -}}
{{- $names := list -}}
{{- $catchAll := list -}}
{{- $owner := dict -}}
{{- range $given -}}
{{- $entry := . -}}
{{- $poolName := .name -}}
{{- if has $poolName $names -}}
{{- fail (printf "pools: %s is named twice" $poolName) -}}
{{- end -}}
{{- $names = append $names $poolName -}}
{{- $models := .models | default list -}}
{{- if not $models }}{{ $catchAll = append $catchAll $poolName }}{{ end -}}
{{- range $models -}}
{{- if not (has . $t.models) -}}
{{- fail (printf "pools: %s is not one of triton.models (the catalogue)" .) -}}
{{- end -}}
{{- /* a model in one pool only: the operator refuses its own --pool arguments otherwise
       (operator/catalogue.py Catalogue), in these words, and never starts */ -}}
{{- if hasKey $owner . -}}
{{- fail (printf "pools: model '%s': in pools '%s' and '%s'; expected one (each pinned model belongs to one pool; the operator refuses to start otherwise)" . (get $owner .) $poolName) -}}
{{- end -}}
{{- $_ := set $owner . $poolName -}}
{{- end -}}
{{- $preload := list -}}
{{- range $p.preload -}}
{{- if or (has . $models) (and (not $models) (not (has . $pinned))) }}{{ $preload = append $preload . }}{{ end -}}
{{- end -}}
{{- $suffix := ternary "" (printf "-%s" .name) (not $.Values.pools) -}}
{{- $labels := ternary (dict) (dict "sonicsite.io/pool" .name) (not $.Values.pools) -}}
{{- $pool := dict "name" .name "suffix" $suffix "models" $models "pinned" $pinned "labels" $labels "preload" $preload -}}
{{- $_ := set $pool "replicas" (hasKey . "replicas" | ternary .replicas $t.replicas) -}}
{{- $_ := set $pool "minReplicas" (hasKey . "minReplicas" | ternary .minReplicas $a.minReplicas) -}}
{{- $_ := set $pool "maxReplicas" (hasKey . "maxReplicas" | ternary .maxReplicas $a.maxReplicas) -}}
{{- /* where each bound came from, for the messages: the pool's own value or autoscaling's */ -}}
{{- range $bound := list "minReplicas" "maxReplicas" -}}
{{- $_ := set $pool (printf "%sFrom" $bound) (hasKey $entry $bound | ternary (printf "pools[%s].%s" $poolName $bound) (printf "autoscaling.%s" $bound)) -}}
{{- end -}}
{{- /* a pool's gpu key by key over triton's (its count, never 0, defaults to triton's) */ -}}
{{- $_ := set $pool "gpu" (merge (deepCopy (.gpu | default dict)) $t.gpu) -}}
{{- $_ := set $pool "nodeSelector" (hasKey . "nodeSelector" | ternary .nodeSelector $t.nodeSelector) -}}
{{- $_ := set $pool "tolerations" (hasKey . "tolerations" | ternary .tolerations $t.tolerations) -}}
{{- $_ := set $pool "resources" (hasKey . "resources" | ternary .resources $t.resources) -}}
{{- $_ := set $pool "resourcesFrom" (hasKey . "resources" | ternary (printf "pools[%s].resources" .name) "triton.resources") -}}
{{- $_ := set $pool "runtimeClassName" (hasKey . "runtimeClassName" | ternary .runtimeClassName $t.runtimeClassName) -}}
{{- $_ := set $pool "supplementalGroups" (hasKey . "supplementalGroups" | ternary .supplementalGroups $t.supplementalGroups) -}}
{{- /* a pool's rollingUpdate key by key over triton's, each key as given (its 0 kept) */ -}}
{{- $rolling := deepCopy ($t.rollingUpdate | default dict) -}}
{{- range $key, $value := (.rollingUpdate | default dict) }}{{ $_ := set $rolling $key $value }}{{ end -}}
{{- $where := ternary "triton.rollingUpdate" (printf "pools[%s].rollingUpdate" .name) (not $.Values.pools) -}}
{{- if and (hasKey $rolling "maxSurge") (hasKey $rolling "maxUnavailable") (eq (trimSuffix "%" (toString $rolling.maxSurge)) "0") (eq (trimSuffix "%" (toString $rolling.maxUnavailable)) "0") -}}
{{- fail (printf "%s: expected maxSurge or maxUnavailable above 0, got both 0 (no server could ever be replaced: Kubernetes refuses the Deployment); a site whose GPUs are all in use sets maxSurge 0 and maxUnavailable 1" $where) -}}
{{- end -}}
{{- $_ := set $pool "rollingUpdate" $rolling -}}
{{- $pools = append $pools $pool -}}
{{- end -}}
{{- if gt (len $catchAll) 1 -}}
{{- fail (printf "pools: at most one pool names no models (it takes every model no other pool names), got %s" (join ", " $catchAll)) -}}
{{- end -}}
{{- if and $.Values.pools (not $catchAll) -}}
{{- range $t.models -}}
{{- if not (has . $pinned) -}}
{{- fail (printf "pools: %s is in no pool, and no pool takes the others (give one pool no models)" .) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and $.Values.pools (not $p.enabled) -}}
{{- fail "pools: expected placement.enabled (the operator loads each model in its pool)" -}}
{{- end -}}
{{- toYaml (dict "pools" $pools) -}}
{{- end -}}

{{/* The operator's pool options: each pool and its models, and its Service. */}}
{{- define "sonicsite.poolArgs" -}}
{{- if .Values.pools -}}
{{- range (include "sonicsite.tritonPools" . | fromYaml).pools }}
- --pool={{ .name }}{{ with .models }}={{ join "," . }}{{ end }}
- --pool-service={{ .name }}={{ include "sonicsite.tritonPoolName" (dict "root" $ "pool" .) }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* A PromQL matcher for a pool's models (the `model` label of Triton's and the gateway's
series): its pinned models, or for the pool that names none, every model not pinned to
another; "" for the single pool of a release without `pools`. Each name is matched as
itself (`a.b` is not a pattern that `axb` matches). Takes a pool entry. */}}
{{- define "sonicsite.poolMatcher" -}}
{{- $quoted := list -}}
{{- range (.models | default .pinned) -}}
{{- $quoted = append $quoted (regexQuoteMeta .) -}}
{{- end -}}
{{- if .models -}}
{{- printf ",model=~%q" (join "|" $quoted) -}}
{{- else if .pinned -}}
{{- printf ",model!~%q" (join "|" $quoted) -}}
{{- end -}}
{{- end -}}

{{/* The models `sonicsite models build` makes, the demo source's (tests/chart holds this
to sonicsite.models.repository.model_names). */}}
{{- define "sonicsite.demoModels" -}}
deepmet gnn_linking identity particle_transformer particlenet_ak4 simple
{{- end -}}

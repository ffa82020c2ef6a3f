"""The Helm chart, proven offline with the real Helm engine and the real schemas and tools
(what `make chart-check` runs), plus the chart's own promises."""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml
from chartcheck import (
    CHART,
    KUBE_VERSIONS,
    check_profile,
    objects,
    profiles,
    render,
    validate_builtin,
    validate_custom,
)

from sonicsite.local import envoy
from sonicsite.local.admin_key import restriction_flags

ROOT = CHART.parents[1]
DASHBOARDS = ROOT / "monitoring" / "dashboards"


@pytest.mark.parametrize("profile", sorted(profiles()))
def test_every_profile_lints_renders_and_passes_every_schema_and_tool(profile):
    report = check_profile(profile, profiles()[profile])
    assert report.errors == [], "\n".join(report.errors)
    assert report.objects > 10 and "Deployment" in report.kinds


def test_a_built_in_object_off_its_schema_is_named_for_every_version():
    """The built-in schemas (one validator per version and kind) refuse what the API server
    would, and an apiVersion without a schema is named, not passed."""
    deployment = next(d for d in _docs({}) if d["kind"] == "Deployment")
    assert validate_builtin([deployment]) == []
    deployment["spec"]["replicsa"] = 2
    odd = {"apiVersion": "apps/v9", "kind": "Deployment", "metadata": {"name": "odd"}}
    errors = validate_builtin([deployment, odd])
    name = f"Deployment/{deployment['metadata']['name']}"
    misspelt = [e for e in errors if e.startswith(name)]
    assert len(misspelt) == len(KUBE_VERSIONS) and all("'replicsa'" in e for e in misspelt)
    assert "(Kubernetes 1.28): spec: Additional properties" in misspelt[0]
    assert f"Deployment/odd (Kubernetes {KUBE_VERSIONS[-1]}): no schema for apps/v9" in errors


def _docs(values: dict) -> list[dict]:
    return objects(render(values))


def _one(docs: list[dict], kind: str, component: str | None = None) -> dict:
    found = [
        d
        for d in docs
        if d["kind"] == kind
        and (
            component is None or d["metadata"]["labels"]["app.kubernetes.io/component"] == component
        )
    ]
    assert len(found) == 1, f"{len(found)} {kind} for {component}"
    return found[0]


def _render_error(values: dict) -> str:
    with pytest.raises(Exception) as caught:
        render(values)
    return str(caught.value)


def test_the_schema_rejects_misspelt_keys_wrong_types_and_min_over_max():
    assert "at '/triton': additional properties 'replicsa' not allowed" in _render_error(
        {"triton": {"replicsa": 2}}
    )
    assert "at '/autoscaling/maxReplicas': got string, want integer" in _render_error(
        {"autoscaling": {"maxReplicas": "four"}}
    )
    too_many = {
        "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2},
        "monitoring": {"prometheus": {"enabled": True}},
    }
    assert "autoscaling.minReplicas: expected at most autoscaling.maxReplicas (2), got 5" in (
        _render_error(too_many)
    )
    assert "at '/triton/gpu/vendor'" in _render_error({"triton": {"gpu": {"vendor": "intel"}}})
    short = {"triton": {"terminationGracePeriodSeconds": 10}}
    assert "triton.terminationGracePeriodSeconds: expected at least" in _render_error(short)


def test_min_zero_renders_zero_and_the_fallback_is_set():
    spec = _one(_docs(profiles()["gpu-keda-values"]), "ScaledObject")["spec"]
    assert spec["minReplicaCount"] == 0 and spec["maxReplicaCount"] == 8
    assert spec["fallback"] == {"failureThreshold": 3, "replicas": 2, "behavior": "static"}
    behavior = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 120


def test_the_fallback_can_be_left_out_for_keda_before_2_18():
    """KEDA before 2.18 refuses a fallback on metrics of type Value: fallbackReplicas null leaves
    it out, on every pool's ScaledObject, which still passes KEDA's CRD."""
    values = profiles()["gpu-pools-values"]
    off = {**values, "autoscaling": {**values["autoscaling"], "fallbackReplicas": None}}
    docs = _docs(off)
    scaled = [d for d in docs if d["kind"] == "ScaledObject"]
    assert len(scaled) == 2 and all("fallback" not in d["spec"] for d in scaled)
    assert all(t["metricType"] == "Value" for d in scaled for t in d["spec"]["triggers"])
    assert validate_custom(scaled) == []
    on = [d for d in _docs(values) if d["kind"] == "ScaledObject"]
    assert [d["spec"]["fallback"]["replicas"] for d in on] == [1, 1]  # the default
    readme = (CHART / "README.md").read_text()
    assert "KEDA 2.18 or later is required" in readme
    assert "`autoscaling.fallbackReplicas: null`" in readme
    assert "only in\nversions that support it" not in readme


def test_the_envoy_bootstrap_is_the_local_sites():
    docs = _docs({})
    rendered = json.loads(_one(docs, "ConfigMap", "envoy")["data"]["envoy.json"])
    assert rendered == envoy.bootstrap(9901, "site-sonicsite-operator.hep.svc", 18000)


def test_triton_drains_runs_non_root_and_requests_gpus_by_vendor():
    for vendor, resource, image in (
        ("nvidia", "nvidia.com/gpu", "nvcr.io/nvidia/tritonserver"),
        ("amd", "amd.com/gpu", "rocm/tritonserver"),
    ):
        docs = _docs({"triton": {"gpu": {"vendor": vendor, "count": 2}}})
        pod = _one(docs, "Deployment", "triton")["spec"]["template"]["spec"]
        triton = pod["containers"][0]
        assert triton["resources"]["limits"][resource] == 2
        assert triton["image"].startswith(image)
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert triton["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert triton["lifecycle"]["preStop"]["exec"]["command"] == ["sleep", "10"]
    assert pod["terminationGracePeriodSeconds"] >= 10 + 30
    assert "--exit-timeout-secs=30" in triton["args"]
    cpu = _one(_docs({}), "Deployment", "triton")["spec"]["template"]["spec"]["containers"][0]
    assert not any("gpu" in k for k in cpu["resources"].get("limits", {}))


def test_every_container_requests_resources_and_no_pod_runs_as_root():
    for name, values in profiles().items():
        for doc in _docs(values):
            spec = doc.get("spec", {})
            pod = spec.get("template", {}).get("spec") if "template" in spec else spec
            if doc["kind"] not in ("Deployment", "Pod"):
                continue
            assert pod["securityContext"]["runAsNonRoot"] is True, (name, doc["metadata"])
            for c in pod.get("initContainers", []) + pod["containers"]:
                assert c["resources"]["requests"], (name, c["name"])
                assert c["securityContext"]["allowPrivilegeEscalation"] is False


# The Kubernetes client's method prefixes and the RBAC verb each needs.
VERBS = {
    "list": "list",
    "read": "get",
    "create": "create",
    "patch": "patch",
    "replace": "update",
    "delete_collection": "deletecollection",
    "delete": "delete",
}


def _api_calls(folder: Path) -> set[tuple[str, str, str]]:
    """(API group, resource, verb) of every Kubernetes API call the code in `folder` makes: each
    call of a method of the Kubernetes client's API classes, read from the client's own request
    path, a list with watch=True as a watch."""
    import ast
    import inspect
    import re

    import kubernetes.client

    classes = inspect.getmembers(kubernetes.client, inspect.isclass)
    apis = [c for name, c in classes if name.endswith("Api")]
    calls = set()
    for source in sorted(folder.glob("*.py")):
        tree = ast.parse(source.read_text())
        watched = set()  # methods called with watch=True, or handed to a Watch's stream()
        for n in ast.walk(tree):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute):
                if any(k.arg == "watch" for k in n.keywords):
                    watched.add(id(n.func))
                if n.func.attr == "stream" and n.args:
                    watched.add(id(n.args[0]))
        for node in ast.walk(tree):
            # called, or passed on: either way used (get_* are discovery, open to every account)
            if not isinstance(node, ast.Attribute) or not node.attr.startswith(tuple(VERBS)):
                continue
            serializers = [getattr(a, f"_{node.attr}_serialize", None) for a in apis]
            for serialize in filter(None, serializers):
                path = re.search(r"resource_path='([^']+)'", inspect.getsource(serialize))[1]
                parts = [p for p in path.split("/") if p and not p.startswith("{")]
                group = "" if parts[0] == "api" else parts[1]
                sub = parts[-1] in ("status", "log", "scale", "exec", "eviction")
                resource = "/".join(parts[-2:]) if sub else parts[-1]
                prefix = max((p for p in VERBS if node.attr.startswith(p)), key=len)
                verb = "watch" if id(node) in watched else VERBS[prefix]
                calls.add((group, resource, verb))
    return calls


def test_the_operator_may_make_exactly_the_api_calls_its_code_makes():
    """Least privilege: the Role grants each (group, resource, verb) the operator's code calls
    the API server for, and nothing else (it lists EndpointSlices; it reads no pod)."""
    calls = _api_calls(ROOT / "operator")
    assert calls == {("discovery.k8s.io", "endpointslices", "list")}
    role = _one(_docs({}), "Role", "operator")
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == calls


def test_the_api_calls_are_read_as_rbac_reads_them(tmp_path):
    """The reading the test above relies on, on hand-written calls."""
    (tmp_path / "calls.py").write_text(
        "core.read_namespaced_pod(name, namespace)\n"
        "core.patch_namespaced_pod_status(name, namespace, body)\n"
        "Watch().stream(core.list_namespaced_pod, namespace)\n"
        "apps.list_namespaced_deployment(namespace, watch=True)\n"
        "coordination.create_namespaced_lease(namespace, body)\n"
        "unrelated.list_models()\n"
    )
    assert _api_calls(tmp_path) == {
        ("", "pods", "get"),
        ("", "pods/status", "patch"),
        ("", "pods", "watch"),
        ("apps", "deployments", "watch"),
        ("coordination.k8s.io", "leases", "create"),
    }


def test_an_upgrade_never_runs_two_operators():
    """Recreate: the old operator (its placement loop, its xDS server) stops before the new
    one starts; the data plane's Deployments keep rolling."""
    docs = _docs({})
    assert _one(docs, "Deployment", "operator")["spec"]["strategy"] == {"type": "Recreate"}
    for component in ("envoy", "gateway"):
        assert "strategy" not in _one(docs, "Deployment", component)["spec"]  # RollingUpdate


def test_notes_tell_the_admin_the_endpoints_and_how_to_test():
    notes = render(profiles()["auth-ingress-values"])["sonicsite/templates/NOTES.txt"]
    assert "site-sonicsite-envoy.hep.svc:8001" in notes
    assert "grpc.sonic.example.org" in notes and "https://sonic.example.org" in notes
    assert "helm test site -n hep" in notes


def test_notes_name_the_models_as_the_servers_hold_them():
    """Every server loads triton.models, or with placement only what is preloaded (per pool
    with pools), the rest on demand."""
    notes = "sonicsite/templates/NOTES.txt"
    assert "Models on every server: particlenet_ak4, deepmet\n" in render({})[notes]
    pooled = render(profiles()["gpu-pools-values"])[notes]
    assert "on every server" not in pooled
    assert "loaded where their requests wait): particlenet_ak4, deepmet, particle_transformer" in (
        pooled
    )
    assert "pool a100: particle_transformer\n" in pooled
    assert "pool t4: every model no other pool names\n" in pooled
    # each pool scales within its own limits, not autoscaling's (0-8 here)
    assert "pool a100: 0-4 servers\n" in pooled and "pool t4: 1-8 servers" in pooled
    assert "Autoscaling: KEDA, 0-" not in pooled
    preloaded = render({"placement": {"enabled": True, "preload": ["deepmet"]}})[notes]
    assert "on every server" not in preloaded
    assert "each new server loads deepmet at start, the others on demand" in preloaded
    assert "a new server starts with none" in render(profiles()["gpu-keda-values"])[notes]


def test_jwt_at_envoy_wires_the_operator_the_jwks_and_the_test_token():
    docs = _docs(profiles()["auth-ingress-values"])
    operator = _one(docs, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][0]
    assert "--jwt-issuer=https://idp.example.org" in operator["args"]
    assert "--jwt-jwks-file=/etc/envoy/jwks/jwks.json" in operator["args"]
    assert "--jwt-audiences=sonicsite" in operator["args"]
    envoy_pod = _one(docs, "Deployment", "envoy")["spec"]["template"]["spec"]
    assert {"name": "jwks", "secret": {"secretName": "sonic-jwks"}} in envoy_pod["volumes"]
    test_pod = _one(docs, "Pod", "test")["spec"]["containers"][0]
    assert test_pod["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "sonic-test-token"
    without = _docs({})
    assert not any(
        a.startswith("--jwt")
        for a in _one(without, "Deployment", "operator")["spec"]["template"]["spec"]["containers"][
            0
        ]["args"]
    )


def test_the_dashboards_ship_as_configmaps_for_grafanas_sidecar():
    docs = _docs({})
    maps = [
        d
        for d in docs
        if d["kind"] == "ConfigMap" and "grafana_dashboard" in d["metadata"]["labels"]
    ]
    shipped = {name: text for m in maps for name, text in m["data"].items()}
    built = sorted(DASHBOARDS.glob("*.json"))
    assert sorted(shipped) == [p.name for p in built]
    for path in built:
        assert shipped[path.name] == path.read_text()
        assert json.loads(shipped[path.name])["uid"].startswith("sonicsite-")
    assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)


# Every optional part switched on, so that every template renders something.
CERTIFICATE = {"certManager": {"enabled": True, "mode": "certificate", "issuer": {"name": "ca"}}}
EVERYTHING = {
    "triton": {"modelRepositories": [{"source": "cvmfs", "repository": "cms.cern.ch"}]},
    "envoy": {"ingress": {"enabled": True, "host": "grpc.example.org", "tls": CERTIFICATE}},
    "gateway": {
        "ingress": {"enabled": True, "host": "sonic.example.org", "tls": CERTIFICATE},
        "auth": {"enabled": True, "tokens": ["a-token-of-sixteen-characters"]},
    },
    "autoscaling": {"enabled": True},
    "monitoring": {
        "prometheus": {"enabled": True},
        "prometheusOperator": {"enabled": True},
        "prometheusAddress": "https://prometheus.monitoring.svc:9090",
        "prometheusAuth": {"modes": ["bearer", "tls"], "secretName": "keda-prometheus"},
    },
    "networkPolicy": {
        "metricsFrom": [
            {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
        ]
    },
    "tracing": {"enabled": True, "collector": {"enabled": True}},
}
SHORT_KINDS = {"PersistentVolumeClaim": "pvc", "PodDisruptionBudget": "pdb"}


@pytest.mark.parametrize("profile", [*sorted(profiles()), "everything"])
def test_every_template_holds_one_kind_of_one_component_and_is_named_for_them(profile):
    values = EVERYTHING if profile == "everything" else profiles()[profile]
    for path, text in render(values).items():
        docs = [d for d in yaml.safe_load_all(text) if d] if path.endswith(".yaml") else []
        kinds = {d["kind"] for d in docs}
        components = {d["metadata"]["labels"]["app.kubernetes.io/component"] for d in docs}
        assert len(kinds) <= 1 and len(components) <= 1, (path, kinds, components)
        hooks = [d for d in docs if "helm.sh/hook" in d["metadata"].get("annotations", {})]
        if docs and not hooks:  # `helm test` pods are named for what they test
            (kind,), (component,) = kinds, components
            stem = f"{component}-{SHORT_KINDS.get(kind, kind.lower())}"
            assert Path(path).name == f"{stem}.yaml", (path, kind, component)


def test_everything_on_renders_every_template():
    rendered = render(EVERYTHING)
    templates = sorted(p.name for p in (CHART / "templates").glob("*.yaml"))
    empty = [t for t in templates if not rendered[f"sonicsite/templates/{t}"].strip()]
    assert empty == []


def test_everything_on_passes_every_schema_and_tool():
    report = check_profile("everything", EVERYTHING)
    assert report.errors == [], "\n".join(report.errors)
    assert {
        "Secret",
        "Ingress",
        "ScaledObject",
        "TriggerAuthentication",
        "PodMonitor",
        "PersistentVolumeClaim",
    } <= set(report.kinds)


def _pod(docs: list[dict], component: str) -> dict:
    return _one(docs, "Deployment", component)["spec"]["template"]["spec"]


def test_the_gateway_reads_into_memory_well_under_its_memory_limit():
    """An 800 MB JSON body took the gateway (1 GiB body bound) past its pod's 1 GiB memory
    limit: what it reads into memory is bounded on its own, by default a sixteenth of it."""
    gateway = _pod(_docs({}), "gateway")["containers"][0]
    limit = gateway["resources"]["limits"]["memory"]
    assert limit == "1Gi"
    assert f"--max-json-bytes={64 << 20}" in gateway["args"]
    assert f"--max-body-bytes={1 << 30}" in gateway["args"]
    chosen = _pod(_docs({"gateway": {"maxJsonBytes": 1000}}), "gateway")["containers"][0]
    assert "--max-json-bytes=1000" in chosen["args"]


def test_triton_refuses_repository_trace_and_logging_without_the_operators_key():
    """As the local site runs Triton (the same flags, the key from a Secret that only the
    operator mounts besides the servers' own environment)."""
    docs = _docs({})
    secret = _one(docs, "Secret", "triton")
    assert len(base64.b64decode(secret["data"]["admin-key"])) == 48
    triton = _pod(docs, "triton")["containers"][0]
    local = restriction_flags("$(SONICSITE_ADMIN_KEY)")  # the local site's flags
    assert all(flag in triton["args"] for flag in local), triton["args"]
    assert "--model-control-mode=explicit" in triton["args"]
    (env,) = [e for e in triton["env"] if e["name"] == "SONICSITE_ADMIN_KEY"]
    assert env["valueFrom"]["secretKeyRef"] == {
        "name": secret["metadata"]["name"],
        "key": "admin-key",
    }
    operator = _pod(docs, "operator")
    (volume,) = [v for v in operator["volumes"] if v["name"] == "admin-key"]
    assert volume["secret"]["secretName"] == secret["metadata"]["name"]
    (mount,) = [m for m in operator["containers"][0]["volumeMounts"] if m["name"] == "admin-key"]
    assert mount["readOnly"] is True
    holders = [d for d in docs if secret["metadata"]["name"] in json.dumps(d.get("spec", {}))]
    assert sorted(d["metadata"]["labels"]["app.kubernetes.io/component"] for d in holders) == [
        "operator",
        "triton",
    ]

    own = _docs({"triton": {"adminKey": {"existingSecret": "site-admin"}}})
    assert not [d for d in own if d["kind"] == "Secret" and "admin-key" in d.get("data", {})]
    (volume,) = [v for v in _pod(own, "operator")["volumes"] if v["name"] == "admin-key"]
    assert volume["secret"]["secretName"] == "site-admin"

    none = _docs({"triton": {"restrictedProtocols": []}})
    args = _pod(none, "triton")["containers"][0]["args"]
    assert not [a for a in args if "restricted" in a]
    assert [v["name"] for v in _pod(none, "operator")["volumes"]] == [
        "operator-state",
        "admission-key",
    ]
    refused = _render_error({"triton": {"restrictedProtocols": ["nonsense"]}})
    assert "at '/triton/restrictedProtocols/0': value must be one of" in refused


def test_the_operator_and_the_gateway_alone_hold_the_admission_passes_key():
    """The passes a model's answers carry (Envoy's, from the operator, and the gateway's)
    come from one key in a Secret that only those two mount, as the local site's file."""
    docs = _docs({})
    (secret,) = [d for d in docs if d["kind"] == "Secret" and "admission-key" in d.get("data", {})]
    assert len(base64.b64decode(secret["data"]["admission-key"])) == 48
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    for component in ("operator", "gateway"):
        pod = _pod(docs, component)
        (volume,) = [v for v in pod["volumes"] if v["name"] == "admission-key"]
        assert volume["secret"] == {
            "secretName": secret["metadata"]["name"],
            "defaultMode": 0o400,
        }
        container = pod["containers"][0]
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "admission-key"]
        assert mount["readOnly"] is True
        flag = f"--admission-key-file={mount['mountPath']}/admission-key"
        assert flag in container["args"], (component, container["args"])
    holders = [d for d in docs if secret["metadata"]["name"] in json.dumps(d.get("spec", {}))]
    assert sorted(d["metadata"]["labels"]["app.kubernetes.io/component"] for d in holders) == [
        "gateway",
        "operator",
    ]
    own = _docs({"operator": {"admission": {"passKey": {"existingSecret": "site-passes"}}}})
    assert not [d for d in own if d["kind"] == "Secret" and "admission-key" in d.get("data", {})]
    for component in ("operator", "gateway"):
        (volume,) = [v for v in _pod(own, component)["volumes"] if v["name"] == "admission-key"]
        assert volume["secret"]["secretName"] == "site-passes"


def test_envoy_reaches_the_gateways_one_server_view_and_clients_do_not():
    docs = _docs({"networkPolicy": {"enabled": True}})
    service = _one(docs, "Service", "gateway")
    (view,) = [p for p in service["spec"]["ports"] if p["name"] == "grpc-view"]
    gateway = _pod(docs, "gateway")["containers"][0]
    assert f"--grpc-port={view['port']}" in gateway["args"]
    assert {"name": "grpc-view", "containerPort": view["port"]} in gateway["ports"]
    host = f"{service['metadata']['name']}.hep.svc"  # the chart's tests render into hep
    operator = _pod(docs, "operator")["containers"][0]
    assert f"--site-view={host}:{view['port']}" in operator["args"]
    http = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "http")
    assert f"--site-view-http={host}:{http}" in operator["args"]
    # with the gateway's tokens on too: left to the servers, REST through Envoy would pass
    # unbounded (a declared shape of 2**40 elements ends a server)
    tokens = {"gateway": {"auth": {"enabled": True, "tokens": ["a-token-of-16-chars"]}}}
    with_tokens = _pod(_docs(tokens), "operator")["containers"][0]["args"]
    assert f"--site-view={host}:{view['port']}" in with_tokens
    assert f"--site-view-http={host}:{http}" in with_tokens
    (entry,) = [
        d for d in docs if d["kind"] == "NetworkPolicy" and "entry" in d["metadata"]["name"]
    ]
    rules = [r for r in entry["spec"]["ingress"] if {"port": view["port"]} in r["ports"]]
    assert len(rules) == 1 and "namespaceSelector" not in json.dumps(rules[0]["from"])

    without = _docs({"gateway": {"enabled": False}})
    assert not [a for a in _pod(without, "operator")["containers"][0]["args"] if "site-view" in a]


def _pod_specs(docs: list[dict]) -> dict[str, dict]:
    """Every pod spec by its object's name: the Deployments' templates, the `helm test` Pod."""
    return {
        d["metadata"]["name"]: d["spec"]["template"]["spec"]
        if d["kind"] == "Deployment"
        else d["spec"]
        for d in docs
        if d["kind"] in ("Deployment", "Pod")
    }


def test_every_pod_of_the_chart_pulls_with_the_sites_image_pull_secrets():
    """The `helm test` pod and the chart's Prometheus too: a private registry's credentials
    cover every image the chart runs."""
    secrets = [{"name": "regcred"}]
    specs = _pod_specs(_docs({**EVERYTHING, "imagePullSecrets": secrets}))
    components = {name.removeprefix("site-sonicsite-") for name in specs}
    assert {"triton", "envoy", "operator", "gateway", "prometheus", "test"} <= components
    assert [name for name, spec in specs.items() if spec.get("imagePullSecrets") != secrets] == []
    without = _pod_specs(_docs(EVERYTHING))
    assert [name for name, spec in without.items() if "imagePullSecrets" in spec] == []


@pytest.mark.parametrize("tls", [True, False])
def test_notes_give_the_ingress_scheme_and_port_that_its_tls_gives(tls):
    ingress = {"enabled": True, "tls": {"secretName": "site-tls" if tls else ""}}
    values = {
        "envoy": {"ingress": {**ingress, "host": "grpc.example.org"}},
        "gateway": {"ingress": {**ingress, "host": "sonic.example.org"}},
    }
    docs = _docs(values)
    ingresses = {d["spec"]["rules"][0]["host"]: d["spec"] for d in docs if d["kind"] == "Ingress"}
    assert all(("tls" in spec) == tls for spec in ingresses.values())
    notes = render(values)["sonicsite/templates/NOTES.txt"]
    scheme, port = ("https", 443) if tls else ("http", 80)
    assert f"grpc.example.org:{port}" in notes
    assert f"{scheme}://sonic.example.org" in notes
    other = ("http", 80) if tls else ("https", 443)
    assert f"grpc.example.org:{other[1]}" not in notes
    assert f"{other[0]}://sonic.example.org" not in notes


def test_the_operator_keeps_a_put_balancing_policy_where_its_restarts_read_it():
    """A PUT /v1/balancing was lost when the operator's container restarted (liveness): the
    policy is kept in a file on a writable emptyDir (the root is read-only), read back."""
    pod = _pod(_docs({}), "operator")
    container = pod["containers"][0]
    (arg,) = [a for a in container["args"] if a.startswith("--balancing-file=")]
    path = arg.partition("=")[2]
    (mount,) = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    assert not mount.get("readOnly")
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert "emptyDir" in volume
    assert container["securityContext"]["readOnlyRootFilesystem"] is True

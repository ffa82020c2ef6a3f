"""Everything a site says in its values reaches the objects it is meant for, as the Helm
engine renders the chart: model repositories (each its own --model-repository, the
configured CVMFS repository mounted where Triton reads it), Triton's extra arguments,
environment, volumes and mounts, each component's probes and placement, the Services'
labels and annotations, ingress TLS from a Secret or from cert-manager, the identity
provider's remote JWKS, and a `helm test` that can be configured or switched off."""

from __future__ import annotations

import json

import pytest
from chartcheck import CHART, objects, one_object, profiles, render, validate_builtin
from crdcheck import load_crds, validate

COMPONENTS = ("triton", "envoy", "gateway", "operator")


def _docs(values: dict) -> list[dict]:
    return objects(render(values))


def _component(doc: dict) -> str:
    return doc["metadata"]["labels"]["app.kubernetes.io/component"]


def _pod(docs: list[dict], component: str) -> dict:
    return one_object(docs, "Deployment", component)["spec"]["template"]["spec"]


def _render_error(values: dict) -> str:
    with pytest.raises(Exception) as caught:
        render(values)
    return str(caught.value)


def _repositories(pod: dict) -> list[str]:
    triton = pod["containers"][0]
    return [a.split("=", 1)[1] for a in triton["args"] if a.startswith("--model-repository=")]


SEVERAL = [
    {"source": "demo", "models": ["simple"]},
    {"source": "pvc", "claimName": "site-models", "subPath": "v2"},
    {"source": "nfs", "server": "nfs.example.org", "path": "/exports/models"},
    {"source": "hostPath", "path": "/data/models"},
    {"source": "cvmfs", "repository": "cms.cern.ch", "subPath": "/cms/sonic/models/"},
    {"source": "cvmfs", "repository": "cms.cern.ch", "subPath": "cms/other"},
    {"source": "cvmfs", "repository": "unpacked.cern.ch", "subPath": "sonic"},
    {"source": "s3", "url": "s3://bucket/models", "credentialsSecret": "s3-keys"},
]


def test_every_repository_is_one_model_repository_argument_on_its_own_volume():
    docs = _docs({"triton": {"modelRepositories": SEVERAL}})
    pod = _pod(docs, "triton")
    triton = pod["containers"][0]
    assert _repositories(pod) == [
        "/models/0",
        "/models/1/v2",
        "/models/2",
        "/models/3",
        "/cvmfs/cms.cern.ch/cms/sonic/models",
        "/cvmfs/cms.cern.ch/cms/other",
        "/cvmfs/unpacked.cern.ch/sonic",
        "s3://bucket/models",
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["models-0"] == {"name": "models-0", "emptyDir": {}}
    assert volumes["models-1"]["persistentVolumeClaim"] == {
        "claimName": "site-models",
        "readOnly": True,
    }
    assert volumes["models-2"]["nfs"]["server"] == "nfs.example.org"
    assert volumes["models-3"]["hostPath"] == {"path": "/data/models", "type": "Directory"}
    # every CVMFS repository from one automount claim, mounted where Triton reads it
    claim = one_object(docs, "PersistentVolumeClaim", "cvmfs")
    assert volumes["cvmfs"]["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["spec"]["storageClassName"] == "cvmfs"
    cvmfs = [m for m in triton["volumeMounts"] if m["name"] == "cvmfs"]
    assert cvmfs == [
        {
            "name": "cvmfs",
            "mountPath": f"/cvmfs/{repository}",
            "subPath": repository,
            "readOnly": True,
            "mountPropagation": "HostToContainer",
        }
        for repository in ("cms.cern.ch", "unpacked.cern.ch")
    ]
    assert triton["envFrom"] == [{"secretRef": {"name": "s3-keys"}}]
    (init,) = pod["initContainers"]  # the demo entry builds its own models into its volume
    assert init["command"][-1] == "simple" and init["volumeMounts"][0]["name"] == "models-0"


@pytest.mark.parametrize("profile", [*sorted(profiles()), "several"])
def test_every_model_repository_triton_reads_is_mounted(profile):
    values = {"triton": {"modelRepositories": SEVERAL}} if profile == "several" else None
    docs = _docs(values or profiles()[profile])
    tritons = [d for d in docs if d["kind"] == "Deployment" and _component(d) == "triton"]
    assert tritons  # one per pool
    for deployment in tritons:
        pod = deployment["spec"]["template"]["spec"]
        mounts = [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]]
        for path in _repositories(pod):
            if not path.startswith("s3://"):
                assert any(path == m or path.startswith(m + "/") for m in mounts), (path, mounts)


def test_cvmfs_from_a_site_claim_or_a_nodes_autofs():
    repos = [{"source": "cvmfs", "repository": "cms.cern.ch"}]
    own = _docs({"triton": {"modelRepositories": repos, "cvmfs": {"existingClaim": "cvmfs"}}})
    assert not [d for d in own if d["kind"] == "PersistentVolumeClaim"]
    (volume,) = [v for v in _pod(own, "triton")["volumes"] if v["name"] == "cvmfs"]
    assert volume["persistentVolumeClaim"]["claimName"] == "cvmfs"
    node = _docs({"triton": {"modelRepositories": repos, "cvmfs": {"hostPath": "/cvmfs"}}})
    assert not [d for d in node if d["kind"] == "PersistentVolumeClaim"]
    (volume,) = [v for v in _pod(node, "triton")["volumes"] if v["name"] == "cvmfs"]
    assert volume["hostPath"] == {"path": "/cvmfs", "type": "Directory"}


def test_repositories_that_cannot_work_are_refused_by_name():
    def refused(*entries: dict) -> str:
        return _render_error({"triton": {"modelRepositories": list(entries)}})

    assert "/triton/modelRepositories/0" in refused({"source": "pvc"})  # no claimName
    assert "/triton/modelRepositories/0" in refused({"source": "nfs", "claimName": "x"})
    assert "/triton/modelRepositories/0" in refused({"source": "cvmfs", "repository": "cms"})
    assert "triton.modelRepositories[0].subPath: expected a path inside the volume" in refused(
        {"source": "hostPath", "path": "/data", "subPath": "../etc"}
    )
    two = refused(
        {"source": "s3", "url": "s3://a/m", "credentialsSecret": "one"},
        {"source": "s3", "url": "s3://b/m", "credentialsSecret": "two"},
    )
    assert "expected one credentialsSecret for every s3 repository" in two
    assert "expected one demo repository at most" in refused({"source": "demo"}, {"source": "demo"})


def test_extra_arguments_env_volumes_and_mounts_reach_triton():
    values = {
        "triton": {
            "extraArgs": ["--log-verbose=1", "--backend-config=onnxruntime,x=1"],
            "extraEnv": [{"name": "CUDA_MODULE_LOADING", "value": "LAZY"}],
            "extraVolumes": [{"name": "licences", "configMap": {"name": "site-licences"}}],
            "extraVolumeMounts": [{"name": "licences", "mountPath": "/opt/licences"}],
        }
    }
    pod = _pod(_docs(values), "triton")
    triton = pod["containers"][0]
    assert triton["args"][-2:] == ["--log-verbose=1", "--backend-config=onnxruntime,x=1"]
    assert {"name": "CUDA_MODULE_LOADING", "value": "LAZY"} in triton["env"]
    assert {"name": "licences", "configMap": {"name": "site-licences"}} in pod["volumes"]
    assert {"name": "licences", "mountPath": "/opt/licences"} in triton["volumeMounts"]


@pytest.mark.parametrize(
    ("argument", "value"),
    [
        ("--model-control-mode=poll", "model control stays explicit, with the operator"),
        ("--model-repository=/elsewhere", "set triton.modelRepositories instead"),
        ("--load-model=*", "set triton.models instead"),
        ("--http-restricted-api=trace:k=v", "set triton.restrictedProtocols instead"),
        ("--grpc-restricted-protocol=logging:k=v", "set triton.restrictedProtocols instead"),
        ("--grpc-port=9001", "set triton.ports.grpc instead"),
        # these rendered, and cut the site off from its server
        ("--allow-grpc=false", "Envoy sends inference over gRPC"),
        ("--allow-http=false", "Envoy's REST cluster, the gateway and the probes need HTTP"),
        ("--metrics-address=127.0.0.1", "Prometheus and the operator reach the pod's address"),
    ],
)
def test_extra_arguments_cannot_undo_what_the_chart_sets(argument, value):
    error = _render_error({"triton": {"extraArgs": ["--log-verbose=1", argument]}})
    flag = argument.split("=")[0]
    assert f"triton.extraArgs[1]: {flag} is the chart's ({value})" in error


def test_extra_env_cannot_replace_the_administrative_key():
    env = [{"name": "SONICSITE_ADMIN_KEY", "value": "known"}]
    assert "triton.extraEnv: SONICSITE_ADMIN_KEY is the chart's" in _render_error(
        {"triton": {"extraEnv": env}}
    )


def test_every_component_takes_its_probes_resources_and_placement():
    values: dict = {}
    for n, component in enumerate(COMPONENTS):
        values[component] = {
            # at most the limit: the chart refuses a request above it (test_resources.py)
            "resources": {
                "requests": {"cpu": f"{n + 1}00m", "memory": "1Gi"},
                "limits": {"memory": "1Gi"},
            },
            "probes": {"liveness": {"periodSeconds": 20 + n, "failureThreshold": 4}},
            "nodeSelector": {"site/pool": component},
            "tolerations": [{"key": "site/pool", "operator": "Equal", "value": component}],
            "affinity": {
                "podAntiAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [
                        {
                            "weight": 1,
                            "podAffinityTerm": {
                                "topologyKey": "kubernetes.io/hostname",
                                "labelSelector": {"matchLabels": {"site/pool": component}},
                            },
                        }
                    ]
                }
            },
            "priorityClassName": f"sonic-{component}",
            "podAnnotations": {"site/owner": component},
        }
    docs = _docs(values)
    defaults = _docs({})
    for n, component in enumerate(COMPONENTS):
        deployment = one_object(docs, "Deployment", component)["spec"]["template"]
        pod, container = deployment["spec"], deployment["spec"]["containers"][0]
        assert container["resources"]["requests"]["cpu"] == f"{n + 1}00m", component
        liveness = container["livenessProbe"]
        default = _pod(defaults, component)["containers"][0]["livenessProbe"]
        assert liveness["httpGet"] == default["httpGet"], component  # the chart's path and port
        assert (liveness["periodSeconds"], liveness["failureThreshold"]) == (20 + n, 4)
        assert pod["nodeSelector"] == {"site/pool": component}
        assert pod["tolerations"][0]["value"] == component
        assert "podAntiAffinity" in pod["affinity"]
        assert pod["priorityClassName"] == f"sonic-{component}"
        assert deployment["metadata"]["annotations"]["site/owner"] == component
    assert not any("priorityClassName" in _pod(defaults, c) for c in COMPONENTS)


def test_probes_keep_their_paths_and_refuse_what_kubernetes_would():
    error = _render_error({"envoy": {"probes": {"liveness": {"successThreshold": 2}}}})
    assert "/envoy/probes/liveness" in error
    error = _render_error({"gateway": {"probes": {"readiness": {"httpGet": {"path": "/"}}}}})
    assert "/gateway/probes/readiness" in error


def test_every_service_takes_labels_and_annotations_and_triton_stays_headless():
    values = {
        component: {"service": {"labels": {"site/scrape": component}, "annotations": {"a": "b"}}}
        for component in COMPONENTS
    }
    values["gateway"]["service"] |= {
        "type": "LoadBalancer",
        "loadBalancerSourceRanges": ["192.0.2.0/24"],
    }
    docs = _docs(values)
    for component in COMPONENTS:
        service = one_object(docs, "Service", component)
        assert service["metadata"]["labels"]["site/scrape"] == component
        assert service["metadata"]["annotations"] == {"a": "b"}
        assert service["metadata"]["labels"]["app.kubernetes.io/component"] == component
    assert one_object(docs, "Service", "triton")["spec"]["clusterIP"] == "None"
    gateway = one_object(docs, "Service", "gateway")["spec"]
    assert gateway["type"] == "LoadBalancer"
    assert gateway["loadBalancerSourceRanges"] == ["192.0.2.0/24"]


def _ingress_values(tls: dict) -> dict:
    return {
        "envoy": {"ingress": {"enabled": True, "host": "grpc.example.org", "tls": tls}},
        "gateway": {"ingress": {"enabled": True, "host": "sonic.example.org", "tls": tls}},
    }


def test_ingress_tls_from_a_named_secret():
    docs = _docs(_ingress_values({"secretName": "site-tls"}))
    for component, host in (("envoy", "grpc.example.org"), ("gateway", "sonic.example.org")):
        ingress = one_object(docs, "Ingress", component)
        assert ingress["spec"]["tls"] == [{"hosts": [host], "secretName": "site-tls"}]
        assert "annotations" not in ingress["metadata"]
    assert not [d for d in docs if d["kind"] == "Certificate"]
    plain = _docs(_ingress_values({}))
    assert "tls" not in one_object(plain, "Ingress", "envoy")["spec"]


@pytest.mark.parametrize(
    ("issuer", "annotations"),
    [
        ({"name": "letsencrypt"}, {"cert-manager.io/cluster-issuer": "letsencrypt"}),
        ({"name": "site-ca", "kind": "Issuer"}, {"cert-manager.io/issuer": "site-ca"}),
        (
            {"name": "vault", "kind": "VaultIssuer", "group": "vault.example.org"},
            {
                "cert-manager.io/issuer": "vault",
                "cert-manager.io/issuer-kind": "VaultIssuer",
                "cert-manager.io/issuer-group": "vault.example.org",
            },
        ),
    ],
)
def test_ingress_tls_from_cert_managers_issuer_annotations(issuer, annotations):
    tls = {"certManager": {"enabled": True, "issuer": issuer}}
    values = _ingress_values(tls)
    values["envoy"]["ingress"]["annotations"] = {
        "nginx.ingress.kubernetes.io/backend-protocol": "GRPC"
    }
    docs = _docs(values)
    envoy = one_object(docs, "Ingress", "envoy")
    assert envoy["metadata"]["annotations"] == {
        "nginx.ingress.kubernetes.io/backend-protocol": "GRPC",
        **annotations,
    }
    (tls_entry,) = envoy["spec"]["tls"]
    assert tls_entry["secretName"] == "site-sonicsite-envoy-tls"  # where cert-manager writes
    assert not [d for d in docs if d["kind"] == "Certificate"]


def test_ingress_tls_from_a_certificate_the_chart_makes_passes_its_crd():
    tls = {
        "secretName": "grpc-cert",
        "certManager": {"enabled": True, "mode": "certificate", "issuer": {"name": "site-ca"}},
    }
    docs = _docs(_ingress_values(tls))
    crds = load_crds(CHART.parent / "crds")
    for component, host in (("envoy", "grpc.example.org"), ("gateway", "sonic.example.org")):
        certificate = one_object(docs, "Certificate", component)
        ingress = one_object(docs, "Ingress", component)
        assert certificate["spec"]["dnsNames"] == [host]
        assert certificate["spec"]["secretName"] == ingress["spec"]["tls"][0]["secretName"]
        assert certificate["spec"]["issuerRef"] == {
            "name": "site-ca",
            "kind": "ClusterIssuer",
            "group": "cert-manager.io",
        }
        assert "cert-manager.io/cluster-issuer" not in ingress["metadata"].get("annotations", {})
        assert validate(certificate, crds) == []
    misspelt = {k: v for k, v in certificate["spec"].items() if k != "dnsNames"}
    broken = dict(certificate, spec={**misspelt, "dnsName": [host]})
    assert validate(broken, crds)  # the CRD's own schema does bite
    missing = {"certManager": {"enabled": True, "mode": "certificate"}}
    error = _render_error(_ingress_values(missing))
    assert "ingress.tls.certManager.issuer.name: expected a cert-manager issuer" in error


def _args(docs: list[dict], component: str) -> list[str]:
    return _pod(docs, component)["containers"][0]["args"]


REMOTE = {
    "enabled": True,
    "issuer": "https://idp.example.org/",
    "audiences": ["sonicsite"],
    "jwksUri": "https://idp.example.org/jwks",
    "jwksCacheSeconds": 120,
    "testTokenSecret": "test-token",
}


def test_a_remote_jwks_reaches_envoy_through_the_operator_and_the_gateway_itself():
    docs = _docs({"envoy": {"jwt": REMOTE}, "gateway": {"auth": {"enabled": True, "jwt": True}}})
    operator = _args(docs, "operator")
    assert "--jwt-jwks-uri=https://idp.example.org/jwks" in operator
    assert "--jwt-jwks-cache=120" in operator
    assert not [a for a in operator if a.startswith("--jwt-jwks-file")]
    envoy = _pod(docs, "envoy")
    assert not [v for v in envoy["volumes"] if v["name"] == "jwks"]  # nothing to mount
    gateway = _args(docs, "gateway")
    assert "--jwt-issuer=https://idp.example.org/" in gateway
    assert "--jwt-audiences=sonicsite" in gateway
    assert "--jwks-uri=https://idp.example.org/jwks" in gateway
    assert not [a for a in gateway if a.startswith("--tokens")]  # JWTs alone
    assert not [d for d in docs if d["kind"] == "Secret" and "tokens" in d.get("stringData", {})]


def test_the_gateway_reads_a_jwks_secret_and_keeps_its_tokens():
    jwt = {k: v for k, v in REMOTE.items() if k != "jwksUri"} | {"jwksSecret": "idp-jwks"}
    auth = {"enabled": True, "jwt": True, "existingSecret": "site-tokens"}
    docs = _docs({"envoy": {"jwt": jwt}, "gateway": {"auth": auth}})
    gateway = _pod(docs, "gateway")
    assert "--jwks-file=/etc/sonicsite/jwks/jwks.json" in gateway["containers"][0]["args"]
    assert "--tokens=/etc/sonicsite/tokens/tokens" in gateway["containers"][0]["args"]
    assert {"name": "jwks", "secret": {"secretName": "idp-jwks"}} in gateway["volumes"]
    assert "--jwt-jwks-file=/etc/envoy/jwks/jwks.json" in _args(docs, "operator")


def test_the_identity_provider_needs_exactly_one_source_of_keys():
    both = REMOTE | {"jwksSecret": "idp-jwks"}
    assert "envoy.jwt: expected jwksUri or jwksSecret, not both" in _render_error(
        {"envoy": {"jwt": both}}
    )
    neither = {k: v for k, v in REMOTE.items() if k != "jwksUri"}
    assert "envoy.jwt: expected the issuer's keys" in _render_error({"envoy": {"jwt": neither}})
    assert "envoy.jwt.issuer: expected the tokens' issuer" in _render_error(
        {"gateway": {"auth": {"enabled": True, "jwt": True}}}
    )
    assert "/envoy/jwt/jwksUri" in _render_error({"envoy": {"jwt": {"jwksUri": "idp/jwks"}}})


def test_helm_test_can_be_switched_off_and_given_requests_from_a_file():
    off = _docs({"tests": {"enabled": False}})
    assert not [d for d in off if d["kind"] == "Pod"]
    assert "helm test" not in render({"tests": {"enabled": False}})["sonicsite/templates/NOTES.txt"]
    inputs = json.dumps({"simple": {"inputs": []}})
    triton = {"models": ["particlenet_ak4", "simple"]}  # tests.models are the site's
    rendered = _docs({"triton": triton, "tests": {"models": ["simple"], "inputs": inputs}})
    pod = one_object(rendered, "Pod", "test")
    (configmap,) = [d for d in rendered if d["kind"] == "ConfigMap" and "inputs.json" in d["data"]]
    assert configmap["data"]["inputs.json"] == inputs
    assert configmap["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert int(configmap["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0
    container = pod["spec"]["containers"][0]
    assert "--inputs=/etc/sonicsite/test/inputs.json" in container["args"]
    assert pod["spec"]["volumes"][0]["configMap"]["name"] == configmap["metadata"]["name"]
    assert "tests.inputs: expected a JSON object" in _render_error({"tests": {"inputs": "{nope"}})


def test_triton_rolls_as_the_site_says_and_never_with_both_steps_at_zero():
    """By default a new server starts before an old one stops; a site whose GPUs are all in use
    stops one first (maxSurge 0, maxUnavailable 1), or the new server never schedules."""
    default = one_object(_docs({}), "Deployment", "triton")["spec"]["strategy"]
    assert default == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    for steps in ({"maxSurge": 0, "maxUnavailable": 1}, {"maxSurge": "25%", "maxUnavailable": 0}):
        docs = _docs({"triton": {"rollingUpdate": steps}})
        deployment = one_object(docs, "Deployment", "triton")
        assert deployment["spec"]["strategy"]["rollingUpdate"] == steps
        assert validate_builtin([deployment]) == []
    for zero in (0, "0%"):
        refused = _render_error({"triton": {"rollingUpdate": {"maxSurge": zero}}})
        assert "triton.rollingUpdate: expected maxSurge or maxUnavailable above 0" in refused
    assert "at '/triton/rollingUpdate/maxSurge'" in _render_error(
        {"triton": {"rollingUpdate": {"maxSurge": "one"}}}
    )


def test_triton_pods_take_a_runtime_class_and_supplemental_groups():
    """The NVIDIA runtime where it is not the nodes' default (k3s, RKE2), the GPU device groups
    for ROCm as non-root: on Triton's pods alone, which stay non-root."""
    values = {
        "triton": {
            "gpu": {"vendor": "amd"},
            "runtimeClassName": "amd",
            "supplementalGroups": [44, 109],
        }
    }
    docs = _docs(values)
    pod = _pod(docs, "triton")
    assert pod["runtimeClassName"] == "amd"
    assert pod["securityContext"]["supplementalGroups"] == [44, 109]
    assert pod["securityContext"]["runAsNonRoot"] is True
    for component in ("envoy", "gateway", "operator"):
        other = _pod(docs, component)
        assert "runtimeClassName" not in other
        assert "supplementalGroups" not in other["securityContext"]
    assert validate_builtin([d for d in docs if d["kind"] == "Deployment"]) == []
    default = _pod(_docs({}), "triton")
    assert "runtimeClassName" not in default
    assert "supplementalGroups" not in default["securityContext"]
    assert "at '/triton/runtimeClassName'" in _render_error({"triton": {"runtimeClassName": "A"}})
    assert "at '/triton/supplementalGroups/0'" in _render_error(
        {"triton": {"supplementalGroups": ["video"]}}
    )


def test_helm_test_models_must_be_the_sites():
    """The test pod asks Envoy for each of tests.models; the operator routes triton.models
    alone, so another model could only fail once `helm test` runs: refused, naming it."""
    refused = _render_error({"tests": {"models": ["deepmet", "nosuch"]}})
    assert "tests.models: nosuch is not one of triton.models" in refused
    docs = _docs({"tests": {"models": ["deepmet"]}})
    (test,) = [d for d in docs if d["kind"] == "Pod"]
    assert "--models=deepmet" in test["spec"]["containers"][0]["args"]
    assert _docs({"tests": {"enabled": False, "models": ["nosuch"]}})  # no test pod: unread


@pytest.mark.parametrize("placement", [False, True])
def test_a_demo_repository_that_builds_fewer_models_than_triton_loads_is_refused(placement):
    """The demo repository's init container builds its `models` alone; Triton is told to
    load triton.models (or the operator loads them on demand), so where the demo repository
    is Triton's only one, a model it does not build is in no repository: refused, naming it."""
    values = {
        "triton": {"modelRepositories": [{"source": "demo", "models": ["deepmet"]}]},
        "placement": {"enabled": placement},
    }
    refused = _render_error(values)
    assert "triton.modelRepositories[0].models: expected every model of triton.models" in refused
    assert "particlenet_ak4" in refused
    # every model built: renders, and the init container builds what Triton loads
    both = {"source": "demo", "models": ["deepmet", "particlenet_ak4"]}
    pod = _pod(_docs({**values, "triton": {"modelRepositories": [both]}}), "triton")
    (init,) = pod["initContainers"]
    assert set(init["command"][-1].split(",")) == {"deepmet", "particlenet_ak4"}
    # with another repository beside it, the others may be there: the chart cannot tell
    other = [{"source": "demo", "models": ["deepmet"]}, {"source": "pvc", "claimName": "models"}]
    assert _docs({**values, "triton": {"modelRepositories": other}})


def test_cvmfs_from_a_claim_and_a_nodes_autofs_at_once_is_refused():
    repos = [{"source": "cvmfs", "repository": "cms.cern.ch"}]
    cvmfs = {"existingClaim": "cvmfs", "hostPath": "/cvmfs"}
    refused = _render_error({"triton": {"modelRepositories": repos, "cvmfs": cvmfs}})
    assert "triton.cvmfs" in refused and "hostPath" in refused and "existingClaim" in refused
    assert "not both" in refused


@pytest.mark.parametrize("where", ["triton", "repository"])
def test_a_demo_model_the_build_does_not_make_is_refused_naming_those_it_makes(where):
    """`triton.models: [foo]` with the demo source rendered, and the init container then
    failed in the cluster ("unknown model(s)")."""
    from sonicsite.models.repository import model_names

    demo = {"source": "demo"} if where == "triton" else {"source": "demo", "models": ["foo"]}
    values = {"triton": {"models": ["foo"], "modelRepositories": [demo]}}
    refused = _render_error(values)
    made = ", ".join(sorted(model_names()))
    said = "triton.modelRepositories[0]: foo is not a demo model (its init container builds "
    said += f"only {made})"
    assert said in refused, refused
    assert _docs({"triton": {"models": sorted(model_names())}})  # every one it makes renders
    # beside a repository of the site's own, the demo builds those of triton.models it can
    own = [{"source": "demo"}, {"source": "pvc", "claimName": "site-models"}]
    pod = _pod(
        _docs({"triton": {"models": ["foo", "deepmet"], "modelRepositories": own}}), "triton"
    )
    assert pod["initContainers"][0]["command"][-1] == "deepmet"

"""Pools in the chart: one Deployment, headless Service and ScaledObject per pool, each pool
scaling on its own models' queue time and woken by requests held for its own models, min 0
allowed; the operator told each pool's models and Service as it parses them; what cannot be a
pool refused with the reason."""

from __future__ import annotations

import re

import pytest
import yaml
from chartcheck import CHART, check_profile, objects, render
from sonicsite.operator import option_policies
from sonicsite.operator.main import parser as operator_parser

POOLS = yaml.safe_load((CHART / "ci" / "gpu-pools-values.yaml").read_text())


def _named(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_the_pools_profile_renders_and_passes_every_schema_and_tool():
    report = check_profile("gpu-pools-values", POOLS)
    assert report.errors == [], "\n".join(report.errors)


def test_each_pool_has_its_deployment_service_and_scaled_object():
    docs = objects(render(POOLS))
    deployments = _named(docs, "Deployment")
    a100, t4 = deployments["site-sonicsite-triton-a100"], deployments["site-sonicsite-triton-t4"]
    assert "site-sonicsite-triton" not in deployments
    for deployment, pool, product in ((a100, "a100", "NVIDIA-A100"), (t4, "t4", "Tesla-T4")):
        spec = deployment["spec"]
        assert spec["selector"]["matchLabels"]["sonicsite.io/pool"] == pool
        pod = spec["template"]
        assert pod["metadata"]["labels"]["sonicsite.io/pool"] == pool
        assert pod["metadata"]["labels"]["app.kubernetes.io/component"] == "triton"
        assert pod["spec"]["nodeSelector"]["nvidia.com/gpu.product"].startswith(product)
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == 1
    services = _named(docs, "Service")
    for pool in ("a100", "t4"):
        service = services[f"site-sonicsite-triton-{pool}"]
        assert service["spec"]["clusterIP"] == "None"
        assert service["spec"]["selector"]["sonicsite.io/pool"] == pool
    scaled = _named(docs, "ScaledObject")
    assert sorted(scaled) == ["site-sonicsite-triton-a100", "site-sonicsite-triton-t4"]
    a100_so, t4_so = scaled["site-sonicsite-triton-a100"], scaled["site-sonicsite-triton-t4"]
    assert a100_so["spec"]["scaleTargetRef"]["name"] == "site-sonicsite-triton-a100"
    assert (a100_so["spec"]["minReplicaCount"], a100_so["spec"]["maxReplicaCount"]) == (0, 4)
    assert (t4_so["spec"]["minReplicaCount"], t4_so["spec"]["maxReplicaCount"]) == (1, 8)
    queue, held = (t["metadata"]["query"] for t in a100_so["spec"]["triggers"])
    assert 'model=~"particle_transformer"' in queue and 'model=~"particle_transformer"' in held
    queue, held = (t["metadata"]["query"] for t in t4_so["spec"]["triggers"])
    assert 'model!~"particle_transformer"' in queue and 'model!~"particle_transformer"' in held


def test_the_operator_gets_each_pool_and_its_service_as_it_parses_them():
    docs = objects(render(POOLS))
    (operator,) = [
        d for d in _named(docs, "Deployment").values() if "operator" in d["metadata"]["name"]
    ]
    parser = operator_parser()
    parsed = parser.parse_args(operator["spec"]["template"]["spec"]["containers"][0]["args"])
    settings = option_policies.placement_settings(parsed, parser)
    assert settings.pools == (("a100", ("particle_transformer",)), ("t4", ()))
    assert parsed.pool_service == ["a100=site-sonicsite-triton-a100", "t4=site-sonicsite-triton-t4"]


def test_a_release_without_pools_keeps_its_objects_names_and_selectors():
    """Upgrading a release that has no pools changes no name and no (immutable) selector."""
    docs = objects(render({}))
    (triton,) = [
        d
        for d in docs
        if d["kind"] == "Deployment" and d["metadata"]["name"] == "site-sonicsite-triton"
    ]
    assert "sonicsite.io/pool" not in triton["spec"]["selector"]["matchLabels"]
    operator = next(
        d for d in docs if d["kind"] == "Deployment" and "operator" in d["metadata"]["name"]
    )
    assert not [
        a for a in operator["spec"]["template"]["spec"]["containers"][0]["args"] if "pool" in a
    ]


@pytest.mark.parametrize(
    ("pools", "message"),
    [
        ([{"name": "a"}, {"name": "b"}], "at most one pool names no models"),
        ([{"name": "a", "models": ["deepmet"]}], "particlenet_ak4 is in no pool"),
        (
            [{"name": "a", "models": ["nosuch"]}, {"name": "b"}],
            "nosuch is not one of triton.models",
        ),
        ([{"name": "a"}, {"name": "a", "models": ["deepmet"]}], "a is named twice"),
        ([{"name": "A_100"}], "pools/0/name"),
        (
            [{"name": "a", "minReplicas": 3, "maxReplicas": 2}],
            r"pools\[a\].minReplicas: expected at most",
        ),
    ],
)
def test_what_cannot_be_a_pool_is_refused_with_the_reason(pools, message):
    values = {**POOLS, "pools": pools, "triton": {"models": ["particlenet_ak4", "deepmet"]}}
    with pytest.raises(Exception, match=message):
        render(values)


def test_pools_need_placement():
    values = {"pools": [{"name": "a"}], "monitoring": {"prometheus": {"enabled": True}}}
    with pytest.raises(Exception, match=r"pools: expected placement\.enabled"):
        render(values)


GPU_TAINT = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


def test_a_pools_own_zero_and_empty_values_are_kept_not_replaced_by_tritons():
    """A pool parked at 0 servers, or with no tolerations and no node selector of its own, is
    not given triton's (sprig's merge took 0, [] and {} for unset)."""
    values = {
        "triton": {
            "replicas": 2,
            "gpu": {"vendor": "nvidia", "count": 2},
            "nodeSelector": {"gpu": "yes"},
            "tolerations": [GPU_TAINT],
        },
        "pools": [
            {
                "name": "parked",
                "models": ["deepmet"],
                "replicas": 0,
                "nodeSelector": {},
                "tolerations": [],
                "gpu": {"vendor": "none"},
            },
            {"name": "amd", "gpu": {"vendor": "amd"}, "resources": {"limits": {"memory": "9Gi"}}},
        ],
        "placement": {"enabled": True},
    }
    deployments = _named(objects(render(values)), "Deployment")
    parked = deployments["site-sonicsite-triton-parked"]["spec"]
    assert parked["replicas"] == 0
    pod = parked["template"]["spec"]
    assert "tolerations" not in pod and "nodeSelector" not in pod
    assert not [k for k in pod["containers"][0]["resources"]["limits"] if "gpu" in k]
    amd = deployments["site-sonicsite-triton-amd"]["spec"]
    assert amd["replicas"] == 2  # triton's, the pool names none
    pod = amd["template"]["spec"]
    assert pod["tolerations"] == [GPU_TAINT] and pod["nodeSelector"] == {"gpu": "yes"}
    (triton,) = pod["containers"]
    assert triton["image"].startswith("rocm/tritonserver:")
    # the pool's gpu key by key over triton's (its count), its resources whole
    assert triton["resources"] == {
        "limits": {"memory": "9Gi", "amd.com/gpu": 2},
        "requests": {"amd.com/gpu": 2},
    }


def test_a_pool_with_only_a_gpu_count_keeps_tritons_vendor():
    """pools[].gpu applies key by key over triton's: {count: 2} alone is a pool of triton's
    GPUs, two per server (the schema once required a vendor)."""
    values = {
        "triton": {"gpu": {"vendor": "nvidia", "count": 1}},
        "pools": [{"name": "a", "gpu": {"count": 2}}],
        "placement": {"enabled": True},
    }
    pod = _named(objects(render(values)), "Deployment")["site-sonicsite-triton-a"]
    (triton,) = pod["spec"]["template"]["spec"]["containers"]
    assert triton["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert triton["image"].startswith("nvcr.io/nvidia/tritonserver:")


def test_a_pool_takes_tritons_runtime_groups_and_rollout_or_its_own():
    """runtimeClassName and supplementalGroups as given (a pool's "" or [] clears triton's),
    rollingUpdate key by key over triton's (a pool's 0 kept), both steps at 0 refused."""
    values = {
        "triton": {
            "gpu": {"vendor": "nvidia"},
            "runtimeClassName": "nvidia",
            "supplementalGroups": [44],
            "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1},
        },
        "pools": [
            {"name": "nv", "models": ["deepmet"]},
            {
                "name": "amd",
                "gpu": {"vendor": "amd"},
                "runtimeClassName": "",
                "supplementalGroups": [44, 109],
                "rollingUpdate": {"maxSurge": 1},
            },
        ],
        "placement": {"enabled": True},
    }
    deployments = _named(objects(render(values)), "Deployment")
    nv, amd = deployments["site-sonicsite-triton-nv"], deployments["site-sonicsite-triton-amd"]
    assert nv["spec"]["template"]["spec"]["runtimeClassName"] == "nvidia"
    assert nv["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"] == [44]
    assert nv["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert "runtimeClassName" not in amd["spec"]["template"]["spec"]
    assert amd["spec"]["template"]["spec"]["securityContext"]["supplementalGroups"] == [44, 109]
    assert amd["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 1}
    stuck = {**values, "pools": [{"name": "a", "rollingUpdate": {"maxUnavailable": 0}}]}
    with pytest.raises(Exception, match=r"pools\[a\]\.rollingUpdate: expected maxSurge or"):
        render(stuck)


DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def test_a_long_release_name_keeps_every_pools_objects_apart_and_within_63_characters():
    """The pool's suffix (and the gateway's `-pods`) is kept whole after the shortened rest, so
    that names stay DNS labels, distinct, and the references to them still meet."""
    release = "cms-tier2-analysis-facility-inference-prod-1"  # 44 characters
    values = {**POOLS, "gateway": {"replicas": 2}}
    docs = objects(render(values, name=release))
    services = _named(docs, "Service")
    deployments = _named(docs, "Deployment")
    scaled = _named(docs, "ScaledObject")
    for names in (services, deployments, scaled):
        assert all(len(n) <= 63 and DNS_LABEL.match(n) for n in names), sorted(names)
    pools = {n for n in deployments if n.endswith(("-a100", "-t4"))}
    assert len(pools) == 2 and pools <= set(services) and pools == set(scaled)
    assert {s["spec"]["scaleTargetRef"]["name"] for s in scaled.values()} == pools
    (operator,) = [d for d in deployments.values() if "--pool" in str(d)]
    args = operator["spec"]["template"]["spec"]["containers"][0]["args"]
    named = {a.split("=", 2)[2] for a in args if a.startswith("--pool-service=")}
    assert named == pools
    headless = [n for n in services if n.endswith("-pods")]
    (prometheus,) = [
        d for d in docs if d["kind"] == "ConfigMap" and "prometheus.yml" in d.get("data", {})
    ]
    config = yaml.safe_load(prometheus["data"]["prometheus.yml"])
    (gateway_job,) = [j for j in config["scrape_configs"] if j["job_name"] == "gateway"]
    assert gateway_job["dns_sd_configs"][0]["names"] == [f"{headless[0]}.hep.svc"]


def test_a_model_pinned_to_two_pools_is_refused_as_the_operator_refuses_it():
    """The operator refuses its own --pool arguments when a model is in two pools, and would
    never start: the chart refuses the values first, in the operator's words."""
    from sonicsite.operator.catalogue import Catalogue, CatalogueError, ModelInfo, Pool

    models = ["m1", "m2"]
    pools = [{"name": "a", "models": ["m1"]}, {"name": "b", "models": ["m1"]}, {"name": "c"}]
    with pytest.raises(CatalogueError) as operator:
        Catalogue(
            {m: ModelInfo(m) for m in models},
            tuple(Pool(p["name"], tuple(p.get("models", ()))) for p in pools),
        )
    values = {"placement": {"enabled": True}, "pools": pools, "triton": {"models": models}}
    with pytest.raises(Exception) as chart:
        render(values)
    assert "pools" in str(chart.value) and str(operator.value) in str(chart.value)
    # a model named twice in one pool: the schema's, naming the value
    twice = [{"name": "a", "models": ["m1", "m1"]}, {"name": "c"}]
    with pytest.raises(Exception, match="at '/pools/0/models'"):
        render({**values, "pools": twice})


def test_a_pools_models_are_matched_as_names_not_patterns():
    """`a.b` in a pool's PromQL matched `axb` too, and the pool of the others dropped it."""
    values = {
        **POOLS,
        "triton": {
            "models": ["a.b", "axb"],
            "modelRepositories": [{"source": "pvc", "claimName": "m"}],
        },
        "pools": [{"name": "dotted", "models": ["a.b"]}, {"name": "rest"}],
    }
    queries = {
        d["metadata"]["name"]: d["spec"]["triggers"][0]["metadata"]["query"]
        for d in objects(render(values))
        if d["kind"] == "ScaledObject"
    }
    dotted, rest = (
        next(q for n, q in queries.items() if n.endswith(p)) for p in ("dotted", "rest")
    )
    assert 'model=~"a\\\\.b"' in dotted and 'model!~"a\\\\.b"' in rest, queries

"""The chart's tracing (values `tracing`): every part told where to export, as the local
site tells them; the site's own OTLP endpoint or the chart's OpenTelemetry Collector."""

from __future__ import annotations

import pytest
import yaml
from chartcheck import CHART, check_profile, objects, render
from sonicsite.gateway.tracing import TracingSettings
from sonicsite.operator.main import build
from sonicsite.operator.main import parser as operator_parser
from sonicsite.operator.xds_tracing import EnvoyTracing

from sonicsite.local.tracing import TracingConfig, triton_flags

SITE_ENDPOINT = {
    "enabled": True,
    "endpoint": "http://otel.monitoring:4318/",
    "sampling": {"envoyPercent": 5, "gatewayRatio": 0.25, "tritonRate": 100},
}
COLLECTOR = {
    "enabled": True,
    "collector": {"enabled": True, "exportEndpoint": "https://tempo.example.org:4318"},
}


def _docs(values: dict) -> list[dict]:
    return objects(render(values))


def _component(docs: list[dict], kind: str, component: str) -> list[dict]:
    return [
        d
        for d in docs
        if d["kind"] == kind and d["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]


def _args(docs: list[dict], component: str) -> list[str]:
    (deployment,) = _component(docs, "Deployment", component)
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def _traced(args: list[str]) -> list[str]:
    return [a for a in args if a.startswith(("--trace-config", "--tracing-"))]


def test_tracing_is_off_by_default_and_no_part_is_told():
    docs = _docs({})
    assert all(_traced(_args(docs, c)) == [] for c in ("triton", "operator", "gateway"))
    assert not [d for d in docs if "otel-collector" in d["metadata"]["name"]]


def test_every_part_exports_to_the_sites_endpoint_as_the_local_site_tells_it():
    docs = _docs({"tracing": SITE_ENDPOINT})
    url = "http://otel.monitoring:4318/v1/traces"
    # Triton: the local site's flags (but its collector's URL and its per-server extras)
    local = triton_flags(TracingConfig(triton_rate=100), "collector:4318", "triton-0")
    local = [f.replace("http://collector:4318/v1/traces", url) for f in local]
    triton = _traced(_args(docs, "triton"))
    assert triton and set(triton) <= set(local), (triton, local)
    assert f"--trace-config=opentelemetry,url={url}" in triton
    assert "--trace-config=rate=100" in triton
    # Envoy, through the operator: the operator's own options take them
    operator = _traced(_args(docs, "operator"))
    options = operator_parser()
    parsed = options.parse_args(["--port=1", "--envoy-listen=h:2", "--site=s", *operator])
    assert (parsed.tracing_endpoint, parsed.tracing_sampling) == (url, 5.0)
    assert EnvoyTracing(parsed.tracing_endpoint, parsed.tracing_sampling).port == 4318
    gateway = _traced(_args(docs, "gateway"))
    assert f"--tracing-endpoint={url}" in gateway and "--tracing-sampling=0.25" in gateway
    assert not [d for d in docs if "otel-collector" in d["metadata"]["name"]]


def test_the_charts_collector_takes_otlp_from_every_part_and_sends_it_on():
    docs = _docs({"tracing": COLLECTOR})
    (service,) = _component(docs, "Service", "otel-collector")
    (config,) = _component(docs, "ConfigMap", "otel-collector")
    (deployment,) = _component(docs, "Deployment", "otel-collector")
    name = service["metadata"]["name"]
    url = f"http://{name}.hep.svc:4318/v1/traces"
    assert f"--trace-config=opentelemetry,url={url}" in _args(docs, "triton")
    assert f"--tracing-endpoint={url}" in _args(docs, "operator")
    assert f"--tracing-endpoint={url}" in _args(docs, "gateway")
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    assert ports == {"otlp-grpc": 4317, "otlp-http": 4318}
    settings = yaml.safe_load(config["data"]["config.yaml"])
    assert settings["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
    assert settings["exporters"] == {"otlphttp": {"endpoint": "https://tempo.example.org:4318"}}
    assert settings["service"]["pipelines"]["traces"]["exporters"] == ["otlphttp"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["volumes"][0]["configMap"]["name"] == config["metadata"]["name"]
    # no export endpoint: the collector's log
    logged = _component(
        _docs({"tracing": {**COLLECTOR, "collector": {"enabled": True}}}),
        "ConfigMap",
        "otel-collector",
    )
    assert yaml.safe_load(logged[0]["data"]["config.yaml"])["exporters"] == {
        "debug": {"verbosity": "basic"}
    }


def test_a_new_export_endpoint_restarts_the_collector_and_nothing_else():
    before = _docs({"tracing": COLLECTOR})
    moved = {**COLLECTOR, "collector": {"enabled": True, "exportEndpoint": "http://jaeger:4318"}}
    after = _docs({"tracing": moved})

    def template(docs: list[dict], component: str) -> dict:
        (deployment,) = _component(docs, "Deployment", component)
        return deployment["spec"]["template"]

    assert template(before, "otel-collector") != template(after, "otel-collector")
    for component in ("triton", "operator", "gateway", "envoy"):
        assert template(before, component) == template(after, component), component


def test_tracing_with_nowhere_to_export_and_bad_settings_are_refused():
    with pytest.raises(Exception, match=r"tracing\.endpoint .* or tracing\.collector\.enabled"):
        render({"tracing": {"enabled": True}})
    with pytest.raises(Exception, match="envoyPercent"):
        render({"tracing": {**SITE_ENDPOINT, "sampling": {"envoyPercent": 150}}})
    with pytest.raises(Exception, match="endpoint"):
        render({"tracing": {"enabled": True, "endpoint": "otel.monitoring:4318"}})
    with pytest.raises(Exception, match="tritonLevel"):
        render({"tracing": {**SITE_ENDPOINT, "tritonLevel": "ALL"}})


def test_the_charts_sampling_defaults_are_the_parts_own():
    values = yaml.safe_load((CHART / "values.yaml").read_text())["tracing"]
    local = TracingConfig()
    assert values["sampling"] == {
        "envoyPercent": local.envoy_sampling,
        "gatewayRatio": local.gateway_sampling,
        "tritonRate": local.triton_rate,
    }
    assert values["tritonLevel"] == local.triton_level
    options = operator_parser().parse_args(["--port=1", "--envoy-listen=h:2", "--site=s"])
    assert options.tracing_sampling == local.envoy_sampling
    assert TracingSettings("http://c:4318/v1/traces").sampling == local.gateway_sampling


def test_the_operator_builds_envoys_tracer_from_the_charts_arguments():
    docs = _docs({"tracing": SITE_ENDPOINT})
    options = operator_parser()
    args = ["--port=1", "--envoy-listen=127.0.0.1:2", "--site=/nonexistent"]
    operator = build(options.parse_args([*args, *_traced(_args(docs, "operator"))]), options)
    assert operator.tracing == EnvoyTracing(
        "http://otel.monitoring:4318/v1/traces", 5.0, "sonicsite-envoy"
    )
    listener = operator.snapshot.resources["listeners"][0]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["tracing"]["random_sampling"] == {"value": 5.0}
    assert "sonicsite_otel_collector" in [
        c["name"] for c in operator.snapshot.resources["clusters"]
    ]


@pytest.mark.parametrize("tracing", [SITE_ENDPOINT, COLLECTOR], ids=["site-endpoint", "collector"])
def test_traced_sites_pass_every_schema_and_tool(tracing):
    report = check_profile("tracing", {"tracing": tracing})
    assert report.errors == [], "\n".join(report.errors)


def test_the_collector_without_tracing_is_refused_naming_both():
    """The collector runs only with tracing on; alone it would be silently left out."""
    with pytest.raises(Exception) as caught:
        render({"tracing": {"enabled": False, "collector": {"enabled": True}}})
    refused = str(caught.value)
    assert "tracing.collector.enabled" in refused and "tracing.enabled" in refused
    assert not [d for d in _docs({}) if "otel-collector" in d["metadata"]["name"]]

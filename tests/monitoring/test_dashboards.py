"""The Grafana dashboards: built in code (monitoring/tools/dashboards.py, `make dashboards`),
committed as JSON, round-tripped through the SDK, queue time per request read from its two
definitions only, and every panel's queries answered by the local site's Prometheus after a
job stream that includes rejections."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest
from dashboard_builder import panels_without_data
from grafana_foundation_sdk.models.dashboard import Dashboard
from monitoring_dashboards import OUT, dashboards, panel_queries, to_json
from overload import SLEEPY_MODEL, sleepy
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate
from sonicsite.operator.admission import AdmissionPolicy
from sonicsite.operator.xds_jwt import JWKS_CLUSTER
from sonicsite.operator.xds_resources import (
    ALL_SERVERS,
    ALL_SERVERS_REST,
    OPERATOR_CLUSTER,
    model_cluster,
    rest_cluster,
)
from sonicsite.operator.xds_site_view import (
    HOLD_CLUSTER,
    HOLD_REST_CLUSTER,
    VIEW_CLUSTER,
    VIEW_REST_CLUSTER,
)
from sonicsite.operator.xds_tracing import TRACING_CLUSTER
from stock import kserve_json

from sonicsite.local import launcher

ROOT = OUT.parents[1]
BUILDER = ROOT / "monitoring" / "tools" / "dashboards.py"
QUEUE_RULE = "sonicsite:model_queue_seconds_per_request:30s"
QUEUE_GAUGE = "sonicsite_model_queue_seconds_per_request"


def test_the_committed_dashboards_are_the_built_ones_and_round_trip_through_the_sdk():
    built = dashboards()
    assert sorted(p.name for p in OUT.glob("*.json")) == sorted(built), "run `make dashboards`"
    for name, model in built.items():
        text = (OUT / name).read_text()
        assert text == to_json(model) + "\n", f"{name} is stale: run `make dashboards`"
        again = Dashboard.from_json(json.loads(text))
        assert json.loads(to_json(again)) == json.loads(text)
        board = json.loads(text)
        names = [v["name"] for v in board["templating"]["list"]]
        assert names == ["datasource", "namespace", "release", "model"]
        assert panel_queries(board)


def test_the_builder_run_as_make_dashboards_runs_it_writes_the_committed_json(tmp_path):
    # `make dashboards` runs the file as a script from the repository root (its own folder,
    # monitoring/tools, on the path); here into a folder of our own, not over the committed one.
    out = subprocess.run(
        [sys.executable, str(BUILDER), str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    written = sorted(p.name for p in tmp_path.glob("*.json"))
    assert written == sorted(p.name for p in OUT.glob("*.json"))
    for name in written:
        assert (tmp_path / name).read_text() == (OUT / name).read_text(), name


def test_queue_time_per_request_comes_from_its_definitions_not_from_the_dashboards():
    # Over the site: the scaling metric's recording rule; per server: the operator's gauge.
    # No panel divides Triton's queue counter by its requests again.
    queue_panels: dict[str, list[str]] = {}
    for name, model in dashboards().items():
        for title, expr in panel_queries(json.loads(to_json(model))):
            assert "nv_inference_queue_duration_us" not in expr, f"{name}: {title}: {expr}"
            if QUEUE_RULE in expr or QUEUE_GAUGE in expr:
                queue_panels.setdefault(name, []).append(expr)
    overview = queue_panels["sonicsite-overview.json"]
    per_model = queue_panels["sonicsite-model.json"]
    assert any(QUEUE_RULE in e for e in overview)
    assert any(QUEUE_RULE in e for e in per_model) and any(QUEUE_GAUGE in e for e in per_model)


# A series a panel reads, and the selector right after it (a name matched by `=`, `=~`, `!=`
# or `!~` is a label in a selector: Envoy's envoy_cluster_name); Prometheus's own `up` of
# each target (the site health row's targets down) where a selector follows it.
SERIES = re.compile(
    r"\b(nv_inference_[a-z_]+|sonicsite_[a-z_]+|sonicsite:[a-z0-9_:]+|envoy_[a-z_]+|up(?=\{))\b"
    r"(?!\s*[=!]~?)"
)


def test_every_query_selects_the_boards_namespace_and_release():
    """A board shows one release: every series every panel reads, recorded ones included,
    carries the namespace and release variables (one value each), so that releases sharing a
    Prometheus are never summed together."""
    for name, model in dashboards().items():
        board = json.loads(to_json(model))
        variables = {v["name"]: v for v in board["templating"]["list"]}
        for scoped in ("namespace", "release"):
            assert not variables[scoped]["multi"] and not variables[scoped]["includeAll"]
        assert "$namespace" in variables["release"]["query"]
        for title, expr in panel_queries(board):
            found = list(SERIES.finditer(expr))
            assert found, f"{name}: {title}: {expr}"
            for match in found:
                selector = expr[match.end() :].split("}", 1)[0]
                assert selector.startswith("{"), f"{name}: {title}: {match[1]} has no selector"
                assert 'namespace=~"$namespace"' in selector, f"{name}: {title}: {expr}"
                assert 'release=~"$release"' in selector, f"{name}: {title}: {expr}"


def _queries(board_name: str) -> list[tuple[str, str]]:
    return panel_queries(json.loads(to_json(dashboards()[board_name])))


def test_latency_at_envoy_reads_the_models_clusters_alone():
    """Envoy's upstream time over the clusters that carry a model's requests, as the operator
    names them: its own, and the all-servers pair its routes share where every server holds
    every model at full weight (route_clusters.py; a one-server site's only traffic); not the
    holding clusters (a held request waits minutes for its model to load), the site-view
    fan-out, the identity provider's keys, the collector or the ADS."""
    envoy = [
        expr
        for _, expr in _queries("sonicsite-overview.json")
        if "envoy_cluster_upstream_rq_time" in expr
    ]
    assert len(envoy) == 2  # p50, p99
    others = [
        OPERATOR_CLUSTER,
        HOLD_CLUSTER,
        HOLD_REST_CLUSTER,
        VIEW_CLUSTER,
        VIEW_REST_CLUSTER,
        JWKS_CLUSTER,
        TRACING_CLUSTER,
    ]
    for expr in envoy:
        found = re.search(r'envoy_cluster_name=~"([^"]+)"', expr)
        assert found, expr
        for value in ("particlenet_ak4", "simple"):  # one model chosen on the board
            chosen = re.compile(found[1].replace("$model", value))
            assert chosen.fullmatch(model_cluster(value)) and chosen.fullmatch(rest_cluster(value))
            assert not chosen.fullmatch(model_cluster("identity"))
            assert chosen.fullmatch(ALL_SERVERS) and chosen.fullmatch(ALL_SERVERS_REST)
        every = re.compile(found[1].replace("$model", ".*"))  # the board's "All"
        assert every.fullmatch(model_cluster("identity"))
        assert [c for c in others if every.fullmatch(c)] == []


# Counters (prometheus_client's `_total`, histograms' `_bucket` and `_count`, Triton's
# counters, which have no suffix) and the gauges of the same shape
COUNTER = re.compile(
    r"\b(\w+_total|\w+_bucket|\w+_seconds_count|nv_inference_request_(?:success|failure)"
    r"|nv_inference_(?:exec_)?count|nv_inference_\w+_duration_us)\{"
)


def test_no_panel_plots_a_counter_raw():
    """A counter's raw value is its count since the process started: a panel shows how
    much it rose (rate or increase over the rate interval)."""
    checked = 0
    for name in dashboards():
        for title, expr in _queries(name):
            for found in COUNTER.finditer(expr):
                before = expr[: found.start()].rstrip()
                assert before.endswith(("rate(", "increase(")), f"{name}: {title}: {expr}"
                checked += 1
    assert checked > 10
    admission = [e for _, e in _queries("sonicsite-overview.json") if "admission_changes" in e]
    assert admission and all("increase(" in e for e in admission)


def test_the_model_variable_offers_models_that_are_only_held():
    """A model of the placement catalogue that no server has loaded yet has requests held,
    and no Triton series: the variable offers it too, so the placement board can show it."""
    for name, model in dashboards().items():
        board = json.loads(to_json(model))
        (variable,) = [v for v in board["templating"]["list"] if v["name"] == "model"]
        query = variable["query"]
        query = query if isinstance(query, str) else query["query"]
        found = re.fullmatch(r'label_values\(\{__name__=~"([^"]+)", (.+)\}, model\)', query)
        assert found, f"{name}: {query}"
        names = re.compile(found[1])
        assert names.fullmatch("nv_inference_request_success"), name
        assert names.fullmatch("sonicsite_gateway_held_requests"), name
        assert found[2] == 'namespace=~"$namespace", release=~"$release"', name


def test_the_placement_board_shows_placements_failures():
    failures = [
        (title, expr)
        for title, expr in _queries("sonicsite-placement.json")
        if "sonicsite_placement_failures_total" in expr
    ]
    assert {title for title, _ in failures} == {"Placement failures"}
    assert any("by (action, model, server)" in expr for _, expr in failures)


# The boards a site without placement fills; sonicsite-placement.json is checked on a site
# with placement on (tests/operator/test_holding.py).
SITE_BOARDS = ("sonicsite-overview.json", "sonicsite-model.json")
MODEL = SLEEPY_MODEL  # queue time from sleeping executions, at little CPU (overload.py)


@pytest.fixture(scope="module")
def busy_site(tmp_path_factory, built_models):
    """A one-server site with Prometheus and an admission threshold a short stream crosses."""
    site_dir = tmp_path_factory.mktemp("dashboards") / "site"
    policy = AdmissionPolicy(
        shed_above_ms=5,
        open_below_ms=2,
        min_hold_s=1,
        retry_after_s=1,
        inflight_cap=64,
        compute_multiple=0.0,  # the ms thresholds alone: shed by queue time
    )
    state = launcher.up(
        site_dir,
        servers=1,
        models=[MODEL, "simple"],
        build_dir=built_models,
        admission=policy,
        delay_ms=sleepy(1),
    )
    yield state
    launcher.down(site_dir)


def _gateway_rejections(state, stop: threading.Event, seen: list[int]) -> None:
    """HTTP requests to the gateway, one after another while the stream runs, until one is
    refused with 429."""
    sample = generate(MODEL, 1, seed=9)
    body = kserve_json(sample.reference_inputs(0, 1))
    url = f"http://{state.http}/v2/models/{MODEL}/infer"
    while not stop.is_set() and 429 not in seen:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as r:
                seen.append(r.status)
        except urllib.error.HTTPError as exc:
            seen.append(exc.code)


def _keep_busy(client: Client, jets, stop: threading.Event, results: list) -> None:
    """A running job: streams of the model, one after another, until `stop`."""
    while not stop.is_set():
        results.append(
            client.stream(MODEL, jets.spec, batch=8, window=8, max_tries=100).run(
                jets, lambda *a: None
            )
        )


def test_every_panel_of_every_dashboard_has_data_on_a_live_site(busy_site):
    """A running job loads the site until its model is shed; new jobs (a fresh client each,
    which the model has not answered) are shed at Envoy and plain HTTP calls at the
    gateway, while the running job goes on (client/admitted.py)."""
    assert busy_site.prometheus, "the local site starts Prometheus when it is installed"
    jets = generate(MODEL, 256, seed=3)
    small = generate(MODEL, 32, seed=4)
    stop, seen, running = threading.Event(), [], []
    poker = threading.Thread(target=_gateway_rejections, args=(busy_site, stop, seen))
    overloaded = 0
    with Client(from_site_file(busy_site.site_dir), "grpc") as load:
        loader = threading.Thread(target=_keep_busy, args=(load, jets, stop, running))
        loader.start()
        poker.start()
        try:

            def a_new_job_shed_at_envoy_and_a_429_from_the_gateway() -> bool:
                nonlocal overloaded
                with Client(from_site_file(busy_site.site_dir), "grpc") as job:
                    result = job.stream(MODEL, small.spec, batch=8, window=8, max_tries=100).run(
                        small, lambda *a: None
                    )
                assert result.events_ok == 32 and result.failed == {}
                overloaded += result.overloaded
                return overloaded > 0 and 429 in seen

            wait_until(
                a_new_job_shed_at_envoy_and_a_429_from_the_gateway,
                "a new job shed at Envoy and a 429 from the gateway",
                timeout=300,
            )
        finally:
            stop.set()
            poker.join(timeout=60)
            loader.join(timeout=300)
    assert not poker.is_alive() and not loader.is_alive()
    assert overloaded > 0, "no stream was shed: no rejection to show"
    assert 429 in seen and 200 in seen
    assert running and all(r.events_ok == 256 and r.failed == {} for r in running)
    # Wait for the samples the panels need: the last scrapes, two samples of each counter for
    # its rate, and 30 s of history behind the scaling metric's recording rule.
    missing: list[str] = []

    def every_panel_answers() -> bool:
        missing[:] = panels_without_data(busy_site.prometheus, SITE_BOARDS)
        return not missing

    with contextlib.suppress(AssertionError):
        wait_until(every_panel_answers, "every panel's queries to return data", timeout=180)
    assert missing == []

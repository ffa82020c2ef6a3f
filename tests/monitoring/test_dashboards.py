"""The Grafana dashboards: built in code, committed as JSON, round-tripped through the SDK,
and every panel's queries answered by the local site's Prometheus after a job stream that
includes rejections."""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request

import pytest
from grafana_foundation_sdk.models.dashboard import Dashboard
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.dashboards import OUT, dashboards, panel_queries, to_json
from sonicsite.models.samples import generate
from sonicsite.operator.admission import AdmissionPolicy
from stock import kserve_json

from sonicsite.local import launcher, prometheus

GRAFANA_VARIABLES = {
    "$namespace": ".*",
    "$release": ".*",
    "$model": ".*",
    "$__rate_interval": "1m",
}


def test_the_committed_dashboards_are_the_built_ones_and_round_trip_through_the_sdk():
    built = dashboards()
    assert sorted(p.name for p in OUT.glob("*.json")) == sorted(built)
    for name, model in built.items():
        text = (OUT / name).read_text()
        assert text == to_json(model) + "\n", f"{name}: run python -P -m sonicsite.dashboards"
        again = Dashboard.from_json(json.loads(text))
        assert json.loads(to_json(again)) == json.loads(text)
        board = json.loads(text)
        names = [v["name"] for v in board["templating"]["list"]]
        assert names == ["datasource", "namespace", "release", "model"]
        assert panel_queries(board)


def _substitute(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


@pytest.fixture(scope="module")
def busy_site(tmp_path_factory, built_models):
    """A one-server site with Prometheus and an admission threshold a short stream crosses."""
    site_dir = tmp_path_factory.mktemp("dashboards") / "site"
    policy = AdmissionPolicy(
        shed_above_ms=5, open_below_ms=2, min_hold_s=1, retry_after_s=1, inflight_cap=64
    )
    state = launcher.up(
        site_dir,
        servers=1,
        models=["particlenet_ak4", "simple"],
        build_dir=built_models,
        admission=policy,
    )
    yield state
    launcher.down(site_dir)


def _gateway_rejections(state, stop: threading.Event, seen: list[int]) -> None:
    """HTTP requests to the gateway while the stream runs, until one is refused with 429."""
    sample = generate("particlenet_ak4", 1, seed=9)
    body = kserve_json(sample.reference_inputs(0, 1))
    url = f"http://{state.http}/v2/models/particlenet_ak4/infer"
    while not stop.is_set() and 429 not in seen:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=30) as r:
                seen.append(r.status)
        except urllib.error.HTTPError as exc:
            seen.append(exc.code)
        time.sleep(0.05)


def test_every_panel_of_every_dashboard_has_data_on_a_live_site(busy_site):
    assert busy_site.prometheus, "the local site starts Prometheus when it is installed"
    jets = generate("particlenet_ak4", 256, seed=3)
    stop, seen = threading.Event(), []
    poker = threading.Thread(target=_gateway_rejections, args=(busy_site, stop, seen))
    poker.start()
    overloaded, deadline = 0, time.monotonic() + 90
    try:
        with Client(from_site_file(busy_site.site_dir), "grpc") as client:
            # streams until one is shed at Envoy (the decision takes a second or two to arrive)
            while not (overloaded and 429 in seen) and time.monotonic() < deadline:
                result = client.stream(
                    "particlenet_ak4", jets.spec, batch=16, window=8, max_tries=100
                ).run(jets, lambda *a: None)
                assert result.events_ok == 256 and result.failed == {}
                overloaded += result.overloaded
    finally:
        stop.set()
        poker.join(timeout=60)
    assert overloaded > 0, "no stream was shed: no rejection to show"
    assert 429 in seen and 200 in seen
    time.sleep(6)  # the last scrapes land
    empty = []
    for name, model in dashboards().items():
        board = json.loads(to_json(model))
        panels: dict[str, int] = {}
        for title, expr in panel_queries(board):
            answer = prometheus.query(busy_site.prometheus, _substitute(expr))
            panels[title] = panels.get(title, 0) + len(answer)
        empty += [f"{name}: {title}" for title, series in panels.items() if series == 0]
    assert empty == []

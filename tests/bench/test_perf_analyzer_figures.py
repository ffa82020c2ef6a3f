"""A perf_analyzer run that never got stable gives its last windows' mean throughput and no
p99: each path's figures say how many repeats they rest on and how many were unstable, in
the dataplane, gateway and stock-tools benches alike (`perf_analyzer.run_figures`)."""

from __future__ import annotations

from types import SimpleNamespace

from sonicsite.bench import dataplane, gateway, stock_tools
from sonicsite.bench.perf_analyzer import run_figures

CASE = dataplane.CASES["identity_10kb"]


def _run(stable: bool, throughput: float = 100.0) -> dict:
    """One run as perf_analyzer() gives it: an unstable one has no p99."""
    return {
        "throughput": throughput,
        "p50_ms": 1.0,
        "p99_ms": 2.0 if stable else None,
        "stability": {"stable": stable, "attempts": []},
    }


def test_a_figure_says_how_many_repeats_it_rests_on_and_how_many_were_unstable():
    found = run_figures([_run(True), _run(False, 90.0), _run(True, 110.0)])
    assert found["throughput"]["repeats_used"] == 3 and found["throughput"]["unstable"] == 1
    assert found["p99_ms"]["repeats_used"] == 2 and found["p99_ms"]["unstable"] == 1
    assert found["p99_ms"]["repeats"] == [2.0, 2.0]
    assert found["unstable_runs"] == 1 and len(found["runs"]) == 3
    # stock_tools' records say `stable` at the top; the client's runs say nothing: stable
    flat = run_figures([{"throughput": 5.0, "p50_ms": 1.0, "p99_ms": None, "stable": False}])
    assert flat["p99_ms"] is None and flat["throughput"]["unstable"] == 1
    client = run_figures([{"throughput": 5.0, "p50_ms": 1.0, "p99_ms": 2.0}])
    assert client["p99_ms"]["unstable"] == 0 and client["p99_ms"]["repeats_used"] == 1


def _unstable_every_other(calls: list[int]):
    """perf_analyzer stood in for: every second run does not get stable."""

    def fake(*_args, **_kwargs) -> dict:
        calls.append(1)
        return _run(len(calls) % 2 == 1)

    return fake


def test_dataplane_and_gateway_figures_count_their_unstable_runs(monkeypatch, tmp_path):
    calls: list[int] = []
    monkeypatch.setattr(dataplane, "perf_analyzer", _unstable_every_other(calls))
    monkeypatch.setattr(dataplane, "SiteRecord", lambda **_kw: None)
    monkeypatch.setattr(
        dataplane, "sonicsite_client", lambda *_a: {"throughput": 9.0, "p50_ms": 1.0, "p99_ms": 2.0}
    )
    server = SimpleNamespace(grpc="a:1", http="a:2")
    state = SimpleNamespace(servers=[server], grpc="e:1", http="g:1")
    found = dataplane._measure_case(state, CASE, 1, 2, {}, tmp_path)
    used = {p: f["throughput"]["repeats_used"] for p, f in found.items() if "runs" in f}
    assert used["perf_analyzer/direct"] == 2 and used["client/direct"] == 2
    unstable = (
        found["perf_analyzer/direct"]["unstable_runs"]
        + found["perf_analyzer/envoy"]["unstable_runs"]
    )
    assert unstable == 2 and found["client/envoy"]["p99_ms"]["unstable"] == 0
    calls.clear()
    monkeypatch.setattr(gateway, "perf_analyzer", _unstable_every_other(calls))
    found = gateway._measure_case(state, CASE, 1, 2, {}, tmp_path)
    assert (
        found["direct"]["p99_ms"]["repeats_used"] + found["gateway"]["p99_ms"]["repeats_used"] == 2
    )
    assert found["direct"]["unstable_runs"] + found["gateway"]["unstable_runs"] == 2


def test_stock_tools_figures_count_their_unstable_runs(monkeypatch, tmp_path):
    runs = iter([True, False, True, True])

    def fake(*_args, **_kwargs) -> dict:
        stable = next(runs)
        return {**_run(stable), "stable": stable, "ok": stable, "error": None}

    monkeypatch.setattr(stock_tools, "run_perf_analyzer", fake)
    monkeypatch.setattr(stock_tools, "requests_per_host", lambda _admin: {})
    monkeypatch.setattr(stock_tools, "envoy_share", lambda *_a: {})
    state = SimpleNamespace(grpc="e:1", http="g:1", envoy_admin="", servers=[])
    options = stock_tools.Options(runs=2, models=("simple",))
    found = stock_tools._runs_in_a_row(state, options, {}, tmp_path)
    assert found["grpc_envoy/simple"]["p99_ms"] == {
        **found["grpc_envoy/simple"]["p99_ms"],
        "repeats_used": 1,
        "unstable": 1,
    }
    assert found["http_gateway/simple"]["unstable_runs"] == 0


def _case(direct: float, envoy: float, added_p50: float) -> dict:
    """One case's perf_analyzer figures: throughputs and p50s through each path."""
    figures = {}
    for path, throughput, p50 in (("direct", direct, 1.0), ("envoy", envoy, 1.0 + added_p50)):
        figures[f"perf_analyzer/{path}"] = run_figures(
            [{"throughput": throughput, "p50_ms": p50, "p99_ms": 2 * p50}]
        )
    return figures


def test_the_dataplane_summary_names_its_worst_case_not_only_the_headline():
    """Envoy at 0.53 of direct on one identity case, adding most on another: both named."""
    results = {
        "identity_10kb/c1": _case(1000.0, 820.0, 0.2),
        "identity_200kb/c4": _case(400.0, 212.0, 0.5),
        "identity_1mb/c1": _case(100.0, 70.0, 1.4),
        "particlenet_16/c4": _case(10.0, 9.8, 0.1),
    }
    worst = dataplane.worst_cases(results, "perf_analyzer/direct", "perf_analyzer/envoy")
    assert worst["lowest_throughput_ratio"] == {"case": "identity_200kb/c4", "ratio": 0.53}
    assert worst["highest_added_p50_ms"] == {"case": "identity_1mb/c1", "added_ms": 1.4}
    assert dataplane.worst_cases({}, "perf_analyzer/direct", "perf_analyzer/envoy") == {
        "lowest_throughput_ratio": None,
        "highest_added_p50_ms": None,
    }

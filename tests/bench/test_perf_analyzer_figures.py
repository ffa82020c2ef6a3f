"""A perf_analyzer run that never got stable gives its last windows' mean throughput and no
p99: each path's figures say how many repeats they rest on and how many were unstable, in
the dataplane, gateway and stock-tools benches alike (`perf_analyzer.run_figures`)."""

from __future__ import annotations

from sonicsite.bench import dataplane, gateway, stock_tools
from sonicsite.bench.perf_analyzer import run_figures, unstable_runs


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


CLIENT_RUN = {"throughput": 9.0, "p50_ms": 1.0, "p99_ms": 2.0, "requests": 300}  # no windows


def test_dataplane_figures_count_their_unstable_runs():
    """Two repeats, the paths taking turns: one perf_analyzer run per path never got stable.
    The client's runs have no windows: stable, every figure resting on both."""
    runs = {
        "perf_analyzer/direct": [_run(True), _run(False, 90.0)],
        "perf_analyzer/envoy": [_run(False, 80.0), _run(True)],
        "client/direct": [CLIENT_RUN, CLIENT_RUN],
        "client/envoy": [CLIENT_RUN, CLIENT_RUN],
    }
    found = dataplane.case_figures(runs)
    used = {p: f["throughput"]["repeats_used"] for p, f in found.items() if "runs" in f}
    assert used == dict.fromkeys(runs, 2)
    direct = found["perf_analyzer/direct"]
    assert direct["p99_ms"]["repeats_used"] == 1 and direct["p99_ms"]["unstable"] == 1
    assert direct["unstable_runs"] + found["perf_analyzer/envoy"]["unstable_runs"] == 2
    assert found["client/envoy"]["p99_ms"] == {
        **found["client/envoy"]["p99_ms"],
        "repeats_used": 2,
        "unstable": 0,
    }
    assert found["perf_analyzer/envoy_vs_direct"]["throughput_ratio"]["repeats"] == [0.8, 1.1111]
    assert unstable_runs({"identity_10kb/c1": found}) == 2  # the summary's count


def test_gateway_figures_count_their_unstable_runs():
    found = gateway.case_figures(
        {"direct": [_run(True), _run(False)], "gateway": [_run(False), _run(True)]}
    )
    assert (
        found["direct"]["p99_ms"]["repeats_used"] + found["gateway"]["p99_ms"]["repeats_used"] == 2
    )
    assert found["direct"]["unstable_runs"] + found["gateway"]["unstable_runs"] == 2
    assert found["gateway_vs_direct"]["throughput_ratio"]["repeats"] == [1.0, 1.0]
    assert unstable_runs({"identity_10kb/c1": found}) == 2


def _record(k: int, stable: bool) -> dict:
    """Run k of stock_tools' runs in a row, as `run_perf_analyzer` records one: `stable` at
    its top, an unstable one with its last windows' mean and no p99."""
    figures = _run(stable)
    return {
        "run": k,
        "rc": 0 if stable else 99,
        "stable": stable,
        "windows": 3 if stable else 10,
        "error": None,
        "throughput": figures["throughput"],
        "p50_ms": figures["p50_ms"],
        "p99_ms": figures["p99_ms"],
        "ok": stable,
    }


def test_stock_tools_figures_count_their_unstable_runs():
    servers = ["triton-0", "triton-1", "triton-2"]
    envoy = stock_tools.in_a_row_figures(
        "grpc", "e:1", servers, [_record(1, True), _record(2, False)]
    )
    assert envoy["p99_ms"] == {**envoy["p99_ms"], "repeats_used": 1, "unstable": 1}
    assert envoy["throughput"]["repeats_used"] == 2 and envoy["unstable_runs"] == 1
    assert envoy["runs_ok"] == 1 and envoy["servers_it_could_use"] == servers
    gateway_path = stock_tools.in_a_row_figures(
        "http", "g:1", servers, [_record(1, True), _record(2, True)]
    )
    assert gateway_path["unstable_runs"] == 0 and gateway_path["runs_ok"] == 2


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

"""The stock-tools bench, reduced: perf_analyzer completes through Envoy without a header and
through the gateway on a three-server site with admission at its defaults, and the JSON says
every run as it came, the direct baseline and Envoy's requests per server; the ratio compares
Envoy and direct over the same one server."""

from __future__ import annotations

import json

from sonicsite.bench import stock_tools
from sonicsite.bench.perf_analyzer import Window


def test_perf_analyzer_completes_through_envoy_and_the_gateway(tmp_path, built_models):
    """One run per path on `simple` with short windows, one direct/Envoy turn: no error, at
    least three windows each; ratios are a bench's figures, not asserted here."""
    options = stock_tools.Options(
        runs=1,
        repeats=1,
        models=("simple",),
        windows={"simple": Window("count_windows", 100)},
        build_dir=built_models,
        max_trials=4,  # a run ends stable or not within 4 windows: not asserted here
    )
    result = stock_tools.run(tmp_path / "stock.json", options)
    saved = json.loads((tmp_path / "stock.json").read_text())
    assert saved["summary"] == result["summary"]
    summary = saved["summary"]
    assert summary["perf_analyzer_runs"] == 2
    assert summary["perf_analyzer_errors"] == 0, saved["details"]["runs_in_a_row"]
    assert summary["ratio_runs_errors"] == 0, saved["details"]["ratio"]
    assert summary["sheds"] == 0
    assert "envoy_no_header_throughput_ratio_simple" in summary
    assert "envoy_with_header_throughput_ratio_simple" in summary  # where a gap would be
    assert summary["bare_envoy_throughput_ratio_simple"] > 0  # the floor, measured alongside
    assert summary["envoy_no_header_over_bare_envoy_simple"] > 0
    assert "envoy_no_header_throughput_ratio_particlenet_ak4" not in summary  # not measured
    assert summary["targets"]["perf_analyzer_errors"] == "== 0"
    assert saved["details"]["perf_analyzer"]["max_trials"] == 4

    cases = saved["details"]["runs_in_a_row"]
    assert set(cases) == {"grpc_envoy/simple", "http_gateway/simple"}
    for case in cases.values():
        (run,) = case["runs"]
        assert run["rc"] is not None and run["error"] is None, run
        assert run["windows"] >= 3 and run["throughput"] > 0
        assert case["servers_it_could_use"] == ["triton-0", "triton-1", "triton-2"]
    envoy_run = cases["grpc_envoy/simple"]["runs"][0]
    assert sum(envoy_run["envoy"]["requests_per_server"].values()) > 0  # Envoy's own count

    ratio = saved["details"]["ratio"]["simple"]
    could = ratio["servers_it_could_use"]
    # like for like: Envoy reaches exactly the one server direct reaches
    assert could["direct"] == ["triton-1"]
    assert could["envoy_no_header"] == could["envoy_with_header"] == could["direct"]
    assert could["envoy_bare"] == could["direct"]
    assert set(ratio["envoy_share_per_server"]) == {"triton-0", "triton-1", "triton-2"}
    (no_header,) = ratio["envoy_no_header"]["runs"]
    sent = no_header["envoy"]["requests_per_server"]
    assert sent["triton-1"] > 0 and sent["triton-0"] == sent["triton-2"] == 0, sent
    for path in ("direct", "envoy_no_header", "envoy_with_header", "envoy_bare"):
        (run,) = ratio[path]["runs"]
        assert run["error"] is None and run["windows"] >= 3, run

    meta = saved["meta"]
    assert meta["admission"] == stock_tools.conditions(stock_tools.AdmissionPolicy())["admission"]
    assert meta["autoscaling"].startswith("off")
    assert saved["details"]["site"]["holding"]["particlenet_ak4"] == ["triton-1"]

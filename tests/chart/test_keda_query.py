"""KEDA's query, verbatim from the rendered chart, run by promtool: the scaling metric (queue
time per request over the release's servers), no higher than the cap the operator exports
for the work its clients declare (`sonicsite_autoscaler_declared_cap_seconds`), so that the
HPA's ceil(servers × metric / target) starts no server that work would leave idle, as the
local autoscaler does (operator/autoscaler.py `scale_up_cap`)."""

from __future__ import annotations

import subprocess

import yaml
from chartcheck import objects, render

RELEASE = 'namespace="hep",release="site"'  # chartcheck's release
# 30 s window at 60 s: 6 steps of 5 s, 100 requests and 100 s of queueing a step: 1 s each
QUEUE = [
    {
        "series": f'nv_inference_queue_duration_us{{{RELEASE},model="m",instance="s0"}}',
        "values": "0+100000000x12",
    },
    {
        "series": f'nv_inference_request_success{{{RELEASE},model="m",instance="s0"}}',
        "values": "0+100x12",
    },
]


def _cap(value: float, scope: str = RELEASE, pool: str = "default") -> dict:
    labels = f'{scope},pool="{pool}",instance="op"'
    return {
        "series": f"sonicsite_autoscaler_declared_cap_seconds{{{labels}}}",
        "values": f"{value}x12",
    }


def _query(values: dict) -> str:
    (scaled,) = [o for o in objects(render(values)) if o["kind"] == "ScaledObject"]
    return scaled["spec"]["triggers"][0]["metadata"]["query"]


def test_the_scaling_metric_is_capped_by_the_declared_work(tmp_path):
    query = _query(
        {"autoscaling": {"enabled": True}, "monitoring": {"prometheus": {"enabled": True}}}
    )
    cases = [
        ([], 1.0),  # no work declared: queue time alone
        ([_cap(0.25)], 0.25),  # the declared work allows less than the queue asks: it holds
        ([_cap(3.0)], 1.0),  # the cap is higher: queue time
        ([_cap(0.25, 'namespace="cms",release="other"')], 1.0),  # another release's cap
        ([_cap(0.25, pool="gpu-b")], 1.0),  # another pool's cap
    ]
    tests = [
        {
            "interval": "5s",
            "input_series": QUEUE + extra,
            "promql_expr_test": [
                {
                    "expr": query,
                    "eval_time": "60s",
                    "exp_samples": [{"labels": "{}", "value": want}],
                }
            ],
        }
        for extra, want in cases
    ]
    _promtool(tmp_path, tests)


def test_with_placement_a_pool_at_zero_reads_zero_not_nothing(tmp_path):
    values = {
        "autoscaling": {"enabled": True, "minReplicas": 0},
        "placement": {"enabled": True},
        "monitoring": {"prometheus": {"enabled": True}},
    }
    query = _query(values)
    test = {
        "interval": "5s",
        "input_series": [_cap(0.25)],  # no Triton series at all
        "promql_expr_test": [
            {"expr": query, "eval_time": "60s", "exp_samples": [{"labels": "{}", "value": 0}]}
        ],
    }
    _promtool(tmp_path, [test])


def _promtool(folder, tests: list[dict]) -> None:
    """promtool's unit tests of PromQL expressions (no rule file: each test evaluates the
    query itself over its input series)."""
    (folder / "keda.test.yaml").write_text(
        yaml.safe_dump({"rule_files": [], "evaluation_interval": "5s", "tests": tests})
    )
    out = subprocess.run(
        ["promtool", "test", "rules", "keda.test.yaml"], cwd=folder, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout

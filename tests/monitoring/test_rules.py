"""Monitoring rules: promtool's checks and unit tests, and the scaling metric proven equal to
the autoscaler's on the same live data in a real Prometheus."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate
from sonicsite.operator.autoscaler import ScalingPolicy, queue_ms_per_request
from sonicsite.operator.loadview import _Scrape, compute_loads

from sonicsite.local import prometheus
from sonicsite.local.processes import stop_group
from sonicsite.local.ports import free_ports

ROOT = Path(__file__).resolve().parents[1]
RULES = sorted((ROOT / "monitoring" / "rules").glob("*.yaml"))
AUTOSCALING = ROOT / "monitoring" / "rules" / "autoscaling.rules.yaml"


def test_rules_pass_promtool_check_and_unit_tests():
    out = subprocess.run(
        ["promtool", "check", "rules", *map(str, RULES)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    tests = sorted((ROOT / "monitoring" / "tests").glob("*.test.yaml"))
    assert tests
    out = subprocess.run(
        ["promtool", "test", "rules", *[t.name for t in tests]],
        cwd=ROOT / "monitoring" / "tests",
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count("SUCCESS") == len(tests)


@pytest.fixture
def live_prometheus(site, tmp_path):
    address = f"127.0.0.1:{free_ports(1)[0]}"
    targets = [f"{s.host}:{s.metrics_port}" for s in site.servers]
    config = tmp_path / "prometheus.yml"
    config.write_text(json.dumps(prometheus.config(targets, RULES)))
    out = subprocess.run(
        ["promtool", "check", "config", str(config)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stdout + out.stderr
    proc = prometheus.start(config, tmp_path / "data", address, tmp_path / "prometheus.log")
    try:
        prometheus.wait_ready(proc, address, tmp_path / "prometheus.log")
        yield address
    finally:
        stop_group(proc.pid)
        proc.wait(timeout=30)


def _scrapes(address: str, at: float) -> dict[str, _Scrape]:
    """Triton's counters as Prometheus holds them at `at`, per scraped server."""
    names = {
        "nv_inference_queue_duration_us": "queue_us",
        "nv_inference_request_success": "success",
    }
    scrapes: dict[str, _Scrape] = {}
    for metric, key in names.items():
        for sample in prometheus.query(address, metric, at):
            instance, model = sample["metric"]["instance"], sample["metric"]["model"]
            scrape = scrapes.setdefault(instance, _Scrape(at, {}))
            scrape.models.setdefault(model, {})[key] = float(sample["value"][1])
    return scrapes


def test_autoscaler_metric_equals_the_recording_rule_on_live_data(site, live_prometheus):
    window = ScalingPolicy().window_s
    assert "offset 30s" in AUTOSCALING.read_text() and window == 30.0
    jets = generate("particlenet_ak4", 64, seed=2)
    simple = generate("simple", 64, seed=2)
    stop = threading.Event()

    def load() -> None:  # two models, through Envoy, for longer than the window
        with Client(from_site_file(Path(site.site_dir)), "grpc") as client:
            while not stop.is_set():
                client.stream("particlenet_ak4", jets.spec, batch=16, window=4).run(
                    jets, lambda *a: None
                )
                client.stream("simple", simple.spec, batch=8, window=2).run(simple, lambda *a: None)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        started = time.monotonic()
        recorded: list[dict] = []
        while time.monotonic() - started < 90:
            time.sleep(2)
            if time.monotonic() - started < window + 15:
                continue  # a full window of samples (the first scrape lands ~5 s after start)
            recorded = prometheus.query(live_prometheus, "sonicsite:queue_seconds_per_request:max")
            if recorded and float(recorded[0]["value"][1]) > 0:
                break
    finally:
        stop.set()
        worker.join(timeout=120)
    assert recorded, "the recording rule produced nothing"
    # Evaluate the rule's own expression at an instant whose scrapes have all landed (a scrape
    # that began before a rule ran can be stored after it), on exactly the samples our
    # function is given.
    at = time.time() - 5
    rules = {
        r["record"]: r["expr"]
        for g in yaml.safe_load(AUTOSCALING.read_text())["groups"]
        for r in g["rules"]
    }
    per_model = rules["sonicsite:model_queue_seconds_per_request:30s"]
    expr = rules["sonicsite:queue_seconds_per_request:max"].replace(
        "sonicsite:model_queue_seconds_per_request:30s", f"({per_model})"
    )
    value = float(prometheus.query(live_prometheus, expr, at)[0]["value"][1])
    now, then = _scrapes(live_prometheus, at), _scrapes(live_prometheus, at - window)
    loads = [
        load
        for instance in now
        if instance in then
        for load in compute_loads(instance, then[instance], now[instance])
    ]
    ours = queue_ms_per_request(loads)
    assert ours is not None and ours > 0
    assert value * 1e3 == pytest.approx(ours, rel=1e-9)  # the same quantity, the same data

"""Job streams: every event answered exactly once, across servers, even when one dies."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

import pytest
from envoy_routes import route_counter
from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.jobs.driver import Progress, StreamSpec, submit
from sonicsite.jobs.executions import (
    EXECUTED,
    EXECUTIONS_DIR,
    RequestId,
    parse_log_line,
    parse_request_id,
)
from sonicsite.local import envoy, launcher


def _unread_bytes(port: int) -> int:
    """Bytes that reached the server listening on `port` and wait unread in its connections'
    receive queues (the kernel's /proc/net/tcp: `tx_queue:rx_queue` of each established
    socket whose local end is that port)."""
    unread = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, queues = fields[1], fields[3], fields[4]
            if state == "01" and int(local.rsplit(":", 1)[1], 16) == port:
                unread += int(queues.split(":")[1], 16)
    return unread


def _answers(out: Path) -> Counter:
    counts: Counter = Counter()
    for path in sorted((out / "jobs").glob("job-*.json")):
        counts.update({int(k): v for k, v in json.loads(path.read_text())["answered"].items()})
    return counts


def _executions(site_dir: Path, stream: str) -> list[tuple[str, RequestId]]:
    """The stream's requests as the servers' logs have them: (server, request), each
    server's in the order it executed them."""
    found = []
    for path in sorted((site_dir / EXECUTIONS_DIR).glob("*.log")):
        for text in path.read_text().splitlines():
            line = parse_log_line(text)
            rid = parse_request_id(line.request_id) if line else None
            if rid is not None and rid.stream == stream and line.outcome == EXECUTED:
                found.append((line.server, rid))
    return found


def test_stream_answers_every_event_exactly_once(site, tmp_path):
    spec = StreamSpec(
        site_dir=Path(site.site_dir),
        models=["particlenet_ak4", "simple", "gnn_linking", "deepmet"],
        jobs=8,
        wave=4,
        events=30,
        out=tmp_path / "out",
        batch=0,
    )
    report = submit(spec)
    total = 8 * 30
    assert report["events_total"] == total
    assert report["events_ok"] == total and report["events_failed"] == 0
    assert report["events_duplicated"] == 0
    answers = _answers(spec.out)
    assert set(answers) == set(range(total)) and set(answers.values()) == {1}
    assert set(report["per_server"]) == {"triton-0", "triton-1"}
    assert sum(report["per_server"].values()) == total
    assert {m: s["events_ok"] for m, s in report["per_model"].items()} == {
        "particlenet_ak4": 60,
        "simple": 60,
        "gnn_linking": 60,
        "deepmet": 60,
    }
    client = report["client"]
    assert client["pack_s"] > 0 and client["network_s"] > 0
    assert set(client["server_times_us"]) == {"triton-0", "triton-1"}
    for times in client["server_times_us"].values():
        assert times["requests"] > 0 and times["compute_infer_us"] > 0
    # Counted where they happen: every event executed exactly once on the servers, but for a
    # try retried once past its deadline (a busy machine: it may have run too; at most its
    # events, here a whole job's, 30), and none without a retry.
    executions = report["executions"]
    twice = report["events_executed_twice"]
    assert executions["checked"] and executions["events_answered_not_logged"] == 0
    assert twice <= 30 * report["retries"], report["retries"]
    assert executions["events_executed_once"] == total - twice
    assert sum(s["events_executed_twice"] for s in report["per_model"].values()) == twice
    assert report["reruns"] == 0 and report["errors"] == [] and report["stopped_by"] is None
    assert report["spec"]["job_stall_s"] == 3600  # none given: the default applied (stall.py)
    saved = json.loads((spec.out / "report.json").read_text())
    assert (
        saved["events_ok"] == total and saved["latency_ms"]["p99"] >= saved["latency_ms"]["p50"] > 0
    )
    assert (spec.out / "report.png").stat().st_size > 10_000


@pytest.mark.parametrize("mode", ["site", "direct"])
def test_server_killed_mid_stream_costs_retries_not_events(tmp_path, built_models, mode):
    """Through Envoy (site) Envoy retries on the other server; direct, the client fails over.
    Either way every event is answered exactly once and the dead server gets nothing more."""
    site_dir = tmp_path / "site"
    # supervise=False: the data plane alone carries the stream (no restart of the victim)
    state = launcher.up(
        site_dir, servers=2, models=["particlenet_ak4"], build_dir=built_models, supervise=False
    )
    victim = state.servers[1]
    try:
        spec = StreamSpec(
            site_dir=site_dir,
            models=["particlenet_ak4"],
            jobs=4,
            wave=4,
            events=80,  # 320 in all: the server dies with most of them still to answer
            out=tmp_path / "out",
            batch=8,
            mode=mode,
        )
        progress: list[Progress] = [Progress(0, 0, 0)]
        result: dict = {}
        runner = threading.Thread(
            target=lambda: result.update(submit(spec, lambda p: progress.__setitem__(0, p)))
        )
        runner.start()
        wait_until(
            lambda: progress[0].ok >= 8, "the stream to answer its first events", timeout=180
        )
        # The kill must land with a request on the victim, whatever the machine's speed:
        # stopped, it answers nothing, and once a request has reached it (bytes wait unread
        # on its gRPC port) it is killed with that request in flight.
        os.killpg(victim.pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: _unread_bytes(victim.grpc_port) > 0,
                f"a request to reach the stopped {victim.id}",
                timeout=120,
            )
        finally:
            os.killpg(victim.pid, signal.SIGKILL)
        runner.join(timeout=300)
        assert not runner.is_alive()
        # the report names what befell the site meanwhile, the cause of the retries
        assert f"{victim.id}: dead at the end of the stream" in " ".join(
            result["site_incidents"]
        ), result.get("site_incidents")
        envoy_retries = envoy.counter(
            state.envoy_admin, route_counter("model-particlenet_ak4", "upstream_rq_retry")
        )
        # Envoy no longer sends to the dead server (two failed health checks): only the
        # live one is healthy there.
        hosts_after = wait_until(
            lambda: (
                envoy.healthy_hosts(state.envoy_admin, "model_particlenet_ak4")
                == [state.servers[0].grpc]
            ),
            "Envoy to take the killed server out",
        )
        # A SIGKILLed server leaves its Python-backend regions in /dev/shm ...
        regions = f"sonicsite_{victim.id}_{victim.grpc_port}_*"
        assert list(Path("/dev/shm").glob(regions))
    finally:
        launcher.down(site_dir)
    # ... and `down` removes exactly those.
    assert not list(Path("/dev/shm").glob(regions))
    assert result["events_ok"] == result["events_total"] == 320
    assert result["events_duplicated"] == 0
    answers = _answers(spec.out)
    assert set(answers) == set(range(320)) and set(answers.values()) == {1}
    # The servers' logs: an event executed twice was in flight on the killed server when it
    # died (executed, never answered); at most the requests in flight then (jobs × window).
    executions = result["executions"]
    assert executions["checked"] and executions["events_answered_not_logged"] == 0
    assert result["events_executed_twice"] == executions["events_executed_twice"]
    in_flight = spec.jobs * spec.window
    assert result["events_executed_twice"] <= in_flight * spec.batch
    lines = _executions(site_dir, result["spec"]["stream"])
    counts = Counter((r.job, e) for _, r in lines for e in range(r.lo, r.hi))
    on_victim = [r for server, r in lines if server == victim.id]
    repeated = [r for r in on_victim if any(counts[(r.job, e)] > 1 for e in range(r.lo, r.hi))]
    assert set(repeated) <= set(on_victim[-in_flight:])  # its last ones: in flight at its death
    if result["events_executed_twice"]:
        assert victim.id in executions["executions_of_repeated_events_by_server"]
    if mode == "direct":
        assert result["retries"] > 0  # the client failed over
    else:
        assert envoy_retries + result["retries"] > 0  # Envoy retried on the other server
    assert hosts_after


def test_demo_command_runs_and_stops_everything(tmp_path, built_models):
    out = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "sonicsite.cli",
            "demo",
            "--dir",
            str(tmp_path / "site"),
            "--build-dir",
            str(built_models),
            "--jobs",
            "2",
            "--wave",
            "2",
            "--events",
            "40",
            "--out",
            str(tmp_path / "out"),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["events_ok"] == report["events_total"] == 80
    (running,) = re.findall(r"(\d+)/\d+ processes running", out.stdout)  # its status
    assert f"site stopped ({running} processes)" in out.stdout  # every one, not the servers
    # where to look while it runs: the gateway's status page and Prometheus
    assert re.search(r"status page: http://127\.0\.0\.1:\d+/", out.stdout)
    assert "site status page:" not in out.stdout  # not in the summary: its site stops after
    assert re.search(
        r"Prometheus \(site rules, every target\): http://127\.0\.0\.1:\d+/", out.stdout
    )
    servers = re.findall(r"triton-\d+\s+pid (\d+)", out.stdout)
    pids = [int(m) for m in re.findall(r"\bpid (\d+)", out.stdout)]
    assert len(servers) == 2 and not [p for p in pids if pid_alive(p)]
    # the workers too: every PID the driver recorded is gone
    workers = json.loads((tmp_path / "out" / "jobs" / "workers.json").read_text())["workers"]
    assert len(workers) == 2 and not [w["pid"] for w in workers if pid_alive(w["pid"])]


def test_worker_exports_its_counters_as_prometheus_text(site, tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-P",
            "-m",
            "sonicsite.jobs.worker",
            "--site",
            site.site_dir,
            "--model",
            "simple",
            "--job",
            "3",
            "--events",
            "20",
            "--out",
            str(tmp_path / "r.json"),
            "--metrics-textfile",
            str(tmp_path / "job.prom"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    text = (tmp_path / "job.prom").read_text()
    assert 'sonicsite_client_requests_total{job="simple-3"} 3' in text  # 20 events, 8 per request
    assert 'sonicsite_client_requests_failed_total{job="simple-3"} 0' in text
    result = json.loads((tmp_path / "r.json").read_text())
    assert sorted(map(int, result["answered"])) == list(range(60, 80))

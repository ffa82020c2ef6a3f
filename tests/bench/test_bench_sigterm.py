"""A bench killed with SIGTERM (a batch system's kill, `timeout`) stops the site it started
and its load generator, says so, and exits 128 + 15: Python's default would have ended it at
once and left the site's servers, Envoy, the gateway and the rest running."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from polling import wait_until

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher
from sonicsite.local.processes import group_members
from sonicsite.local.state import SiteState


def _measuring(pgid: int) -> bool:
    """A perf_analyzer runs in process group `pgid` (the bench's own)."""
    for pid in group_members(pgid):
        try:
            if b"perf_analyzer" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:  # gone meanwhile
            continue
    return False


def _site_state(tmp: Path) -> SiteState | None:
    """The bench's site once Envoy, the gateway and the operator are recorded as started."""
    for state_file in tmp.glob("sonicsite-bench-*/site/state.json"):
        try:
            state = SiteState.load(state_file.parent)
        except (OSError, ValueError):  # being written
            return None
        if state.servers and {"envoy", "gateway", "operator"} <= {p.name for p in state.processes}:
            return state
    return None


def test_sigterm_mid_measurement_stops_the_bench_site_and_its_load(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = tmp_path / "gateway.json"
    cmd = [str(Path(sys.executable).parent / "sonicsite"), "bench", "gateway", "--json", str(out)]
    bench = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    state = None
    try:
        state = wait_until(lambda: _site_state(tmp_path), "the bench's site up", 300)
        wait_until(lambda: _measuring(bench.pid), "perf_analyzer running under the bench", 300)
        bench.send_signal(signal.SIGTERM)
        _, stderr = bench.communicate(timeout=300)
    finally:
        if bench.poll() is None:  # the test failed before the bench ended: stop it anyway
            bench.kill()
            bench.wait()
        if state is not None and Path(state.site_dir).exists():  # what the bench left
            launcher.down(Path(state.site_dir))
    pids = [s.pid for s in state.servers] + [p.pid for p in state.processes if p.pid]
    assert bench.returncode == 128 + signal.SIGTERM.value, stderr.decode()[-2000:]
    assert "stopped by SIGTERM" in stderr.decode(), stderr.decode()[-2000:]
    assert not [p for p in pids if pid_alive(p)]
    assert not group_members(bench.pid)  # perf_analyzer included
    # what it measured before the stop (if anything) is kept, and where it went is said
    assert f"is in {out}" in stderr.decode(), stderr.decode()[-2000:]
    assert json.loads(out.read_text())["summary"] == {"incomplete": "stopped by SIGTERM"}


def _workers_file(tmp: Path) -> Path | None:
    """A fault scenario's stream, once its driver has recorded its workers."""
    for path in tmp.glob("sonicsite-fault-*/out/jobs/workers.json"):
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):  # being written
            return None
        return path if record.get("workers") else None
    return None


def test_sigterm_mid_scenario_stops_the_stream_and_its_workers(tmp_path, built_models):
    """The fault bench's `submit` runs in a session of its own, its workers in theirs: by
    the time the bench has exited on SIGTERM, the bench has stopped submit, which has
    stopped every worker; the scenario's site is down."""
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    out = tmp_path / "faults.json"
    cmd = [str(Path(sys.executable).parent / "sonicsite"), "bench", "faults", "--json", str(out)]
    cmd += ["--scenarios", "prometheus-kill", "--rate", "20", "--duration", "20"]
    cmd += ["--build-dir", str(built_models)]
    bench = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
    )
    record = None
    site = None
    try:
        wait_until(
            lambda: _workers_file(tmp_path) or bench.poll() is not None,
            "the scenario's workers",
            300,
        )
        workers = _workers_file(tmp_path)
        assert workers is not None, bench.communicate()[1].decode()[-3000:]
        record = json.loads(workers.read_text())
        site = SiteState.load(workers.parent.parent.parent / "site")
        bench.send_signal(signal.SIGTERM)
        _, stderr = bench.communicate(timeout=300)
    finally:
        if bench.poll() is None:  # the test failed before the bench ended: stop it anyway
            bench.kill()
            bench.wait()
        if site is not None and Path(site.site_dir).exists():  # what the bench left
            launcher.down(Path(site.site_dir))
    driver, pids = record["driver"], [w["pid"] for w in record["workers"]]
    left = [p for p in [driver, *pids] if pid_alive(p)] + group_members(driver)
    if left:  # the test's own cleanup: they are ours, by PID
        for pid in left:
            os.kill(pid, signal.SIGKILL)
    assert bench.returncode == 128 + signal.SIGTERM.value, stderr.decode()[-2000:]
    assert not left, f"left running at the bench's exit: {left}"
    assert not [p for p in [s.pid for s in site.servers] if pid_alive(p)]

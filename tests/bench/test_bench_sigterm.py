"""A bench killed with SIGTERM (a batch system's kill, `timeout`) stops the site it started
and its load generator, says so, and exits 128 + 15: Python's default would have ended it at
once and left the site's servers, Envoy, the gateway and the rest running."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from polling import wait_until

from sonicsite.local import launcher
from sonicsite.local.processes import alive, group_members
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
    assert not [p for p in pids if alive(p)]
    assert not group_members(bench.pid)  # perf_analyzer included
    assert not out.exists()

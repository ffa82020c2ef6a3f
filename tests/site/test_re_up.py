"""A second `up` in a folder starts its Prometheus on an empty TSDB: the first site's series
(its supervisor's restart counts, its targets) were reopened, so the new site's alerts fired
for restarts it never had and its servers were counted twice. A Prometheus the supervisor
restarts within one site keeps its data. And `down` is safe to repeat: with nothing left to
stop it says so and exits 0."""

from __future__ import annotations

import os
import signal

from polling import wait_until
from site_cli import sonicsite_cli

from sonicsite.local import launcher, prometheus

GENEROUS_S = 120.0
RESTARTS = 'sonicsite_process_restarts_total{process="prometheus"}'


def _answer(address: str, expr: str, at: float | None = None) -> list[dict]:
    try:
        return prometheus.query(address, expr, at)
    except OSError:  # not answering yet (started again by the supervisor)
        return []


def _value(address: str, expr: str) -> float | None:
    answer = _answer(address, expr)
    return float(answer[0]["value"][1]) if answer else None


def _instances(address: str) -> set[str]:
    """Every target instance the TSDB has a sample of, over the last hour."""
    answer = _answer(address, "count by (instance) (last_over_time(up[1h]))")
    return {r["metric"]["instance"] for r in answer}


def test_a_new_up_starts_prometheus_empty_and_a_restart_keeps_its_data(tmp_path, built_models):
    site_dir = (tmp_path / "site").resolve()
    args = dict(servers=1, models=["simple"], build_dir=built_models)
    first = launcher.up(site_dir, **args)
    try:
        assert first.prometheus, "the local site starts Prometheus when it is installed"
        old = wait_until(lambda: _instances(first.prometheus), "the first targets scraped")
        before = wait_until(
            lambda: _answer(first.prometheus, "sum(count_over_time(up[1h]))"), "samples"
        )
        seen_at = float(before[0]["value"][0])
        # the supervisor restarts Prometheus (SIGKILLed): the same command, the same TSDB
        pid = first.process("prometheus").pid
        os.kill(pid, signal.SIGKILL)
        wait_until(
            lambda: _value(first.prometheus, f"max({RESTARTS})") == 1.0,
            "Prometheus restarted by the supervisor, its restart scraped",
            timeout=GENEROUS_S,
        )
        # samples from before the kill (a SIGKILL may lose the last few, not the TSDB)
        kept = _answer(first.prometheus, "sum(count_over_time(up[1h]))", at=seen_at)
        assert kept and float(kept[0]["value"][1]) > 0, (kept, before)
    finally:
        launcher.down(site_dir)

    second = launcher.up(site_dir, **args)
    try:
        new = wait_until(lambda: _instances(second.prometheus), "the new site's targets")
        wait_until(
            lambda: _value(second.prometheus, f"max({RESTARTS})") == 0.0,
            "the new supervisor's restart count of Prometheus scraped",
        )
        assert not new & old, f"the new TSDB has the old site's targets: {sorted(new & old)}"
        ghosts = _answer(second.prometheus, f"max_over_time({RESTARTS}[1h]) > 0")
        assert ghosts == [], f"the old site's restarts read by the new site: {ghosts}"
        assert (site_dir / "prometheus" / "data.previous").is_dir()  # kept for a post-mortem
    finally:
        stopped = sonicsite_cli("down", "--dir", str(site_dir))
    assert stopped.returncode == 0 and stopped.stdout.startswith("stopped "), stopped.stderr
    again = sonicsite_cli("down", "--dir", str(site_dir))
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout == f"sonicsite down: nothing to stop in {site_dir}: no site runs there\n"
    assert "start one" not in again.stdout + again.stderr

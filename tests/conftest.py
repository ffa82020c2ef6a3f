"""Shared fixtures: one local site (real Triton servers) for the whole session.

Under CI=true a skipped test fails the run: CI must exercise everything.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from sonicsite.models.builders import build

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher as site_launcher
from sonicsite.local.ports import PORT_RANGE_VARIABLE
from sonicsite.local.state import SiteState

ROOT = Path(__file__).resolve().parents[1]
BUILD_DIR = ROOT / "build" / "models"

# The modules that take longest, longest first (seconds each, its tests' setup, call and
# teardown summed, in one run of the whole suite with four workers on one of these 2-core
# machines, 2026-12-03). `make test` hands whole files to its workers in collection order
# (--dist loadfile --no-loadscope-reorder): started first, the long ones run beside each
# other and the short ones fill in at the end, so that no worker finishes a minute
# before another. (pytest-xdist's own order, files with the most tests first, left the
# one-test benches for last; a 70 s simulation missing here ran last of all.) Only the
# order matters: a module missing here runs after these, in the order pytest collects it.
LONGEST_FIRST = (
    "jobs/test_backends_submit.py",  # 135
    "operator/test_holding.py",  # 128
    "site/test_supervisor.py",  # 107
    "jobs/test_backends_without_site.py",  # 92
    "jobs/test_faults.py",  # 86
    "jobs/test_resume.py",  # 85
    "operator/test_placement_loop.py",  # 81
    "client/test_aot.py",  # 78
    "sim/test_declared_work_sim.py",  # 77
    "monitoring/test_dashboards.py",  # 74
    "client/test_failover.py",  # 70
    "jobs/test_jobs.py",  # 65
    "client/test_backends.py",  # 61
    "compat/test_bursts.py",  # 61
    "site/test_launcher.py",  # 60
    "operator/test_autoscaler.py",  # 58
    "chart/test_chart.py",  # 57
    "compat/test_perf_analyzer.py",  # 56
    "bench/test_placement_bench.py",  # 55
    "jobs/test_command_checks.py",  # 54
    "bench/test_stock_tools_bench.py",  # 53
    "monitoring/test_scoped_queries.py",  # 48
    "operator/test_burst_hedged.py",  # 48
    "jobs/test_fault_bench.py",  # 46
    "operator/test_model_control.py",  # 44
    "jobs/test_stop_and_resume_edges.py",  # 41
    "operator/test_shed_expiry.py",  # 35
    "bench/test_sim_check.py",  # 35
    "operator/test_blind_spots.py",  # 34
    "operator/test_declared_work.py",  # 32
    "gateway/test_status_processes.py",  # 28
    "gateway/test_held_streams.py",  # 27
    "chart/test_probes.py",  # 27
    "operator/test_pools.py",  # 26
    "sim/test_simulator.py",  # 26
    "gateway/test_fuzz.py",  # 26
    "client/test_retries.py",  # 25
    "operator/test_operator_log.py",  # 24
    "models/test_pytorch_backend.py",  # 24
    "site/test_supervisor_busy.py",  # 24
    "sim/test_reproducible.py",  # 23
    "operator/test_scale_from_zero.py",  # 22
    "bench/test_bench_sigterm.py",  # 21
    "jobs/test_frozen_workers.py",  # 21
    "operator/test_routing.py",  # 20
    "operator/test_eviction.py",  # 20
    "models/test_repository.py",  # 20
    "site/test_supervision.py",  # 20
    "operator/test_admission.py",  # 18
    "operator/test_hung_servers.py",  # 18
    "site/test_up_tokens.py",  # 18
    "site/test_local_failures_told.py",  # 16
    "site/test_state_file_errors.py",  # 16
    "site/test_up_interrupted_twice.py",  # 16
    "operator/test_xds_limits.py",  # 16
    "operator/test_keep_warm.py",  # 16
)


@dataclass(eq=False)  # a plugin: pluggy keeps it in sets, by identity
class SkipsRefused:
    """Under CI=true a skipped test fails the run: the skips of this session, kept on its
    config (a plugin of its own), reported and turned into a failing exit status at its end."""

    skipped: list[str] = field(default_factory=list)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.skipped:
            self.skipped.append(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if os.environ.get("CI") == "true" and self.skipped:
            n, which = len(self.skipped), self.skipped
            print(f"\nCI=true: {n} test(s) skipped, which CI does not allow: {which}")
            session.exitstatus = 1


def pytest_configure(config: pytest.Config) -> None:
    """Each pytest-xdist worker chooses its sites' ports from a range of its own, below the
    kernel's ephemeral ports (sonicsite/local/ports.py says why). The session's skips are
    counted by a SkipsRefused of its own. Ctrl-C is Python's KeyboardInterrupt here and in
    what the tests start, as at a terminal, even where the suite itself was started with
    SIGINT ignored (a shell's background job, nohup): the tests of Ctrl-C stand for a user
    at a terminal, and an ignored SIGINT is inherited through exec."""
    config.pluginmanager.register(SkipsRefused(), "sonicsite-skips-refused")
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if worker.startswith("gw") and not os.environ.get(PORT_RANGE_VARIABLE):
        lo = 10000 + 2000 * int(worker[2:])
        os.environ[PORT_RANGE_VARIABLE] = f"{lo}-{lo + 1999}"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The longest modules first (LONGEST_FIRST), each module's tests in their own order."""
    rank = {f"tests/{name}": k for k, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))


@pytest.fixture(scope="session")
def built_models() -> Path:
    """The ONNX files; `make test` builds them first, a bare `pytest` builds them here."""
    if not (BUILD_DIR / "manifest.json").exists():
        build(BUILD_DIR)
    return BUILD_DIR


@pytest.fixture(scope="session")
def site(tmp_path_factory: pytest.TempPathFactory, built_models: Path) -> SiteState:
    """Two Triton servers serving every model, shared by all tests that only send requests."""
    site_dir = tmp_path_factory.mktemp("site")
    state = site_launcher.up(site_dir, servers=2, build_dir=built_models)
    yield state
    site_launcher.down(site_dir)
    assert not [s.pid for s in state.servers if pid_alive(s.pid)]

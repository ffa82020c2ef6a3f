"""What every bench shares (bench/common.py): the order of turns, figures, releasing what a
bench holds, what a run that fails late leaves, the cores it reports and where it pins
perf_analyzer; and each shared helper defined once."""

from __future__ import annotations

import ast
import itertools
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from sonicsite.bench import faults, inprocess, placement, triton_version
from sonicsite.bench.common import Cleanups, Recorder, figure, in_turn, write_result
from sonicsite.bench.dataplane import comparison
from sonicsite.sim.output import OutputError

from sonicsite.cli import Terminated, main

BENCH = Path(faults.__file__).resolve().parent


def test_each_repeat_starts_with_the_path_that_ended_the_one_before():
    paths = ("direct", "envoy")
    turns = [in_turn(paths, repeat) for repeat in range(4)]
    assert turns == [["direct", "envoy"], ["envoy", "direct"]] * 2
    for before, after in itertools.pairwise(turns):
        assert after[0] == before[-1]
    four = ("direct", "envoy_no_header", "envoy_with_header", "envoy_bare")
    assert in_turn(four, 1) == list(reversed(four))  # stock-tools' four paths


def test_a_difference_near_zero_has_no_spread():
    """(max - min) / median says nothing of a figure centred near zero (an added p50)."""
    added = comparison(
        [{"throughput": 100.0, "p50_ms": 1.0}, {"throughput": 100.0, "p50_ms": 1.0}],
        [{"throughput": 90.0, "p50_ms": 1.01}, {"throughput": 95.0, "p50_ms": 0.98}],
    )["added_p50_ms"]
    assert added["spread"] is None and added["min"] < 0 < added["max"]
    assert figure([-2.0, -1.0, -4.0])["spread"] == 1.5  # |median|: never negative


def test_every_release_runs_and_the_first_error_is_the_one_raised():
    released = []

    def fails() -> None:
        raise ConnectionError("the server is gone")

    with (
        pytest.raises(RuntimeError, match="the measurement's own") as raised,
        Cleanups() as cleanup,
    ):
        cleanup.add("the first", lambda: released.append("first"))
        cleanup.add("the region", fails)
        cleanup.add("the last", lambda: released.append("last"))
        raise RuntimeError("the measurement's own error")
    assert released == ["last", "first"]  # last in, first out; none skipped
    assert raised.value.__notes__ == [
        "releasing the region failed: ConnectionError: the server is gone"
    ]
    # no error of its own: the release's is the error
    with pytest.raises(RuntimeError, match="releasing the region failed"), Cleanups() as cleanup:
        cleanup.add("the region", fails)


def test_a_run_that_fails_late_leaves_what_it_measured(tmp_path, capsys):
    out = tmp_path / "bench.json"
    record = Recorder(out, "example")
    record.site = {"admission": "off", "sheds": None}
    with pytest.raises(ValueError, match="math domain error") as raised, record.measuring():
        record.details["first_part"] = {"throughput": 12.5}
        raise ValueError("math domain error")
    saved = json.loads(out.read_text())
    assert saved["summary"] == {"incomplete": "ValueError: math domain error"}
    assert saved["details"]["first_part"] == {"throughput": 12.5}
    assert saved["meta"]["admission"] == "off" and saved["meta"]["commit"]
    # the traceback is kept for whoever debugs it; the command says the note (commands.py)
    assert "raise ValueError" in "".join(saved["details"]["failure_traceback"])
    assert raised.value.__notes__ == [f"what was measured before it is in {out} (incomplete)"]
    with pytest.raises(KeyboardInterrupt), Recorder(out, "example").measuring():
        raise KeyboardInterrupt
    assert json.loads(out.read_text())["summary"] == {"incomplete": "stopped by SIGINT"}


def test_a_run_that_fails_before_measuring_says_nothing_was_measured(tmp_path):
    out = tmp_path / "bench.json"
    with pytest.raises(RuntimeError) as raised, Recorder(out, "example").measuring():
        raise RuntimeError("no server came up")
    assert raised.value.__notes__ == [f"nothing was measured before it; the error is in {out}"]
    saved = json.loads(out.read_text())
    assert saved["summary"] == {"incomplete": "RuntimeError: no server came up"}


def test_meta_counts_the_cpu_of_what_the_run_started_as_its_own(tmp_path):
    """A process the run started and reaped before the result is written counts as the
    run's (its parent's cutime), not as load from outside."""
    record = Recorder(tmp_path / "bench.json", "example")
    burn = "import time\nwhile time.process_time() < 0.5: pass"
    subprocess.run([sys.executable, "-c", burn], check=True, timeout=300)
    cpu = record.write({})["meta"]["cpu_during_run"]
    assert cpu["this_run_cpu_s"] >= 0.5, cpu
    assert cpu["machine_busy_cores"] >= 0.9 * cpu["this_run_cores"] - 0.05, cpu  # two clocks
    assert cpu["outside_cores"] >= 0.0 and cpu["seconds"] > 0, cpu


@pytest.mark.skipif(shutil.which("taskset") is None, reason="taskset is not installed")
def test_one_allotted_core_is_reported_and_perf_analyzer_stays_in_it(tmp_path):
    """Under `taskset -c N` (a batch slot's cpuset): meta and machine say 1 core, and
    perf_analyzer is not pinned to a CPU outside the allotment."""
    first = min(os.sched_getaffinity(0))
    script = (
        "import json; from pathlib import Path; "
        "from sonicsite.bench.common import meta, write_result; "
        "from sonicsite.bench.perf_analyzer import _pinned; "
        f"r = write_result(Path({str(tmp_path / 'r.json')!r}), 'x', {{}}, {{}}); "
        "print(json.dumps([meta()['cores'], r['machine']['cores'], _pinned(['x'])]))"
    )
    done = subprocess.run(
        ["taskset", "-c", str(first), sys.executable, "-P", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    cores, machine_cores, pinned = json.loads(done.stdout.strip().splitlines()[-1])
    assert cores == 1 and machine_cores == 1
    assert pinned == ["x"]  # one CPU: nothing to pin to, never another CPU


@pytest.mark.parametrize(
    "site",
    [
        pytest.param(faults.site_meta(3), id="faults"),
        pytest.param(inprocess.site_meta(0), id="inprocess"),
        pytest.param(placement.site_meta(placement.Options(), 0), id="placement"),
    ],
)
def test_a_bench_meta_says_the_site_it_ran(site):
    """The admission, the scaling and the sheds of the sites a bench started."""
    assert {"admission", "autoscaling", "sheds"} <= set(site)
    assert isinstance(site["admission"], dict)


def test_placement_meta_says_the_scale_from_zero_autoscales():
    site = placement.site_meta(placement.Options(), 0)
    assert site["from_zero"]["autoscaling"]["min_servers"] == 0
    assert "placement_on_demand" in site
    assert "from_zero" not in placement.site_meta(placement.Options(from_zero=False), 0)


def _defined() -> dict[str, list[str]]:
    """Every function name defined in bench/*.py (nested ones too), with its modules."""
    found: dict[str, list[str]] = {}
    for path in sorted(BENCH.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef):
                found.setdefault(node.name, []).append(path.name)
    return found


SHARED = {
    "figure": "common.py",
    "path_figures": "common.py",
    "ratio_of_medians": "common.py",
    "in_turn": "common.py",
    "http_get": "common.py",
    "http_json": "common.py",
    "wait_for": "common.py",
    "last3_mean": "perf_analyzer.py",
    "cpu_ticks": "outside_load.py",
}
GONE = ("_figures", "_over", "_ratio_of_medians", "_last3_mean", "_get", "_wait_for", "_ticks")


def test_each_shared_helper_is_defined_once():
    defined = _defined()
    assert {name: defined.get(name) for name in SHARED} == {
        name: [module] for name, module in SHARED.items()
    }
    assert not {name: defined[name] for name in GONE if name in defined}
    readers = [p.name for p in BENCH.glob("*.py") if 'f"/proc/{' in p.read_text()]
    assert readers == []  # what /proc says of a process: contract/processes_seen.py alone


def test_a_result_is_never_written_over_a_fifo_and_through_a_symlink_at_its_target(tmp_path):
    """write_result, every bench's writer (check-local's too): a FIFO there is refused and
    left a FIFO (written into, it waited for a reader, or fed one the result); a symlink is
    written through, whole, the link kept."""
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so that a write would not wait
    try:
        with pytest.raises(OutputError, match="it is a FIFO"):
            write_result(fifo, "x", {}, {})
        assert os.read(reader, 4096) == b""  # nothing was sent down the pipe
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    link.symlink_to(real)
    write_result(link, "x", {"a": 1}, {})
    assert link.is_symlink() and json.loads(real.read_text())["summary"] == {"a": 1}


def test_a_bench_json_that_cannot_be_written_is_refused_before_the_bench(tmp_path, capsys):
    """Checked first, before the options and any site (the faults' scenario named here is
    refused too, so that no site would start were it not)."""
    fifo = tmp_path / "faults.json"
    os.mkfifo(fifo)
    code = main(["bench", "faults", "--json", str(fifo), "--scenarios", "typo"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"sonicsite bench faults: --json {fifo}: cannot write: it is a FIFO" in err, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_meta_gives_tritons_own_version_beside_the_wheels(tmp_path):
    """The wheel's version is nvidia-pytriton's; Triton's own is asked of a server."""
    versions = write_result(tmp_path / "r.json", "x", {}, {})["meta"]["versions"]
    assert versions["nvidia-pytriton"] != versions["tritonserver"]
    major, minor, patch = versions["tritonserver"].split(".")
    assert major.isdigit() and minor.isdigit() and patch.isdigit(), versions


def test_a_server_that_gives_no_version_in_time_is_said_unknown_with_why():
    version = triton_version.server_version(deadline_s=0.0)
    assert version.startswith("unknown: tritonserver (pid ") and "did not answer" in version


def test_a_run_stopped_by_sigterm_keeps_what_it_measured(tmp_path):
    """A batch system's kill (SIGTERM, raised as the command line's Terminated) is no
    Exception, yet the run's result is written all the same, saying what stopped it."""
    out = tmp_path / "bench.json"
    with pytest.raises(Terminated) as raised, Recorder(out, "example").measuring() as record:
        record.details["first_part"] = {"throughput": 12.5}
        raise Terminated(15)
    saved = json.loads(out.read_text())
    assert saved["summary"] == {"incomplete": "stopped by SIGTERM"}
    assert saved["details"]["first_part"] == {"throughput": 12.5}
    assert raised.value.__notes__ == [f"what was measured before it is in {out} (incomplete)"]
    with pytest.raises(KeyboardInterrupt), Recorder(out, "example").measuring():
        raise KeyboardInterrupt
    assert json.loads(out.read_text())["summary"] == {"incomplete": "stopped by SIGINT"}

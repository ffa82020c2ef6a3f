"""`sonicsite submit --backend local|site|auto`: the workers run the model where they are
told, every event is answered exactly once, and the report counts the events each backend
ran, and the switches of "auto" with their reasons. One local site for the module."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from polling import wait_until

from sonicsite.jobs.driver import Progress, StreamSpec, submit
from sonicsite.local import launcher
from sonicsite.local.state import SiteState

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def torch_site(tmp_path_factory: pytest.TempPathFactory, built_models: Path):
    site_dir = tmp_path_factory.mktemp("backends-site")
    state = launcher.up(
        site_dir, servers=1, models=["particlenet_ak4", "deepmet"], build_dir=built_models
    )
    yield state
    launcher.down(site_dir)


def _every_event_once(out: Path, total: int) -> None:
    answered: dict[int, int] = {}
    for path in sorted((out / "jobs").glob("job-*.json")):
        for event, n in json.loads(path.read_text())["answered"].items():
            answered[int(event)] = answered.get(int(event), 0) + n
    assert sorted(answered) == list(range(total)) and set(answered.values()) == {1}


def test_submit_backend_local_runs_every_event_in_the_workers(torch_site, tmp_path):
    """Through the command line: the workers answer every event in process; the servers'
    logs hold none of the stream, and none is counted as answered but not logged."""
    out = tmp_path / "out"
    command = [
        *(sys.executable, "-P", "-m", "sonicsite", "submit", "--dir", torch_site.site_dir),
        *("--model", "particlenet_ak4,deepmet", "--jobs", "2", "--wave", "2"),
        *("--events", "12", "--out", str(out), "--backend", "local"),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    print(f"\n{done.stdout}")
    assert "events per backend: site 0, in process 24" in done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["spec"]["backend"] == "local"
    assert report["events_ok"] == 24 and report["events_failed"] == 0
    assert report["per_backend"] == {"local": 24, "site": 0}
    assert report["per_path"] == {"local": 24} and report["per_server"] == {"local": 24}
    assert report["switches"] == {"count": {}, "first": []}
    for model in ("particlenet_ak4", "deepmet"):
        assert report["per_model"][model]["per_backend"] == {"local": 12, "site": 0}
    executions = report["executions"]
    assert executions["events_executed"] == 0 and executions["events_answered_not_logged"] == 0
    _every_event_once(out, 24)


def test_submit_backend_local_with_aot_compiles_once_and_runs_every_event(
    torch_site, tmp_path, built_models
):
    """--compile aot --models-dir: submit compiles the package once before the workers
    start (into that repository's cache), and every worker runs it."""
    models = tmp_path / "models"
    (models / "deepmet" / "1").mkdir(parents=True)
    for name in ("model.pt", "model.pt2"):
        shutil.copy(built_models / "deepmet" / "1" / name, models / "deepmet" / "1" / name)
    out = tmp_path / "out"
    command = [
        *(sys.executable, "-P", "-m", "sonicsite", "submit", "--dir", torch_site.site_dir),
        *("--model", "deepmet", "--jobs", "2", "--wave", "2", "--events", "12"),
        *("--out", str(out), "--backend", "local", "--compile", "aot"),
        *("--models-dir", str(models)),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    report = json.loads((out / "report.json").read_text())
    assert (report["spec"]["backend"], report["spec"]["compile"]) == ("local", "aot")
    assert report["per_backend"] == {"local": 24, "site": 0} and report["events_failed"] == 0
    (package,) = (models / "deepmet" / "1" / "aot").iterdir()  # one compile, one package
    assert (package / "model.pt2").is_file()
    _every_event_once(out, 24)


def test_submit_backend_auto_stays_on_a_site_that_answers(torch_site, tmp_path):
    spec = StreamSpec(
        site_dir=Path(torch_site.site_dir),
        models=["particlenet_ak4"],
        jobs=2,
        wave=2,
        events=32,
        out=tmp_path / "out",
        backend="auto",
    )
    report = submit(spec)
    assert report["events_ok"] == 64 and report["per_backend"] == {"local": 0, "site": 64}
    assert report["switches"]["count"] == {}
    assert report["executions"]["events_executed_once"] == 64
    _every_event_once(spec.out, 64)


def test_submit_backend_auto_goes_on_in_the_workers_when_the_site_dies(tmp_path, built_models):
    """Envoy, the gateway and the server killed mid-stream (unsupervised, so they stay
    dead): the workers switch to their own process and every event is answered once."""
    site_dir = tmp_path / "site"
    launcher.up(
        site_dir, servers=1, models=["particlenet_ak4"], build_dir=built_models, supervise=False
    )
    try:
        spec = StreamSpec(
            site_dir=site_dir,
            models=["particlenet_ak4"],
            jobs=2,
            wave=2,
            events=200,
            out=tmp_path / "out",
            batch=8,
            backend="auto",
            cpu_ms_per_event=20,  # 3 s at least after the 80: the site is killed mid-stream
        )
        progress = [Progress(0, 0, 0)]
        result: dict = {}
        runner = threading.Thread(
            target=lambda: result.update(submit(spec, lambda p: progress.__setitem__(0, p)))
        )
        runner.start()
        wait_until(lambda: progress[0].ok >= 80, "the stream to answer 80 events", timeout=180)
        state = SiteState.load(site_dir)
        for pid in [p.pid for p in state.processes if p.name in ("envoy", "gateway")] + [
            s.pid for s in state.servers
        ]:
            os.kill(pid, signal.SIGKILL)
        runner.join(timeout=500)
        assert not runner.is_alive()
    finally:
        launcher.down(site_dir)
    print(f"\nsite killed mid-stream: {result['per_backend']}, switches {result['switches']}")
    assert result["events_ok"] == 400 and result["events_failed"] == 0
    assert result["per_backend"]["local"] > 0 and result["per_backend"]["site"] >= 80
    assert sum(result["per_backend"].values()) == 400
    assert result["switches"]["count"].get("site->local", 0) >= 1
    assert all(s["reason"] for s in result["switches"]["first"])
    _every_event_once(spec.out, 400)


def test_submit_backend_local_refuses_a_model_without_torchscript(torch_site, tmp_path):
    spec = StreamSpec(
        site_dir=Path(torch_site.site_dir),
        models=["deepmet"],
        jobs=1,
        wave=1,
        events=4,
        out=tmp_path / "out",
        backend="local",
        models_dir=tmp_path / "nothing",
    )
    with pytest.raises(ValueError, match=r"model 'deepmet': .*model.pt is missing"):
        submit(spec)

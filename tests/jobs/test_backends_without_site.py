"""`submit --backend local` needs no site (the models' metadata from their config.pbtxt),
and `--backend auto` runs in the workers when there is none: at submit's start, or when a
job of a later wave starts after `sonicsite down` (its worker finds no site file). The
report says that no site was used, or why each job ran in process."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from polling import wait_until

from sonicsite.jobs.driver import Progress, StreamSpec, submit
from sonicsite.local import launcher

ROOT = Path(__file__).resolve().parents[2]
MODEL = "particlenet_ak4"  # built as TorchScript too: it runs in process


def _answered_once(out: Path, total: int) -> None:
    answered: dict[int, int] = {}
    for path in sorted((out / "jobs").glob("job-*.json")):
        for event, n in json.loads(path.read_text())["answered"].items():
            answered[int(event)] = answered.get(int(event), 0) + n
    assert sorted(answered) == list(range(total)) and set(answered.values()) == {1}


def test_submit_backend_local_runs_with_no_site_and_says_none_was_used(tmp_path, built_models):
    site_dir, out = tmp_path / "site", tmp_path / "out"  # never started: no state.json
    command = [
        *(sys.executable, "-P", "-m", "sonicsite", "submit", "--dir", str(site_dir)),
        *("--model", MODEL, "--jobs", "2", "--events", "20", "--backend", "local"),
        *("--models-dir", str(built_models), "--out", str(out)),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr + done.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["events_ok"] == 40 and report["per_backend"] == {"local": 40, "site": 0}
    assert report["site_used"] is False
    assert report["spec"]["site"] is None
    assert "site: none used (--backend local: the models ran in the workers)" in done.stdout
    assert "site status page" not in done.stdout, done.stdout
    assert not site_dir.exists()  # nothing made where no site is
    _answered_once(out, 40)


def test_submit_backend_auto_with_no_site_runs_every_job_in_process(tmp_path, built_models):
    notes: list[str] = []
    spec = StreamSpec(
        site_dir=tmp_path / "site",
        models=[MODEL],
        jobs=2,
        wave=1,
        events=16,
        out=tmp_path / "out",
        backend="auto",
        models_dir=built_models,
    )
    report = submit(spec, note=notes.append)
    assert report["events_ok"] == 32 and report["events_failed"] == 0, report["errors"]
    assert report["per_backend"] == {"local": 32, "site": 0}
    assert report["switches"]["count"] == {"site->local": 2}
    assert all("no site at" in s["reason"] for s in report["switches"]["first"])
    assert report["site_used"] is False
    said = "\n".join(notes)
    assert f"no site at {spec.site_dir}" in said and "backend auto runs" in said, said
    _answered_once(spec.out, 32)


def test_an_auto_worker_that_starts_after_the_site_stopped_runs_in_process(tmp_path, built_models):
    """A later wave's job of an auto stream, its site stopped (`down` removed its
    state.json): the worker's discovery finds no site file, and it runs its events in
    process, the switch and its reason recorded, instead of failing them all."""
    out = tmp_path / "job-00002.json"
    command = [
        *(sys.executable, "-P", "-m", "sonicsite.jobs.worker", "--site", str(tmp_path / "gone")),
        *("--model", MODEL, "--job", "2", "--events", "24", "--batch", "8"),
        *("--backend", "auto", "--models-dir", str(built_models), "--out", str(out)),
    ]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["error"] is None and not result["failed"]
    assert len(result["answered"]) == 24
    assert result["client"]["backend"] == "auto"
    assert result["client"]["rows_per_backend"] == {"site": 0, "local": 24}
    (switch,) = result["client"]["switches"]
    assert switch["from"] == "site" and switch["to"] == "local"
    assert f"no site at {tmp_path / 'gone'}" in switch["reason"], switch


def test_auto_jobs_of_a_later_wave_run_in_process_after_the_site_is_stopped(tmp_path, built_models):
    """The audit's stream: `sonicsite down` while the first wave runs; that wave switches to
    its workers, and the second wave, started with no site file, runs there too: every
    event answered once, none failed on the missing site."""
    site_dir = tmp_path / "site"
    launcher.up(site_dir, servers=1, models=[MODEL], build_dir=built_models, supervise=False)
    spec = StreamSpec(
        site_dir=site_dir,
        models=[MODEL],
        jobs=4,
        wave=2,
        events=300,
        out=tmp_path / "out",
        batch=8,
        backend="auto",
        models_dir=built_models,
        cpu_ms_per_event=20,  # 5 s at least after the first 40: the site stops mid-wave
    )
    progress = [Progress(0, 0, 0)]
    result: dict = {}
    runner = threading.Thread(
        target=lambda: result.update(submit(spec, lambda p: progress.__setitem__(0, p)))
    )
    runner.start()
    try:
        wait_until(lambda: progress[0].ok >= 40, "the first wave to answer 40 events", 180)
    finally:
        launcher.down(site_dir)
    runner.join(timeout=500)
    assert not runner.is_alive()
    assert result["events_ok"] == 1200 and result["events_failed"] == 0, result["errors"]
    later = [s for s in result["switches"]["first"] if s["job"] in (2, 3)]
    assert sorted(s["job"] for s in later) == [2, 3], result["switches"]
    assert all(f"no site at {site_dir}" in s["reason"] for s in later), later
    assert result["site_used"] is True and "site_stopped" not in result
    _answered_once(spec.out, 1200)

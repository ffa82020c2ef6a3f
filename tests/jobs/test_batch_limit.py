"""`submit --batch` over a model's max batch is refused before any worker starts, naming
the model, the batch and the limit (not 40 events failed in the workers); and the console
never cuts an error in the middle of a word, a number least of all."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from job_results import failed_job

from sonicsite.jobs.driver import StreamSpec, submit
from sonicsite.jobs.report import build_report, print_summary

ROOT = Path(__file__).resolve().parents[2]
SONICSITE = [sys.executable, "-P", "-m", "sonicsite"]


def test_submit_refuses_a_batch_over_the_models_max_batch_as_a_usage_error(tmp_path):
    out = tmp_path / "out"
    command = [*SONICSITE, "submit", "--dir", str(tmp_path / "site"), "--model", "deepmet"]
    command += ["--jobs", "2", "--events", "20", "--batch", "17", "--out", str(out)]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr + done.stdout
    assert (
        "argument --batch: 17 events per request is more than model deepmet takes "
        "(its max batch size is 16)"
    ) in done.stderr, done.stderr
    assert not out.exists()  # refused before anything was made
    # the limit itself, and 0 (each model's default), are taken: the site is then checked
    for batch in ("16", "0"):
        command[command.index("--batch") + 1] = batch
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 1 and "no site at" in done.stderr, done.stderr


def test_a_stream_spec_with_a_batch_over_a_models_limit_is_refused(tmp_path):
    """The API's submit too, for each model of the stream: the first over its limit named."""
    spec = StreamSpec(
        site_dir=tmp_path / "site",
        models=["particlenet_ak4", "simple"],
        jobs=2,
        wave=2,
        events=8,
        out=tmp_path / "out",
        batch=9,
    )
    said = (
        r"^batch: 9 events per request is more than model simple takes \(its max batch size is 8\)"
    )
    with pytest.raises(ValueError, match=said):
        submit(spec)
    assert not spec.out.exists()


def test_the_console_cuts_a_long_error_at_a_word_not_in_a_number(capsys):
    message = "SpecError: " + "; ".join(  # as a worker said it (a batch of 17, deepmet's 16)
        f"input {name!r}: 17 rows per request, expected at most max_batch_size 16"
        for name in ("input", "input_cat0", "input_cat1", "input_cat2")
    )
    result = failed_job(0, {str(i): message for i in range(4)}, model="deepmet")
    report = build_report([result], 0.0, 1.0, {})
    report["stopped_by"] = None
    print_summary(report, Path("out"))
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("error: ")]
    said = line.removeprefix("error: ").split(" (4 events;")[0]
    assert said.endswith(" ..."), line
    kept = said.removesuffix(" ...")
    assert message.startswith(kept) and not message[len(kept)].isalnum(), line  # whole words
    assert "max_batch_size 16" in kept, line  # the limit whole, not "1..."

"""A bench option value the bench would refuse is a usage error: exit status 2 and one line
naming the option, before any site starts (not a traceback, nor a failure minutes in)."""

from __future__ import annotations

import json

import pytest

from sonicsite.cli import main


def _usage(argv: list[str], capsys) -> tuple[int, str]:
    """The exit status and stderr of `sonicsite ...argv` (argparse's errors exit; the
    benches' Options' refusals return)."""
    try:
        code = main(argv)
    except SystemExit as stopped:
        code = stopped.code
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("bench", "option", "value", "named"),
    [
        ("balancing", "--slowdowns", ",", "slowdowns"),
        ("balancing", "--slowdowns", "", "slowdowns"),
        ("balancing", "--slowdowns", "abc", "slowdowns"),
        ("balancing", "--slowdowns", "0.5", "slowdowns"),
        ("balancing", "--work-ms", "0", "work-ms"),
        ("balancing", "--open-seconds", "0", "open-seconds"),
        ("placement", "--phase-s", "0", "phase-s"),
        ("placement", "--phase-s", "90", "phase_s"),
        ("stock-tools", "--models", "foo", "models"),
        ("stock-tools", "--models", ",", "models"),
        ("faults", "--scenarios", "typo", "scenarios"),
        ("faults", "--scenarios", ",", "scenarios"),
        ("inprocess", "--batches", "0,-4", "batches"),
        ("inprocess", "--device", "tpu", "device"),
        ("client", "--sizes", "0", "sizes"),
    ],
)
def test_a_bad_bench_option_is_a_usage_error(tmp_path, capsys, bench, option, value, named):
    out = tmp_path / "bench.json"
    code, err = _usage(["bench", bench, "--json", str(out), option, value], capsys)
    assert code == 2, err
    assert "Traceback" not in err, err
    said = err.strip().splitlines()[-1]  # argparse's usage lines come before it
    assert said.startswith(f"sonicsite bench {bench}") and named in said, err
    assert not out.exists()
    assert not list(tmp_path.glob("sonicsite-*"))


def test_a_bench_that_fails_says_why_in_words_and_where_the_result_went(tmp_path, capsys):
    """A bench whose models were never built: one line naming the missing file and one
    saying that nothing was measured and where the error is kept, exit status 1, no
    traceback on the console (it is in the JSON, for whoever debugs it)."""
    out, models = tmp_path / "client.json", tmp_path / "never-built"
    argv = ["bench", "client", "--json", str(out), "--build-dir", str(models), "--sizes", "1"]
    code, err = _usage([*argv, "--repeats", "1"], capsys)
    assert code == 1, err
    assert "Traceback" not in err, err
    first, note = err.strip().splitlines()
    assert first.startswith("sonicsite bench client: failed: ") and str(models) in first, err
    assert note == f"  nothing was measured before it; the error is in {out}", err
    saved = json.loads(out.read_text())
    assert saved["summary"]["incomplete"] in first
    assert any("Traceback" in line for line in saved["details"]["failure_traceback"])

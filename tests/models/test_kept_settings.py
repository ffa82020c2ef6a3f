"""SONICSITE_KEPT_TTL_S and SONICSITE_KEPT_MAX_MB (how long and how much of its answers a
server keeps): a bad value failed every server's model load with a raw "could not convert
string to float" that never named the variable. It is named, with what it expects, by the
runner and by `sonicsite up` before any server starts; both read it through one function."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types

import pytest
from sonicsite.models.kept_settings import MAX_MB_VARIABLE, TTL_VARIABLE, kept_settings
from sonicsite.models.repository import RUNNER, write_local_repository

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]


def test_unset_or_empty_is_the_default_and_numbers_are_taken():
    assert kept_settings({}) == (300.0, 64 << 20)
    assert kept_settings({TTL_VARIABLE: " ", MAX_MB_VARIABLE: ""}) == (300.0, 64 << 20)
    assert kept_settings({TTL_VARIABLE: "10", MAX_MB_VARIABLE: "0.5"}) == (10.0, 1 << 19)


@pytest.mark.parametrize("variable", [TTL_VARIABLE, MAX_MB_VARIABLE])
@pytest.mark.parametrize("value", ["abc", "-1", "nan", "inf"])
def test_a_bad_value_names_the_variable_and_what_it_expects(variable, value):
    with pytest.raises(ValueError) as caught:
        kept_settings({variable: value})
    assert str(caught.value).startswith(f"{variable}: expected a finite number ≥ 0 (default "), (
        caught.value
    )
    assert repr(value) in str(caught.value)


def test_the_runner_reads_them_through_the_file_copied_beside_it(monkeypatch, tmp_path):
    """The runner runs in Triton's stub without the project's imports: the repository
    writer copies kept_settings.py beside each model.py, and the runner loads it there."""
    monkeypatch.setitem(sys.modules, "triton_python_backend_utils", types.ModuleType("pb"))
    spec = importlib.util.spec_from_file_location("runner_under_test", RUNNER)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    loaded = runner._kept_settings()
    assert loaded.kept_settings({TTL_VARIABLE: "7"}) == (7.0, 64 << 20)
    built = tmp_path / "built"
    (built / "simple" / "1").mkdir(parents=True)
    (built / "simple" / "1" / "model.onnx").write_bytes(b"")
    write_local_repository(built, tmp_path / "repository", ["simple"], [])
    version = tmp_path / "repository" / "simple" / "1"
    assert (version / runner.KEPT_SETTINGS_FILE).is_file() and (version / "model.py").is_file()


def test_up_refuses_a_bad_value_before_any_server_starts(tmp_path, built_models):
    site_dir = tmp_path / "site"
    up = ["up", "--dir", str(site_dir), "--servers", "1", "--models", "simple"]
    out = subprocess.run(
        [*SONICSITE, *up, "--build-dir", str(built_models), "--no-supervise"],
        capture_output=True,
        text=True,
        timeout=300,
        env=os.environ | {TTL_VARIABLE: "abc"},
    )
    assert out.returncode == 1, out.stdout + out.stderr
    said = f"sonicsite up: {TTL_VARIABLE}: expected a finite number ≥ 0 (default 300), got 'abc'"
    assert said in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert not site_dir.exists()  # nothing was started, nothing made

"""perf_analyzer's libraries where the system lacks them (bench/perf_analyzer.py): on a lent
machine (devices/site) there is no Debian libb64, and the environment the benches give
perf_analyzer links the Triton wheel's copy, as it always links the wheel's libcudart."""

from __future__ import annotations

import ctypes.util
import re
import subprocess

from sonicsite.bench import perf_analyzer
from sonicsite.bench.perf_analyzer import perf_analyzer_binary, perf_analyzer_env


def _resolved(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        ["ldd", perf_analyzer_binary()], env=env, capture_output=True, text=True, check=True
    ).stdout
    return dict(re.findall(r"^\s*(\S+) => (\S+)", out, re.MULTILINE))


def test_the_wheels_libcudart_is_linked(tmp_path) -> None:
    libs = _resolved(perf_analyzer_env(tmp_path))
    assert libs["libcudart.so.12"] == str(tmp_path / "libcudart.so.12")
    assert (tmp_path / "libcudart.so.12").resolve().name.startswith("libcudart-")


def test_without_a_system_libb64_the_wheels_copy_is_linked(tmp_path, monkeypatch) -> None:
    real = ctypes.util.find_library
    monkeypatch.setattr(  # a machine without Debian's libb64-0d, as the lent GPU machines
        perf_analyzer.ctypes.util,
        "find_library",
        lambda name: None if name == "b64" else real(name),
    )
    libs = _resolved(perf_analyzer_env(tmp_path))
    assert libs["libb64.so.0d"] == str(tmp_path / "libb64.so.0d")
    assert (tmp_path / "libb64.so.0d").resolve().name.startswith("libb64-")
    version = subprocess.run(
        [perf_analyzer_binary(), "--version"],
        env=perf_analyzer_env(tmp_path),
        capture_output=True,
        text=True,
    )
    assert version.returncode == 0, version.stderr
    assert "Perf Analyzer Version" in version.stdout + version.stderr


def test_with_the_system_libb64_nothing_is_linked_for_it(tmp_path) -> None:
    assert ctypes.util.find_library("b64"), "libb64-0d: one of `make system`'s packages"
    perf_analyzer_env(tmp_path)
    assert not (tmp_path / "libb64.so.0d").exists()

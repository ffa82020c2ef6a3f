"""Where the servers' Python-backend stub finds our packages (sonicsite/local/triton.py):
it runs isolated, blind to PYTHONPATH, so the launcher writes the path for it, in the
launcher's own order (a NumPy 1.x that PYTHONPATH brings before a NumPy 2 installed
beside the interpreter: the stub answers NumPy 2 arrays as empty tensors)."""

from __future__ import annotations

import os
import sysconfig

from sonicsite.local.triton import TritonInstall


def test_the_stub_path_is_the_environment_without_pythonpath(monkeypatch) -> None:
    monkeypatch.delenv("PYTHONPATH", raising=False)
    paths = TritonInstall.python_path()
    assert paths[0] == sysconfig.get_paths()["purelib"]
    assert set(paths) == {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}


def test_pythonpath_comes_first_on_the_stub_path(monkeypatch, tmp_path) -> None:
    first, second = tmp_path / "numpy1", tmp_path / "ours"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(first), "", str(second)]))
    paths = TritonInstall.python_path()
    assert paths[:2] == [str(first), str(second)]
    assert paths[2] == sysconfig.get_paths()["purelib"]
    assert len(paths) == len(set(paths))

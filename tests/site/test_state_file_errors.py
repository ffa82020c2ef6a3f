"""A site directory whose state.json is not a site's (not JSON, not an object, servers or
processes without their fields, a key missing): every command that reads it says so in one
line naming the file, with its own exit status, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]

NOT_A_STATE = {
    "not JSON": ("{'servers': [", "Expecting property name"),
    "a list": ("[1, 2]", "expected a JSON object, got list"),
    "servers not a list": ('{"site_dir": "x", "servers": 5, "models": []}', "'servers'"),
    "a process without a pid": (
        '{"site_dir": "x", "servers": [], "models": [], "processes": [{"name": "a", "kind": "b"}]}',
        "processes[0] lacks pid",
    ),
    "no site_dir": ('{"servers": [], "models": []}', "no 'site_dir'"),
    "a pid that is text": (
        '{"site_dir": "x", "servers": [], "models": [], '
        '"processes": [{"name": "gateway", "kind": "gateway", "pid": "123"}]}',
        "'gateway': pid is '123', expected a number (int)",
    ),
    "a port that is null": (
        '{"site_dir": "x", "models": [], "servers": [{"id": "triton-0", "host": "h", '
        '"grpc_port": null, "http_port": 2, "metrics_port": 3}]}',
        "'triton-0': grpc_port is None, expected a number (int)",
    ),
}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*SONICSITE, *args], capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kind", sorted(NOT_A_STATE))
def test_status_names_a_state_file_that_is_not_a_sites(tmp_path, kind):
    text, why = NOT_A_STATE[kind]
    (tmp_path / "state.json").write_text(text)
    for json_flag in ([], ["--json"]):
        out = _cli("status", "--dir", str(tmp_path), *json_flag)
        assert out.returncode == 1, out.stdout + out.stderr
        assert f"{tmp_path / 'state.json'}: not a sonicsite state file (" in out.stderr
        assert why in out.stderr and "Traceback" not in out.stderr, out.stderr


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (["models", "status"], 1),
        (["submit", "--model", "simple", "--out", "OUT"], 1),
        (["down"], 1),
        (["up", "--servers", "1"], 1),
    ],
)
def test_every_command_names_a_state_file_that_is_not_a_sites(tmp_path, command, code):
    state = tmp_path / "state.json"
    state.write_text("not json at all")
    command = [str(tmp_path / "out") if c == "OUT" else c for c in command]
    out = _cli(*command, "--dir", str(tmp_path))
    assert out.returncode == code, out.stdout + out.stderr
    assert f"{state}: not a sonicsite state file (" in out.stderr, out.stderr
    assert "remove it" in out.stderr and "Traceback" not in out.stderr
    assert state.read_text() == "not json at all"  # left as it was


@pytest.mark.parametrize(
    "command", [["status"], ["status", "--json"], ["models", "status"], ["down"], ["submit"]]
)
def test_every_command_names_itself_first(tmp_path, command):
    """`down` and `submit` said "sonicsite down: ...", `status` and `models status` only the
    error: each says which command speaks. `down` without a site has nothing to stop: it
    says so and succeeds (a cleanup script or trap may call it twice)."""
    extra = ["--model", "simple", "--out", str(tmp_path / "out")] if command == ["submit"] else []
    out = _cli(*command, *extra, "--dir", str(tmp_path / "none"))
    name = " ".join(c for c in command if not c.startswith("--"))
    if command == ["down"]:
        assert out.returncode == 0, out.stdout + out.stderr
        said = f"sonicsite down: nothing to stop in {tmp_path / 'none'}: no site runs there\n"
        assert out.stdout == said and out.stderr == "", out.stdout + out.stderr
        return
    assert out.returncode == 1, out.stdout + out.stderr
    assert out.stderr.startswith(f"sonicsite {name}: no site at {tmp_path / 'none'}"), out.stderr

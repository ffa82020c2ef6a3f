"""What a failed `up` leaves for the operator: why, in the folder (logs/up.log, named by the
error), for a scripted `up` whose stderr was thrown away; a range of ports too small for the
whole site refused before anything starts, part by part; a part short of ports named with
what the whole site needs; and models looked for where the working directory puts them,
said so."""

from __future__ import annotations

import re
import socket
from contextlib import ExitStack

import pytest
from site_cli import sonicsite_cli

from sonicsite.contract.wire import STATE_FILE
from sonicsite.local import control_plane, launcher
from sonicsite.local.errors import SiteError
from sonicsite.local.port_need import CONTROL_PLANE, CONTROL_PLANE_PORTS, site_need
from sonicsite.local.ports import PORT_RANGE_VARIABLE, PortsExhausted, free_in_range, free_ports
from sonicsite.local.state import SiteState
from sonicsite.local.up_log import UP_LOG, up_logged

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}"
# inside the suite's ranges would meet another worker's ports: the ranges' top end (conftest)
# is far below, and these are below the kernel's ephemeral ports
SMALL_RANGE = (31000, 31011)


def _free_window(size: int) -> int:
    """The first port of `size` ports in a row, from SMALL_RANGE's start on, all free now."""
    for lo in range(SMALL_RANGE[0], 32000 - size, size):
        if free_in_range((lo, lo + size - 1), size) == size:
            return lo
    raise AssertionError(f"no {size} free ports in a row in 31000-31999")


def test_up_without_build_dir_elsewhere_says_where_it_looked_and_logs_why(tmp_path):
    """From another folder, `up` said only "…/build/models/simple/1/model.onnx is missing; run
    `sonicsite models build`": not that --build-dir defaults to a path relative to the
    working directory. And the reason was only on stderr."""
    site_dir = (tmp_path / "site").resolve()
    args = ["--dir", str(site_dir), "--servers", "1", "--models", "simple", "--no-supervise"]
    out = sonicsite_cli("up", *args, cwd=tmp_path)
    assert out.returncode == 1, out.stdout + out.stderr
    said = out.stderr
    assert f"{tmp_path / 'build' / 'models' / 'simple' / '1' / 'model.onnx'} is missing" in said
    assert f"relative to the working directory, {tmp_path}" in said, said
    assert "`--build-dir`" in said and "`sonicsite models build`" in said, said
    log = site_dir / "logs" / UP_LOG
    assert f"(logged in {log})" in said, said
    lines = log.read_text().splitlines()
    assert re.fullmatch(rf"{STAMP} up started \(pid \d+, .*\)", lines[0]), lines
    assert re.fullmatch(rf"{STAMP} up failed: model 'simple': .* is missing\. .*", lines[1]), lines
    assert not (site_dir / STATE_FILE).exists()


def test_a_range_too_small_for_the_whole_site_is_refused_before_anything_starts(
    monkeypatch, tmp_path
):
    """The up-front check counted the servers' ports alone: with room for those, `up` started
    the servers and failed at the control plane, naming neither it nor the site's need."""
    monkeypatch.setenv(PORT_RANGE_VARIABLE, "31000-31007")  # 8: the servers' 3 fit
    with pytest.raises(SiteError) as refused:
        launcher.up(tmp_path / "site", servers=1)
    said = str(refused.value)
    assert said.startswith("servers: a site of 1 servers needs "), said
    assert f"over the 8 of {PORT_RANGE_VARIABLE}=31000-31007: 3 for the servers (3 each), " in said
    assert f"6 for {CONTROL_PLANE}" in said and "1 for the supervisor" in said, said
    assert not (tmp_path / "site").exists()


def test_ports_in_use_now_are_counted_before_anything_starts(monkeypatch, tmp_path):
    lo, hi = SMALL_RANGE
    monkeypatch.setenv(PORT_RANGE_VARIABLE, f"{lo}-{hi}")
    need = site_need(1, False, True, True, True).total  # at most 11 of the range's 12
    with ExitStack() as held:
        for port in range(lo, lo + 12 - need + 1):  # one port too many taken
            s = held.enter_context(socket.socket())
            s.bind(("127.0.0.1", port))
            s.listen()
        with pytest.raises(SiteError) as refused:
            launcher.up(tmp_path / "site", servers=1, supervise=True)
    said = str(refused.value)
    free = re.search(rf"only (\d+) of the 12 of {PORT_RANGE_VARIABLE}={lo}-{hi} are free now", said)
    assert free and int(free[1]) < need, said  # (another process may hold more of them)
    assert "TIME-WAIT" in said and "ip_local_port_range" in said, said
    assert not (tmp_path / "site").exists()


def test_a_part_short_of_ports_is_named_with_what_the_whole_site_needs(monkeypatch, tmp_path):
    """Ports taken between the check and a part's start: the part, its count, the range, and
    what the whole site needs, on the error and in logs/up.log."""
    lo, hi = SMALL_RANGE
    monkeypatch.setenv(PORT_RANGE_VARIABLE, f"{lo}-{hi}")
    need = site_need(2, False, True, True, True)
    site_dir = tmp_path / "site"
    with pytest.raises(PortsExhausted) as short, up_logged(site_dir, need):
        free_ports(13, part=CONTROL_PLANE)
    said = str(short.value)
    assert (
        said
        == f"{PORT_RANGE_VARIABLE}={lo}-{hi}: no 13 free ports left for {CONTROL_PLANE} in its 12"
    )
    whole = f"the whole site needs {need.total} ports at start ({need.said()})"
    assert short.value.__notes__ == [whole]  # the log's place said by `sonicsite up`
    logged = (site_dir / "logs" / UP_LOG).read_text()
    assert f"up failed: {said}; {whole}\n" in logged, logged


def test_a_port_taken_before_the_control_plane_is_named_and_what_up_stopped_too(
    monkeypatch, tmp_path, built_models
):
    """A range exactly the site's size, two of its ports taken by another process once the
    servers have started (the real port chooser is called, a socket holds them first):
    `up` said only "no 6 free ports left in its 10". Now: for which part, what the whole
    site needs, what `up` stopped, and where it logged all that."""
    need = site_need(1, False, True, control_plane.prometheus_installed(), False)
    lo = _free_window(need.total)  # a site's ports stay in TIME-WAIT a minute after it
    monkeypatch.setenv(PORT_RANGE_VARIABLE, f"{lo}-{lo + need.total - 1}")
    squatters: list[socket.socket] = []
    free_ports_then = control_plane.free_ports

    def one_taken_first(count: int, *args, **kwargs) -> list[int]:
        if count == CONTROL_PLANE_PORTS and not squatters:
            chosen = SiteState.load(site_dir).ports()
            left = [p for p in range(lo, lo + need.total) if p not in chosen]
            squatters.extend(socket.create_server(("127.0.0.1", p)) for p in left[:2])
        return free_ports_then(count, *args, **kwargs)

    monkeypatch.setattr(control_plane, "free_ports", one_taken_first)
    site_dir = (tmp_path / "site").resolve()
    try:
        with pytest.raises(SiteError) as failed:
            launcher.up(
                site_dir, servers=1, models=["simple"], build_dir=built_models, supervise=False
            )
    finally:
        for squatter in squatters:
            squatter.close()
    said = str(failed.value)
    assert f"no {CONTROL_PLANE_PORTS} free ports left for {CONTROL_PLANE} in its" in said, said
    whole = f"the whole site needs {need.total} ports at start ({need.said()})"
    log = site_dir / "logs" / UP_LOG
    notes = failed.value.__notes__
    assert notes == ["`up` stopped what it had started: triton-0", whole]
    logged = log.read_text().splitlines()[-1]
    assert logged.endswith(
        f"up failed: {said}; {whole}; `up` stopped what it had started: triton-0"
    )
    assert not (site_dir / STATE_FILE).exists()

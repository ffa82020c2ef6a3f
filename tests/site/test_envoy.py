"""The local site's Envoy: its bootstrap is a few lines that Envoy accepts; its admin is a
Unix socket only the site's user may open, and its one other port besides the site's
listeners serves GET /stats/prometheus and /ready alone (envoy_admin.py)."""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sonicsite.local import envoy
from sonicsite.local.envoy_admin import SOCKET_PATH_MAX, admin_get, admin_socket
from sonicsite.local.errors import EnvoyError


def test_envoy_bootstrap_is_a_few_lines_and_valid(tmp_path):
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(envoy.bootstrap(9901, "sonicsite-operator", 8080)))
    envoy.validate(config)
    boot = json.loads(config.read_text())
    assert set(boot) == {"node", "admin", "dynamic_resources", "static_resources"}
    assert [c["name"] for c in boot["static_resources"]["clusters"]] == ["sonicsite_operator"]


def test_a_sites_bootstrap_is_the_charts_with_its_admin_on_a_socket_and_valid(tmp_path):
    config = tmp_path / "envoy.json"
    socket = tmp_path / "envoy-admin.sock"
    config.write_text(json.dumps(envoy.site_bootstrap(socket, 9902, "127.0.0.1", 8080)))
    envoy.validate(config)
    boot = json.loads(config.read_text())
    assert boot["admin"] == {"address": {"pipe": {"path": str(socket), "mode": 0o600}}}
    chart = envoy.bootstrap(0, "127.0.0.1", 8080)
    assert {k: v for k, v in boot.items() if k not in ("admin", "static_resources")} == {
        k: v for k, v in chart.items() if k not in ("admin", "static_resources")
    }


def _listening(pid: int) -> set[str]:
    """host:port of every TCP socket the process listens on (/proc: its fds' inodes)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "tcp6"):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:
                host, port = local.split(":")
                address = ".".join(str(int(host[i : i + 2], 16)) for i in (6, 4, 2, 0))
                found.add(f"{address if len(host) == 8 else '[v6]'}:{int(port, 16)}")
    return found


def _status(method: str, url: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url, method=method), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_a_sites_envoy_admin_is_a_socket_of_its_user_alone(site):
    held = os.stat(site.envoy_admin)
    assert stat.S_ISSOCK(held.st_mode) and stat.S_IMODE(held.st_mode) == 0o600
    assert held.st_uid == os.getuid()
    info = json.loads(admin_get(site.envoy_admin, "/server_info"))
    assert info["state"] == "LIVE"
    # Envoy listens on TCP where the site's own listeners are, and on its stats port
    envoy_pid = site.process("envoy").pid
    tcp = _listening(envoy_pid)
    assert site.envoy_stats in tcp and site.grpc in tcp, tcp
    for address in tcp - {site.envoy_stats}:  # none of the others is the admin
        assert _status("GET", f"http://{address}/server_info") != 200, address


def test_a_sites_envoy_stats_port_serves_its_stats_and_readiness_alone(site):
    stats = f"http://{site.envoy_stats}"
    with urllib.request.urlopen(f"{stats}/stats/prometheus", timeout=10) as reply:
        assert reply.status == 200 and b"envoy_cluster_upstream_rq_total" in reply.read()
    with urllib.request.urlopen(f"{stats}/ready", timeout=10) as reply:
        assert reply.read().strip() == b"LIVE"
    for method, path in [("GET", "/config_dump"), ("POST", "/quitquitquit"), ("POST", "/ready")]:
        assert _status(method, f"{stats}{path}") == 404, (method, path)
    assert _status("POST", f"{stats}/logging?level=trace") == 404
    assert b"LIVE" in admin_get(site.envoy_admin, "/ready")  # still up: nothing reached it


@pytest.fixture
def short_tmp(monkeypatch) -> Iterator[Path]:
    """A temporary directory of a short path (/tmp/...), as the system's usually is, and no
    session runtime folder."""
    folder = Path(tempfile.mkdtemp(dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(folder))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    yield folder
    shutil.rmtree(folder)


DEEP = ("d" * 60, "e" * 60)  # a site folder too deep for a socket in it


def test_a_site_folder_too_long_for_a_socket_has_it_in_a_private_folder(tmp_path, short_tmp):
    site = tmp_path / "site"
    assert admin_socket(site) == site.resolve() / "envoy-admin.sock"
    path = admin_socket(tmp_path.joinpath(*DEEP))
    assert len(os.fsencode(path)) <= SOCKET_PATH_MAX
    assert path.parent == short_tmp / f"sonicsite-{os.getuid()}"
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert admin_socket(tmp_path.joinpath(*DEEP)) == path  # the same site, the same socket
    assert admin_socket(tmp_path / ("f" * 120)) != path


def test_the_sessions_runtime_folder_comes_first(tmp_path, short_tmp, monkeypatch):
    runtime = short_tmp / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    assert admin_socket(tmp_path.joinpath(*DEEP)).parent == runtime


def test_a_temporary_directory_too_long_itself_leaves_it_under_tmp(tmp_path, monkeypatch):
    """As the suite's benches run it: TMPDIR a test's own folder, as deep as the site's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path.joinpath(*DEEP)))
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    path = admin_socket(tmp_path.joinpath(*DEEP, "site"))
    assert path.parent == Path("/tmp") / f"sonicsite-{os.getuid()}"
    assert len(os.fsencode(path)) <= SOCKET_PATH_MAX


def test_a_private_folder_that_others_may_open_is_refused(tmp_path, short_tmp):
    shared = short_tmp / f"sonicsite-{os.getuid()}"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(EnvoyError, match=r"not a folder of this user's alone.*drwxr-xr-x"):
        admin_socket(tmp_path / ("d" * 120))

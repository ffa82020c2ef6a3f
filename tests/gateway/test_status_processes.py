"""The status page and `/v1/status` name every process of a local site with its state and
restarts (read from the site's state file through the contract's reader); after a SIGKILL
the page shows the restart, in a real headless browser (Debian's Chromium). Without a state
file (Kubernetes) they say that processes are the cluster's job."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from polling import wait_until

from sonicsite.contract.wire import STATE_FILE, read_processes
from sonicsite.local import launcher
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import start_process, stop_group, wait_for_http

EVERY = {"triton-0", "operator", "envoy", "gateway", "prometheus", "supervisor"}


@pytest.fixture(scope="module")
def local_site(tmp_path_factory, built_models):
    site_dir = tmp_path_factory.mktemp("status") / "site"
    state = launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models)
    yield state
    if (site_dir / STATE_FILE).exists():
        launcher.down(site_dir)


def _status(http: str) -> dict:
    with urllib.request.urlopen(f"http://{http}/v1/status", timeout=10) as reply:
        return json.loads(reply.read())


def _dom(url: str) -> str:
    """The page as Chromium renders it once its script has read /v1/status."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "Debian's chromium is needed (make system installs it)"
    command = [
        chromium,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--virtual-time-budget=6000",
        "--dump-dom",
        url,
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120).stdout


def _rows(dom: str) -> dict[str, dict[str, str]]:
    """The processes table's rows by process: their data attributes and cells."""
    rows = {}
    for attrs, body in re.findall(r"<tr ([^>]*data-process[^>]*)>(.*?)</tr>", dom):
        data = dict(re.findall(r'data-(\w+)="([^"]*)"', attrs))
        data["cells"] = re.findall(r"<td[^>]*>(.*?)</td>", body)
        rows[data["process"]] = data
    return rows


def test_v1_status_lists_every_process_of_the_site(local_site):
    processes = _status(local_site.http)["processes"]
    assert processes["local"] and processes["supervised"]
    assert "supervised by pid" in processes["note"]
    records = {r["name"]: r for r in processes["records"]}
    assert set(records) == EVERY
    assert all(r["state"] == "running" and r["restarts"] == 0 for r in records.values())
    assert records["gateway"]["kind"] == "gateway" and records["triton-0"]["kind"] == "server"


def test_a_supervisor_that_does_not_answer_is_not_supervision(local_site):
    """A stopped (or hung) supervisor's PID lives: the page said "supervised by pid N: a
    process that dies is restarted" while nothing restarted anything. Its /healthz is asked."""
    watcher = next(r for r in read_processes(Path(local_site.site_dir)) if r.kind == "supervisor")
    os.kill(watcher.pid, signal.SIGSTOP)
    try:
        processes = _status(local_site.http)["processes"]
    finally:
        os.kill(watcher.pid, signal.SIGCONT)
    assert not processes["supervised"], processes["note"]
    assert f"the supervisor (pid {watcher.pid}) does not answer" in processes["note"]
    wait_until(lambda: _status(local_site.http)["processes"]["supervised"], "supervised again")


def test_a_hung_process_is_not_answering_on_the_page_as_status_says(local_site):
    """A SIGSTOPped operator was "running" on the page while `sonicsite status` said it did
    not answer: its health URL is asked, and its row says so, and why."""
    operator = next(r for r in read_processes(Path(local_site.site_dir)) if r.name == "operator")
    os.kill(operator.pid, signal.SIGSTOP)
    try:
        records = {r["name"]: r for r in _status(local_site.http)["processes"]["records"]}
    finally:
        os.kill(operator.pid, signal.SIGCONT)
    assert records["operator"]["state"] == "not answering", records["operator"]
    assert records["operator"]["why"].startswith(operator.health + ": no answer in ")
    assert records["envoy"]["state"] == "running" and "why" not in records["envoy"]
    wait_until(
        lambda: all(
            r["state"] == "running" for r in _status(local_site.http)["processes"]["records"]
        ),
        "every process to answer again",
    )


def test_the_page_lists_every_process_and_shows_a_restart_in_chromium(local_site):
    rows = _rows(_dom(f"http://{local_site.http}/"))
    assert set(rows) == EVERY
    assert all(r["state"] == "running" and r["restarts"] == "0" for r in rows.values()), rows
    victim = next(r for r in read_processes(Path(local_site.site_dir)) if r.name == "operator")
    os.kill(victim.pid, signal.SIGKILL)
    wait_until(
        lambda: any(
            r.name == "operator" and r.restarts == 1 and r.state == "running"
            for r in read_processes(Path(local_site.site_dir))
        ),
        "the operator to run again",
        timeout=180,
    )
    row = _rows(_dom(f"http://{local_site.http}/"))["operator"]
    assert row["restarts"] == "1" and row["state"] == "running"
    assert row["cells"][4] == "1"  # the restarts column
    assert row["cells"][5]  # the last exit, e.g. "killed by SIGKILL"
    assert row["cells"][2] != str(victim.pid)  # the new PID


def test_without_a_state_file_the_page_says_processes_are_the_clusters_job(local_site, tmp_path):
    """As on Kubernetes: the gateway runs without --site-state."""
    (port,) = free_ports(1)
    log = tmp_path / "gateway.log"
    cmd = [sys.executable, "-P", "-m", "sonicsite.gateway.main"]
    cmd += [f"--operator=http://{local_site.operator}", f"--port={port}"]
    proc = start_process(cmd, log)
    try:
        wait_for_http(f"http://127.0.0.1:{port}/v1/site", proc, log, 120, AssertionError)
        processes = _status(f"127.0.0.1:{port}")["processes"]
        assert not processes["local"] and processes["records"] == []
        dom = _dom(f"http://127.0.0.1:{port}/")
        assert "processes are the cluster's job" in dom and "data-process" not in dom
    finally:
        stop_group(proc.pid)


def test_the_gateway_refuses_a_state_file_that_is_not_there(tmp_path):
    missing = tmp_path / STATE_FILE
    gateway = [sys.executable, "-P", "-m", "sonicsite.gateway.main", "--operator=http://x:1"]
    out = subprocess.run(
        [*gateway, "--port=1", f"--site-state={missing}"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert f"--site-state: expected a site's state.json, {missing} does not exist" in out.stderr

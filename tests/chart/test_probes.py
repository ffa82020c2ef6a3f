"""The chart's liveness probes would fire on a hung process and not on a healthy one.

The probes are taken from the chart as the Helm engine renders it and run the way the kubelet
runs an httpGet probe (HTTP/1.1 GET, `timeoutSeconds`, success on a status from 200 to 399,
restart after `failureThreshold` failures in a row) against the real processes of a local
site: the operator, the gateway and Envoy, each then stopped with SIGSTOP (hung, not dead:
it still holds its port). The probes run back to back rather than `periodSeconds` apart: a
stopped process stays stopped, so only the count of failures in a row decides.
"""

from __future__ import annotations

import os
import signal
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from chartcheck import objects, render
from polling import wait_until

from sonicsite.local import launcher
from sonicsite.local.state import SiteState

CONTAINERS = {"operator": "operator", "gateway": "gateway", "envoy": "envoy"}


@pytest.fixture(scope="module")
def local_site(tmp_path_factory: pytest.TempPathFactory, built_models: Path) -> SiteState:
    site_dir = tmp_path_factory.mktemp("probes") / "site"
    launcher.up(site_dir, servers=1, models=["identity"], build_dir=built_models, supervise=False)
    try:
        yield SiteState.load(site_dir)
    finally:
        launcher.down(site_dir)


def _liveness(component: str) -> tuple[dict, dict[str, int]]:
    """The component's liveness probe, and its container's ports by name."""
    for doc in objects(render({})):
        if doc["kind"] != "Deployment":
            continue
        for container in doc["spec"]["template"]["spec"]["containers"]:
            if container["name"] == CONTAINERS[component]:
                ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
                return container["livenessProbe"], ports
    raise AssertionError(f"the chart renders no {component} container")


def _address(state: SiteState, component: str) -> str:
    return {"operator": state.operator, "gateway": state.http, "envoy": state.grpc}[component]


def _probe_ok(probe: dict, address: str) -> bool:
    """One httpGet probe, as the kubelet makes it."""
    get = probe["httpGet"]
    url = f"http://{address}{get['path']}"
    try:
        with urllib.request.urlopen(url, timeout=probe.get("timeoutSeconds", 1)) as reply:
            return 200 <= reply.status < 400
    except urllib.error.HTTPError as exc:
        return 200 <= exc.code < 400
    except (urllib.error.URLError, OSError):
        return False


def _stopped(pid: int) -> bool:
    """Every thread of the process is stopped (state T in /proc)."""
    states = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            states.append((task / "stat").read_text().rsplit(")", 1)[1].split()[0])
        except FileNotFoundError:  # a thread that ended
            continue
    return bool(states) and all(state in ("T", "t") for state in states)


def _fires(probe: dict, address: str) -> bool:
    """True when `failureThreshold` probes in a row fail: the kubelet restarts the container."""
    return not any(_probe_ok(probe, address) for _ in range(probe.get("failureThreshold", 3)))


@pytest.mark.parametrize("component", sorted(CONTAINERS))
def test_liveness_fires_on_a_hung_process_only(local_site: SiteState, component: str):
    probe, ports = _liveness(component)
    assert "httpGet" in probe, f"{component}: a TCP probe passes on a hung process"
    assert probe["httpGet"]["port"] in ports or isinstance(probe["httpGet"]["port"], int)
    assert probe.get("timeoutSeconds", 1) <= 5 and probe.get("failureThreshold", 3) <= 6
    address = _address(local_site, component)
    assert not _fires(probe, address), f"{component}: the probe fires on a healthy process"
    pid = SiteState.load(Path(local_site.site_dir)).process(component).pid
    os.kill(pid, signal.SIGSTOP)
    try:
        # SIGSTOP reaches a process's threads a moment after kill() returns: a probe sent at
        # once may still be answered (seen with Envoy on a loaded machine)
        wait_until(lambda: _stopped(pid), f"{component} (PID {pid}) to stop")
        assert _fires(probe, address), f"{component}: a hung process passes its liveness probe"
    finally:
        os.kill(pid, signal.SIGCONT)
    # The kubelet spaces its probes by periodSeconds: a process that runs again passes one
    # within that time (the operator's health is its next step), and then no longer fires.
    wait_until(lambda: _probe_ok(probe, address), f"{component} answering its probe again")
    assert not _fires(probe, address), f"{component}: the probe still fires once it runs again"

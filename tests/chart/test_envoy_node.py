"""Each Envoy pod of the chart has its own xDS node id, its pod name: the operator counts
each Envoy's ACKs apart (operator/envoy_acks.py), and one node id shared by the replicas
made it take one pod's ACK for both. Proven on the real Envoy: started with the
Deployment's own arguments, expanded as Kubernetes expands `$(VAR)` from the container's
environment, it runs under the pod's name."""

from __future__ import annotations

import json
import re
import subprocess
import urllib.request
from pathlib import Path

from chartcheck import objects, one_object, render
from polling import wait_until

from sonicsite.local.envoy import binary
from sonicsite.local.ports import free_ports


def _expanded(args: list[str], env: dict[str, str]) -> list[str]:
    """`$(NAME)` replaced by the container's variable, as the kubelet does."""
    return [re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env[m[1]], a) for a in args]


def _node_id(admin: int) -> str | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{admin}/server_info", timeout=5) as r:
            return json.loads(r.read())["node"]["id"]
    except OSError:  # not listening yet
        return None


def _said_node_id(envoy: subprocess.Popen, admin: int, log: Path) -> str:
    """The node id `envoy` says on its admin port once it listens; it must not exit first."""

    def said() -> str | None:
        assert envoy.poll() is None, log.read_text()[-2000:]
        return _node_id(admin)

    return wait_until(said, "Envoy to say its node id", 60, 0.2)


def test_each_envoy_pod_runs_under_its_own_name_as_its_node_id(tmp_path):
    (admin,) = free_ports(1)  # of this worker's range: no outgoing connection takes it
    docs = objects(render({"envoy": {"adminPort": admin}}))
    deployment = one_object(docs, "Deployment", "envoy")
    assert deployment["spec"]["replicas"] >= 2  # the default: more than one Envoy
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    (pod_name,) = [v for v in container["env"] if v["name"] == "POD_NAME"]
    # the downward API: each pod's own name, never two the same in a namespace
    assert pod_name["valueFrom"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert container["args"][container["args"].index("--service-node") + 1] == "$(POD_NAME)"
    bootstrap = json.loads(one_object(docs, "ConfigMap", "envoy")["data"]["envoy.json"])
    for source in ("lds_config", "cds_config"):  # no operator here: start without waiting
        bootstrap["dynamic_resources"][source]["initial_fetch_timeout"] = "0.5s"
    (tmp_path / "envoy.json").write_text(json.dumps(bootstrap))
    args = [
        a.replace("/etc/envoy/envoy.json", str(tmp_path / "envoy.json")) for a in container["args"]
    ]
    ids = {}
    for pod in ("site-sonicsite-envoy-7d9f-abcde", "site-sonicsite-envoy-7d9f-fghij"):
        run = _expanded(args, {"POD_NAME": pod})
        with (tmp_path / "envoy.log").open("w") as log:
            envoy = subprocess.Popen(
                [str(binary()), *run, "--concurrency", "1"],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            ids[pod] = _said_node_id(envoy, admin, tmp_path / "envoy.log")
        finally:
            envoy.terminate()
            envoy.wait(timeout=30)
    assert ids == {pod: pod for pod in ids}, ids

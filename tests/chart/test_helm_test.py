"""The `helm test` pod, as the chart renders it for a profile, run against the session's
local site: its command and arguments, its requests file (the hook ConfigMap of
tests.inputs), only the Envoy address and the file's folder taken from here."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from chartcheck import objects, profiles, render

PROFILE = "minimal-cpu-values"
MOUNT = "/etc/sonicsite/test"


def _test_pod(values: dict) -> tuple[list[str], dict[str, str]]:
    """The test container's command line and the files of its ConfigMap."""
    docs = objects(render(values))
    (pod,) = [d for d in docs if d["kind"] == "Pod"]
    (container,) = pod["spec"]["containers"]
    files = {}
    for d in docs:
        if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-test-inputs"):
            files = d["data"]
    return [*container["command"], *container["args"]], files


def _run(command: list[str], files: dict[str, str], grpc: str, folder: Path):
    """The pod's command here: the Envoy Service's address is the local site's, the mounted
    ConfigMap is a folder of the test's."""
    for name, text in files.items():
        (folder / name).write_text(text)
    local = []
    for arg in command:
        if arg.startswith("--grpc="):
            arg = f"--grpc={grpc}"
        local.append(arg.replace(MOUNT, str(folder)))
    executable = shutil.which("sonicsite", path=str(Path(sys.executable).parent))
    return subprocess.run(
        [executable, *local[1:]], capture_output=True, text=True, timeout=300, check=False
    )


def test_the_profiles_helm_test_passes_against_a_site(site, tmp_path):
    command, files = _test_pod(profiles()[PROFILE])
    assert command[:2] == ["sonicsite", "check"] and "inputs.json" in files
    done = _run(command, files, site.grpc, tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "simple: the request from" in done.stdout and "answered" in done.stdout
    assert "identity: 4/4 events answered and checked" in done.stdout


def test_a_wrong_answer_or_a_model_without_a_request_fails_the_test(site, tmp_path):
    values = json.loads(json.dumps(profiles()[PROFILE]))
    inputs = json.loads(values["tests"]["inputs"])
    inputs["simple"]["outputs"]["OUTPUT0"][3] += 1  # the server answers 4, not 5
    values["tests"]["inputs"] = json.dumps(inputs)
    command, files = _test_pod(values)
    done = _run(command, files, site.grpc, tmp_path)
    assert done.returncode == 1
    assert "simple: the request from" in done.stdout and "OUTPUT0: off by up to 1" in done.stdout

    # a site's own model (one of triton.models, the only ones tests.models may name) with no
    # demo sample and no request in tests.inputs
    values["triton"]["models"] = [*values["triton"]["models"], "site_own_model"]
    own = {"source": "pvc", "claimName": "site-models"}  # where the site's own model is
    values["triton"]["modelRepositories"] = [{"source": "demo"}, own]
    values["tests"]["models"] = ["site_own_model"]
    command, files = _test_pod(values)
    done = _run(command, files, site.grpc, tmp_path)
    assert done.returncode == 2  # a usage error: the test pod fails all the same
    assert "model(s) ['site_own_model']: --inputs" in done.stderr, done.stderr
    assert "has no request for them" in done.stderr, done.stderr


KEDA = {"autoscaling": {"enabled": True}, "monitoring": {"prometheus": {"enabled": True}}}
POOLED = {"placement": {"enabled": True}}


def _tested(values: dict) -> list[str] | None:
    """The models the `helm test` pod asks Envoy for; None where no test pod renders."""
    pods = [d for d in objects(render(values)) if d["kind"] == "Pod"]
    if not pods:
        return None
    (pod,) = pods
    (arg,) = [a for a in pod["spec"]["containers"][0]["args"] if a.startswith("--models=")]
    return arg.removeprefix("--models=").split(",")


def test_the_models_of_a_parked_pool_are_not_tested():
    """A pool parked at 0 servers (replicas 0 without autoscaling; minReplicas 0 with it,
    scaled to zero when idle) has no server to answer: `helm test` failed on it (the gateway
    held the request until its deadline) though the pool had no pod on purpose."""
    parked = {"name": "parked", "models": ["deepmet"], "replicas": 0}
    values = {**POOLED, "pools": [parked, {"name": "cpu"}]}
    assert _tested(values) == ["particlenet_ak4"]
    # tests.models naming a parked pool's model: that one is skipped, the others tested
    values["tests"] = {"models": ["deepmet", "particlenet_ak4"]}
    assert _tested(values) == ["particlenet_ak4"]
    # scaled to zero by KEDA: nothing runs until requests wake it
    woken = {"name": "gpu", "models": ["deepmet"], "minReplicas": 0}
    values = {**KEDA, **POOLED, "pools": [woken, {"name": "cpu"}]}
    assert _tested(values) == ["particlenet_ak4"]
    # unless tests.models names it: the site asks for the wake (its request is held)
    values["tests"] = {"models": ["deepmet"]}
    assert _tested(values) == ["deepmet"]
    # the catch-all pool parked: every model no other pool names
    values = {**POOLED, "pools": [{"name": "a", "models": ["deepmet"]}, parked | {"models": []}]}
    assert _tested(values) == ["deepmet"]


def test_a_pool_that_runs_a_server_is_tested():
    """replicas 0 is no park with autoscaling (KEDA keeps minReplicas), nor minReplicas 0
    without it (the Deployment keeps replicas)."""
    zero = {"name": "gpu", "models": ["deepmet"], "replicas": 0, "minReplicas": 1}
    assert _tested({**KEDA, **POOLED, "pools": [zero, {"name": "cpu"}]}) == [
        "particlenet_ak4",
        "deepmet",
    ]
    idle = {"name": "gpu", "models": ["deepmet"], "minReplicas": 0}
    assert _tested({**POOLED, "pools": [idle, {"name": "cpu"}]}) == ["particlenet_ak4", "deepmet"]


def test_a_site_parked_whole_renders_no_test_and_says_so():
    """Every model parked: no model left to ask, so no test pod (nor its inputs ConfigMap),
    where `sonicsite check` with no model would fail on its arguments."""
    values = json.loads(json.dumps(profiles()[PROFILE]))
    values["triton"]["replicas"] = 0
    rendered = render(values)
    assert _tested(values) is None
    kinds = {(d["kind"], d["metadata"]["name"]) for d in objects(rendered)}
    assert not [name for kind, name in kinds if name.endswith("-test-inputs")]
    notes = " ".join(rendered["sonicsite/templates/NOTES.txt"].split())
    assert "no model to test" in notes, notes
    # a parked pool's models are named where the test is shown
    values = {
        **POOLED,
        "pools": [{"name": "parked", "models": ["deepmet"], "replicas": 0}, {"name": "cpu"}],
    }
    notes = " ".join(render(values)["sonicsite/templates/NOTES.txt"].split())
    assert "skips the models of pools parked at 0 servers" in notes, notes
    assert "deepmet (pool parked)" in notes, notes

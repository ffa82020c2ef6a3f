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

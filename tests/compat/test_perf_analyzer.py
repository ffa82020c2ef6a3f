"""perf_analyzer, the field's load generator, measures the site through every path as it
measures one Triton server: a short count-based run ends with its figures and no request
errors, and the server-side counts it reads from the path's statistics match what it sent
(through the site, the statistics summed over the servers that hold the model)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from compat_paths import HELD, paths_for
from sonicsite.bench.perf_analyzer import perf_analyzer_env

BINARY = Path(sys.executable).parent / "perf_analyzer"
# (protocol, path): gRPC direct and through Envoy; REST direct, through Envoy and the gateway
RUNS = [
    ("grpc", "direct"),
    ("grpc", "envoy"),
    ("http", "direct"),
    ("http", "envoy"),
    ("http", "gateway"),
]
CLIENT = re.compile(r"Client:\s*\n\s*Request count: (\d+)")
SERVER = re.compile(r"Server:\s*\n\s*Inference count: (\d+)")
UNSTABLE = "Failed to obtain stable measurement"
# perf_analyzer reads the server's counts at the start and end of each of its three windows,
# and at concurrency 1 one request may be in flight at each of those six reads: counted by
# the server but not the client, or the other way (seen on a direct server under load: 4).
# Beside two CPU hogs a direct server was also seen 7 off in 3737 requests (its windows of
# thousands of requests, time slices longer than a request): one more per 500 requests.
EDGE = 6
EDGE_PER_REQUESTS = 500
# The client keeps sending while perf_analyzer reads the counts, and counts only requests
# inside its windows, which lie between those reads: requests completed while a read is
# answered are the server's alone. Through the site a read crosses Envoy, the gateway and
# every server; with three test workers on two cores one was answered so late that the
# server counted 40 more than the client sent (1182 for 1142, through Envoy). So the
# server's count may exceed the client's by a tenth: a view that missed one of simple's three
# servers (about a third) or counted one twice is still caught, and the server never counts
# fewer than the client sent beyond the edges.
READ_SHARE = 10
# The second run's stability: windows within 1000 % of their mean. At 100 % a busy machine
# (two CPU hogs beside the suite) still gave 10 windows without three alike at concurrency 1.
ANY_SPREAD = 1000


@pytest.fixture(scope="module")
def pa_env(tmp_path_factory) -> tuple[dict[str, str], Path]:
    workdir = tmp_path_factory.mktemp("perf-analyzer")
    return perf_analyzer_env(workdir), workdir


def _run(env, workdir, model: str, protocol: str, target: str, stability: int, trials: int) -> str:
    cmd = [
        str(BINARY),
        *("-m", model, "-u", target, "-i", protocol, "-b", "1", "-p", "100"),
        *("--concurrency-range", "1", "--measurement-mode", "count_windows"),
        *("--measurement-request-count", "50", "-s", str(stability), "--max-trials", str(trials)),
    ]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=workdir)
    text = out.stdout + out.stderr
    if out.returncode != 0:  # only a run not stable at 10 % is measured again
        assert UNSTABLE in text and stability < ANY_SPREAD, text[-2000:]
        return ""
    return text


CASES = [(p, path, "simple") for p, path in RUNS] + [
    ("grpc", "envoy", HELD),
    ("http", "envoy", HELD),
    ("http", "gateway", HELD),
]


@pytest.mark.parametrize(("protocol", "path", "model"), CASES)
def test_perf_analyzer_measures_every_path(compat_site, pa_env, protocol, path, model):
    """A run stable at 10 %; on a machine too busy for that, the same run accepting any
    spread (the figures are not what this test is about). The server-side count it read
    from the path's statistics is never short of its client-side request count beyond a
    request per window edge (and one per 500 on a busy machine), nor over it by more than
    the requests that complete while the counts are read: through the site the count is
    summed over the model's servers, on every path (Envoy sends statistics to the site's
    view, gRPC and REST)."""
    env, workdir = pa_env
    paths = paths_for(compat_site, model)
    target = paths.grpc(path) if protocol == "grpc" else paths.http(path)
    # a window takes about a second whatever its size: 4 windows to get stable at 10 %
    text = _run(env, workdir, model, protocol, target, 10, 4) or _run(
        env, workdir, model, protocol, target, ANY_SPREAD, 10
    )
    assert "Inferences/Second vs. Client" in text, text[-2000:]
    assert "error" not in text.lower(), text[-2000:]
    sent = int(CLIENT.search(text).group(1))
    assert sent >= 150  # three windows of at least 50
    served = int(SERVER.search(text).group(1))
    assert served >= sent - EDGE - sent // EDGE_PER_REQUESTS, text[-1500:]
    assert served <= sent + EDGE + sent // READ_SHARE, text[-1500:]

"""`sonicsite bench balancing`: round robin vs least request vs sonicsite's load-aware weights.

A three-server site serving the identity model; one server is slowed by the runner's delay
knob (every execution sleeps `delay_ms`), as a server on a busy or older node would be. The
same closed-loop stream (the sonicsite client through Envoy, 2 and 8 requests in flight) runs
under each policy; the policies take turns within every repeat, switched at run
time through the operator (`PUT /v1/balancing`), and each turn starts once Envoy runs the
policy. p50, p99, throughput and the slow server's share of requests; medians of repeats.
"""

from __future__ import annotations

import json
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
from sonicsite.client import Client, Column, SoA, TensorSpec
from sonicsite.client.discovery import from_site_file
from sonicsite.operator.balancing import POLICIES
from sonicsite.operator.xds_resources import model_cluster

from sonicsite.contract.wire import SiteRecord
from sonicsite.local import envoy, launcher
from sonicsite.local.state import SiteState

from .common import load_now, median_runs, write_result

MODEL = "identity"
FLOATS = 2560  # 10 kB per request
SLOW = "triton-2"
BASELINE = "round-robin"


def set_policy(state: SiteState, policy: str, timeout: float = 10.0) -> float:
    """Switch the operator's policy and wait until Envoy runs it: its lb_policy, and the
    endpoint weights the operator publishes under it; seconds it took."""
    request = urllib.request.Request(
        f"http://{state.operator}/v1/balancing",
        data=json.dumps({"policy": policy}).encode(),
        method="PUT",
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=5):
        pass
    started = time.monotonic()
    while True:
        with urllib.request.urlopen(f"http://{state.operator}/v1/state", timeout=5) as reply:
            site = json.loads(reply.read())
        published = {s["grpc"]: site["models"][MODEL]["weights"][s["id"]] for s in site["servers"]}
        running = envoy.lb_policies(state.envoy_admin).get(model_cluster(MODEL))
        in_envoy = envoy.weights(state.envoy_admin, model_cluster(MODEL))
        if site["balancing"] == policy and running == POLICIES[policy] and in_envoy == published:
            return time.monotonic() - started
        if time.monotonic() - started > timeout:
            raise RuntimeError(
                f"Envoy does not run {policy} after {timeout} s: {running}, weights {in_envoy}"
            )
        time.sleep(0.05)


def stream(site: SiteRecord, requests: int, concurrency: int, slow: str = SLOW) -> dict:
    """One closed-loop stream; `slow_share` is the part of requests `slow` answered."""
    source = SoA.allocate([Column("x", np.float32, (FLOATS,))], requests)
    source["x"][...] = 1.0
    spec = TensorSpec(MODEL).append_block("INPUT0", "x").append_output("OUTPUT0")
    with Client(site, "grpc", "site") as client:
        run = client.stream(MODEL, spec, batch=1, window=concurrency)
        started = time.perf_counter()
        result = run.run(source, lambda *a: None)
        elapsed = time.perf_counter() - started
    if result.failed:
        raise RuntimeError(f"the stream lost events: {result.failed}")
    ok = [r for r in result.stats.records if r.ok]
    latencies = [r.latency_s * 1e3 for r in ok]
    return {
        "throughput": result.events_ok / elapsed,
        "p50_ms": float(np.percentile(latencies, 50)),
        "p99_ms": float(np.percentile(latencies, 99)),
        "slow_share": sum(r.server == slow for r in ok) / len(ok),
    }


def run(
    json_path: Path,
    repeats: int = 3,
    delay_ms: float = 40.0,
    requests: int = 600,
    concurrencies: tuple[int, ...] = (2, 8),
    build_dir: Path = Path("build/models"),
) -> dict:
    """The summary takes, over the concurrencies, the load-aware policy's worst ratios."""
    started = load_now()
    policies = [BASELINE] + [p for p in POLICIES if p != BASELINE]
    runs = {c: {p: [] for p in policies} for c in concurrencies}
    switch_s: list[float] = []
    weights: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="sonicsite-bench-") as tmp:
        site_dir = Path(tmp) / "site"
        state = launcher.up(
            site_dir, servers=3, models=[MODEL], build_dir=build_dir, delay_ms={SLOW: delay_ms}
        )
        try:
            site = from_site_file(site_dir)
            for policy in policies:  # warm-up: every policy once, measurements kept nowhere
                set_policy(state, policy)
                stream(site, requests // 4, max(concurrencies))
            for _ in range(repeats):
                for policy in policies:
                    switch_s.append(set_policy(state, policy))
                    for c in concurrencies:
                        runs[c][policy].append(stream(site, requests, c))
                    if policy == "load-aware":
                        weights.append(envoy.weights(state.envoy_admin, model_cluster(MODEL)))
        finally:
            launcher.down(site_dir)

    medians = {
        f"c{c}": {p: median_runs(rs) for p, rs in by_policy.items()}
        for c, by_policy in runs.items()
    }

    def ratios(policy: str, key: str) -> list[float]:
        return [round(m[policy][key] / m[BASELINE][key], 3) for m in medians.values()]

    summary = {
        "p99_ratio_vs_round_robin": max(ratios("load-aware", "p99_ms")),
        "throughput_ratio_vs_round_robin": min(ratios("load-aware", "throughput")),
        "least_request_p99_ratio_vs_round_robin": max(ratios("least-request", "p99_ms")),
        "least_request_throughput_ratio_vs_round_robin": min(ratios("least-request", "throughput")),
        "slow_server_share": {
            c: {p: m["slow_share"] for p, m in by_policy.items()}
            for c, by_policy in medians.items()
        },
        "targets": {
            "p99_ratio_vs_round_robin": "<= 0.5",
            "throughput_ratio_vs_round_robin": ">= 1.3",
        },
    }
    return write_result(
        json_path,
        "balancing",
        summary,
        {
            "repeats": repeats,
            "site": f"3 Triton servers, {MODEL} at {FLOATS * 4} bytes per request; "
            f"{SLOW} sleeps {delay_ms} ms per execution",
            "driver": f"sonicsite client through Envoy, {requests} requests per measurement, "
            f"concurrency {list(concurrencies)}",
            "policies": medians,
            "runs": {f"c{c}": by_policy for c, by_policy in runs.items()},
            "policy_switch_s": [round(s, 3) for s in switch_s],
            "load_aware_envoy_weights": weights,
        },
        load_before=started,
    )

"""The balancing bench's load generator: the sonicsite client through Envoy, closed loop or
open loop (Poisson arrivals, latency from each request's scheduled arrival), and switching
the operator's balancing policy until Envoy runs it."""

from __future__ import annotations

import time
import urllib.error
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from sonicsite.client import Client, Column, SoA, TensorSpec
from sonicsite.operator.balancing import POLICIES
from sonicsite.operator.xds_resources import model_cluster

from sonicsite.contract.wire import SiteRecord
from sonicsite.jobs.arrivals import open_loop_offsets
from sonicsite.local import envoy, operator_control
from sonicsite.local.state import SiteState

from .common import http_json

MODEL = "identity"
FLOATS = 256  # 1 kB per request
SLOW = "triton-2"
OPEN_WINDOW = 64  # open loop: requests that may be in flight (the client's threads)


@dataclass
class Answers:
    """One measurement's answers: per request its latency and (when answered) its server."""

    latency_ms: list[float] = field(default_factory=list)
    done_at: list[float] = field(default_factory=list)  # epoch s of each answer, in order
    servers: list[str] = field(default_factory=list)  # who gave the answer at done_at[i]
    elapsed_s: float = 0.0
    failed: int = 0
    retries: int = 0
    not_via_envoy: int = 0  # attempts the client failed over to the gateway or the servers
    offered_rps: float | None = None  # open loop: the arrivals offered per second

    def figures(self, slow: str = SLOW, where: str = "a measurement") -> dict:
        """`where`: which measurement (slowdown, load, policy), named if none answered."""
        if not self.latency_ms:
            raise RuntimeError(
                f"{where}: no request was answered ({self.failed} failed, "
                f"{self.retries} retries, {self.elapsed_s:.1f} s)"
            )
        return {
            "requests": len(self.latency_ms),
            "throughput": len(self.latency_ms) / self.elapsed_s,
            "p50_ms": float(np.percentile(self.latency_ms, 50)),
            "p99_ms": float(np.percentile(self.latency_ms, 99)),
            "slow_share": self.servers.count(slow) / max(len(self.servers), 1),
            "failed": self.failed,
            "retries": self.retries,
            "not_via_envoy": self.not_via_envoy,
        } | self.served()

    def served(self) -> dict:
        """Open loop: the rate offered and the part of it served (throughput over it); a
        site that did not keep up answers its queue after the arrivals end, and its p99
        then measures how long the turn ran, not the policy."""
        if self.offered_rps is None:
            return {}
        throughput = len(self.latency_ms) / self.elapsed_s
        return {
            "offered_rps": self.offered_rps,
            "served_over_offered": throughput / self.offered_rps,
        }


def set_policy(state: SiteState, policy: str, timeout: float = 30.0) -> float:
    """Switch the operator's policy and wait until Envoy runs it: its lb_policy, and the
    endpoint weights the operator publishes under it; seconds it took. An operator that does
    not answer for a moment (restarted by the supervisor) is asked again until `timeout`."""
    started = time.monotonic()
    while True:
        try:
            return _switch(state, policy, started, timeout)
        except urllib.error.URLError:
            if time.monotonic() - started > timeout:
                raise
            time.sleep(0.5)


def _switch(state: SiteState, policy: str, started: float, timeout: float) -> float:
    operator_control.put(Path(state.site_dir), state.operator, "/v1/balancing", {"policy": policy})
    while True:
        site = http_json(state.operator, "/v1/state", 5)
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


def _send(
    site: SiteRecord,
    requests: int,
    window: int,
    arrivals: list[float] | None,
    connect: Callable[..., Client] = Client,
) -> Answers:
    """Send `requests` through Envoy, `window` in flight at most; each request's latency from
    its scheduled arrival (open loop) or its first send (closed loop) to its answer. Each
    answer's time and server come from the same attempt's record (answers arrive out of
    order: the request index says nothing of who answered when). `connect`: the client."""
    source = SoA.allocate([Column("x", np.float32, (FLOATS,))], requests)
    source["x"][...] = 1.0
    spec = TensorSpec(MODEL).append_block("INPUT0", "x").append_output("OUTPUT0")
    sent: dict[int, float] = {}
    done: dict[int, float] = {}

    def on_send(lo: int, hi: int) -> None:
        sent[lo] = time.time()

    def on_result(lo: int, hi: int, outputs: dict) -> None:
        done[lo] = time.time()

    with connect(site, "grpc", "site") as client:
        run = client.stream(MODEL, spec, batch=1, window=window)
        started = time.time()
        result = run.run(source, on_result, arrivals, on_send)
        elapsed = time.time() - (arrivals[0] if arrivals else started)
    begin = arrivals or [sent.get(i, 0.0) for i in range(requests)]
    answered = sorted(done)
    records = result.stats.records
    by_time = sorted((r.start + r.latency_s, r.server) for r in records if r.ok)
    return Answers(
        latency_ms=[(done[i] - begin[i]) * 1e3 for i in answered],
        done_at=[at for at, _ in by_time],
        servers=[server for _, server in by_time],
        elapsed_s=elapsed,
        failed=result.events_failed,
        retries=result.retries,
        not_via_envoy=sum(r.path != "envoy" for r in records),
    )


def closed_loop(site: SiteRecord, requests: int, concurrency: int) -> Answers:
    return _send(site, requests, concurrency, None)


def open_loop(site: SiteRecord, rate: float, seconds: float, seed: int) -> Answers:
    """Poisson arrivals at `rate` per second for `seconds`, starting a moment from now."""
    start = time.time() + 0.2
    arrivals = [start + t for t in open_loop_offsets(rate, seconds, seed)]
    answers = _send(site, len(arrivals), OPEN_WINDOW, arrivals)
    # the draw's own rate (a fixed count over a Poisson span), not the nominal one
    answers.offered_rps = len(arrivals) / max(arrivals[-1] - arrivals[0], 1e-3)
    return answers


def stream(site: SiteRecord, requests: int, concurrency: int, slow: str = SLOW) -> dict:
    """One closed-loop stream's figures; `slow_share` is the part of requests `slow` answered."""
    answers = closed_loop(site, requests, concurrency)
    if answers.failed:
        raise RuntimeError(f"the stream lost events: {answers.failed}")
    return answers.figures(slow, f"a closed loop of {requests} requests")

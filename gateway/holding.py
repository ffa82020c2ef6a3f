"""Requests held, not failed: a request for a model of the site's catalogue that no server
holds ready now waits here until the operator's state shows a server that does, then goes
to it; past the model's deadline it fails with an error naming the model and why.

Envoy sends here only inference, metadata and config (what a client asks before its first
inference) for such models (the operator's hold routes, operator/xds_routes.py
`hold_routes`), so no other request takes this hop: over gRPC to the gateway's gRPC server
(`handlers`: the request's bytes passed on as they came, read only for the model's name),
over REST to its HTTP port (forwarding.py `Forwarder.hold`); a stream's messages are held
one by one by the gateway's stream router (streams.py), through `wait` as any other.
Readiness is not held: it answers "not ready" at once, as Triton does. The operator loads
the model because it is told how many requests wait for it (`report`: `PUT /v1/held`
whenever the counts change and every second; its copy lapses a few seconds after the last,
so no count outlives this gateway).

If the operator dies while requests are held, they stay held here: Envoy keeps its routes,
this gateway keeps the last state it read, and once the operator is back (the supervisor
restarts it) the next report tells it what waits, it loads the model and every held request
is answered. If this gateway dies, its held requests fail at once with a reset or an
unavailable status, which the client retries: none is lost silently.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
import httpx2
from tritonclient.grpc import service_pb2

from sonicsite.contract.wire import (
    HELD_HEADER,
    SERVER_HEADER,
    HoldingRecord,
    not_loaded,
    still_loading,
)

from .balancer import Balancer
from .metrics import GatewayMetrics
from .siteview import SiteView
from .transitions import HoldEpisodes

LOG = logging.getLogger(__name__)
SERVICE = "inference.GRPCInferenceService"
HELD_METHODS = ("ModelInfer", "ModelMetadata", "ModelConfig")  # what Envoy's hold routes send
REPORT_EVERY_S = 1.0  # the counts go to the operator at least this often while any is held
# metadata a gRPC stack sets itself: not passed on
OWN_METADATA = ("user-agent", "te", "content-type", "host")


def answer_margin(wait_s: float) -> float:
    """How long before the client's own wait for an attempt (`wait_s`) a held request is
    answered "still loading": a tenth of it, at least half a second, at most half of it."""
    return min(wait_s / 2, max(0.5, 0.1 * wait_s))


@dataclass(frozen=True)
class Held:
    """How a hold ended. `error` "": a server holds the model ready now (send the request
    there). Else the error, with `left_s` > 0 when the client's own wait ran out first (the
    site would hold the request that much longer: the client asks again) and 0 when the
    model's deadline passed."""

    error: str = ""
    left_s: float = 0.0
    gone: bool = False  # the client went while its request was held


@dataclass
class Holder:
    view: SiteView
    metrics: GatewayMetrics
    poll_s: float = 0.05  # how often a held request looks at the view (one event loop)
    # the longest wait for a server's answer to a call whose client set no deadline (the
    # gateway's --timeout, as on REST): a server that never answers does not hold the call,
    # and its count under way in the balancer, for good
    answer_s: float = 60.0
    counts: dict[str, int] = field(default_factory=dict)  # requests held now, per model
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    channels: dict[str, grpc.aio.Channel] = field(default_factory=dict)  # by gRPC address
    trouble: str = ""  # the kind of the last failure to send the counts, logged; "": none
    episodes: HoldEpisodes = field(default_factory=HoldEpisodes)  # what is held, as logged
    # which servers take a model, and which of them a call goes to (the forwarder's too)
    balancer: Balancer = field(init=False)

    def __post_init__(self) -> None:
        self.balancer = Balancer(self.view)

    def holds(self, model: str) -> bool:
        """True when a request for `model` is to be held: it is in the catalogue and no
        server holds it ready now."""
        record = self.view.holding
        return record is not None and model in record.models and not self.balancer.serving(model)

    async def wait(
        self, model: str, wait_s: float | None = None, gone: Callable[[], bool] | None = None
    ) -> Held:
        """Wait until a server holds `model` ready, at most the model's deadline and, where
        the client said how long it waits (`wait_s`), a little less than that; not once the
        client has gone (`gone`: an HTTP client's connection; a gRPC call that ends is
        cancelled). A gone client's request held on counted as work waiting for the model
        until its deadline: placement loaded the model, or woke a pool, for nobody."""
        record = self.view.holding or HoldingRecord()
        deadline_s = record.deadline(model)
        start = time.monotonic()
        until = start + deadline_s
        answer_by = start + wait_s - answer_margin(wait_s) if wait_s else until
        outcome = "forwarded"
        self._count(model, 1)
        self.episodes.begin(model, (self.view.holding or record).reasons.get(model, ""))
        try:
            while not self.balancer.serving(model):
                now = time.monotonic()
                reason = (self.view.holding or record).reasons.get(model, "")
                if now >= until:
                    outcome = "expired"  # logged once per episode (transitions.py)
                    return Held(not_loaded(model, deadline_s, reason))
                if now >= answer_by:
                    outcome = "asked_again"
                    said = still_loading(model, now - start, until - now, reason)
                    return Held(said, until - now)
                if gone is not None and gone():
                    outcome = "client_gone"
                    return Held(f"the client went after {now - start:.1f} s held", gone=True)
                await asyncio.sleep(self.poll_s)
            return Held()
        except asyncio.CancelledError:  # a gRPC call that ended: its client went
            outcome = "client_gone"
            raise
        finally:
            self._count(model, -1)
            self.episodes.end(model, outcome, deadline_s)
            self.metrics.hold_seconds.labels(model, outcome).observe(time.monotonic() - start)

    def _count(self, model: str, step: int) -> None:
        self.counts[model] = self.counts.get(model, 0) + step
        self.metrics.held.labels(model).set(self.counts[model])
        if not self.counts[model]:
            del self.counts[model]
        self.changed.set()

    def due(self, counts: dict[str, int], sent: dict[str, int] | None) -> bool:
        """Whether `counts` go to the operator now, `sent` being what it last took (None:
        nothing yet, or the last send failed): while any is held, and once more when none
        is. Never while placement is off: the operator takes no counts then (it answers
        404), and a gateway that sent them anyway cost itself and the operator a request a
        second for nothing."""
        if self.view.holding is None:
            return False
        return bool(counts) or sent != {}

    async def report(self, client: httpx2.AsyncClient, source: str) -> None:
        """Tell the operator the counts when they change, and every second while any is
        held (one more time once none is); a failed send is tried again on the next. A
        failure is logged once per kind (not every second), and once more when the
        operator takes the counts again."""
        sent: dict[str, int] | None = None
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), REPORT_EVERY_S)
            self.changed.clear()
            self.episodes.settle()  # the holds over said, each in one line
            counts = dict(self.counts)
            if not self.due(counts, sent):
                continue
            try:
                sent = await self._send(client, source, counts)
            except Exception:  # a bug: said, and the counts sent again on the next round
                LOG.exception("held counts not sent to the operator")
                sent = None

    async def _send(
        self, client: httpx2.AsyncClient, source: str, counts: dict[str, int]
    ) -> dict[str, int] | None:
        """`counts` to the operator: what it took, None when it did not."""
        url = f"{self.view.operator}/v1/held"
        try:
            reply = await client.put(url, json={"source": source, "held": counts}, timeout=2.0)
        except httpx2.HTTPError as exc:
            self._trouble(type(exc).__name__, f"PUT {url}: held counts not sent: {exc!r}")
            return None
        if reply.status_code != 200:
            said = f"the operator refused the held counts (HTTP {reply.status_code})"
            body = reply.text[:200]
            self._trouble(f"HTTP {reply.status_code}", f"PUT {url}: {said}: {body}")
            return None
        if self.trouble:
            LOG.warning("PUT %s: the operator takes the held counts again", url)
            self.trouble = ""
        return counts

    def _trouble(self, kind: str, message: str) -> None:
        """Log why the counts did not reach the operator, once per kind of failure (its
        exception's type, or its HTTP status) rather than at every send."""
        if kind != self.trouble:
            LOG.warning("%s; the operator's placement does not see what is held here", message)
            self.trouble = kind

    # -- gRPC -------------------------------------------------------------------------------

    def handlers(self) -> dict[str, grpc.RpcMethodHandler]:
        """The held methods for the gateway's gRPC server (grpc_view.py), bytes in and out:
        inference, and the model's metadata and config that a client reads before it."""

        def method(name: str) -> grpc.RpcMethodHandler:
            async def forward(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
                return await self._forward(name, request, context)

            return grpc.unary_unary_rpc_method_handler(forward)

        return {name: method(name) for name in HELD_METHODS}

    async def _forward(
        self, method: str, request: bytes, context: grpc.aio.ServicerContext
    ) -> bytes:
        """Hold the call until a server holds its model, then pass it on as it came."""
        message = getattr(service_pb2, f"{method}Request").FromString(request)
        model = message.model_name if method == "ModelInfer" else message.name
        if self.holds(model):
            held = await self.wait(model, context.time_remaining())
            if held.error:
                left = ((HELD_HEADER, f"{held.left_s:.3f}"),)
                await context.abort(grpc.StatusCode.UNAVAILABLE, held.error, left)
        metadata = tuple(
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if not k.startswith((":", "grpc-")) and k not in OWN_METADATA
        )
        # a job wave's held calls are released together: each counted under way as it goes,
        # so the next goes elsewhere rather than all queueing on one replica (balancer.py)
        server = self.balancer.pick(model)
        if server is None:  # not in the site: Triton's own answer
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"Request for unknown model: '{model}' is not found"
            )
        deadline = context.time_remaining()
        try:
            call = self.channel(server.grpc).unary_unary(f"/{SERVICE}/{method}")
            timeout = self.answer_s if deadline is None else deadline
            reply = await call(request, timeout=timeout, metadata=metadata)
            # which server answered, as Envoy says on a model's own route: the client
            # credits its events to it (per_server), not to the holder's endpoint
            await context.send_initial_metadata(((SERVER_HEADER, server.id),))
            return reply
        except grpc.aio.AioRpcError as exc:
            said = exc.details() or ""
            if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED and deadline is None:
                said = (
                    f"{method} for model {model!r}: server {server.id!r} gave no answer within "
                    f"{self.answer_s:g} s (the gateway's --timeout)"
                )
            await context.abort(exc.code(), said)
        finally:
            self.balancer.done(server.id)

    def channel(self, address: str) -> grpc.aio.Channel:
        """The gateway's one channel to a server's gRPC port (calls share it)."""
        if address not in self.channels:
            self.channels[address] = grpc.aio.insecure_channel(
                address,
                options=[
                    ("grpc.max_send_message_length", -1),
                    ("grpc.max_receive_message_length", -1),
                ],
            )
        return self.channels[address]

    async def close(self) -> None:
        for channel in self.channels.values():
            await channel.close()

"""Envoy's configuration over gRPC ADS: the aggregated discovery service, state of the
world. Each Envoy opens one stream to the operator and subscribes to listeners and clusters
(its bootstrap), then to the routes and endpoints they name; the operator answers each
subscription with the current snapshot's resources and pushes again whenever a step
publishes a new version (`AdsServer.of`: controller.py `on_publish`), so that nothing is
polled: Envoy's node (77 KB with its extensions) comes once per stream.

The protocol, per resource type: a response carries a version and a nonce; Envoy answers
with that nonce, the version it applied and, when it rejected the response (a NACK), the
reason, which the operator logs. One response per type is awaiting its answer at a time; a
newer version goes out once it is answered. A rejected response is sent again after a
back-off (`resend_after`) until Envoy takes it: a refusal may pass (a listener's port held by
another process while Envoy restarted), and Envoy does not ask again by itself. What Envoy
acknowledges is what EnvoyAcks (envoy_acks.py) knows it applied; a stream that sits on an
unanswered response for ENVOY_GONE_S no longer counts as an Envoy that is there (a hung Envoy
holds no route back).
"""

from __future__ import annotations

import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from .controller import Operator
from .envoy_acks import ENVOY_GONE_S, EnvoyAcks
from .metrics import OperatorMetrics
from .xds_protos import ADS_METHOD, KINDS, XdsTypes, xds_types
from .xds_resources import TYPE_URLS
from .xds_snapshot import Snapshot

SERVICE = "envoy.service.discovery.v3.AggregatedDiscoveryService"
ORDER = ("clusters", "endpoints", "listeners", "routes")  # a new cluster before its use
WILDCARD = ("listeners", "clusters")  # the types Envoy asks for without naming resources
TICK_S = 1.0  # a stream with nothing to do says it is alive this often
STREAMS = 64  # Envoys one operator serves at once (each stream holds a thread)
# the operator pings each Envoy's connection this often and drops it when a ping is not
# answered in KEEPALIVE_TIMEOUT_MS: a half-open stream (an Envoy killed without a FIN, a
# dropped network) would otherwise hold one of the STREAMS threads for ever
KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS = 30_000, 10_000
XDS_PORT = 18000  # the operator's ADS port unless told (--xds-port)
LOG = logging.getLogger("sonicsite.operator.xds")


@dataclass
class Subscription:
    """One resource type on one stream."""

    names: tuple[str, ...] = ()  # what Envoy asks for (none: every resource of the type)
    sent_version: str | None = None
    sent_names: tuple[str, ...] = ()
    nonce: str = ""  # of the response awaiting Envoy's answer ("": none)
    sent_at: float = 0.0
    refusals: int = 0  # Envoy's answers in a row that rejected what was sent
    refused_at: float = 0.0


RESEND_S, RESEND_MAX_S = 2.0, 60.0


def resend_after(refusals: int) -> float:
    """Seconds from Envoy's latest refusal to sending the same again: doubling from
    RESEND_S to RESEND_MAX_S (one log line a minute while a refusal lasts)."""
    return min(RESEND_S * 2 ** max(refusals - 1, 0), RESEND_MAX_S)


@dataclass
class AdsStream:
    """One Envoy's stream: its subscriptions, what was sent, what it answered. What it
    applied is kept under `key` (its node id and `serial`, the stream's number on this
    operator): two Envoys that share a node id are two streams, each waited for."""

    acks: EnvoyAcks
    node: str = ""
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    nonces: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    serial: int = 0

    @property
    def key(self) -> str:
        return f"{self.node}#{self.serial}"

    def receive(self, request, now: float) -> tuple[str, str]:
        """A DiscoveryRequest: a subscription, an ACK or a NACK. Returns a line to log (a
        NACK, or a type the operator does not serve), else "", and the kind a NACK
        rejected."""
        if not self.node:
            self.node = request.node.id or "?"
        kind = KINDS.get(request.type_url)
        if kind is None:
            return f"xDS: Envoy {self.node} asked for {request.type_url!r}, not served", ""
        sub = self.subscriptions.setdefault(kind, Subscription())
        sub.names = tuple(sorted(request.resource_names))
        if not sub.nonce or request.response_nonce != sub.nonce:
            return "", ""  # a subscription, or an answer to an older response
        sub.nonce = ""
        if request.HasField("error_detail"):
            sub.refusals, sub.refused_at = sub.refusals + 1, now
            why = request.error_detail.message
            again = f"sent again in {resend_after(sub.refusals):g} s"
            line = f"xDS: Envoy {self.node} rejected {kind} version {sub.sent_version}: {why}"
            return f"{line} ({again}; refusal {sub.refusals} in a row)", kind
        sub.refusals = 0
        self.acks.applied(self.key, kind, list(sub.sent_names), sub.sent_version or "", now)
        return "", ""

    def due(self, snapshot: Snapshot, now: float) -> list[str]:
        """The types to send now, in make-before-break order: those with no response
        awaiting an answer whose version or requested names changed since the last send,
        or whose last send Envoy rejected a back-off ago."""
        return [
            kind
            for kind in ORDER
            if (sub := self.subscriptions.get(kind)) is not None
            and not sub.nonce
            and (
                sub.sent_version != snapshot.versions[kind]
                or sub.names != sub.sent_names
                or (sub.refusals and now - sub.refused_at >= resend_after(sub.refusals))
            )
        ]

    def refused(self) -> set[str]:
        """The kinds whose last answer from this Envoy was a refusal."""
        return {kind for kind, sub in self.subscriptions.items() if sub.refusals}

    def sent(self, kind: str, version: str, now: float) -> str:
        """Record a response to `kind` and return its nonce."""
        sub = self.subscriptions[kind]
        sub.sent_version, sub.sent_names, sub.sent_at = version, sub.names, now
        sub.nonce = str(next(self.nonces))
        return sub.nonce

    def answering(self, now: float) -> bool:
        """Whether Envoy answered everything sent to it in time (else it may be hung)."""
        return all(
            not s.nonce or now - s.sent_at < ENVOY_GONE_S for s in self.subscriptions.values()
        )


@dataclass
class AdsServer:
    """The ADS service: one stream per Envoy, each sent what `snapshot` returns now and
    pushed again on `published`; what Envoys acknowledge goes to `acks`."""

    snapshot: Callable[[], Snapshot | None]
    acks: EnvoyAcks
    metrics: OperatorMetrics
    types: XdsTypes = field(default_factory=xds_types)
    _inboxes: set[queue.Queue] = field(default_factory=set)
    _encoded: dict[tuple[str, str], dict[str, object]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _serials: Iterator[int] = field(default_factory=lambda: itertools.count(1))
    open_nodes: dict[str, int] = field(default_factory=dict)  # node id -> streams open
    refusing: dict[str, set[str]] = field(default_factory=dict)  # stream -> kinds refused

    @classmethod
    def of(cls, operator: Operator) -> AdsServer:
        """The operator's: its latest snapshot, pushed after each step that publishes."""
        ads = cls(lambda: operator.view()[0], operator.envoy, operator.metrics)
        operator.on_publish.append(ads.published)
        return ads

    def published(self) -> None:
        """A new snapshot is in place: every stream looks at what is due."""
        with self._lock:
            for inbox in self._inboxes:
                inbox.put(None)  # a new snapshot: look at what is due

    def _resources(self, snapshot: Snapshot, kind: str, names: tuple[str, ...]) -> list:
        """The named resources of `kind` (listeners and clusters: all when none are named;
        routes and endpoints: only those named), encoded once per version for all streams."""
        version = snapshot.versions[kind]
        with self._lock:
            encoded = self._encoded.get((kind, version))
            if encoded is None:
                key = "cluster_name" if kind == "endpoints" else "name"
                items = snapshot.resources[kind]
                encoded = {r[key]: self.types.encode(kind, r) for r in items}
                for old in [k for k in self._encoded if k[0] == kind]:
                    del self._encoded[old]
                self._encoded[(kind, version)] = encoded
        wildcard = kind in WILDCARD and not names
        return [encoded[n] for n in (encoded if wildcard else names) if n in encoded]

    def stream(self, requests: Iterator, context: grpc.ServicerContext) -> Iterator:
        """StreamAggregatedResources: answer and push until Envoy goes."""
        inbox: queue.Queue = queue.Queue()
        reader = threading.Thread(target=_read, args=(requests, inbox), daemon=True)
        with self._lock:
            ads = AdsStream(self.acks, serial=next(self._serials))
        try:
            with self._lock:
                self._inboxes.add(inbox)
                self.metrics.xds_streams.set(len(self._inboxes))
            reader.start()
            yield from self._serve(ads, inbox)
        except Exception as exc:  # a snapshot Envoy's API refuses, a bug: said, not swallowed
            LOG.error("xDS: the stream to Envoy %s failed: %r", ads.node, exc)
            raise
        finally:
            if ads.node:
                LOG.info("xDS: Envoy %s's stream %d closed", ads.node, ads.serial)
            with self._lock:
                self._inboxes.discard(inbox)
                self.metrics.xds_streams.set(len(self._inboxes))
                left = self.open_nodes.pop(ads.node, 0) - 1
                if left > 0:
                    self.open_nodes[ads.node] = left
            self._refusing(ads.key, set())

    def _refusing(self, stream: str, kinds: set[str]) -> None:
        """The stream's kinds refused now, and per kind the Envoys refusing it (a gauge:
        an alert holds while a refusal lasts, not only when one is new)."""
        with self._lock:
            if kinds:
                self.refusing[stream] = kinds
            else:
                self.refusing.pop(stream, None)
            counts = {kind: 0 for kind in KINDS.values()}
            for refused in self.refusing.values():
                for kind in refused:
                    counts[kind] += 1
        for kind, count in counts.items():
            self.metrics.xds_refusing.labels(kind).set(count)

    def opened(self, ads: AdsStream) -> None:
        """The stream's Envoy named its node: counted, and said when another stream under
        the same node id is open (each Envoy should have its own: the chart gives each pod
        its name; both are still waited for, `AdsStream.key`)."""
        with self._lock:
            others = self.open_nodes.get(ads.node, 0)
            self.open_nodes[ads.node] = others + 1
        LOG.info("xDS: Envoy %s connected (stream %d)", ads.node, ads.serial)
        if others:
            LOG.warning(
                "xDS: a second ADS stream (stream %d) under Envoy node id %r, %d already open: "
                "two Envoys share one node id (give each its own: --service-node), or one "
                "reconnected before its old stream closed; each stream's ACKs are counted apart",
                *(ads.serial, ads.node, others),
            )

    def _serve(self, ads: AdsStream, inbox: queue.Queue) -> Iterator:
        while True:
            try:
                item = inbox.get(timeout=TICK_S)
            except queue.Empty:
                item = None
            if isinstance(item, _End):
                if item.error:
                    LOG.warning("xDS: Envoy %s's stream ended: %s", ads.node, item.error)
                return
            now = time.time()
            if item is not None:
                named = bool(ads.node)
                line, rejected = ads.receive(item, now)
                if not named and ads.node:
                    self.opened(ads)
                if line:
                    LOG.warning("%s", line)
                if rejected:
                    self.metrics.xds_rejected.labels(rejected).inc()
                self._refusing(ads.key, ads.refused())
            snapshot = self.snapshot()
            if snapshot is not None:
                for kind in ads.due(snapshot, now):
                    sub = ads.subscriptions[kind]
                    resources = self._resources(snapshot, kind, sub.names)
                    version = snapshot.versions[kind]
                    nonce = ads.sent(kind, version, now)
                    yield self.types.response(
                        version_info=version,
                        resources=resources,
                        type_url=TYPE_URLS[kind],
                        nonce=nonce,
                    )
            if ads.node and ads.answering(now):
                self.acks.alive(ads.key, now)


@dataclass(frozen=True)
class _End:
    error: str = ""  # why the stream ended, when not by Envoy closing it


def _read(requests: Iterator, inbox: queue.Queue) -> None:
    """Envoy's requests into the stream's inbox, then the end."""
    try:
        for request in requests:
            inbox.put(request)
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        inbox.put(_End("" if code == grpc.StatusCode.CANCELLED else str(exc)))
        return
    inbox.put(_End())


class _Streams(grpc.GenericRpcHandler):
    """The ADS method, counting the streams open so that one over the limit is said and
    counted (`sonicsite_operator_xds_streams_refused_total`): gRPC refuses it
    (RESOURCE_EXHAUSTED, `maximum_concurrent_rpcs`) without a word on our side.
    The count is ours, never above gRPC's (a stream counts from its first step to its last):
    no refusal is made up, and one in the instant a stream starts or ends may go unsaid here
    (the refused Envoy logs its RESOURCE_EXHAUSTED and tries again)."""

    def __init__(self, ads: AdsServer, limit: int) -> None:
        self.limit, self.open, self._lock = limit, 0, threading.Lock()
        self.handler = grpc.stream_stream_rpc_method_handler(
            self._stream,
            request_deserializer=ads.types.request.FromString,
            response_serializer=lambda message: message.SerializeToString(),
        )
        self.ads = ads

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler | None:
        if details.method != ADS_METHOD:
            return None
        with self._lock:
            full = self.open >= self.limit
        if full:  # gRPC checks the same count right after and refuses it
            self.ads.metrics.xds_streams_refused.inc()
            LOG.error(
                "xDS: refused an Envoy's ADS stream (RESOURCE_EXHAUSTED): %d streams open "
                "already, the most this operator serves (xds_ads.STREAMS); that Envoy gets no "
                "configuration until one closes",
                self.limit,
            )
        return self.handler

    def _stream(self, requests: Iterator, context: grpc.ServicerContext) -> Iterator:
        with self._lock:
            self.open += 1
        try:
            yield from self.ads.stream(requests, context)
        finally:
            with self._lock:
                self.open -= 1


def serve(
    ads: AdsServer,
    host: str,
    port: int,
    streams: int = STREAMS,
    keepalive_ms: tuple[int, int] = (KEEPALIVE_TIME_MS, KEEPALIVE_TIMEOUT_MS),
) -> tuple[grpc.Server, int]:
    """Start the ADS service on host:port; returns the server and its port (0: a free one).
    At most `streams` Envoys at once (one more is refused, and said); each connection is
    pinged every `keepalive_ms[0]` and dropped when an answer takes over `keepalive_ms[1]`."""
    options = [
        ("grpc.keepalive_time_ms", keepalive_ms[0]),
        ("grpc.keepalive_timeout_ms", keepalive_ms[1]),
        # how long any ping's answer is waited for: keepalive_timeout_ms alone does not end a
        # silent connection (grpcio 1.85)
        ("grpc.http2.ping_timeout_ms", keepalive_ms[1]),
        # an Envoy's own keepalive pings (a bootstrap's connection_keepalive), however often,
        # never get its connection closed (by default: GOAWAY after 2 within 5 min)
        ("grpc.http2.max_ping_strikes", 0),
    ]
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=streams),
        options=options,
        maximum_concurrent_rpcs=streams,
    )
    server.add_generic_rpc_handlers((_Streams(ads, streams),))
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"xDS: cannot listen on {host}:{port} (in use?)")
    server.start()
    return server, bound

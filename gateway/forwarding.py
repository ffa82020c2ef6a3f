"""Sending a request on to a Triton server: pick one per request (balancer.py), retry once
on another server when the connection fails before anything was processed, and answer in
KServe v2's error shape when no server can (Triton's own texts when no server holds the
model: triton_errors.py), or hold the request until one does (holding.py, `hold`). An
inference reply is passed through as the server sends it (StreamedReply), never joined;
the other replies are whole."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING
from urllib.parse import quote

from fastapi import Response
from fastapi.responses import JSONResponse
from opentelemetry.trace import Span
from starlette.types import Receive, Scope, Send

from sonicsite.contract.wire import (
    HELD_HEADER,
    INFERENCE_HEADER_LENGTH,
    SERVER_HEADER,
    ServerRecord,
)

from .balancer import Balancer
from .holding import Holder
from .metrics import GatewayMetrics
from .siteview import SiteView
from .splicing import SinkGone
from .statistics import StatisticsMemory
from .tracing import GatewayTracing
from .transitions import ServerTrouble
from .triton_errors import MODEL, unknown_model, unready_model
from .upstream import (
    BodyMismatch,
    BodyStream,
    ClientGone,
    ClientStalled,
    ConnectFailed,
    Reply,
    Upstream,
)

if TYPE_CHECKING:
    from .server import ClientBody

# passed on each way: a compressed body (kserve.py `decoded_head`) and the reply's compression the
# client asks for go through as Triton takes and gives them
PASSED_HEADERS = ("content-type", INFERENCE_HEADER_LENGTH, "content-encoding", "accept-encoding")
LOG = logging.getLogger(__name__)


def error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    """An error in KServe v2's shape, {"error": ...}, which stock clients read."""
    return JSONResponse({"error": message}, status_code=status, headers=headers)


def client_gone(model: str, exc: Exception) -> JSONResponse:
    """A client that closed its connection before its whole body came: a line in the log,
    and a reply nobody reads (its connection is closed), under nginx's 499 in the metrics;
    one that stopped sending it, 408 (the server is not to blame)."""
    LOG.warning("model %r: %s", model, exc)
    return error(408 if isinstance(exc, ClientStalled) else 499, f"model {model!r}: {exc}")


class StreamedReply(Response):
    """A server's reply passed on while it arrives: its head at once, then its body in the
    chunks the socket delivered, never joined, or spliced from the server's socket to the
    client's where the client's connection offers it (`client`, a ClientBody) and the rest
    is large. A reply that breaks off mid-body ends the client's connection short of its
    Content-Length, as a proxy's must (the status went out already); `broken` is told why.
    A client that goes away meanwhile is no server's failure. `finished` callbacks run once
    it is over, either way."""

    def __init__(
        self,
        status: int,
        headers: dict[str, str],
        first: bytes,
        rest: BodyStream,
        broken: Callable[[str], None],
        client: ClientBody | None = None,
    ) -> None:
        super().__init__(None, status, headers)  # headers hold Content-Length: kept
        self.first, self.rest, self.broken, self.client = first, rest, broken, client
        self.finished: list[Callable[[], None]] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        rest = self.rest
        spliced = self.client is not None and rest.spliceable()
        if not spliced:
            rest.stream()
        try:
            start = {"type": "http.response.start", "status": self.status_code}
            await send({**start, "headers": self.raw_headers})
            if self.first:
                await send({"type": "http.response.body", "body": self.first, "more_body": True})
            if spliced:
                await rest.splice_to(self.client)  # type: ignore[arg-type]
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            else:
                async for data in rest:
                    more = rest.remaining > 0
                    await send({"type": "http.response.body", "body": data, "more_body": more})
        except SinkGone:
            pass  # the client went away: its connection is closed
        except (ConnectionError, TimeoutError) as exc:
            self.broken(f"{exc!r}")  # returns unfinished: the server closes the connection
        finally:
            rest.close()
            for callback in self.finished:
                callback()


# what a path segment may hold as it is (RFC 3986 `pchar`, '%' included): a name read from
# the raw path (routes_kserve.py `raw_path`) goes on unchanged, as Triton reads it
SEGMENT_SAFE = "%!$&'()*+,;=:@"


def version_path(model: str, version: str | None) -> str:
    """The server's path for a model (and version), each name one path segment as it
    arrived (Triton decodes no percent-escape in a name: 'sim%2Fple' is a name); only what
    a segment cannot hold ('/', a space) is percent-encoded."""
    path = f"/v2/models/{quote(model, safe=SEGMENT_SAFE)}"
    return path + (f"/versions/{quote(version, safe=SEGMENT_SAFE)}" if version else "")


@dataclass
class Forwarder:
    view: SiteView
    metrics: GatewayMetrics
    timeout_s: float = 60.0
    balancer: Balancer = field(init=False)  # the holder's, so one count of what is under way
    upstream: Upstream = field(default_factory=Upstream)
    tracing: GatewayTracing | None = None  # the gateway's tracer (tracing.py), if tracing
    holder: Holder | None = None  # holds requests for a model no server holds (holding.py)
    trouble: ServerTrouble = field(default_factory=ServerTrouble)  # servers failing, as logged
    # each server's last statistics, standing in for one that does not answer (statistics.py)
    statistics: StatisticsMemory = field(default_factory=StatisticsMemory)

    def __post_init__(self) -> None:
        self.balancer = self.holder.balancer if self.holder is not None else Balancer(self.view)

    async def send(
        self,
        method: str,
        model: str,
        path: str,
        body: bytes = b"",
        headers: dict | None = None,
        rest: AsyncIterator[bytes] | None = None,
        length: int | None = None,
        stream: bool = False,
        kind: str = MODEL,
        version: str | None = None,
        span: Span | None = None,
        wait_s: float | None = None,
        client: ClientBody | None = None,
        gone: Callable[[], bool] | None = None,
    ) -> Response:
        """One request to a server of `model` ('' = any server); retried once elsewhere
        when the connection fails. `rest`: the body's remaining chunks, streamed on;
        `client`: the rest of the body is on the client's socket, spliced on (and a large
        reply spliced back);
        `stream`: the reply's body is passed on as it arrives (a StreamedReply). With no
        server for the model, Triton's answer for the route's `kind` (and `version`).
        `span`: the request's span (a traced gateway): each try is a child span of it.
        `wait_s`: how long the client waits for its attempt, `gone`: whether it has gone
        (`hold`)."""
        tried, last = "", ""
        for attempt in range(2):
            server = self.balancer.pick(model, avoid=tried) if model else self._any(tried)
            if server is None:
                if attempt:
                    break
                held = await self.hold(model, wait_s, gone) if model and kind == MODEL else None
                if held is not None:
                    return held
                server = self.balancer.pick(model) if model else None
                if server is None:
                    return self.unserved(model, kind, version)
            try:
                with self._traced(span, server.id, headers or {}) as sent:
                    reply = await self.upstream.request(
                        server.http,
                        *(method, path, sent, body, self.timeout_s, rest, length, client),
                    )
            except ConnectFailed as exc:
                self.balancer.done(server.id)
                self.metrics.upstream_errors.labels(server.id, "connect").inc()
                if not attempt:
                    self.metrics.retries.labels(self.metrics.model(self.view, model)).inc()
                then = "requests retried once on another server that serves the model"
                self.trouble.failed(server.id, f"connection failed: {exc}", then)
                tried, last = server.id, f"{server.id}: {exc}"
                continue
            except TimeoutError:
                self.balancer.done(server.id)
                self.metrics.upstream_errors.labels(server.id, "timeout").inc()
                said = f"no answer within {self.timeout_s} s"
                self.trouble.failed(server.id, said, "requests answered 504")
                return error(504, f"{server.id}: {said}")
            except BodyMismatch as exc:
                self.balancer.done(server.id)
                return error(400, str(exc))
            except (ConnectionError, OSError, ValueError) as exc:  # failed mid-reply
                self.balancer.done(server.id)
                self.metrics.upstream_errors.labels(server.id, "broken").inc()
                said = f"the reply broke off: {exc!r}"
                self.trouble.failed(server.id, said, "requests answered 502")
                return error(502, f"{server.id}: {said}")
            except ClientGone as exc:  # its body spliced: nothing more can reach it
                self.balancer.done(server.id)
                return client_gone(model, exc)
            except BaseException:  # the client went away mid-body, or the task was cancelled
                self.balancer.done(server.id)
                raise
            # the server's part ends with its reply's head: the rest is the gateway's
            self.balancer.done(server.id)
            self.trouble.answered(server.id)
            if reply.status >= 500:
                self.metrics.upstream_errors.labels(server.id, "5xx").inc()
            return await self._pass_on(reply, server.id, stream, client)
        return error(502, f"no server could be reached: {last}")

    def _traced(self, span: Span | None, server: str, headers: dict) -> AbstractContextManager:
        """The headers to send to `server`, with a try's trace context when traced."""
        if span is None or self.tracing is None:
            return contextlib.nullcontext(headers)
        return self.tracing.forward(span, server, headers)

    async def hold(
        self, model: str, wait_s: float | None = None, gone: Callable[[], bool] | None = None
    ) -> Response | None:
        """For a model of the catalogue that no server holds ready: wait until one does
        (None then: send the request), or a 503 naming the model and why: its deadline
        passed, or the client's own wait (`wait_s`, its `sonicsite-wait-s`) is nearly over
        and the model is still loading (`sonicsite-held` says how much longer the site
        would hold it); a 499 nobody reads once the client has gone (`gone`). None at once
        for any other model."""
        if self.holder is None or not self.holder.holds(model):
            return None
        held = await self.holder.wait(model, wait_s, gone)
        if not held.error:
            return None
        if held.gone:
            return client_gone(model, ClientGone(held.error))
        if not held.left_s:
            self.metrics.rejections.labels(
                self.metrics.model(self.view, model), "hold_deadline"
            ).inc()
        return error(503, held.error, {HELD_HEADER: f"{held.left_s:.3f}"})

    def unserved(self, model: str, kind: str = MODEL, version: str | None = None) -> Response:
        """The reply when no server takes `model` now: Triton's, for a model unknown to the
        site or one whose every server is out of the rotation."""
        if not model:
            return error(503, "no ready server takes requests now")
        if model not in self.view.site.models:
            self.metrics.rejections.labels(
                self.metrics.model(self.view, model), "unknown_model"
            ).inc()
            return unknown_model(kind, model)
        return unready_model(kind, model, version)

    async def _pass_on(
        self, reply: Reply, server: str, stream: bool, client: ClientBody | None = None
    ) -> Response:
        """The client's reply: the server's status, body and the headers clients read."""
        passed = {k: v for k, v in reply.headers.items() if k in PASSED_HEADERS}
        passed[SERVER_HEADER] = server
        if reply.rest is None:
            return Response(reply.body, reply.status, headers=passed)
        if stream:
            passed["content-length"] = str(len(reply.body) + reply.rest.remaining)
            broken = self._broken(server)
            return StreamedReply(reply.status, passed, reply.body, reply.rest, broken, client)
        try:
            whole = await reply.whole()
        except (ConnectionError, TimeoutError) as exc:
            self.metrics.upstream_errors.labels(server, "broken").inc()
            return error(502, f"{server}: the reply broke off: {exc!r}")
        return Response(whole.body, whole.status, headers=passed)

    def _broken(self, server: str) -> Callable[[str], None]:
        """What a reply that broke off mid-body leaves: a count and a line in the log (the
        client sees its connection end short of the body)."""
        counter = self.metrics.upstream_errors.labels(server, "broken")

        def broken(why: str) -> None:
            counter.inc()
            LOG.warning("%s: the reply broke off mid-body: %s", server, why)

        return broken

    def _any(self, avoid: str) -> ServerRecord | None:
        """A server for a request of no model: one serving any of the site's models, or
        one that names none (it takes any: a server discovered without its list)."""
        for model in [*self.view.site.models, ""]:
            server = self.balancer.pick(model, avoid)
            if server is not None:
                return server
        return None

    def close(self) -> None:
        self.upstream.close()

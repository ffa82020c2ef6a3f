"""Stock clients' gRPC streams (`ModelStreamInfer`), each message sent to a server that holds
the model it names, as one Triton server would take them.

Envoy routes a call by its first bytes: a stream opened for one model would carry a later
message for another model to a server that may not hold it ("unknown model"), and one
opened while its model was open would carry requests past a shed. So Envoy sends a stream
that does not name its model in the `sonicsite-model` header here (the operator's
`stock-streams` route, operator/xds_site_view.py), and a stream for a model no server holds
(its hold route). Each message is routed on its own: held while its model loads
(holding.py, the held count is placement's demand), refused in the stream with the shed's
reason while its model is shed (the stream stays open for its other models), otherwise sent
on the stream this call keeps open to a server that holds its model (one per server, opened
at its first message; the servers and the pick the gateway's REST and gRPC calls get,
balancer.py, a model's later messages kept on its server while it takes them). The
answers, the servers' and the gateway's own, go back in the order of the requests, as one
Triton server gives them (stream_order.py: an answer waits for every earlier one; at most
MAX_IN_FLIGHT requests of a stream unanswered, then the client's messages wait). The bytes
go on as they came: only a message's first field (the model's name) is read, and an
answer's final flag.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2

from sonicsite.contract.admission_pass import AdmissionPasses
from sonicsite.contract.wire import ADMITTED_HEADER

from .holding import OWN_METADATA, SERVICE, Holder
from .stream_order import MAX_IN_FLIGHT, AnswerOrder

METHOD = f"/{SERVICE}/ModelStreamInfer"
LOG = logging.getLogger(__name__)


def model_of(message: bytes) -> str:
    """A ModelInferRequest's `model_name` (field 1), read from its first bytes when it leads
    them (as every client writes it), else from the whole message."""
    if len(message) > 2 and message[0] == 0x0A and message[1] < 0x80:
        end = 2 + message[1]
        if end <= len(message):
            return message[2:end].decode("utf-8", "replace")
    return service_pb2.ModelInferRequest.FromString(message).model_name


def error_reply(message: bytes, text: str) -> bytes:
    """An answer in the stream that fails one request, as Triton answers a request it
    cannot run (its id and model named, the reason in `error_message`)."""
    request = service_pb2.ModelInferRequest.FromString(message)
    response = service_pb2.ModelInferResponse(
        model_name=request.model_name, model_version=request.model_version, id=request.id
    )
    reply = service_pb2.ModelStreamInferResponse(error_message=text, infer_response=response)
    return reply.SerializeToString()


@dataclass(frozen=True)
class _Ended:
    """A server's stream ended: closed by the server (`error` None) or broken."""

    server: str
    error: grpc.aio.AioRpcError | None = None


@dataclass(frozen=True)
class _Sent:
    """A request about to be written to `server`: its place in line, taken before any
    answer of the server's to it can arrive."""

    server: str


@dataclass(frozen=True)
class _Answer:
    """An answer: `server`'s, or the gateway's own (`server` "")."""

    answer: bytes
    server: str = ""


@dataclass
class StreamCall:
    """One client's stream: the streams it keeps open to servers, the answers on their way
    back, the model each sends to which server."""

    holder: Holder
    passes: AdmissionPasses | None
    context: grpc.aio.ServicerContext
    metadata: tuple[tuple[str, str], ...]
    answers: asyncio.Queue = field(default_factory=asyncio.Queue)
    upstreams: dict[str, grpc.aio.StreamStreamCall] = field(default_factory=dict)
    readers: list[asyncio.Task] = field(default_factory=list)
    placed: dict[str, str] = field(default_factory=dict)  # model -> server id
    failure: tuple[grpc.StatusCode, str] | None = None  # why feeding stopped short
    counted: dict[str, int] = field(default_factory=dict)  # under way in the balancer, by server
    # requests routed and not yet answered to the client (stream_order.py)
    room: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(MAX_IN_FLIGHT))

    async def feed(self, requests: AsyncIterator[bytes]) -> None:
        """Every message to its model's server (or answered here), then each server's
        stream closed for writing; None put among the answers once all is sent."""
        try:
            async for message in requests:
                await self.room.acquire()  # released once its answer has gone out
                await self._route(message)
            for call in self.upstreams.values():
                await call.done_writing()
        except grpc.aio.AioRpcError as exc:  # a server's stream broke while written to
            self.failure = (exc.code(), f"a server's stream: {exc.details()}")
        except DecodeError as exc:
            why = f"a stream message that is no ModelInferRequest: {exc}"
            self.failure = (grpc.StatusCode.INVALID_ARGUMENT, why)
        except Exception as exc:  # a bug: said to the client and logged, not hidden
            LOG.exception("the gateway's stream proxy failed")
            self.failure = (grpc.StatusCode.INTERNAL, f"the gateway's stream proxy: {exc!r}")
        await self.answers.put(None)

    async def _route(self, message: bytes) -> None:
        model = model_of(message)
        refused = self._refused(model)
        if refused:
            await self.answers.put(_Answer(error_reply(message, refused)))
            return
        if self.holder.holds(model):
            held = await self.holder.wait(model, self.context.time_remaining())
            if held.error:
                await self.answers.put(_Answer(error_reply(message, held.error)))
                return
        balancer = self.holder.balancer
        servers = balancer.serving(model)
        if not servers:  # not in the site: Triton's own answer
            unknown = f"Request for unknown model: '{model}' is not found"
            await self.answers.put(_Answer(error_reply(message, unknown)))
            return
        server = next((s for s in servers if s.id == self.placed.get(model)), None)
        server = server or balancer.choose(servers)
        self.placed[model] = server.id
        upstream = self._upstream(server.id, server.grpc)
        await self.answers.put(_Sent(server.id))
        await upstream.write(message)

    def tally(self, order: AnswerOrder, server: str) -> None:
        """Keep the balancer's count of `server`'s requests under way equal to this
        stream's requests it has not answered yet (`order`)."""
        unanswered = order.unanswered(server)
        counted = self.counted.get(server, 0)
        if unanswered > counted:
            self.holder.balancer.started(server, unanswered - counted)
        elif unanswered < counted:
            self.holder.balancer.done(server, counted - unanswered)
        self.counted[server] = unanswered

    def _refused(self, model: str) -> str:
        """The shed's refusal of `model`, as the gateway's REST route words it; "" when open
        (or the caller brings back the model's pass)."""
        now = time.time()
        admission, _ = self.holder.view.shed(model, now)
        if admission is None:
            return ""
        presented = dict(self.context.invocation_metadata() or ()).get(ADMITTED_HEADER)
        admitted = self.passes is not None and self.passes.admits(model, presented, now)
        if not admission.refuses(now, admitted):
            return ""
        wait = max(1, admission.retry_after_s)
        return f"model {model!r} is shed: {admission.reason}; retry after {wait} s"

    def _upstream(self, server: str, address: str) -> grpc.aio.StreamStreamCall:
        if server not in self.upstreams:
            channel = self.holder.channel(address)
            call = channel.stream_stream(METHOD)(
                metadata=self.metadata, timeout=self.context.time_remaining()
            )
            self.upstreams[server] = call
            self.readers.append(asyncio.create_task(self._read(server, call)))
        return self.upstreams[server]

    async def _read(self, server: str, call: grpc.aio.StreamStreamCall) -> None:
        try:
            async for answer in call:
                await self.answers.put(_Answer(answer, server))
        except grpc.aio.AioRpcError as exc:
            await self.answers.put(_Ended(server, exc))
            return
        await self.answers.put(_Ended(server))

    async def close(self) -> None:
        for server, counted in self.counted.items():  # unanswered now for good
            self.holder.balancer.done(server, counted)
        self.counted.clear()
        for call in self.upstreams.values():
            call.cancel()
        for reader in self.readers:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader


def _why_ended(ended: _Ended, order: AnswerOrder) -> tuple[grpc.StatusCode, str]:
    """What a request of a server whose stream ended fails with: the server's status, or
    (closed with requests unanswered) an internal error naming it."""
    if ended.error is not None:
        return ended.error.code(), f"{ended.server}: {ended.error.details()}"
    left = order.unanswered(ended.server)
    return (
        grpc.StatusCode.INTERNAL,
        f"{ended.server}: closed its stream, {left} request(s) unanswered",
    )


def handler(holder: Holder, passes: AdmissionPasses | None) -> grpc.RpcMethodHandler:
    """`ModelStreamInfer` for the gateway's gRPC server (grpc_view.py), bytes in and out."""

    async def stream(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        metadata = tuple(
            (k, v)
            for k, v in context.invocation_metadata() or ()
            if not k.startswith((":", "grpc-")) and k not in OWN_METADATA
        )
        call = StreamCall(holder, passes, context, metadata)
        feeding = asyncio.create_task(call.feed(requests))
        order, fed, ended = AnswerOrder(), False, 0
        try:
            while not (fed and ended == len(call.readers) and not order.pending()):
                event = await call.answers.get()
                if event is None:  # every message sent (or answered here)
                    fed = True
                    if call.failure is not None:  # after the answers of what came before
                        order.fail_here(call.failure)
                elif isinstance(event, _Sent):
                    order.expect(event.server)
                elif isinstance(event, _Ended):
                    ended += 1
                    order.failed(event.server, _why_ended(event, order))
                elif event.server:
                    order.arrived(event.server, event.answer)
                else:
                    order.answered(event.answer)
                if event is not None and event.server:
                    call.tally(order, event.server)
                answers, answered, failure = order.ready()
                for answer in answers:
                    yield answer
                for _ in range(answered):
                    call.room.release()
                if failure is not None:  # a server's stream broke: so does this one
                    await context.abort(*failure)
        finally:
            feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await feeding
            await call.close()

    return grpc.stream_stream_rpc_method_handler(stream)

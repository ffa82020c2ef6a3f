"""The site's one-server view over gRPC: the RPCs whose true answer is the pool's, not one
server's, served by the gateway for Envoy to route to (the operator's `site-view` routes):

- `ServerMetadata`: the site's one name, the servers' version, the extensions usable
  through the site;
- `ModelStatistics`: counts and durations summed over the servers that hold the model, so
  that the before/after differences a profiler (perf_analyzer) takes match the requests it
  sent, whichever Envoy connection the call takes;
- `RepositoryIndex`: the union over the pool, each model with its state.

The answers are the HTTP routes' own (site_view_replies.py), turned into Triton's protobuf
messages, and their errors into the status codes Triton gives for the same HTTP status:
one definition, both protocols. The same server takes `ModelInfer` (and the model's
metadata and config) for a model that no server holds, which Envoy's hold routes send
here: the holder (holding.py) answers them once a server holds the model; and stock
clients' streams, each message routed by its own model (streams.py). Every other RPC
goes to the servers; this service never sees them (gRPC's UNIMPLEMENTED if one came).
With the site's admission key, a call without the view token that Envoy's routes carry is
refused (`EnvoyOnly`): the port is Envoy's, which asks clients for the site's tokens and JWTs.
"""

from __future__ import annotations

import json

import grpc
from fastapi import Response
from google.protobuf import json_format
from google.protobuf.message import Message
from tritonclient.grpc import service_pb2, service_pb2_grpc

from sonicsite.contract.admission_pass import AdmissionPasses
from sonicsite.contract.wire import VIEW_HEADER

from . import site_view_replies, streams
from .forwarding import Forwarder
from .holding import Holder

# Triton's HTTP status for an error -> its gRPC status for the same error
GRPC_STATUS = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    403: grpc.StatusCode.PERMISSION_DENIED,
    404: grpc.StatusCode.NOT_FOUND,
    409: grpc.StatusCode.ALREADY_EXISTS,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    501: grpc.StatusCode.UNIMPLEMENTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}
VIEW_RPCS = ("ServerMetadata", "ModelStatistics", "RepositoryIndex")  # what Envoy sends here


async def _answer(reply: Response, message: Message, context: grpc.aio.ServicerContext):
    """The HTTP route's reply as `message`, or its error as Triton's gRPC status."""
    body = json.loads(reply.body or b"{}")
    if reply.status_code != 200:
        code = GRPC_STATUS.get(reply.status_code, grpc.StatusCode.INTERNAL)
        text = body.get("error", "") if isinstance(body, dict) else str(body)
        await context.abort(code, text)
    if isinstance(body, list):  # the repository index: a list of models
        body = {"models": body}
    return json_format.ParseDict(body, message, ignore_unknown_fields=True)


class OneServerView(service_pb2_grpc.GRPCInferenceServiceServicer):
    def __init__(self, forwarder: Forwarder, name: str) -> None:
        self.forwarder, self.name = forwarder, name

    # gRPC's method names, as the generated servicer declares them
    async def ServerMetadata(self, request, context):
        reply = await site_view_replies.server_metadata(self.forwarder, self.name)
        return await _answer(reply, service_pb2.ServerMetadataResponse(), context)

    async def ModelStatistics(self, request, context):
        version = request.version or None
        reply = await site_view_replies.statistics(self.forwarder, request.name, version)
        return await _answer(reply, service_pb2.ModelStatisticsResponse(), context)

    async def RepositoryIndex(self, request, context):
        body = json.dumps({"ready": True} if request.ready else {}).encode()
        reply = await site_view_replies.repository_index(self.forwarder, body)
        return await _answer(reply, service_pb2.RepositoryIndexResponse(), context)


UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


REFUSED = (
    "the site's gRPC view answers the site's Envoy only (its routes carry the view token, "
    f"header {VIEW_HEADER}): call the site's gRPC endpoint, Envoy's listener"
)


class EnvoyOnly(grpc.aio.ServerInterceptor):
    """Refuses a call without the site's view token (PERMISSION_DENIED, saying why): the
    view's port answers Envoy, which applies the site's tokens and JWTs and adds the token
    (operator/xds_site_view.py `guard`), not whoever reaches the port past them."""

    def __init__(self, passes: AdmissionPasses) -> None:
        self.passes = passes

    async def intercept_service(self, continuation, details: grpc.HandlerCallDetails):
        handler = await continuation(details)
        presented = dict(details.invocation_metadata or ()).get(VIEW_HEADER)
        if handler is None or self.passes.views(presented):
            return handler
        return _refusing(handler)


def _refusing(handler: grpc.RpcMethodHandler) -> grpc.RpcMethodHandler:
    """A handler of the same kind as `handler` (unary or streaming) that refuses the call
    before reading any of it."""

    async def refuse(request, context: grpc.aio.ServicerContext):
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, REFUSED)

    kind = {
        (False, False): grpc.unary_unary_rpc_method_handler,
        (False, True): grpc.unary_stream_rpc_method_handler,
        (True, False): grpc.stream_unary_rpc_method_handler,
        (True, True): grpc.stream_stream_rpc_method_handler,
    }[(handler.request_streaming, handler.response_streaming)]
    return kind(refuse, handler.request_deserializer, handler.response_serializer)


async def serve(
    forwarder: Forwarder,
    name: str,
    address: str,
    holder: Holder | None = None,
    passes: AdmissionPasses | None = None,
) -> grpc.aio.Server:
    """Start the view on `address` (host:port) in the running event loop, with the
    holder's methods and stock clients' streams when given a holder (streams.py; `passes`:
    the admission passes a shed accepts) (the other methods: UNIMPLEMENTED). With `passes`,
    every call needs the site's view token (`EnvoyOnly`)."""
    view = OneServerView(forwarder, name)
    methods = {
        rpc: grpc.unary_unary_rpc_method_handler(
            getattr(view, rpc),
            request_deserializer=getattr(service_pb2, f"{rpc}Request").FromString,
            response_serializer=getattr(service_pb2, f"{rpc}Response").SerializeToString,
        )
        for rpc in VIEW_RPCS
    }
    if holder is not None:  # bytes in and out: the request goes on as it came
        methods |= holder.handlers()
        methods["ModelStreamInfer"] = streams.handler(holder, passes)
    guards = [EnvoyOnly(passes)] if passes is not None else []
    server = grpc.aio.server(options=UNLIMITED, interceptors=guards)
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("inference.GRPCInferenceService", methods),)
    )
    if not server.add_insecure_port(address):
        raise OSError(f"gateway gRPC view: cannot listen on {address}")
    await server.start()
    return server

"""A call the gateway passes on for a stock client that set no deadline (gateway/holding.py
`_forward`): a server that never answers (hung, SIGSTOPped: its port accepts, nobody reads)
held the call, and its count under way in the gateway's balancer, for good. Now it ends at
the gateway's --timeout as DEADLINE_EXCEEDED naming the server, and the count is given
back."""

from __future__ import annotations

import asyncio

import grpc
from polling import wait_until_async
from site_cli import silent_port
from sonicsite.gateway import grpc_view
from sonicsite.gateway.forwarding import Forwarder
from sonicsite.gateway.holding import Holder
from sonicsite.gateway.metrics import GatewayMetrics
from sonicsite.gateway.siteview import SiteView
from tritonclient.grpc import service_pb2

from sonicsite.contract.wire import ServerRecord, SiteRecord
from sonicsite.local.ports import free_ports

METHOD = "/inference.GRPCInferenceService/ModelInfer"


def test_a_call_without_a_deadline_to_a_server_that_never_answers_ends_at_the_timeout():
    with silent_port() as hung:
        host, port = hung.rsplit(":", 1)
        view = SiteView("http://127.0.0.1:9")  # no operator: the view is what the test says
        view.site = SiteRecord(servers=(ServerRecord("triton-9", host, int(port), 1, 2, ("m",)),))
        (view_port,) = free_ports(1)

        async def main() -> grpc.aio.AioRpcError:
            holder = Holder(view, GatewayMetrics(), answer_s=1.0)
            forwarder = Forwarder(view, holder.metrics, holder=holder)
            server = await grpc_view.serve(forwarder, "t", f"127.0.0.1:{view_port}", holder)
            try:
                async with grpc.aio.insecure_channel(f"127.0.0.1:{view_port}") as channel:
                    infer = channel.unary_unary(METHOD)
                    request = service_pb2.ModelInferRequest(model_name="m").SerializeToString()
                    # no deadline, as tritonclient's default; the guard here only keeps a
                    # hang from holding the suite (the old code never answered)
                    call = infer(request)
                    try:
                        await asyncio.wait_for(call, 300)
                    except grpc.aio.AioRpcError as exc:
                        # the handler gives the count under way back as it unwinds, which
                        # may be just after its status reached the client (beside CPU hogs)
                        given_back = lambda: not any(holder.balancer.in_flight.values())  # noqa: E731
                        await wait_until_async(given_back, "the count under way given back")
                        return exc
                    raise AssertionError("the hung server answered")
            finally:
                await server.stop(None)
                await holder.close()

        refused = asyncio.run(main())
    assert refused.code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert refused.details() == (
        "ModelInfer for model 'm': server 'triton-9' gave no answer within 1 s "
        "(the gateway's --timeout)"
    )

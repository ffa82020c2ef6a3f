"""The servers' statistics a stream reads before and after (client/stats.py): a figure of
the report, so a server whose reply is not Triton's statistics is left out, never a reason
for the stream to stop; real servers' replies are read."""

from __future__ import annotations

from sonicsite.client.stats import parse_statistics, read_statistics
from sonicsite.client.transport_grpc import GrpcTransport


class _Garbled:
    """A server (or a proxy before it) whose statistics reply is not Triton's."""

    def __init__(self, body: dict) -> None:
        self.body = body

    def statistics(self, model: str, timeout: float) -> dict:
        return parse_statistics(self.body)


def test_a_reply_that_is_not_statistics_is_left_out_and_real_ones_are_read(site):
    real = GrpcTransport(site.servers[0].grpc, "triton-0")
    try:
        transports = {
            "triton-0": real,
            "text": _Garbled({"inference_stats": {"success": {"count": "many"}}}),
            "list": _Garbled({"inference_stats": ["success"]}),
        }
        read = read_statistics(transports, "simple", 10.0)
    finally:
        real.close()
    assert set(read) == {"triton-0"}
    assert read["triton-0"]["success"][0] >= 0

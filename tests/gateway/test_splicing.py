"""Large bodies go from socket to socket by splice, never read by the gateway: the kernel
transfer itself over real loopback TCP sockets (exact bytes, in order after a head, each
side ending early), and the live site's gateway with raw HTTP clients (every body exact on
one kept-alive connection, the JSON part arriving after the head, the bytes counted as
spliced, a client that leaves mid-body costs nothing and leaves the gateway serving)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import time
import urllib.request

import numpy as np
import pytest
from polling import wait_until
from sonicsite.gateway.splicing import Pipe, Pipes, SinkGone, SourceGone, move

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    """A connected pair of non-blocking loopback TCP sockets (as the gateway's are)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    for s in (a, b):
        s.setblocking(False)
    return a, b


async def _send_slowly(sock: socket.socket, data: bytes, piece: int) -> None:
    loop = asyncio.get_running_loop()
    for start in range(0, len(data), piece):
        await loop.sock_sendall(sock, data[start : start + piece])
        await asyncio.sleep(0.001)


async def _receive(sock: socket.socket, count: int) -> bytes:
    loop = asyncio.get_running_loop()
    got = bytearray()
    while len(got) < count:
        more = await loop.sock_recv(sock, count - len(got))
        if not more:
            break
        got += more
    return bytes(got)


def test_a_body_moves_whole_and_in_order_after_its_head():
    async def main() -> None:
        client, source = _tcp_pair()
        sink, server = _tcp_pair()
        pipe = Pipe.new()
        head = b"POST /x HTTP/1.1\r\nContent-Length: 1048576\r\n\r\n"
        sending = asyncio.create_task(_send_slowly(client, PAYLOAD, 100_000))
        receiving = asyncio.create_task(_receive(server, len(head) + len(PAYLOAD)))
        await move(source.fileno(), sink.fileno(), len(PAYLOAD), pipe, 30.0, (head,))
        await sending
        assert await receiving == head + PAYLOAD
        assert pipe.held == 0
        for s in (client, source, sink, server):
            s.close()
        pipe.close()

    asyncio.run(main())


def test_a_source_that_ends_early_and_a_sink_that_is_gone_are_told_apart():
    async def main() -> None:
        client, source = _tcp_pair()
        sink, server = _tcp_pair()
        pipes = Pipes()
        pipe = pipes.take()
        await asyncio.get_running_loop().sock_sendall(client, PAYLOAD[:1000])
        client.close()  # 1000 bytes of the 1 MiB promised, then the end
        drained = asyncio.create_task(_receive(server, len(PAYLOAD)))
        with pytest.raises(SourceGone, match="bytes short"):
            await move(source.fileno(), sink.fileno(), len(PAYLOAD), pipe, 30.0)
        sink.close()  # the first 1000 bytes went on before the end
        assert await drained == PAYLOAD[:1000]
        pipes.give_back(pipe)

        client, source = _tcp_pair()
        sink, server = _tcp_pair()
        server.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
        server.close()  # reset: the server's side is gone before anything is sent
        await asyncio.sleep(0.05)
        pipe = pipes.take()
        with pytest.raises(SinkGone) as gone:
            await move(source.fileno(), sink.fileno(), 10, pipe, 30.0, (b"head",))
        assert gone.value.untouched  # nothing of the source moved: it may go elsewhere
        pipes.give_back(pipe)  # it still holds the head: closed, never reused
        assert pipe not in pipes.spare
        for s in (client, source, sink):
            s.close()
        pipes.close()

    asyncio.run(main())


def _infer_request(model: str, x: np.ndarray, json_after_head: bool) -> tuple[bytes, bytes]:
    """A KServe v2 binary request for `model` with input INPUT0 = x: its head and body."""
    part = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = part + x.tobytes()
    head = (
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: site\r\n"
        f"Inference-Header-Content-Length: {len(part)}\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    return head, body


def _read_reply(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        more = sock.recv(65536)
        assert more, f"the gateway closed the connection; got {data[:200]!r}"
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
    length = int(headers["content-length"])
    while len(body) < length:
        more = sock.recv(1 << 20)
        assert more, f"the reply ended {length - len(body)} bytes short"
        body += more
    return status, headers, body


def _output(headers: dict[str, str], body: bytes) -> np.ndarray:
    n = int(headers["inference-header-content-length"])
    return np.frombuffer(body[n:], dtype=np.float32)


def _spliced(gateway: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://{gateway}/metrics", timeout=30).read().decode()
    found = re.findall(r'sonicsite_gateway_spliced_bytes_total\{direction="(\w+)"\} (\S+)', text)
    return {direction: float(value) for direction, value in found}


def _awaiting_json_part(gateway: str) -> float:
    text = urllib.request.urlopen(f"http://{gateway}/metrics", timeout=30).read().decode()
    (value,) = re.findall(r"^sonicsite_gateway_requests_awaiting_json_part (\S+)$", text, re.M)
    return float(value)


def test_bodies_on_one_kept_alive_connection_are_exact_and_spliced(site):
    rng = np.random.default_rng(11)
    before = _spliced(site.http)
    sizes = (262144, 16, 51200, 262144)  # 1 MiB, a small one read as usual, 200 kB, 1 MiB
    sent_large = 0
    with socket.create_connection(tuple(site.http.rsplit(":", 1)), timeout=60) as sock:
        for k, n in enumerate(sizes):
            x = rng.random((1, n), dtype=np.float32)
            head, body = _infer_request("identity", x, json_after_head=k == 0)
            if k == 0:  # the head alone first: the JSON part comes in a later read
                sock.sendall(head)
                wait_until(
                    lambda: _awaiting_json_part(site.http) == 1,
                    "the gateway awaiting the JSON part after the head alone",
                )
                sock.sendall(body)
            else:
                sock.sendall(head + body)
            status, headers, reply = _read_reply(sock)
            assert status == 200, reply[:300]
            assert headers.get("connection") != "close"
            np.testing.assert_array_equal(_output(headers, reply), x.ravel())
            if x.nbytes >= 65536:
                sent_large += x.nbytes
    after = _spliced(site.http)
    assert _awaiting_json_part(site.http) == 0  # the gauge let go of the first one
    # each large body went by splice but for its first read (16 kB at most), both ways
    for direction in ("request", "reply"):
        moved = after.get(direction, 0) - before.get(direction, 0)
        assert moved >= sent_large - 3 * (16 << 10), (direction, moved, sent_large)


def _gateway_fds(site) -> int:
    pid = next(p.pid for p in site.processes if p.name == "gateway")
    return len(os.listdir(f"/proc/{pid}/fd"))


def test_a_client_that_leaves_mid_body_leaves_nothing_behind(site):
    x = np.ones((1, 262144), dtype=np.float32)
    head, body = _infer_request("identity", x, json_after_head=False)
    address = tuple(site.http.rsplit(":", 1))

    def one_whole() -> bool:
        with socket.create_connection(address, timeout=60) as sock:
            sock.sendall(head + body)
            status, headers, reply = _read_reply(sock)
        return status == 200 and bool(np.array_equal(_output(headers, reply), x.ravel()))

    assert one_whole()  # the gateway's spare pipes and kept connections exist now
    baseline = _gateway_fds(site)
    for _ in range(6):
        with socket.create_connection(address, timeout=60) as sock:
            sock.sendall(head + body[: len(body) // 3])
            time.sleep(0.05)
        # closed mid-body: the gateway drops its side, and its server connection
    assert one_whole()  # still serving, the same way
    wait_until(
        lambda: _gateway_fds(site) <= baseline + 2,
        f"the gateway's open fds back to about {baseline} (a leak would add 2 per client)",
    )

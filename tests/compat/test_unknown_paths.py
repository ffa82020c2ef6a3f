"""A path one Triton server does not serve (outside /v2, `/V2`, `//v2`), asked through Envoy
as curl asks it: Triton's own 404 and error, asked live from a server of the site. Envoy's
default route used to send such a plain HTTP request to the servers' gRPC ports: a GET came
back 200 with an empty gRPC body, a POST 503 "upstream connect error"."""

from __future__ import annotations

import socket

import pytest
from compat_paths import raw

PATHS = ["/foo", "/metrics", "/V2", "//v2", "/"]


@pytest.mark.parametrize("method", ["GET", "POST"])
@pytest.mark.parametrize("path", PATHS)
def test_a_path_triton_does_not_serve_gets_its_404_through_envoy(compat_site, path, method):
    body = b"{}" if method == "POST" else None
    direct = raw(compat_site.servers[0].http, method, path, body)
    envoy = raw(compat_site.grpc, method, path, body)
    assert direct.status == 404, direct  # Triton's own answer, asked live
    # the same status and error (Envoy's KServe error body ends in a newline, and says it is
    # JSON, where Triton says text/plain: tritonclient and curl | jq read both alike)
    assert (envoy.status, envoy.json()) == (direct.status, direct.json()), envoy


@pytest.mark.parametrize("path", ["/v2/nosuch", "/v2/models/simple/versions//infer"])
def test_a_v2_path_triton_does_not_serve_gets_its_404_through_the_gateway(compat_site, path):
    """The gateway said `{"error": "no route GET /v2/nosuch"}`, where a server says "Not
    Found"."""
    direct = raw(compat_site.servers[0].http, "GET", path)
    gateway = raw(compat_site.http, "GET", path)
    assert direct.status == 404, direct
    assert (gateway.status, gateway.json()) == (direct.status, direct.json()), gateway


def _http_10(address: str, request: bytes) -> int:
    """The status an HTTP/1.0 request gets (as ApacheBench and some probes send it: no Host,
    the connection closed after the reply)."""
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=30) as conn:
        conn.sendall(request)
        reply = b""
        while chunk := conn.recv(65536):
            reply += chunk
    return int(reply.split(b" ", 2)[1])


@pytest.mark.parametrize("where", ["envoy", "gateway"])
def test_an_http_10_client_is_answered_as_a_server_answers_it(compat_site, where):
    """Envoy answered HTTP/1.0 with 426 "Upgrade Required", where a server and the gateway
    answer it."""
    tensor = b'{"name":"INPUT%d","shape":[1,16],"datatype":"INT32","data":[%s]}'
    data = b",".join(b"1" for _ in range(16))
    body = b'{"inputs":[%s,%s]}' % (tensor % (0, data), tensor % (1, data))
    infer = (
        b"POST /v2/models/simple/infer HTTP/1.0\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
    )
    ready = b"GET /v2/health/ready HTTP/1.0\r\n\r\n"
    address = compat_site.grpc if where == "envoy" else compat_site.http
    direct = compat_site.servers[0].http
    for request in (ready, infer):
        assert _http_10(address, request) == _http_10(direct, request), request
    assert _http_10(address, ready) == _http_10(address, infer) == 200

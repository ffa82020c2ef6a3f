"""A path one Triton server does not serve (outside /v2, `/V2`, `//v2`), asked through Envoy
as curl asks it: Triton's own 404 and error, asked live from a server of the site. Envoy's
default route used to send such a plain HTTP request to the servers' gRPC ports: a GET came
back 200 with an empty gRPC body, a POST 503 "upstream connect error"."""

from __future__ import annotations

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

"""Discovery (where the site is) and the per-request pick (which server a request goes to),
without a site: explicit endpoints, the state file, a gateway's /v1/site (a real HTTP
server that wants a token), what is said when nothing is found or the site cannot be asked."""

from __future__ import annotations

import json
import random
import socket
import time

import pytest
from loopback_http import answering
from sonicsite.client import Client
from sonicsite.client.balancer import LATENCY_HALF_LIFE_S, Balancer, Endpoint, power_of_two
from sonicsite.client.discovery import DiscoveryError, discover, from_site_file

from sonicsite.contract.wire import STATE_FILE, ServerRecord, load_state_file


def test_explicit_endpoints_come_first_then_the_state_file(tmp_path, monkeypatch):
    monkeypatch.delenv("SONICSITE_URL", raising=False)
    site = discover(endpoints=["h1:8001", "h2:8001"])
    assert [(s.id, s.grpc) for s in site.servers] == [
        ("server-0", "h1:8001"),
        ("server-1", "h2:8001"),
    ]
    servers = [
        ServerRecord("triton-0", "127.0.0.1", 1, 2, 3, ("simple",)).to_dict(),
        ServerRecord("triton-1", "127.0.0.1", 4, 5, 6, ("simple",), draining=True).to_dict(),
    ]
    state = {"site_dir": str(tmp_path), "models": ["simple"], "grpc": "127.0.0.1:9"}
    (tmp_path / STATE_FILE).write_text(json.dumps(state | {"servers": servers}))
    found = discover(site=tmp_path)
    assert found.grpc == "127.0.0.1:9" and found.source == str(tmp_path / STATE_FILE)
    assert [s.id for s in found.servers] == ["triton-0"]  # draining servers take no new work
    assert from_site_file(tmp_path) == found


def _refused_url() -> str:
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_an_explicit_site_or_url_wins_over_the_environment(tmp_path, monkeypatch):
    """With SONICSITE_URL naming another site, `Client.connect(site=...)` (and so `submit
    --dir X`, whose workers connect with site=X) went to SONICSITE_URL's site: the whole
    stream ran there. What the caller names wins: the site argument over SONICSITE_URL,
    the url argument over SONICSITE_SITE; the environment only when nothing is named."""
    servers = [ServerRecord("triton-0", "127.0.0.1", 1, 2, 3, ("simple",)).to_dict()]
    state = {"site_dir": str(tmp_path), "models": ["simple"], "grpc": "127.0.0.1:9"}
    (tmp_path / STATE_FILE).write_text(json.dumps(state | {"servers": servers}))
    monkeypatch.setenv("SONICSITE_URL", _refused_url())  # another site, down here
    found = discover(site=tmp_path)
    assert found.source == str(tmp_path / STATE_FILE) and found.grpc == "127.0.0.1:9"
    with Client.connect(site=tmp_path, mode="direct", declare_work=False) as client:
        assert client.site.source == str(tmp_path / STATE_FILE)
    with pytest.raises(DiscoveryError, match=r"from the site argument: no site file at .*nowhere"):
        discover(site=tmp_path / "nowhere")  # named, not SONICSITE_URL tried instead
    with pytest.raises(DiscoveryError, match=r"\(from SONICSITE_URL\): unreachable"):
        discover()  # nothing named: the environment
    monkeypatch.delenv("SONICSITE_URL")
    monkeypatch.setenv("SONICSITE_SITE", str(tmp_path))
    with pytest.raises(DiscoveryError, match=r"\(from the url argument\): unreachable"):
        discover(url=_refused_url())  # the url argument over SONICSITE_SITE
    assert discover().source == str(tmp_path / STATE_FILE)


def test_a_state_file_that_is_not_a_sites_is_named_by_the_client(tmp_path, monkeypatch):
    """The README's worker (`Client.connect()`, SONICSITE_SITE) given a folder whose
    state.json is not a site's: the contract's one rule, the file named and why, where the
    folder came from; not "no server of the site serves" a model at its first stream."""
    monkeypatch.delenv("SONICSITE_URL", raising=False)
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / STATE_FILE).write_text(json.dumps({"foo": 1}))
    monkeypatch.setenv("SONICSITE_SITE", str(junk))
    with pytest.raises(DiscoveryError) as caught:
        Client.connect()
    said = str(caught.value)
    assert f"{junk / STATE_FILE}: not a sonicsite state file (no 'site_dir'" in said, said
    assert said.startswith("site discovery from SONICSITE_SITE: "), said
    with pytest.raises(ValueError) as commands:  # what every command says of it
        load_state_file(junk)
    assert said.endswith(str(commands.value)), (said, str(commands.value))
    for lacking in ("servers", "models"):  # a site's file has them all (`up` writes them)
        (junk / STATE_FILE).write_text(json.dumps({"site_dir": str(junk), lacking: []}))
        with pytest.raises(DiscoveryError, match="not a sonicsite state file"):
            Client.connect()


def test_nothing_found_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("SONICSITE_URL", raising=False)
    monkeypatch.setenv("SONICSITE_SITE", str(tmp_path / "nowhere"))
    with pytest.raises(DiscoveryError, match=r"no site file at .*nowhere.*sonicsite up"):
        discover()


def test_power_of_two_prefers_the_cheaper_of_two_counting_what_is_in_flight():
    fast = Endpoint("fast", None, latency_s=0.01)
    slow = Endpoint("slow", None, latency_s=0.1)
    rng = random.Random(1)
    assert {power_of_two([fast, slow], rng).id for _ in range(20)} == {"fast"}
    busy = Endpoint("busy", None, in_flight=20, latency_s=0.01)
    assert power_of_two([busy, slow], rng).id == "slow"  # 21 x 10 ms > 1 x 100 ms
    busy.in_flight = 5  # 6 x 10 ms < 1 x 100 ms
    assert power_of_two([busy, slow], rng).id == "busy"


def test_an_idle_endpoints_latency_ages_so_that_it_is_measured_again():
    """Measured 10× slower once and then never picked, a server would starve for good; with
    nothing in flight its figure halves every half-life, so it is tried again. One with a
    request in flight is being measured: its figure does not age (a hung server is not
    sent more for being slow to answer)."""
    now = time.monotonic()
    fast = Endpoint("fast", None, latency_s=0.01, answered_at=now)
    stale = Endpoint("stale", None, latency_s=0.1, answered_at=now)
    rng = random.Random(1)
    assert power_of_two([fast, stale], rng).id == "fast"
    stale.answered_at = now - 4 * LATENCY_HALF_LIFE_S  # 16× less: 6 ms against 10 ms
    assert stale.cost(now) == pytest.approx(0.1 / 16)
    assert power_of_two([fast, stale], rng).id == "stale"
    stale.in_flight = 1
    assert stale.cost(now) == pytest.approx(2 * 0.1)
    stale.in_flight = 0
    stale.observe(0.1)  # answered: measured now, the figure is fresh again
    assert stale.cost(stale.answered_at) == pytest.approx(stale.latency_s)


def test_the_balancer_avoids_servers_that_are_down_or_asked_for_a_pause():
    a, b = Endpoint("a", None), Endpoint("b", None)
    balancer = Balancer([a, b], random.Random(2))
    marked = time.monotonic()
    balancer.mark_down(a)
    assert a.down_until > marked  # down for its cool-down...
    a.down_until = time.monotonic() + 600  # ...made long: the test's own pace cannot end it
    assert {balancer.acquire().id for _ in range(10)} == {"b"}
    assert b.in_flight == 10
    for _ in range(10):
        balancer.done(b, 0.01)
    assert b.in_flight == 0 and b.latency_s == pytest.approx(0.01)
    balancer.hold(b, 60)
    a.down_until = 0.0  # a is back
    assert balancer.acquire(avoid="b").id == "a"


def _site_route(token: str):
    """A gateway's /v1/site that, like the gateway's auth, wants `token` for it."""
    record = {"servers": [ServerRecord("triton-0", "127.0.0.1", 1, 2, 3, ("simple",)).to_dict()]}

    def answer(method: str, path: str, headers: dict, body: bytes):
        if path != "/v1/site":
            return 404, {}, b"{}"
        if headers.get("Authorization") != f"Bearer {token}":
            return 401, {}, b'{"error": "a bearer token is required"}'
        return 200, {"Content-Type": "application/json"}, json.dumps(record).encode()

    return answer


def test_connect_asks_the_site_with_its_token(http_peer, monkeypatch):
    """Client.connect(token=...) found the site without sending the token: a site with
    tokens answered a raw HTTPError 401. The URL needs no scheme (http:// as work_url)."""
    monkeypatch.delenv("SONICSITE_TOKEN", raising=False)
    address = http_peer(_site_route("s3cret"))
    monkeypatch.setenv("SONICSITE_URL", address)  # host:port: "unknown url type" before
    with Client.connect(mode="direct", token="s3cret", declare_work=False) as client:
        assert [s.id for s in client.site.servers] == ["triton-0"]
    monkeypatch.setenv("SONICSITE_TOKEN", "s3cret")
    assert [s.id for s in discover().servers] == ["triton-0"]
    monkeypatch.delenv("SONICSITE_TOKEN")
    with pytest.raises(
        DiscoveryError,
        match=rf"site discovery at http://{address} \(from SONICSITE_URL\): HTTP 401 .*token",
    ):
        discover()


def test_an_unreachable_site_url_is_named(monkeypatch):
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("SONICSITE_URL", f"http://127.0.0.1:{port}")
    with pytest.raises(
        DiscoveryError,
        match=rf"site discovery at http://127.0.0.1:{port} \(from SONICSITE_URL\): unreachable",
    ):
        discover()
    with pytest.raises(DiscoveryError, match=r"\(from the url argument\): unreachable"):
        discover(url=f"127.0.0.1:{port}")


@pytest.mark.parametrize("endpoint", ["localhost", "localhost:", "localhost:port", ":8001"])
def test_an_endpoint_that_is_not_host_port_is_named(endpoint):
    with pytest.raises(DiscoveryError, match=rf"endpoints\[1\]: '{endpoint}' is not host:port"):
        discover(endpoints=["h1:8001", endpoint])


def test_a_url_that_is_not_the_gateway_is_named_as_such(http_peer):
    """A URL pointing at a gRPC port escaped as a raw http.client.BadStatusLine of binary
    bytes; a port with no /v1/site (Triton's HTTP, Envoy) said only 'HTTP 404' or
    'JSONDecodeError'. Each is a DiscoveryError that asks whether it is the gateway."""
    settings_frame = b"\x00\x00\x18\x04\x00\x00\x00\x00\x00" + bytes(24)
    grpc_port, port, _ = answering(settings_frame)
    with grpc_port, pytest.raises(DiscoveryError, match=r"no site record .*is it the site's"):
        discover(url=f"127.0.0.1:{port}")
    not_json = http_peer(lambda method, path, headers, body: (200, {}, b"<html>hi</html>"))
    with pytest.raises(DiscoveryError, match=r"JSONDecodeError.*is it the site's gateway"):
        discover(url=not_json)
    no_route = http_peer(lambda method, path, headers, body: (404, {}, b"{}"))
    with pytest.raises(DiscoveryError, match=r"HTTP 404 .*is it the site's gateway"):
        discover(url=no_route)

"""The operator's log tells an incident's story: every line timestamped and named, one line
at each start (PID, ports, what it reads, its policies), and each change it sees or decides
once: a server joining, draining, leaving; its metrics unreadable (why), out of the view,
readable again; a server weighed down for a model. First the rules on the real load view and
balancing; then a real site (no supervisor: what the test stops stays stopped until it
resumes it) whose servers are slowed, hung, resumed, killed, added and removed."""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from polling import wait_until
from sonicsite.bench.balancing_load import stream
from sonicsite.client.discovery import from_site_file
from sonicsite.operator.balancing import Balancing
from sonicsite.operator.loadview import LoadView, ModelLoad
from sonicsite.operator.transitions import Transitions

from sonicsite.contract.wire import ServerRecord
from sonicsite.local import launcher
from sonicsite.local.servers import add_server, remove_server
from sonicsite.local.state import SiteState

STAMP = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}"  # the supervisor's asctime
LINE = re.compile(rf"^{STAMP} operator: \S")
MODEL = "identity"
TEXT = """# TYPE nv_inference_request_success counter
nv_inference_request_success{model="m",version="1"} 1
"""


def _server(server_id: str, port: int, draining: bool = False) -> ServerRecord:
    return ServerRecord(server_id, "127.0.0.1", port, port + 1, port + 2, ("m",), draining=draining)


def test_each_server_change_is_one_line_not_one_per_step():
    told = Transitions()
    a, b = _server("a", 1000), _server("b", 2000)
    joined = told.membership([a, b])
    assert [line.split(":")[0] for line in joined] == ["server a joined", "server b joined"]
    assert "gRPC 127.0.0.1:1000" in joined[0] and "holds m" in joined[0]
    assert told.membership([a, b]) == []
    assert told.membership([a, _server("b", 2000, draining=True)]) == [
        "server b draining: Envoy sends it no new request"
    ]
    moved = told.membership([_server("a", 3000)])
    assert moved[0].startswith("server a moved: gRPC 127.0.0.1:1000 -> 127.0.0.1:3000")
    assert moved[1] == "server b left: no longer among the servers discovered"


def test_a_servers_metrics_are_told_when_they_fail_leave_the_view_and_return():
    told, view, a = Transitions(), LoadView(grace=3), _server("a", 1000)
    refused = ConnectionRefusedError("connection refused")
    view.record("a", 0.0, TEXT)
    assert told.scrapes(view, [a], 0.0) == []
    lines = []
    for t in range(1, 7):  # six failed scrapes: one line at the first, one at the third
        view.record("a", float(t), refused)
        lines += told.scrapes(view, [a], float(t))
    assert len(lines) == 2, lines
    assert lines[0].startswith("server a unreadable: metrics unreadable (1 failed scrapes")
    assert "connection refused" in lines[0]
    assert lines[1].startswith("server a out of the operator's view after 3 failed scrapes")
    assert "(2 s)" in lines[1]
    view.record("a", 7.0, TEXT)
    assert told.scrapes(view, [a], 7.0) == [
        "server a readable again after 6 failed scrapes in a row (6 s), back in the view"
    ]
    assert told.scrapes(view, [a], 8.0) == []


def test_a_draining_servers_failed_scrapes_are_not_told():
    """Stopped by its remover, a draining server's metrics port closes before it leaves the
    servers discovered: not an incident to tell (its stop is the remover's line)."""
    told, view = Transitions(), LoadView(grace=3)
    serving, draining = _server("a", 1000), _server("a", 1000, draining=True)
    view.record("a", 0.0, TEXT)
    assert told.scrapes(view, [serving], 0.0) == []
    for t in range(1, 5):
        view.record("a", float(t), ConnectionRefusedError("connection refused"))
        assert told.scrapes(view, [draining], float(t)) == []
    view.record("a", 5.0, ConnectionRefusedError("connection refused"))
    (line,) = told.scrapes(view, [serving], 5.0)  # no longer draining: told
    assert line.startswith("server a out of the operator's view"), line


def _loads(**compute_ms: float) -> list[ModelLoad]:
    return [
        ModelLoad("m", s, 10, 0.0, ms * 1e4, 0.0, 10.0, 0.0, 1.0) for s, ms in compute_ms.items()
    ]


def test_a_server_weighed_down_and_back_is_told_once_each_with_what_was_measured():
    told, balancing = Transitions(), Balancing()
    told.membership([_server("a", 1000), _server("b", 2000)])
    lines = []
    for _ in range(20):  # b five times as slow, for long
        balancing.observe(_loads(a=1.0, b=5.0))
        lines += told.weights(balancing, {"m": balancing.weights("m", ["a", "b"])})
    assert len(lines) == 1, lines
    assert lines[0].startswith("balancing: b weighed down for m: 5.0 ms per request, 5.0× the")
    balancing.observe(_loads(a=1.0, b=1.0))  # a faster measurement is believed at once
    back = told.weights(balancing, {"m": balancing.weights("m", ["a", "b"])})
    assert back == [
        "balancing: b back to full weight for m: 1.0 ms per request, 1.0× the model's "
        "reference 1.0 ms (1.0× over its models)"
    ]
    assert told.weights(balancing, {"m": balancing.weights("m", ["a", "b"])}) == []
    for _ in range(20):
        balancing.observe(_loads(a=1.0, b=5.0))
    assert len(told.weights(balancing, {"m": balancing.weights("m", ["a", "b"])})) == 1
    balancing.policy = "round-robin"  # every server weighs alike: said once
    alike = {"m": balancing.weights("m", ["a", "b"])}
    assert told.weights(balancing, alike) == [
        "balancing: b back to full weight for m: policy round-robin"
    ]
    assert told.weights(balancing, alike) == []


def test_a_models_routes_moving_to_the_holder_and_back_are_told():
    told = Transitions()
    assert told.routes(["m", "n"]) == ["routes: m to its servers", "routes: n to its servers"]
    assert told.routes(["m", "n"]) == []
    (held,) = told.routes(["n"])
    assert held.startswith("routes: m to the gateway's holder (no replica routed: ")
    assert told.routes(["m", "n"]) == ["routes: m to its servers"]


def test_a_per_try_timeout_is_told_when_it_changes_not_when_first_seen():
    told = Transitions()
    assert told.tries({"m": 15.0}, ["m"]) == []  # never measured: the cap
    assert told.tries({"m": 3.0}, ["m"]) == ["per-try timeout of m at Envoy: 15 s -> 3 s"]
    assert told.tries({"m": 3.0}, ["m"]) == []
    assert told.tries({}, ["m"]) == [
        "per-try timeout of m at Envoy: 3 s -> none (one server takes the model)"
    ]
    assert told.tries({}, []) == []  # no server holds it: said as the servers change


# -- a real site ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def local_site(tmp_path_factory, built_models) -> Iterator[Path]:
    """Two servers of `identity`, triton-1 slowed by 40 ms a request; no supervisor."""
    site_dir = tmp_path_factory.mktemp("logged") / "site"
    launcher.up(
        site_dir,
        servers=2,
        models=[MODEL],
        build_dir=built_models,
        delay_ms={"triton-1": 40.0},
        supervise=False,
    )
    try:
        yield site_dir
    finally:
        launcher.down(site_dir)


def _log(site_dir: Path) -> str:
    return (site_dir / "logs" / "operator.log").read_text()


def _lines(site_dir: Path, text: str) -> list[str]:
    return [line for line in _log(site_dir).splitlines() if text in line]


def _told(site_dir: Path, text: str) -> list[str]:
    """The log's lines holding `text`, once there is at least one."""
    return wait_until(lambda: _lines(site_dir, text), f"{text!r} in the operator's log")


def test_the_operator_says_once_that_it_starts_with_what_and_timestamps_every_line(local_site):
    (start,) = _told(local_site, "operator: operator started: pid ")
    record = SiteState.load(local_site).process("operator")
    assert record is not None
    assert re.match(rf"^{STAMP} operator: operator started: pid {record.pid}; API ", start)
    for said in ("xDS 127.0.0.1:", f"servers from the site's state file in {local_site}"):
        assert said in start, start
    for said in ("admission: shed above", "balancing load-aware", "placement off"):
        assert said in start, start
    for server in ("triton-0", "triton-1"):
        assert len(_told(local_site, f"operator: server {server} joined: gRPC ")) == 1
    lines = _log(local_site).splitlines()
    assert lines and all(LINE.match(line) for line in lines), lines


def test_a_slow_server_weighed_down_is_told_once_with_its_slowness(local_site):
    stream(from_site_file(local_site), 100, 2, "triton-1")
    (line,) = _told(local_site, f"balancing: triton-1 weighed down for {MODEL}: ")
    assert re.search(r"ms per request, [\d.]+× the model's reference [\d.]+ ms", line), line
    assert not _lines(local_site, "balancing: triton-0")


def test_a_hung_then_killed_server_is_told_once_per_change_with_why(local_site):
    hung = SiteState.load(local_site).server("triton-0")
    assert hung is not None
    os.kill(hung.pid, signal.SIGSTOP)
    try:
        _told(local_site, "server triton-0 out of the operator's view after 3 failed scrapes")
        (unreadable,) = _lines(local_site, "server triton-0 unreadable: ")
        assert hung.metrics_url in unreadable and "TimeoutError" in unreadable, unreadable
    finally:
        os.kill(hung.pid, signal.SIGCONT)
    (back,) = _told(local_site, "server triton-0 readable again after ")
    assert back.endswith(", back in the view"), back
    assert len(_lines(local_site, "server triton-0 out of the operator's view")) == 1
    os.kill(hung.pid, signal.SIGKILL)  # no supervisor: it stays dead
    wait_until(
        lambda: len(_lines(local_site, "server triton-0 out of the operator's view")) == 2,
        "the killed server out of the operator's view",
    )
    unreadable = _lines(local_site, "server triton-0 unreadable: ")
    assert len(unreadable) == 2 and "Connection refused" in unreadable[1], unreadable
    assert len(_lines(local_site, "server triton-0 readable again")) == 1


def test_a_server_added_and_removed_is_told_joining_draining_and_leaving(local_site):
    added = add_server(local_site)
    (joined,) = _told(local_site, f"server {added.id} joined: gRPC {added.grpc}")
    assert f"holds {MODEL}" in joined
    remove_server(local_site, added.id, drain_s=30)
    _told(local_site, f"server {added.id} left: ")
    assert len(_lines(local_site, f"server {added.id} draining: ")) == 1
    assert not _lines(local_site, f"server {added.id} unreadable")
    lines = _log(local_site).splitlines()
    assert all(LINE.match(line) for line in lines), [x for x in lines if not LINE.match(x)]

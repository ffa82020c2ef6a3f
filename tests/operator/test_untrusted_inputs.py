"""What reaches the operator from outside, at its worst: a server's metrics with figures
that are no numbers, a reply that trickles, a wall clock that steps back, request bodies
with numbers past any range or nested past Python's stack, and an idle unload whose reason
is gone by its turn. Each is refused or bounded, with a reason, and no step fails."""

from __future__ import annotations

import http.client
import json
import socket
import threading

import pytest
from sonicsite.operator.api import make_server
from sonicsite.operator.controller import Operator
from sonicsite.operator.declared_work import DeclaredWork
from sonicsite.operator.loadview import LoadView
from sonicsite.operator.placement_checks import SeenSince, dropped
from sonicsite.operator.placement_state import Decision, HeldCounts, Kind, Rule
from triton_counters import parse_metrics

from sonicsite.contract.work_report import WorkReport

SUCCESS = "nv_inference_request_success"


def _metrics(success: float, model: str = "m") -> str:
    return f'{SUCCESS}{{model="{model}",version="1"}} {success}\n'


@pytest.mark.parametrize("value", ["NaN", "+Inf", "-Inf", "-3"])
def test_a_figure_that_is_no_count_is_a_failed_scrape_not_a_rate(value):
    """Prometheus' text allows NaN and infinities; Triton never sends them. Taken in, a NaN
    went into every rate and made each step fail (the autoscaler's ceil, placement's int)
    and gave a slow server full weight again. Now the scrape fails, naming the figure."""
    with pytest.raises(ValueError, match=rf"{SUCCESS}\{{model='m'\}} is"):
        parse_metrics(_metrics(float(value)) if value != "NaN" else _metrics(float("nan")))
    view = LoadView(grace=3)
    view.record("s0", 0.0, _metrics(10))
    view.record("s0", 1.0, f'{SUCCESS}{{model="m",version="1"}} {value}\n')
    health = view.health["s0"]
    assert not health.up and "not Prometheus' text format" in health.error
    assert view.in_view("s0")  # one failed scrape: still in the view, with its last figures


def test_a_clock_that_steps_back_makes_no_rate_of_a_near_zero_time():
    """Scrapes at 100 s and 105 s, then the wall clock 5 s back: the interval over the step
    is not measured (its rate was 10^6 times the real one), the others are."""
    view = LoadView()
    for at, success in ((100.0, 0), (105.0, 250), (100.0, 500), (105.0, 750)):
        view.record("s0", at, _metrics(success))
    (load,) = view.loads["s0"]
    assert load.throughput_rps == pytest.approx(50.0)
    (window,) = view.window_loads(4.0)
    assert window.throughput_rps <= 50.0 + 1e-9


def test_a_reply_sent_slowly_costs_a_scrape_its_timeout_not_its_length():
    """A server sends its metrics a line every 0.3 s, each read within the 0.5 s read
    timeout: the scrape of every server waited for the whole reply (9 s here). Now it is
    given up once the scrape's own time is over, the server named, while the reply is
    still coming."""
    lines = [_metrics(k, f"m{k}").encode() for k in range(30)]
    sent_all = threading.Event()
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            body = b"".join(lines)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body))
            try:
                for line in lines:
                    conn.sendall(line)
                    sent_all.wait(0.3)
            except OSError:
                pass
        sent_all.set()

    server = threading.Thread(target=serve, daemon=True)
    server.start()
    try:
        view = LoadView(timeout_s=0.5)
        view.scrape_all({"slow": f"http://127.0.0.1:{listener.getsockname()[1]}/metrics"})
        assert not sent_all.is_set()  # given up while the reply was still coming
        health = view.health["slow"]
        assert not health.up and "no whole reply within 1 s" in health.error
    finally:
        sent_all.set()
        listener.close()
        server.join(timeout=60)


@pytest.mark.parametrize(
    "body",
    [
        {"source": "a", "left": {"m": 10**400}},
        {"source": "a", "left": {"m": 10**308}},
        {"source": "a", "left": {"m": True}},
        {"source": "a", "left": {"m": 5}, "rps": {"m": 1e300}},
    ],
    ids=["past-float", "huge", "bool", "huge-rate"],
)
def test_a_report_with_a_count_past_any_job_is_refused(body):
    """10^400 raised OverflowError out of the check (the API never answered); 10^308 was
    taken, and the autoscaler's cap failed every step while its lease held."""
    with pytest.raises(ValueError, match=r"expected a (whole )?number from 0 to 1e\+09"):
        WorkReport.from_dict(body)


def test_held_counts_refuse_booleans_and_counts_past_any_site():
    held = HeldCounts()
    for count in (True, 10**400, -1):
        with pytest.raises(ValueError, match=r"held\['m'\]: expected a count from 0 to 1e\+09"):
            held.report("gateway", {"m": count}, 0.0)


def test_the_api_answers_bodies_past_any_range_or_depth_with_400():
    class NoServers:
        def servers(self) -> list:
            return []

    operator = Operator(NoServers(), "127.0.0.1", 10000)
    server = make_server(operator, "127.0.0.1", 0)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()

    def put(path: str, body: str) -> tuple[int, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
        try:
            conn.request("PUT", path, body=body)
            reply = conn.getresponse()
            return reply.status, json.loads(reply.read())
        finally:
            conn.close()

    try:
        huge = '{"source": "a", "left": {"m": 1%s}}' % ("0" * 400)
        status, said = put("/v1/work", huge)
        assert status == 400 and "expected a whole number from 0 to 1e+09" in said["error"]
        for path in ("/v1/work", "/v1/balancing"):
            status, said = put(path, "[" * 100_000 + "]" * 100_000)
            assert status == 400 and said["error"], said
    finally:
        server.shutdown()
        server.server_close()
        serving.join(timeout=30)


def test_an_idle_unload_whose_model_has_work_now_is_dropped():
    """Decided while nobody wanted the model; by its turn requests are held for it or work
    declared: the unload went ahead, and the next step loaded the model again, cold."""
    idle = Decision(Kind.UNLOAD, Rule.IDLE, "m", "s0", "unused for 300 s")
    seen = {"held": {}, "declared": set(), "loaded": {}, "over_since": {}, "queue_ms": 100.0}
    assert dropped(idle, [], set(), SeenSince(**seen)) == ""
    why = "requests held or work declared for it since"
    assert dropped(idle, [], set(), SeenSince(**(seen | {"declared": {"m"}}))) == why
    assert dropped(idle, [], set(), SeenSince(**(seen | {"held": {"m": 2}}))) == why


def test_a_lease_outlives_its_sender_by_no_more_than_itself_when_the_clock_steps_back():
    """A report at 1000 s with a 20 s lease, then the wall clock 600 s back: the lease ran
    to 1020 s, so the report held for 620 s more. Now it runs from the clock's new time."""
    work = DeclaredWork()
    work.report(WorkReport("job", {"m": 500}, {"m": 10.0}, 20.0), now=1000.0)
    assert work.totals(400.0)["m"].left == 500  # the clock stepped back: from now
    assert work.totals(419.0)["m"].left == 500
    assert work.totals(421.0) == {}
    held = HeldCounts(ttl_s=3.0)
    held.report("gateway", {"m": 7}, now=1000.0)
    assert held.held(400.0) == {"m": 7}
    assert held.held(404.0) == {}

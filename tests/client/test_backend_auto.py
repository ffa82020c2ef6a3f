"""Backend "auto"'s rule on its own, over a real Failover of the site's paths: a site that
keeps shedding past the deadline sends the stream in process, one probe at a time goes
back, and the site's answer to it brings the stream back; a site that fails only now and
then (answers in between) never does."""

from __future__ import annotations

import time

from polling import wait_until
from sonicsite.client.backend_auto import LOCAL, SITE, AutoPolicy, AutoSwitch
from sonicsite.client.balancer import Balancer, Endpoint
from sonicsite.client.errors import INTERNAL, OVERLOADED, UNAVAILABLE
from sonicsite.client.failover import Failover


def _site() -> tuple[Failover, Endpoint]:
    envoy = Endpoint("envoy", None, path="envoy")
    servers = [Endpoint("triton-0", None), Endpoint("triton-1", None)]
    return Failover({"envoy": Balancer([envoy]), "direct": Balancer(servers)}), envoy


def _sent(switch: AutoSwitch, failover: Failover) -> tuple[Endpoint, bool] | None:
    """Where the next attempt goes when it goes to the site; None when it runs in process."""
    chosen, probe = switch.endpoint(failover)
    return (chosen, probe) if chosen is not None else None


def test_a_site_that_keeps_shedding_sends_the_stream_in_process_and_a_probe_brings_it_back():
    failover, envoy = _site()
    switch = AutoSwitch(AutoPolicy(shed_s=0.2, probe_s=0.05))
    chosen, probe = switch.endpoint(failover)
    assert chosen is envoy and not probe
    failover.done(envoy, None)
    switch.failed(OVERLOADED, probe, "envoy: RESOURCE_EXHAUSTED: shed")
    failover.hold(envoy, 600)  # the retry-after: every path held (until the test ends it)
    chosen, probe = switch.endpoint(failover)  # waits, then gives up on the site
    assert chosen is None and switch.backend == LOCAL
    assert switch.switches[-1]["reason"].startswith("the site kept shedding the model for")
    # In process: nothing goes to the site while it holds the model; then one probe.
    assert switch.endpoint(failover) == (None, False)
    failover.not_before = 0.0  # the hold is over
    probed = wait_until(lambda: switch.endpoint(failover)[0], "a probe of the site")
    assert probed is envoy and switch.probe_out
    assert switch.endpoint(failover) == (None, False)  # one probe at a time
    failover.done(envoy, 0.01)
    switch.answered(True)
    assert switch.backend == SITE and not switch.probe_out
    assert [s["to"] for s in switch.switches] == [LOCAL, SITE]
    assert switch.switches[-1]["reason"] == "the site answered again (a probe)"


def test_a_failed_probe_keeps_the_stream_in_process():
    failover, _ = _site()
    switch = AutoSwitch(AutoPolicy(unreachable_s=0.05, probe_s=600))
    switch.failed(UNAVAILABLE, False, "envoy: connection refused")
    wait_until(lambda: _sent(switch, failover) is None, "the switch to local")
    assert "the site did not answer for" in switch.switches[0]["reason"]
    assert switch.endpoint(failover) == (None, False)  # the first probe waits probe_s
    switch.next_probe = 0.0  # as if probe_s had passed
    probed, probe = _sent(switch, failover)
    assert probe
    failover.done(probed, None)
    switch.failed(UNAVAILABLE, True, "envoy: connection refused")
    assert switch.backend == LOCAL and not switch.probe_out
    assert switch.endpoint(failover) == (None, False)  # the next probe waits probe_s again


def test_failures_with_answers_between_them_never_leave_the_site():
    failover, _ = _site()
    switch = AutoSwitch(AutoPolicy(unreachable_s=0.05))
    for _ in range(5):
        switch.failed(UNAVAILABLE, False, "reset")
        switch.answered(False)  # the site answered in between: the clock stops
        time.sleep(0.06)  # longer than the deadline, between a failure and the next call
        chosen, _ = switch.endpoint(failover)
        assert chosen is not None
        failover.done(chosen, 0.01)
    switch.failed(INTERNAL, False, "the model failed")  # an answer of a kind: no clock
    time.sleep(0.06)
    assert switch.endpoint(failover)[0] is not None and switch.switches == []

"""The operator's model control against real Triton servers (model control `explicit`,
restricted protocols keyed by the site's key): load and unload change a server's repository
index, a load's footprint is measured and remembered, failures name the model, the server
and Triton's reason, and a model unloaded and loaded again reads in the load view as the
work done since, never as negative or made-up work."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from control_site import MODELS, control_target, two_servers
from polling import wait_until
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.client.errors import UNAVAILABLE, InferError
from sonicsite.models.samples import generate
from sonicsite.operator import model_control
from sonicsite.operator.catalogue import catalogue_of, read_repository
from sonicsite.operator.loadview import LoadView
from sonicsite.operator.model_control import ControlTarget, ModelControlError

from sonicsite.contract.wire import ADMIN_KEY_HEADER
from sonicsite.local.ports import free_ports
from sonicsite.local.state import SiteState


@pytest.fixture(scope="module")
def pair(tmp_path_factory, built_models) -> SiteState:
    """Two servers, identity on triton-0 only; no control plane (the operator's calls go to
    the servers' own ports)."""
    site_dir = tmp_path_factory.mktemp("control") / "site"
    with two_servers(site_dir, built_models, balancer=False) as state:
        yield state


def test_load_and_unload_with_the_key_change_the_index_and_the_footprint_is_remembered(pair):
    target = control_target(pair, "triton-1")
    catalogue = catalogue_of(read_repository(Path(pair.site_dir) / "repository"))
    index = model_control.repository_index(target)
    assert sorted(e.name for e in index) == sorted(catalogue.models) == sorted(MODELS)
    assert model_control.ready_models(target) == {"simple"}

    loaded = model_control.load(target, "identity")
    assert model_control.ready_models(target) == {"simple", "identity"}
    footprint = loaded.footprint
    assert footprint is not None and footprint.source == model_control.FROM_PROCESS_RSS
    # the model's own process (a Python-backend stub: tens of MB) came with it
    assert footprint.bytes > 10 * 2**20 and footprint.server == "triton-1"
    catalogue = catalogue.with_footprint("identity", footprint)
    again = model_control.load(target, "identity")  # loaded already: Triton does nothing
    assert loaded.fresh and not again.fresh and again.footprint is None

    model_control.unload(target, "identity")
    states = {e.name: (e.state, e.reason) for e in model_control.repository_index(target)}
    assert states["identity"] == ("UNAVAILABLE", "unloaded") and states["simple"][0] == "READY"
    assert catalogue.footprint_bytes("identity") == footprint.bytes  # remembered unloaded
    assert model_control.ready_models(control_target(pair, "triton-0")) == {"simple", "identity"}


def test_failures_name_the_model_the_server_and_tritons_reason(pair):
    target = control_target(pair, "triton-1")
    with pytest.raises(ModelControlError) as missing:
        model_control.load(target, "nosuch")
    assert "load of model 'nosuch' on server 'triton-1' failed" in str(missing.value)
    assert "failed to poll from model repository" in missing.value.reason
    wrong = ControlTarget(target.server, target.http, "not-the-key")
    with pytest.raises(ModelControlError, match=f"model 'simple' .* 403: .*{ADMIN_KEY_HEADER}"):
        model_control.unload(wrong, "simple")
    assert "simple" in model_control.ready_models(target)  # refused: still loaded
    (port,) = free_ports(1)
    gone = ControlTarget("triton-9", f"127.0.0.1:{port}", target.key)
    with pytest.raises(ModelControlError, match=r"on server 'triton-9' failed: .* unreachable"):
        model_control.load(gone, "simple")


def _infer(http: str, count: int) -> None:
    client = httpclient.InferenceServerClient(http)
    try:
        for k in range(count):
            inputs = [httpclient.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]
            for tensor in inputs:
                tensor.set_data_from_numpy(np.full((1, 16), k, dtype=np.int32))
            client.infer("simple", inputs)
    finally:
        client.close()


def test_a_reload_reads_as_the_work_done_since_never_as_negative_work(pair):
    """Triton resets a model's counters when it unloads it: 20 requests before, 3 after a
    reload between two scrapes read as 3 requests in that interval (not 0, not -17), with
    the queue time Triton's own statistics give since the reload, and 23 over the window."""
    server = pair.server("triton-0")
    target = control_target(pair, "triton-0")
    view = LoadView(timeout_s=5.0)

    def scraped(total: int) -> bool:
        view.scrape(server.id, server.metrics_url)
        return view._last[server.id].models.get("simple", {}).get("success") == total

    view.scrape(server.id, server.metrics_url)
    before = view._last[server.id].models["simple"]["success"]
    _infer(server.http, 20)
    wait_until(lambda: scraped(before + 20), "Triton's metrics to count 20 requests")
    model_control.unload(target, "simple")
    assert model_control.load(target, "simple").fresh  # the counters start from zero
    _infer(server.http, 3)
    wait_until(lambda: scraped(3), "Triton's metrics to count 3 requests since the reload")
    (load,) = [x for x in view.loads[server.id] if x.model == "simple"]
    client = httpclient.InferenceServerClient(server.http)
    stats = client.get_inference_statistics("simple")["model_stats"][0]["inference_stats"]
    client.close()
    assert load.requests == 3 and stats["success"]["count"] == 3
    # Triton's metric adds each request's queue time in whole microseconds (truncated), its
    # statistics in nanoseconds: they may differ by up to a microsecond per request
    assert load.queue_us == pytest.approx(stats["queue"]["ns"] / 1e3, rel=0, abs=3)
    assert load.queue_us >= 0 and load.compute_us > 0 and load.failure_rps == 0
    history = view._history[server.id]
    span = history[-1].at - history[0].at  # every scrape since the first
    (window,) = [x for x in view.window_loads(span) if x.model == "simple"]
    assert window.requests == 23  # the reload counted from zero inside the window


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_a_request_sent_where_the_model_is_unloaded_is_answered_by_another_server(pair, transport):
    """Triton refuses a request for a model it has unloaded ('has no available versions')
    before running it, so the client sends it to another server rather than failing it:
    the race of an unload with a client or gateway that has not yet seen it costs a retry,
    not the events."""
    target = control_target(pair, "triton-1")
    model_control.unload(target, "simple")
    try:
        sample = generate("simple", 64, seed=5)
        with Client(from_site_file(pair.site_dir), transport) as client:
            result = client.stream("simple", sample.spec, batch=4, window=2).run(
                sample, lambda *a: None
            )
        assert result.events_ok == 64 and result.failed == {}
        refused = [r for r in result.stats.records if not r.ok]
        assert refused and {r.server for r in refused} == {"triton-1"}
        assert {(r.error, r.unprocessed) for r in refused} == {(UNAVAILABLE, True)}
        assert result.stats.summary()["rows_per_server"] == {"triton-0": 64}
    finally:
        model_control.load(target, "simple")


class CountedRefusals:
    """An endpoint's transport as it is, counting the tries refused before they ran (the
    stream's own records come with its result, once it has returned)."""

    def __init__(self, transport, refused: list[str]) -> None:
        self.transport, self.refused = transport, refused

    def __getattr__(self, name: str):
        return getattr(self.transport, name)

    def _counted(self, call, *args, **kwargs):
        try:
            return call(*args, **kwargs)
        except InferError as exc:
            if exc.unprocessed:
                self.refused.append(exc.kind)
            raise

    def model_info(self, *args, **kwargs):
        return self._counted(self.transport.model_info, *args, **kwargs)

    def infer(self, *args, **kwargs):
        return self._counted(self.transport.infer, *args, **kwargs)


def test_a_model_not_ready_on_any_server_is_waited_for_not_given_up(pair):
    """`simple` unloaded on both servers: each try is refused before it runs ('has no
    available versions'), and the client waits between such tries (the second in a row on).
    Loaded again on one server once the stream's tries were refused, every event is
    answered there, none failed."""
    targets = [control_target(pair, server) for server in ("triton-0", "triton-1")]
    for target in targets:
        model_control.unload(target, "simple")
    try:
        sample = generate("simple", 32, seed=6)
        asked = threading.Event()

        class Watched:  # the sample, saying when the stream first asks it for events
            def __len__(self) -> int:
                return len(sample)

            def request(self, lo: int, hi: int):
                asked.set()
                return sample.request(lo, hi)

        with Client(from_site_file(pair.site_dir), "grpc", "direct") as client:
            stream = client.stream("simple", sample.spec, batch=8, window=2, max_tries=40)
            seen: list[str] = []  # the kinds of the tries refused, as they are
            for endpoint in stream.balancer.endpoints:
                endpoint.transport = CountedRefusals(endpoint.transport, seen)
            done: list = []
            running = threading.Thread(
                target=lambda: done.append(stream.run(Watched(), sample.check))
            )
            running.start()
            wait_until(asked.is_set, "the stream to ask for its first events")
            wait_until(lambda: len(seen) >= 2, "two of the stream's tries refused")
            model_control.load(targets[1], "simple")
            running.join(timeout=300)
        (result,) = done
        assert result.events_ok == 32 and result.failed == {}, result.failed
        refused = [r for r in result.stats.records if not r.ok]
        assert len(refused) >= 2 and set(seen) == {UNAVAILABLE}
        assert {(r.error, r.unprocessed) for r in refused} == {(UNAVAILABLE, True)}
        assert result.stats.summary()["rows_per_server"] == {"triton-1": 32}
    finally:
        for target in targets:
            model_control.load(target, "simple")


def test_tries_spent_on_a_model_not_ready_anywhere_fail_with_its_reason(pair):
    """Unloaded on both servers, a stream of 4 tries a chunk, one chunk at a time: the
    chunks fail with Triton's reason, not as a site that never answered (the servers did
    answer: before, the stream was given up as "site unreachable"), and a chunk's tries are
    spread by its back-off from the second on (at least 0.05 + 0.1 s between its first and
    its last), not spent at once."""
    targets = [control_target(pair, server) for server in ("triton-0", "triton-1")]
    for target in targets:
        model_control.unload(target, "simple")
    try:
        sample = generate("simple", 16, seed=7)
        with Client(from_site_file(pair.site_dir), "grpc", "direct") as client:
            stream = client.stream("simple", sample.spec, batch=8, window=1, max_tries=4)
            result = stream.run(sample, sample.check)
        assert result.events_ok == 0 and sorted(result.failed) == [(0, 8), (8, 16)]
        for error in result.failed.values():
            assert "has no available versions" in error and "site unreachable" not in error
        tries = sorted(r.start for r in result.stats.records)
        assert len(tries) == 8
        assert tries[3] - tries[0] >= 0.15 and tries[7] - tries[4] >= 0.15, tries
    finally:
        for target in targets:
            model_control.load(target, "simple")

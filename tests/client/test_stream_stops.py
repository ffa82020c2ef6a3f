"""When a stream stops early (client/stream_guard.py): the first exception of a chunk
cancels the chunks not yet begun; a spec whose outputs do not fit the model fails before
anything is sent; a site that never answers fails the chunks left once one chunk has used up
its tries, the endpoints named, while a site that answered keeps the per-chunk retry rule;
and what is not a source of events is named as such."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path

import numpy as np
import pytest
from sonicsite.client import (
    Client,
    InferError,
    Ragged,
    SoA,
    SpecError,
    Stream,
    StreamOptions,
    TensorSpec,
)
from sonicsite.client.balancer import Balancer, Endpoint
from sonicsite.client.discovery import from_site_file
from sonicsite.client.errors import INTERNAL, UNAVAILABLE
from sonicsite.client.stream_guard import Reach, SourceError
from sonicsite.client.transport_grpc import GrpcTransport
from sonicsite.models.samples import generate

CLIENT = str(Path(sys.modules["sonicsite.client"].__file__).resolve().parent) + os.sep


def test_the_first_exception_cancels_the_chunks_not_yet_begun(site):
    """A worker's callback raises on the first answer: the stream raised only after every
    other chunk had run (ten here, a whole job in a worker)."""
    calls = []
    lock = threading.Lock()

    def on_result(lo, hi, outputs) -> None:
        with lock:
            calls.append(lo)
        raise RuntimeError(f"the worker's callback failed on events {lo}..{hi}")

    with Client(from_site_file(site.site_dir), "grpc", "direct") as client:
        sample = generate("simple", 20, seed=11)
        stream = client.stream("simple", sample.spec, batch=2, window=1)
        with pytest.raises(RuntimeError, match=r"callback failed on events 0\.\.2"):
            stream.run(sample, on_result)
    # the one that raised, and those begun before the stop reached the pool (one, or on a
    # busy machine a few): not all ten, as before
    assert 1 <= len(calls) < 10, calls


def test_output_columns_that_do_not_fit_fail_before_anything_is_sent(site):
    """`sum` one value short per row: the whole job ran and then failed with numpy's raw
    "could not broadcast" naming no output; now a SpecError names output and column, and
    no chunk is answered."""
    sample = generate("simple", 8, seed=12)
    soa = SoA.from_arrays(
        {
            "a": sample.soa["a"],
            "b": sample.soa["b"],
            "sum": np.zeros((8, 15), np.int32),
            "difference": np.zeros((8, 16), np.int32),
        }
    )
    answered = []
    with Client(from_site_file(site.site_dir), "grpc", "direct") as client:
        stream = client.stream("simple", sample.spec, batch=2, window=2)
        with pytest.raises(SpecError, match=r"output 'OUTPUT0': columns \['sum'\] hold 15"):
            stream.run(soa, lambda *a: answered.append(a))
    assert answered == []


def _refused_address() -> str:
    """host:port where nothing listens (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def test_a_site_that_never_answers_fails_the_chunks_left_at_once():
    """Every server refuses: each chunk spent all its tries and cool-downs (8 chunks took
    141 s, 10^5 events a day, nothing raised). Once one chunk has used up its tries with
    nothing answered since that chunk began, the others fail at once, the endpoints named."""
    endpoints = [
        Endpoint(f"dead-{k}", GrpcTransport(_refused_address(), f"dead-{k}")) for k in range(2)
    ]
    sample = generate("simple", 16, seed=13)
    options = StreamOptions(batch=2, window=2, max_tries=3, backoff_s=0.01, backoff_max_s=0.02)
    stream = Stream(Balancer(endpoints), "simple", sample.spec, options, statistics={})
    try:
        result = stream.run(sample, sample.check)
    finally:
        for e in endpoints:
            e.transport.close()
    assert result.delivered == [] and len(result.failed) == 8
    gave_up = [why for why in result.failed.values() if why.startswith("site unreachable")]
    assert gave_up, result.failed
    assert "no endpoint (dead-0, dead-1) has answered for" in gave_up[0]
    assert {r.error for r in result.stats.records} == {UNAVAILABLE}
    # only the chunks in flight when the first gave up made attempts, not all eight
    assert len(result.stats.records) <= options.window * options.max_tries


def test_the_chunks_in_flight_share_the_silence_of_a_dead_site():
    """One endpoint that refuses, a window of 4: each chunk got a quarter of the endpoint's
    probes and spent its own tries (30 failed requests, 129 s against 21 s with a window of
    1). The stream's tries in a row count together: it gives up after as many failed tries
    as one chunk has, and no chunk waiting for the endpoint sends another."""
    sample = generate("simple", 40, seed=14)
    attempts = {}
    for window in (1, 4):
        endpoint = Endpoint("dead", GrpcTransport(_refused_address(), "dead"))
        options = StreamOptions(batch=8, window=window, max_tries=4, backoff_s=0.01)
        stream = Stream(Balancer([endpoint]), "simple", sample.spec, options, statistics={})
        try:
            result = stream.run(sample, sample.check)
        finally:
            endpoint.transport.close()
        attempts[window] = len(result.stats.records)
        assert len(result.failed) == 5 and result.delivered == [], result.failed
        assert any(why.startswith("site unreachable") for why in result.failed.values())
    # no chunk spent tries of its own (at most one sent as the stream gave up): each try
    # waits out a back-off, so the attempts are what the stream's time went on (chunks
    # counting their tries apart made 10 here, 30 in the run that found it)
    assert attempts[4] <= options.max_tries + 1, attempts


def test_a_site_that_answered_keeps_the_per_chunk_rule():
    """The give-up rule only for a site silent through a chunk's tries: an answer since the
    chunk began (a failover's, a restart shorter than a chunk's tries) keeps every chunk's
    own tries; so does a chunk that failed otherwise than unreachable."""
    alive, dead = Endpoint("alive", None), Endpoint("dead", None)
    reach = Reach([alive, dead])
    reach.exhausted(INTERNAL, "alive: INTERNAL: the model raised")
    assert reach.gave_up == ""
    time.sleep(0.001)
    alive.observe(0.01)  # answered after the stream began
    reach.exhausted(UNAVAILABLE, "dead: connection refused")
    assert reach.gave_up == ""
    later = Reach([alive, dead])  # a new stream: that answer came before it
    later.exhausted(UNAVAILABLE, "dead: connection refused")
    assert later.gave_up.startswith("site unreachable: no endpoint (alive, dead)")
    assert "last error: dead: connection refused" in later.gave_up


def test_a_ragged_collection_is_named_as_no_source():
    """A Ragged has a length but no request(lo, hi): run() failed with a raw AttributeError
    from inside a chunk."""
    content = SoA.from_arrays({"x": np.zeros(5, np.float32)})
    ragged = Ragged(content, [0, 2, 5])
    stream = Stream(Balancer([Endpoint("e", None)]), "m", TensorSpec("m"), statistics={})
    with pytest.raises(SourceError, match=r"a Ragged has no request; .*\.collections\(lo, hi\)"):
        stream.run(ragged, lambda *a: None)


def test_a_site_that_died_mid_stream_gives_up_once_silent_through_a_chunks_tries():
    """A site that answered and then died: a chunk that began before its last answer keeps
    the per-chunk rule; one that began after it, and used up its tries with no endpoint
    answering meanwhile, gives up for the chunks left (they are sent again on a resume).
    Before, every chunk spent its own tries: 688 events took 10 minutes to fail."""
    alive, dead = Endpoint("alive", None), Endpoint("dead", None)
    reach = Reach([alive, dead])
    before_last_answer = time.monotonic()
    time.sleep(0.001)
    alive.observe(0.01)  # the site's last answer
    reach.exhausted(UNAVAILABLE, "dead: connection refused", before_last_answer)
    assert reach.gave_up == ""
    time.sleep(0.001)
    reach.exhausted(UNAVAILABLE, "alive: connection refused", time.monotonic())
    assert reach.gave_up.startswith("site unreachable: no endpoint (alive, dead) has answered")
    assert "since a chunk's tries began" in reach.gave_up
    assert "last error: alive: connection refused" in reach.gave_up


def test_a_kept_answer_whose_callback_raises_is_delivered_once(site):
    """A chunk sent before (a rerun's, by its journal) is first looked up: the server kept
    its answer. The worker's callback raises on it: the stream stops with that exception,
    the chunk delivered once and its endpoint released once. Before, the delivery ran inside
    the attempt: an InferError from the callback was taken for a failed try, the chunk sent
    again and delivered twice, and the endpoint's count of requests in flight went below 0."""
    sample = generate("simple", 8, seed=41)
    tag = f"t41-{uuid.uuid4().hex[:8]}/job-00000/"
    with Client(from_site_file(site.site_dir), "grpc", "direct") as client:
        first = client.stream("simple", sample.spec, batch=8, window=1, request_tag=tag)
        assert first.run(sample, sample.check).events_ok == 8  # the servers keep its answer
        seen = []

        def on_result(lo, hi, outputs) -> None:
            seen.append((lo, hi))
            raise InferError(INTERNAL, "the worker's next step failed", "elsewhere")

        again = client.stream("simple", sample.spec, batch=8, window=1, request_tag=tag)
        with pytest.raises(InferError, match="the worker's next step failed"):
            again.run(sample, on_result, resent={(0, 8)})
        assert seen == [(0, 8)]
        assert [e.in_flight for e in again.balancer.endpoints] == [0, 0]


# A worker whose user presses Ctrl-C on the first answer: SIGINT to its main thread, which is
# in stream.run; the chunk under way waits in its callback until the worker has the
# KeyboardInterrupt, so that no chunk can begin meanwhile but by the stream's own doing.
CTRL_C_WORKER = """
import json, signal, sys, threading, time
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate

sample = generate("simple", 200, seed=7)
begun, interrupted = [], threading.Event()

class Events:
    def __len__(self):
        return len(sample)

    def request(self, lo, hi):
        begun.append(lo)
        return sample.request(lo, hi)

def on_result(lo, hi, outputs):
    if lo == 0:
        signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # Ctrl-C
        interrupted.wait(30)  # under way until the worker has the interrupt

with Client(from_site_file(sys.argv[1]), "grpc", "direct") as client:
    stream = client.stream("simple", sample.spec, batch=2, window=1)
    try:
        stream.run(Events(), on_result)
        raised = False
    except KeyboardInterrupt:
        raised = True
    begun_when_raised = len(begun)
    interrupted.set()
    deadline = time.monotonic() + 120  # the chunk under way ends
    while time.monotonic() < deadline and any(
        t.name.startswith("sonicsite_") for t in threading.enumerate()
    ):
        time.sleep(0.05)
    threads = [t.name for t in threading.enumerate() if t.name.startswith("sonicsite_")]
print(json.dumps({"raised": raised, "begun_when_raised": begun_when_raised,
                  "begun": len(begun), "threads": threads}))
"""


def test_ctrl_c_stops_the_stream_and_begins_no_chunk_after_it(site, tmp_path):
    """Ctrl-C in a worker did not stop its stream: the pool's exit waited for every chunk
    left, all of them sent (32 s after Ctrl-C for 20,000 events), then raised. Now the
    KeyboardInterrupt is raised at once: of 100 chunks, only the one under way (it was
    answered) had begun, none after, and the stream's threads end."""
    script = tmp_path / "worker.py"
    script.write_text(CTRL_C_WORKER)
    out = subprocess.run(
        [sys.executable, "-P", str(script), str(site.site_dir)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
        env=os.environ.copy(),
    )
    assert out.returncode == 0, out.stderr
    said = json.loads(out.stdout.strip().splitlines()[-1])
    assert said["raised"], said
    assert said["begun_when_raised"] == 1, said  # was 100: every chunk sent after Ctrl-C
    assert said["begun"] == 1 and said["threads"] == [], said


def _library_frames(exc: BaseException) -> list[str]:
    """The frames of this library and of the thread pool in `exc`'s traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    return [
        f"{Path(f.filename).name}:{f.name}"
        for f in frames
        if str(Path(f.filename).resolve()).startswith(CLIENT) or "concurrent" in f.filename
    ]


def test_a_workers_error_is_raised_without_a_wall_of_library_frames(site):
    """A bad spec or a worker's callback that raised came out of a worker thread: about 20
    frames of concurrent.futures, the engine, the plan and the spec above the message. A
    bad spec is found before any thread starts and raised from `run` alone; a callback's
    error keeps the worker's own frame and loses the library's but the caller's `run`."""
    sample = generate("particlenet_ak4", 32, seed=3)
    columns = {name: sample.soa[name] for name in sample.soa.names}
    columns["pfcand_mask"] = columns["pfcand_mask"][:, :49].copy()  # one particle short
    short = SoA.from_arrays(columns)
    answered = []
    with Client(from_site_file(site.site_dir), "grpc") as client:
        stream = client.stream("particlenet_ak4", sample.spec, batch=16, window=2)
        with pytest.raises(SpecError) as caught:
            stream.run(short, lambda *a: answered.append(a))
        assert _library_frames(caught.value) == ["engine.py:run"], caught.value
        assert str(caught.value).startswith("input 'pf_mask': column 'pfcand_mask' has rows")
        assert answered == []

        def on_result(lo, hi, outputs) -> None:
            raise ZeroDivisionError(f"the worker's own step failed on events {lo}..{hi}")

        with pytest.raises(ZeroDivisionError) as caught:
            stream.run(sample, on_result)
    frames = traceback.extract_tb(caught.value.__traceback__)
    assert _library_frames(caught.value) == ["engine.py:run", "stream_guard.py:run_all"]
    assert frames[-1].name == "on_result", frames  # where the worker's error was raised

"""Back-off and deadlines: RESOURCE_EXHAUSTED and 429 from a real Envoy delay the stream by
the retry-after; a deadline that always passes fails the chunk without losing it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.models.samples import generate

from sonicsite.contract.wire import ServerRecord, SiteRecord
from sonicsite.local import envoy
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import stop_group

ENVOY_CONFIG = Path(__file__).with_name("envoy_rate_limited.yaml")

RETRY_AFTER_S = 1


@pytest.fixture(scope="module")
def limited_envoy(site, tmp_path_factory):
    """Real Envoy in front of one server, admitting one inference per second and answering
    the rest with RESOURCE_EXHAUSTED (gRPC) or 429 (HTTP) and a retry-after."""
    listen, admin = free_ports(2)
    server = site.servers[0]
    folder = tmp_path_factory.mktemp("envoy")
    config = folder / "envoy.yaml"
    config.write_text(
        ENVOY_CONFIG.read_text().format(
            admin=admin,
            listen=listen,
            grpc=server.grpc_port,
            http=server.http_port,
            retry_after=RETRY_AFTER_S,
        )
    )
    envoy.validate(config)
    proc = envoy.start(config, folder / "envoy.log")
    try:
        envoy.wait_ready(proc, f"127.0.0.1:{admin}", folder / "envoy.log")
        yield f"127.0.0.1:{listen}"
    finally:
        stop_group(proc.pid)
        proc.wait(timeout=30)
    assert not list(Path("/dev/shm").glob("envoy_shared_memory_*"))


@pytest.mark.parametrize("transport", ["grpc", "http"])
def test_resource_exhausted_and_429_delay_retries_by_the_retry_after(limited_envoy, transport):
    host, port = limited_envoy.rsplit(":", 1)
    envoy_as_server = ServerRecord("envoy", host, int(port), int(port), 0)
    site = SiteRecord(servers=(envoy_as_server,), source="test")
    with Client(site, transport, "direct") as client:
        sample = generate("simple", 8, seed=3)
        seen = []
        result = client.stream("simple", sample.spec, batch=2, window=2, backoff_s=0.01).run(
            sample, lambda lo, hi, out: seen.append((lo, hi))
        )
    assert sorted(seen) == [(0, 2), (2, 4), (4, 6), (6, 8)] and result.failed == {}
    np.testing.assert_array_equal(sample.soa["sum"], sample.expected["sum"])
    records = sorted(result.stats.records, key=lambda r: r.start)
    rejected = [r for r in records if r.error == "overloaded"]
    assert rejected and result.overloaded == len(rejected)
    for r in rejected:
        answered_at = r.start + r.latency_s
        later = [x.start for x in records if x.start > answered_at]
        # No request of the stream starts before the retry-after has passed.
        assert all(start >= answered_at + RETRY_AFTER_S - 0.005 for start in later)


def test_a_deadline_that_always_passes_fails_the_chunk_without_losing_it(site):
    """Each attempt times out; after max_tries the events are reported failed, by chunk."""
    with Client(from_site_file(site.site_dir), "grpc", "direct") as client:
        jets = generate("particle_transformer", 16, seed=5)
        delivered = []
        stream = client.stream(
            "particle_transformer",
            jets.spec,
            batch=16,
            timeout_s=0.001,
            max_tries=2,
            backoff_s=0.01,
        )
        result = stream.run(jets, lambda lo, hi, out: delivered.append((lo, hi)))
        assert delivered == [] and result.events_ok == 0 and result.events_failed == 16
        assert list(result.failed) == [(0, 16)]
        assert "DEADLINE_EXCEEDED" in result.failed[(0, 16)]
        assert [r.error for r in result.stats.records] == ["timeout", "timeout"]
        # With a sane deadline the same events go through.
        ok = client.stream("particle_transformer", jets.spec, batch=16).run(
            jets, lambda lo, hi, out: None
        )
        assert ok.events_ok == 16


def _shed_stream(limited_envoy: str, **options):
    """Eight chunks of one event at once through the Envoy that admits one a second: most
    are shed several times in a row before their turn."""
    host, port = limited_envoy.rsplit(":", 1)
    envoy_as_server = ServerRecord("envoy", host, int(port), int(port), 0)
    site = SiteRecord(servers=(envoy_as_server,), source="test")
    with Client(site, "grpc", "direct") as client:
        sample = generate("simple", 8, seed=4)
        stream = client.stream("simple", sample.spec, batch=1, window=8, max_tries=2, **options)
        return stream.run(sample, lambda lo, hi, out: None)


def test_sheds_are_waited_out_not_counted_as_tries(limited_envoy):
    """A shed is the site's flow control: chunks shed more often than `max_tries` in a row
    are still delivered, while they have waited out the sheds for less than
    `overload_wait_s`."""
    sheds = []
    # More sheds than chunks: some chunk was shed max_tries (2) times or more. On a busy
    # machine the eight chunks may go out spread over seconds and be shed less: sent again.
    while len(sheds) < 5 and (not sheds or sheds[-1] <= 8):
        result = _shed_stream(limited_envoy, backoff_s=0.01, backoff_max_s=0.2)
        assert result.failed == {} and result.events_ok == 8
        records = [r for r in result.stats.records if r.error == "overloaded"]
        assert result.overloaded == len(records)
        sheds.append(len(records))
    assert sheds[-1] > 8, f"sheds per stream: {sheds}"


def test_sheds_count_as_tries_once_the_overload_wait_is_over(limited_envoy):
    """With no overload wait, a chunk shed `max_tries` times fails with the site's reason."""
    result = _shed_stream(limited_envoy, backoff_s=0.01, backoff_max_s=0.2, overload_wait_s=1e-9)
    assert result.failed, "every chunk got through: the sheds were not counted"
    assert all("RESOURCE_EXHAUSTED" in why for why in result.failed.values()), result.failed
    assert result.events_ok + result.events_failed == 8


class _Watched:
    """A job's events whose `request` is timed (wall clock, as the stream's records): the
    job's own work for a chunk, called once however often the chunk is tried, before its
    first try."""

    def __init__(self, sample) -> None:
        self.sample, self.calls = sample, []

    def __len__(self) -> int:
        return len(self.sample)

    def request(self, lo: int, hi: int):
        began = time.time()
        columns = self.sample.request(lo, hi)
        self.calls.append((lo, hi, began, time.time()))
        return columns


def test_a_chunks_events_are_asked_of_the_job_once_before_its_tries(limited_envoy):
    """Shed chunks are tried again and again; the source's `request` (where a job may do
    its own work for the events) ran once per chunk, the first before any try began, so
    that the job's work is in no try's latency."""
    host, port = limited_envoy.rsplit(":", 1)
    site = SiteRecord(servers=(ServerRecord("envoy", host, int(port), int(port), 0),), source="t")
    with Client(site, "grpc", "direct") as client:
        sample = generate("simple", 6, seed=6)
        watched = _Watched(sample)
        stream = client.stream("simple", sample.spec, batch=1, window=1, backoff_s=0.01)
        result = stream.run(watched, lambda lo, hi, out: None)
    assert result.failed == {} and result.overloaded > 0  # some chunk was tried again
    assert sorted((lo, hi) for lo, hi, _, _ in watched.calls) == [(k, k + 1) for k in range(6)]
    tries = sorted(r.start for r in result.stats.records)
    assert len(tries) > len(watched.calls) and tries[0] >= watched.calls[0][3]

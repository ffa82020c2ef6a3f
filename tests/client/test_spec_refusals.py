"""What a stream refuses at the call, before any request: a spec with no outputs (every
answer dropped), an output column given twice (one answer overwrote the other), an
`on_result` that is not callable; and a model's metadata no endpoint gave is a
DiscoveryError, as the docs name it. No site needed: nothing is sent."""

from __future__ import annotations

import numpy as np
import pytest
from sonicsite.client import SoA, SpecError, Stream, StreamOptions, TensorSpec, make_plan
from sonicsite.client.balancer import Balancer, Endpoint
from sonicsite.client.discovery import DiscoveryError
from sonicsite.client.session import Client
from sonicsite.models.samples import generate

from sonicsite.contract.wire import ServerRecord, SiteRecord
from sonicsite.jobs.worker import config_info
from sonicsite.local.ports import free_ports


def _client() -> Client:
    """A client of one server where nothing listens."""
    (port,) = free_ports(1)
    site = SiteRecord(servers=(ServerRecord.at("server-0", f"127.0.0.1:{port}"),), source="x")
    return Client(site, "grpc", "direct", declare_work=False)


def test_a_spec_with_no_outputs_is_refused_with_the_ways_to_get_them():
    """It ran and gave on_result `{}` for every chunk: the answers were dropped."""
    spec = TensorSpec("simple").append_block("INPUT0", "a").append_block("INPUT1", "b")
    with _client() as client, pytest.raises(SpecError) as caught:
        client.stream("simple", spec, batch=4)
    (problem,) = caught.value.problems
    assert problem.startswith("outputs: the spec of 'simple' has none"), problem
    assert "append_output(name, column)" in problem and "append_output(name)" in problem


def test_an_output_column_given_twice_is_refused():
    """OUTPUT0 and OUTPUT1 both into `res`: accepted, and one answer overwrote the other."""
    soa = SoA.wrap({k: np.zeros((4, 16), np.int32) for k in ("a", "b", "res")})
    spec = (
        TensorSpec("simple")
        .append_block("INPUT0", "a")
        .append_block("INPUT1", "b")
        .append_output("OUTPUT0", "res")
        .append_output("OUTPUT1", "res")
    )
    with pytest.raises(SpecError) as caught:
        make_plan(spec, config_info("simple"), soa)
    assert caught.value.problems == [
        "output columns ['res']: given more than once; expected one per output"
    ]


def test_an_on_result_that_is_not_callable_is_refused_at_run():
    """None failed in a stream's thread: "'NoneType' object is not callable"."""
    sample = generate("simple", 4, seed=1)
    stream = Stream(Balancer([Endpoint("e", None)]), "simple", sample.spec, StreamOptions())
    with pytest.raises(TypeError, match=r"on_result: a NoneType is not callable"):
        stream.run(sample, None)


def test_model_info_that_no_endpoint_gave_is_a_discovery_error():
    """A plain ValueError, where the docs name ModelNotServed or DiscoveryError."""
    with _client() as client, pytest.raises(DiscoveryError, match=r"no endpoint of the site"):
        client.model_info("simple")

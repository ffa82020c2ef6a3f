"""Stock clients reach their model's route: Envoy finds the model in the request itself.

The sonicsite client names its model in a header; stock tools (tritonclient, perf_analyzer)
do not, yet to them the site must be one Triton server, with admission, weights and the
servers that hold the model applying to them too.

- KServe v2 REST names the model in the URL: the routes match the path (`rest_model_regex`)
  and nothing is read from the body.
- gRPC names it in the request message (field 1, `model_name` or `name`, of the request of
  ModelInfer, ModelStreamInfer, ModelMetadata, ModelReady, ModelConfig, ModelStatistics).
  The default route of those methods runs a WebAssembly filter of Envoy's own
  (`model_match.wat`, proxy-wasm ABI 0.2.1, built to `model_match.wasm` and sent inline in
  the listener): it holds the request's headers until the first bytes of its body have
  come, reads field 1 of the first message after gRPC's 5-byte prefix (other fields before
  it skipped; never past the first message, whose length the prefix gives, nor past
  SCAN_BYTES), adds it as the model header if it is a plain name ([A-Za-z0-9._-]+) and lets
  the request go on; Envoy picks the route again, as if the client had sent the header. The
  rest of the request streams on unbuffered, however large, and a stream's first message
  is never waited past: a message without the name goes by the default route at once.
  Why this: checked with Envoy 1.40 (`envoy --mode validate` and a live Envoy), a Lua
  filter's `bodyChunks()` lets the headers go on before the first chunk ("header map can no
  longer be modified"), so it cannot route; its `body()` waits for the whole request (and
  for a stream's end: ModelStreamInfer would hang); `grpc_field_extraction` and
  `proto_message_extraction` hold the whole first message (16 MB for a large ModelInfer)
  and need a descriptor set; ext_proc needs a server of its own outside Envoy. The filter
  before this one was `ext_authz` with a partial body, answered by a Lua listener inside
  Envoy: a second HTTP stream per request over a Unix socket, which cost stock clients a
  quarter of Envoy's throughput on small requests (`sonicsite bench stock-tools`:
  `envoy_no_header_over_bare_envoy_simple` 0.73). The WebAssembly filter runs in the
  request's own stream, in V8: no socket, no second stream, a few microseconds.
  A request that carries the header pays nothing (every other route disables the filter).
  The filter needs `allow_on_headers_stop_iteration` (by default Envoy turns a wasm filter's
  StopIteration on headers into StopAllIteration, and the body would never reach it), and
  fails open: should the VM fail, requests go on by the default route.
- A compressed message (tritonclient's `compression_algorithm="gzip"`: gRPC's flag byte 1)
  hides the name: the filter marks the request (`COMPRESSED_HEADER`) and its route
  (`compressed_route`) refuses it with UNIMPLEMENTED and the reason: otherwise it would go
  by the default route to an arbitrary server, past admission and the holder. A client
  that names the model in the header takes the model's route, compressed or not.
- What would reach an arbitrary server, or change one for everybody, is refused by Envoy
  itself (`refused_routes`): model load/unload, shared-memory registration, trace and log
  settings. A gRPC client gets PERMISSION_DENIED (Envoy maps the 403 of its own reply) with
  the reason; a REST client 403 with a KServe error body.
"""

from __future__ import annotations

import base64
import re
from importlib import resources

from sonicsite.contract.wire import MODEL_HEADER

MODEL_MATCH = "sonicsite.model_match"  # the listener's filter name (per-route configs use it)
FILTERS = "type.googleapis.com/envoy.extensions.filters.http"
GRPC_SERVICE = "/inference.GRPCInferenceService/"
SCAN_BYTES = 128  # the most the filter holds: the name must be within them ($SCAN in the .wat)
WASM = "model_match.wasm"  # beside this module, built from model_match.wat
FILTER_CONFIG = "type.googleapis.com/envoy.config.route.v3.FilterConfig"

# gRPC methods whose request message names the model in field 1 (model_name or name)
NAMED_METHODS = (
    "ModelInfer",
    "ModelStreamInfer",
    "ModelMetadata",
    "ModelReady",
    "ModelConfig",
    "ModelStatistics",
)

# set by the filter on a compressed first message (model_match.wat); a client that sends
# it itself without the model header is refused as if it had compressed
COMPRESSED_HEADER = "x-sonicsite-compressed"
COMPRESSED = (
    "a compressed gRPC message is not routed by the site: its balancer finds the model in "
    "a message's first bytes, which compression hides; send the request uncompressed "
    f"(no compression_algorithm), or name the model in the {MODEL_HEADER!r} header"
)

_REFUSED = "refused through the site's balancer"
REPOSITORY = (
    f"model repository control is {_REFUSED}: it would load or unload a model on one "
    "arbitrary server; the site's operator decides which servers hold which models"
)
SHARED_MEMORY = (
    f"shared-memory registration is {_REFUSED}: it would reach an arbitrary server; "
    "register with a server's own port (co-located)"
)
TRACE = (
    f"trace settings are {_REFUSED}: they would change one arbitrary server; set them on "
    "a server's own port"
)
LOGGING = (
    f"log settings are {_REFUSED}: they would change one arbitrary server; set them on a "
    "server's own port"
)

# (route name, why, gRPC methods, REST path regex)
REFUSED: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    (
        "repository",
        REPOSITORY,
        ("RepositoryModelLoad", "RepositoryModelUnload"),
        r"^/v2/repository/models/.*",
    ),
    (
        "shared-memory",
        SHARED_MEMORY,
        (
            "SystemSharedMemoryStatus",
            "SystemSharedMemoryRegister",
            "SystemSharedMemoryUnregister",
            "CudaSharedMemoryStatus",
            "CudaSharedMemoryRegister",
            "CudaSharedMemoryUnregister",
        ),
        r"^/v2/(systemsharedmemory|cudasharedmemory)(/.*)?$",
    ),
    ("trace", TRACE, ("TraceSetting",), r"^/v2(/models/[^/]+(/versions/[^/]+)?)?/trace/setting$"),
    ("logging", LOGGING, ("LogSettings",), r"^/v2/logging$"),
)


def model_match_filter() -> dict:
    """The WebAssembly filter on the main listener (see the module's docstring): the model's
    name from the first bytes of a stock gRPC client's message into the model header. Run
    by the default gRPC routes only (every other route disables it)."""
    code = resources.files(__package__).joinpath(WASM).read_bytes()
    return {
        "name": MODEL_MATCH,
        "typed_config": {
            "@type": f"{FILTERS}.wasm.v3.Wasm",
            "config": {
                "name": MODEL_MATCH,
                "vm_config": {
                    "vm_id": MODEL_MATCH,
                    "runtime": "envoy.wasm.runtime.v8",
                    "code": {"local": {"inline_bytes": base64.b64encode(code).decode()}},
                },
                "allow_on_headers_stop_iteration": True,
                "failure_policy": "FAIL_OPEN",
            },
        },
    }


def without_model_match() -> dict:
    """A route's `typed_per_filter_config` entry that skips the model-finding script."""
    return {MODEL_MATCH: {"@type": FILTER_CONFIG, "disabled": True}}


def rest_model_regex(model: str) -> str:
    """KServe v2 REST paths about `model`: /v2/models/<m>[/versions/<v>][/...]."""
    return rf"^/v2/models/{re.escape(model)}(/versions/[^/]+)?(/.*)?$"


def named_methods_regex() -> str:
    """The gRPC paths whose message names a model."""
    return f"^{re.escape(GRPC_SERVICE)}({'|'.join(NAMED_METHODS)})$"


def refused_routes() -> list[dict]:
    """Routes Envoy answers itself with 403: a gRPC client sees PERMISSION_DENIED with the
    reason as its message (Envoy's local reply for gRPC), a REST client a KServe error
    (the listener's local-reply mapper)."""
    routes = []
    for kind, reason, methods, rest_regex in REFUSED:
        grpc_paths = f"^{re.escape(GRPC_SERVICE)}({'|'.join(methods)})$"
        routes.append(
            {
                "name": f"refused-grpc-{kind}",
                "match": {"safe_regex": {"regex": grpc_paths}},
                "direct_response": {"status": 403, "body": {"inline_string": reason}},
                "typed_per_filter_config": without_model_match(),
            }
        )
        routes.append(
            {
                "name": f"refused-rest-{kind}",
                "match": {"safe_regex": {"regex": rest_regex}},
                # the reason alone: the listener's local-reply mapper makes it a KServe
                # error body, {"error": ...} (xds_local_replies.py `shed_reply`)
                "direct_response": {"status": 403, "body": {"inline_string": reason}},
                "typed_per_filter_config": without_model_match(),
            }
        )
    return routes


def compressed_route() -> dict:
    """The gRPC calls the filter marked compressed, refused: 404, which Envoy turns into
    UNIMPLEMENTED with the reason (`COMPRESSED`) for a gRPC client."""
    return {
        "name": "refused-grpc-compressed",
        "match": {
            "safe_regex": {"regex": named_methods_regex()},
            "headers": [{"name": COMPRESSED_HEADER, "present_match": True}],
        },
        "direct_response": {"status": 404, "body": {"inline_string": COMPRESSED}},
        "typed_per_filter_config": without_model_match(),
    }


# a request that is not gRPC (its content-type; a REST call may carry none): for a route's
# match and for a local-reply mapper's header filter alike
NOT_GRPC = {
    "name": "content-type",
    "string_match": {"prefix": "application/grpc"},
    "invert_match": True,
    "treat_missing_header_as_empty": True,
}

# the reason one Triton server gives for a path it does not serve, on its HTTP port; Envoy's
# local-reply mapper puts it in the KServe error body, {"error": "Not Found"}, as Triton does
NOT_FOUND = "Not Found"


def not_found_route() -> dict:
    """A request that is not gRPC and no route above took (a path outside /v2, `/V2`,
    `//v2`): Triton's own 404, rather than the default route's gRPC cluster, which answered
    a plain HTTP GET 200 with an empty gRPC body and a POST 503."""
    return {
        "name": "not-found",
        "match": {
            "prefix": "/",
            "headers": [NOT_GRPC],
        },
        "direct_response": {"status": 404, "body": {"inline_string": NOT_FOUND}},
        "typed_per_filter_config": without_model_match(),
    }

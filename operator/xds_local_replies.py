"""Envoy's own replies (the listener's local-reply mappers): a shed with its retry-after, a
model no server has ready said of that model, and every other error a REST client gets
from Envoy itself as a KServe error body; xds_resources.py puts them on the listener."""

from __future__ import annotations

import json

from sonicsite.contract.admission_pass import NO_PASS
from sonicsite.contract.wire import (
    ADMISSION_HEADER,
    ADMITTED_HEADER,
    MODEL_HEADER,
    RETRY_AFTER_HEADER,
)

from .xds_model_match import NOT_GRPC

# Envoy's reply when a model's cluster has no ready server (a server's model that did not
# load, the servers holding it down): retryable, as the 503 and UNAVAILABLE it comes with
NONE_READY = (
    "no server of the site has this model ready now (it did not load, or the servers "
    "holding it are down or restarting); retry later"
)


def shed_reply(retry_after_s: int) -> dict:
    """Envoy's own replies (the listener's local-reply mappers). Those to requests the
    fault filter refused (response flag FI) carry the retry-after and no admission pass:
    gRPC clients get RESOURCE_EXHAUSTED with the reason, REST clients 429 with it in a
    KServe error body (as the gateway answers).
    Every other error Envoy answers a REST client itself (a per-try timeout, no healthy
    server, a failed connection, a refused route) is a KServe error body too,
    {"error": <Envoy's reason>}: tritonclient reads that, where Envoy's plain text made it
    say "Parse error at offset 0" and hide the reason. gRPC clients get the reason in
    grpc-message already."""
    reason = (
        "model shed by sonicsite admission: its queue time per request is over the "
        f"threshold; retry after {retry_after_s} s"
    )
    headers = [
        {
            "header": {"key": RETRY_AFTER_HEADER, "value": str(retry_after_s)},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        },
        {
            "header": {"key": ADMISSION_HEADER, "value": "shed"},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        },
        # Envoy puts the route's response headers (the model's admission pass) on its own
        # replies too: a refused caller must not get a pass from its refusal
        {
            "header": {"key": ADMITTED_HEADER, "value": NO_PASS},
            "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
        },
    ]
    shed = {"response_flag_filter": {"flags": ["FI"]}}
    not_grpc = {"header_filter": {"header": NOT_GRPC}}
    rest = {"and_filter": {"filters": [shed, not_grpc]}}
    failed = {"status_code_filter": {"comparison": {"op": "GE", "value": _status(400)}}}
    # no ready server where a model was named (in its path, in its header): said of it
    none_ready = {"response_flag_filter": {"flags": ["UH"]}}
    model_path = {"string_match": {"prefix": "/v2/models/"}}
    rest_model = {"header_filter": {"header": {"name": ":path", **model_path}}}
    grpc_model = {"header_filter": {"header": {"name": MODEL_HEADER, "present_match": True}}}
    return {
        "mappers": [
            {
                "filter": rest,
                "headers_to_add": headers,
                "body": {"inline_string": json.dumps({"error": reason})},
                "body_format_override": {
                    "text_format_source": {"inline_string": "%LOCAL_REPLY_BODY%"},
                    "content_type": "application/json",
                },
            },
            {"filter": shed, "headers_to_add": headers, "body": {"inline_string": reason}},
            {  # Envoy's "no healthy upstream", said of the model (still 503, UNAVAILABLE)
                "filter": {"and_filter": {"filters": [none_ready, not_grpc, rest_model]}},
                "body_format_override": {"json_format": {"error": f"%REQ(:PATH)%: {NONE_READY}"}},
            },
            {
                "filter": {"and_filter": {"filters": [none_ready, grpc_model]}},
                "body_format_override": {
                    "text_format_source": {
                        "inline_string": f"model '%REQ({MODEL_HEADER})%': {NONE_READY}"
                    }
                },
            },
            {
                "filter": {"and_filter": {"filters": [failed, not_grpc]}},
                "body_format_override": {"json_format": {"error": "%LOCAL_REPLY_BODY%"}},
            },
        ]
    }


def _status(code: int) -> dict:
    """A status code in a local-reply filter's comparison (a RuntimeUInt32)."""
    return {"default_value": code, "runtime_key": f"sonicsite.local_reply.status_{code}"}

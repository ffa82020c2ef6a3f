"""Triton's own error replies for a model the gateway has no server for, so that a stock
client sees the texts one Triton server gives (Triton 2.51's HTTP frontend, checked against
a live server in tests/gateway/test_one_server_view.py).

Errors about a request's content (input names, datatypes, shapes, batch size, missing
inputs, versions) are not made here: the request goes to a server of the model and Triton
answers them itself. Only a model no server holds (unknown), or one whose every server is
out of the rotation now (unready), has no server to ask.

Each route kind says it in its own way: metadata, config and inference name the model as
unknown; readiness is a bare "not ready"; statistics say the model is not available.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse

MODEL, READY, STATS = "model", "ready", "stats"  # route kinds (metadata, config, infer: MODEL)


def _reply(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def unknown_model(kind: str, model: str) -> JSONResponse:
    """What Triton answers for a model it does not hold (with or without a version)."""
    if kind == READY:
        return _reply(400, "Model version not ready")
    if kind == STATS:
        return _reply(400, f"requested model '{model}' is not available")
    return _reply(404, f"Request for unknown model: '{model}' is not found")


def unready_model(kind: str, model: str, version: str | None) -> JSONResponse:
    """What Triton answers for a model it holds but not ready, with one change: metadata,
    config and inference answer 503, not Triton's 404 for an unversioned request, because on
    a site this is passing (servers restarting or draining) and clients retry a 503."""
    if kind != MODEL:
        return unknown_model(kind, model)
    if version is None:
        return _reply(503, f"Request for unknown model: '{model}' has no available versions")
    return _reply(
        503, f"Request for unknown model: '{model}' version {version} is not at ready state"
    )

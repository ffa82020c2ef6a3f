"""Triton's /metrics text as the load view reads it, for tests that hand it counters they
wrote: per model, versions summed (the operator reads a live server's with
operator/triton_metrics.py `read_metrics`)."""

from __future__ import annotations

from sonicsite.operator.triton_metrics import parse_versions, summed


def parse_metrics(text: str) -> dict[str, dict[str, float]]:
    """Triton's /metrics text as {model: {counter or gauge: value}}, versions summed
    (`parse_versions`)."""
    return summed(parse_versions(text))

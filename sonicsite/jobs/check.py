"""`sonicsite check`: one verified inference per model through a site's gRPC endpoint, what
the chart's `helm test` pod runs."""

from __future__ import annotations

from sonicsite.client import Client
from sonicsite.contract.wire import SiteRecord
from sonicsite.models.samples import generate


def check(grpc: str, models: list[str], events: int) -> int:
    """Send `events` events of each model through `grpc` with the sonicsite client and check
    every answer; prints a line per model, returns 1 if any model failed."""
    failed = 0
    with Client(SiteRecord(grpc=grpc, source="--grpc"), "grpc", "site") as client:
        for model in models:
            sample = generate(model, events, seed=7)
            result = client.stream(model, sample.spec, batch=events).run(
                sample, lambda lo, hi, outputs, s=sample: s.check(lo, hi, outputs)
            )
            ok = result.events_ok == events and not result.failed
            failed += not ok
            print(
                f"{model}: {result.events_ok}/{events} events answered and checked"
                + ("" if ok else f"; failed: {result.failed}")
            )
    return 1 if failed else 0

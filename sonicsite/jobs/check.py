"""`sonicsite check`: one verified inference per model through a site's gRPC endpoint, what
the chart's `helm test` pod runs: the demo sample of each model, or the request given for it
in an `--inputs` file (check_inputs.py; a site's own models have no demo sample)."""

from __future__ import annotations

import os
from pathlib import Path

from sonicsite.client import Client
from sonicsite.contract.wire import SiteRecord
from sonicsite.models.samples import GENERATORS, generate

from .check_inputs import load, send


def check(grpc: str, models: list[str], events: int, inputs: Path | None = None) -> int:
    """Send `events` events of each model through `grpc` with the sonicsite client and check
    every answer (a model in `inputs`: its request from the file); prints a line per model,
    returns 1 if any model failed."""
    requests = load(inputs) if inputs is not None else {}
    unknown = [m for m in models if m not in requests and m not in GENERATORS]
    if unknown:
        print(f"{', '.join(unknown)}: no demo sample; give a request for each in --inputs")
        return 1
    failed = 0
    token = os.environ.get("SONICSITE_TOKEN", "")
    for model in (m for m in models if m in requests):
        why = send(grpc, requests[model], token)
        failed += bool(why)
        print(f"{model}: the request from {inputs} " + (f"failed: {why}" if why else "answered"))
    with Client(SiteRecord(grpc=grpc, source="--grpc"), "grpc", "site") as client:
        for model in (m for m in models if m not in requests):
            sample = generate(model, events, seed=7)
            result = client.stream(model, sample.spec, batch=events).run(
                sample, lambda lo, hi, outputs, s=sample: s.check(lo, hi, outputs)
            )
            ok = result.events_ok == events and not result.failed
            failed += not ok
            print(
                f"{model}: {result.events_ok}/{events} events answered and checked"
                + ("" if ok else f"; failed through --grpc {grpc} (as 'envoy'): {result.failed}")
            )
    return 1 if failed else 0

"""`sonicsite check`: one verified inference per model through a site's gRPC endpoint, what
the chart's `helm test` pod runs: the demo sample of each model, or the request given for it
in an `--inputs` file (check_inputs.py; a site's own models have no demo sample)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from sonicsite.client import Client
from sonicsite.contract.wire import SiteRecord
from sonicsite.models.samples import GENERATORS, generate

from .check_inputs import load, send
from .error_kinds import plain_status

EXIT_USAGE = 2  # a model that cannot be checked, as argparse's usage errors
# events per request: the default --events in one request, more in more requests, each
# within any model's max batch (`simple` takes 8 rows; a graph event is many rows)
CHECK_BATCH = 4


def unknown_models(models: list[str], requests: dict, inputs: Path | None) -> str:
    """Why some of `models` cannot be checked (neither a demo model nor in the --inputs
    file), naming them and what is known; '' when every one can."""
    unknown = [m for m in models if m not in requests and m not in GENERATORS]
    if not unknown:
        return ""
    demo = f"the models with a demo sample are {', '.join(sorted(GENERATORS))}"
    if inputs is None:
        return (
            f"unknown model(s) {unknown}: {demo}; a site's own model needs a request for it "
            "in --inputs FILE"
        )
    held = ", ".join(sorted(requests)) or "none"
    return (
        f"model(s) {unknown}: --inputs {inputs} has no request for them (it has: {held}), "
        f"and {demo}"
    )


def check(grpc: str, models: list[str], events: int, inputs: Path | None = None) -> int:
    """Send `events` events of each model through `grpc` with the sonicsite client and check
    every answer (a model in `inputs`: its request from the file); prints a line per model
    and one per failed chunk (`failure_lines`), returns 1 if any model failed, EXIT_USAGE
    (saying why on stderr) for a model that has neither a demo sample nor a request in
    `inputs`."""
    requests = load(inputs) if inputs is not None else {}
    if why := unknown_models(models, requests, inputs):
        print(f"sonicsite check: argument --models: {why}", file=sys.stderr)
        return EXIT_USAGE
    failed = 0
    token = os.environ.get("SONICSITE_TOKEN", "")
    for model in (m for m in models if m in requests):
        why = send(grpc, requests[model], token)
        failed += bool(why)
        print(f"{model}: the request from {inputs} " + (f"failed: {why}" if why else "answered"))
    with Client(SiteRecord(grpc=grpc, source="--grpc"), "grpc", "site") as client:
        for model in (m for m in models if m not in requests):
            sample = generate(model, events, seed=7)
            result = client.stream(model, sample.spec, batch=min(events, CHECK_BATCH)).run(
                sample, lambda lo, hi, outputs, s=sample: s.check(lo, hi, outputs)
            )
            ok = result.events_ok == events and not result.failed
            failed += not ok
            print(
                f"{model}: {result.events_ok}/{events} events answered and checked"
                + ("" if ok else f"; failed through --grpc {grpc} (as 'envoy'):")
            )
            for line in failure_lines(result.failed):
                print(f"  {line}")
    return 1 if failed else 0


def failure_lines(failed: dict[tuple[int, int], str]) -> list[str]:
    """A line per failed chunk, in event order: its events [lo, hi) and why, the gRPC status
    as gRPC names it ("events 0-4: envoy: NOT_FOUND: ...")."""
    return [f"events {lo}-{hi}: {plain_status(why)}" for (lo, hi), why in sorted(failed.items())]

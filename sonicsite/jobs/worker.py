"""One worker job: stream a sample's events through the site with the sonicsite client and
check every answer.

Run as `python -P -m sonicsite.worker ...` by the job-stream driver, as a batch job would be.
The client balances per request (or sends to the site's balanced endpoint), retries on
another server when one fails, and honours retry-after: a server that dies costs retries,
never events. Progress goes to stdout, one line per answered request; the result (every
event id answered, every request's timing) goes to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sonicsite.client import Client
from sonicsite.client.stats import StreamStats
from sonicsite.models.samples import DEFAULT_BATCH, AnswerError, generate


@dataclass
class JobResult:
    job: int
    model: str
    first_event: int
    events: int
    transport: str
    answered: dict[int, int] = field(default_factory=dict)  # event id -> verified answers
    failed: dict[int, str] = field(default_factory=dict)  # event id -> last error
    requests: list[tuple[float, float, str, int, bool]] = field(default_factory=list)
    retries: int = 0
    overloaded: int = 0
    client: dict = field(default_factory=dict)  # the stream's stats summary


def run_job(
    client: Client,
    model: str,
    job: int,
    events: int,
    batch: int,
    seed: int,
    window: int = 2,
    progress=None,
) -> tuple[JobResult, StreamStats]:
    """Send events [job*events, (job+1)*events) in requests of `batch` events."""
    sample = generate(model, events, seed + job, allocate=client.allocate)
    first = job * events
    result = JobResult(job, model, first, events, client.transport)
    lock = threading.Lock()
    done = [0]

    def on_result(lo: int, hi: int, outputs) -> None:
        try:
            sample.check(lo, hi, outputs)
        except AnswerError as exc:
            with lock:
                result.failed.update({first + i: str(exc) for i in range(lo, hi)})
            return
        with lock:
            for i in range(first + lo, first + hi):
                result.answered[i] = result.answered.get(i, 0) + 1
            done[0] += hi - lo
            if progress:
                progress(done[0])

    stream = client.stream(model, sample.spec, batch=batch, window=window)
    outcome = stream.run(sample, on_result)
    for (lo, hi), error in outcome.failed.items():
        result.failed.update({first + i: error for i in range(lo, hi)})
    result.retries, result.overloaded = outcome.retries, outcome.overloaded
    result.requests = [
        (r.start, r.latency_s, r.server, r.rows, r.ok) for r in outcome.stats.records
    ]
    result.client = outcome.stats.summary()
    return result, outcome.stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sonicsite.jobs.worker")
    parser.add_argument("--site", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--transport", default="grpc", choices=["grpc", "http", "shm", "cuda"])
    parser.add_argument(
        "--mode",
        default=None,
        choices=["site", "direct"],
        help="through the site's balancer (default when it has one) or direct",
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--metrics-textfile",
        type=Path,
        default=None,
        help="also write the stream's counters in Prometheus text format here",
    )
    args = parser.parse_args(argv)
    batch = args.batch or DEFAULT_BATCH.get(args.model, 8)

    def progress(done: int) -> None:
        print(f"progress {done}", flush=True)

    with Client.connect(transport=args.transport, mode=args.mode, site=args.site) as client:
        result, stats = run_job(
            client, args.model, args.job, args.events, batch, args.seed, args.window, progress
        )
    if args.metrics_textfile:
        args.metrics_textfile.write_text(stats.to_prometheus(job=f"{args.model}-{args.job}"))
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(result)))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

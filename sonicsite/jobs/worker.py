"""One worker job: stream a sample's events through the site with the sonicsite client and
check every answer.

Run as `python -P -m sonicsite.jobs.worker ...` by the job-stream driver, as a batch job
would be. The client balances per request (or sends to the site's balanced endpoint),
retries on another server when one fails, and honours retry-after: a server that dies costs
retries, never events. Every chunk's result goes to the job's journal as it arrives
(journal.py), so a rerun of a killed job (`--attempt 2`) sends only the events without one.
Progress goes to stdout (`progress OK FAILED`, the job's totals), and `alive` every second
from a thread of its own, so that the driver can tell a frozen worker from a slow one
(spawn.py); the result (every event answered or failed, every request's timing, the
worker's own exception if it failed) goes to a JSON file. A worker whose driver dies (the
pipe `--parent-fd` closes) stops at once.

`--backend local` runs the model in this process instead (the client's backend_local.py: the
TorchScript file under `--models-dir`, loaded at the first event, `--torch-threads` threads,
default 1, on `--device`); `--backend auto` sends to the site while it answers and runs in
process when it does not (backend_auto.py). The model's metadata then comes from its
config.pbtxt, so that a site that is down from the start costs no event: local never looks
for a site, and auto with no site file as the job starts (`sonicsite down` before a later
wave) runs every event in process, a switch with that reason (`connect`). The result's
`client` says how many events each backend ran (`rows_per_backend`), which chunks ran in
process (`local_events`) and every switch with its reason (`switches`).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sonicsite.client import Client, DiscoveryError
from sonicsite.client.backend_local import BACKENDS, COMPILES, LOCAL, LocalModels
from sonicsite.client.layout import Columns
from sonicsite.client.spec import ModelInfo
from sonicsite.client.stats import StreamStats
from sonicsite.client.stream_io import Source
from sonicsite.models.repository import load_entry
from sonicsite.models.samples import DEFAULT_BATCH, AnswerError, generate

from .arrivals import schedule
from .executions import request_tag
from .journal import Journal, JournalState, read_journal
from .lifeline import heartbeat, watch_parent
from .result import JobResult, write_result

MODELS_DIR = Path("build/models")  # where `sonicsite models build` writes (launcher's default)
EXIT_FAILED = 2  # the worker caught an exception and reported it in its result


@dataclass
class _Range:
    """Events [offset, offset + size) of a sample, as a source of their own."""

    sample: Source
    offset: int
    size: int
    cpu_s_per_event: float = 0.0  # the job's own work for an event before it is sent

    def __len__(self) -> int:
        return self.size

    def request(self, lo: int, hi: int) -> Columns:
        reconstruct(self.cpu_s_per_event * (hi - lo))
        return self.sample.request(self.offset + lo, self.offset + hi)


WORK_BLOCK = bytes(1 << 16)  # hashed over and over by `reconstruct`


def reconstruct(cpu_s: float) -> None:
    """The job's own CPU work for a request's events, a stand-in for its reconstruction:
    `cpu_s` of this thread's CPU time, so that a busy machine stretches it as it stretches
    real work. Hashing releases the GIL, as compiled reconstruction code runs: the requests
    in flight and the other threads' work go on meanwhile, as a job's do."""
    end = time.thread_time() + cpu_s
    while time.thread_time() < end:
        hashlib.sha256(WORK_BLOCK).digest()


def run_job(
    client: Client,
    model: str,
    job: int,
    events: int,
    batch: int,
    seed: int,
    window: int = 2,
    progress: Callable[[int, int], None] | None = None,
    journal: Journal | None = None,
    attempt: int = 1,
    stream: str = "local",
    prior: JournalState | None = None,
    rate: float = 0.0,
    start_at: float = 0.0,
    backend: str = "site",
    compile: str = "jit",
    resend_failed: bool = False,
    cpu_ms_per_event: float = 0.0,
    no_site: str = "",
) -> tuple[JobResult, StreamStats]:
    """Send the job's events [job*events, (job+1)*events) that have no result in `prior`
    (all of them by default; with `resend_failed`, those that failed too, but for a wrong
    answer) in requests of `batch` events; `progress(ok, failed)`. With
    `rate` (events per second), open loop: each request at its Poisson arrival from
    `start_at` (arrivals.py), up to `window` in flight; closed loop otherwise. `backend`:
    "site", "local" or "auto" (the client's; local and auto need the client's `local`).
    `cpu_ms_per_event`: the job's own CPU work per event, done as each request is made.
    `no_site`: why backend auto has no site to try (the client has none): every event runs
    in process, that switch recorded with its reason."""
    prior = prior or JournalState()
    times = schedule(events, batch, rate, seed + job, start_at or time.time()) if rate else None
    sample = generate(model, events, seed + job, allocate=client.allocate)
    first = job * events
    result = JobResult(job, model, first, events, client.transport, attempt=attempt)
    lock = threading.Lock()
    counts = list(prior.settled(resend_failed))
    merged = StreamStats()
    local_events: list[list[int]] = []  # [first, last + 1] of each chunk run in process
    switches: list[dict] = []
    runs_on = backend
    if no_site and backend == "auto":
        runs_on = LOCAL
        switches.append({"at": time.time(), "from": "site", "to": LOCAL, "reason": no_site})

    def tell() -> None:
        if progress:
            progress(counts[0], counts[1])

    if journal:
        journal.started(attempt)
    for offset, end in prior.missing(events, resend_failed):

        def on_result(lo: int, hi: int, outputs, offset: int = offset) -> None:
            lo, hi = offset + lo, offset + hi
            try:
                sample.check(lo, hi, outputs)
            except AnswerError as exc:
                with lock:
                    result.failed.update({first + i: str(exc) for i in range(lo, hi)})
                    counts[1] += hi - lo
                if journal:  # a wrong answer: final, a resend would be as wrong
                    journal.failed(attempt, lo, hi, str(exc), final=True)
                tell()
                return
            if journal:
                journal.answered(attempt, lo, hi)
            with lock:
                for i in range(first + lo, first + hi):
                    result.answered[i] = result.answered.get(i, 0) + 1
                counts[0] += hi - lo
            tell()

        def on_send(lo: int, hi: int, offset: int = offset) -> None:
            if journal:
                journal.sent(attempt, offset + lo, offset + hi)

        run = client.stream(
            model,
            sample.spec,
            batch=batch,
            window=window,
            request_tag=request_tag(stream, job),
            request_offset=offset,
            backend=runs_on,
            compile=compile,
        )
        arrivals = None
        if times is not None:
            arrivals = [times[(offset + lo) // batch] for lo in range(0, end - offset, batch)]
        resent = {(lo - offset, hi - offset) for lo, hi in prior.sent if offset <= lo < end}
        events = _Range(sample, offset, end - offset, cpu_ms_per_event / 1000)
        outcome = run.run(events, on_result, arrivals, on_send, resent)
        for (lo, hi), error in outcome.failed.items():
            lo, hi = offset + lo, offset + hi
            result.failed.update({first + i: error for i in range(lo, hi)})
            counts[1] += hi - lo
            if journal:
                journal.failed(attempt, lo, hi, error)
        tell()
        result.retries += outcome.retries
        result.overloaded += outcome.overloaded
        local_events += [[first + offset + lo, first + offset + hi] for lo, hi in outcome.local]
        switches += outcome.switches
        merged.merge(outcome.stats)
    result.requests = [(r.start, r.latency_s, r.server, r.rows, r.ok) for r in merged.records]
    result.client = merged.summary()
    rows = result.client["rows_per_path"]
    result.client["backend"] = backend
    result.client["rows_per_backend"] = {
        "site": sum(n for path, n in rows.items() if path != LOCAL),
        "local": rows.get(LOCAL, 0),
    }
    result.client["local_events"] = local_events
    result.client["switches"] = switches
    return result, merged


def config_info(model: str) -> ModelInfo:
    """A model's metadata from the repository's config.pbtxt, as its servers give it: what the
    in-process backend checks the spec against when the site may not answer."""
    return ModelInfo.from_config(load_entry(model).config_path)


def connect(args: argparse.Namespace, local: LocalModels | None) -> tuple[Client, str]:
    """The job's client, and why it has no site ('' when it has one). Backend local needs
    none (its models' metadata from their config.pbtxt); backend auto whose site is not there
    as the job starts (stopped by `sonicsite down` before a later wave) runs in process,
    rather than failing every event on the missing site file."""
    if args.backend == LOCAL:
        return Client(transport=args.transport, local=local), "backend local: no site used"
    try:
        site = Client.connect(transport=args.transport, mode=args.mode, site=args.site, local=local)
        return site, ""
    except DiscoveryError as exc:
        if args.backend != "auto":
            raise
        why = f"no site at {args.site} as the job started, so it runs in process ({exc})"
        return Client(transport=args.transport, local=local), why


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sonicsite.jobs.worker")
    parser.add_argument("--site", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--window", type=int, default=2)
    parser.add_argument("--transport", default="grpc", choices=["grpc", "http", "shm", "cuda"])
    parser.add_argument("--mode", default=None, choices=["site", "direct"])  # client's
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--backend",
        default="site",
        choices=list(BACKENDS),
        help="where the model runs: the site, this process (local), or the site with this "
        "process as fallback (auto)",
    )
    parser.add_argument("--compile", default="jit", choices=list(COMPILES))
    parser.add_argument(
        "--models-dir",
        type=Path,
        default=MODELS_DIR,
        help="backend local/auto: the built models (<dir>/<model>/1/model.pt)",
    )
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="backend local/auto: torch's intra- and inter-op threads (default 1)",
    )
    parser.add_argument("--device", default="cpu", help="backend local/auto: cpu or cuda[:N]")
    parser.add_argument(
        "--rate",
        type=float,
        default=0.0,
        help="open loop: events per second, in requests at Poisson arrivals (0: closed loop)",
    )
    parser.add_argument(
        "--start-at",
        type=float,
        default=0.0,
        help="open loop: when the job's arrivals start (epoch s; a rerun keeps its schedule)",
    )
    parser.add_argument(
        "--cpu-ms-per-event",
        type=float,
        default=0.0,
        help="the job's own CPU work per event (its reconstruction), in ms of CPU time",
    )
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--journal", type=Path, default=None, help="default: OUT.journal")
    parser.add_argument("--attempt", type=int, default=1, help="1 + the reruns before this one")
    parser.add_argument(
        "--resend-failed",
        action="store_true",
        help="send again the events the journal says failed (but for a wrong answer): "
        "`submit --resume`",
    )
    parser.add_argument("--stream", default="local", help="names the stream in request ids")
    parser.add_argument("--parent-fd", type=int, default=None, help="stop on this pipe's EOF")
    parser.add_argument(
        "--metrics-textfile", type=Path, default=None, help="the counters, Prometheus's text"
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.parent_fd is not None:
        watch_parent(args.parent_fd, args.job)
    journal_path = args.journal or args.out.with_suffix(".journal")
    batch = args.batch or DEFAULT_BATCH.get(args.model, 8)

    said = threading.Lock()  # one line at a time on stdout, from the heartbeat and the job

    def say(line: str) -> None:
        with said:
            print(line, flush=True)

    def progress(ok: int, failed: int) -> None:
        say(f"progress {ok} {failed}")

    stop_beating = heartbeat(say)

    first = args.job * args.events
    result = JobResult(
        args.job, args.model, first, args.events, args.transport, attempt=args.attempt
    )
    try:
        local = None
        if args.backend != "site":
            local = LocalModels(
                args.models_dir.resolve(),
                config_info,
                args.torch_threads,
                args.torch_threads,
                args.device,
            )
        prior = read_journal(journal_path)
        if prior.missing(args.events, args.resend_failed):
            client, no_site = connect(args, local)
            with client, Journal(journal_path) as journal:
                result, stats = run_job(
                    client,
                    args.model,
                    args.job,
                    args.events,
                    batch,
                    args.seed,
                    args.window,
                    progress,
                    journal,
                    args.attempt,
                    args.stream,
                    prior,
                    args.rate,
                    args.start_at,
                    args.backend,
                    args.compile,
                    args.resend_failed,
                    args.cpu_ms_per_event,
                    no_site,
                )
            if args.metrics_textfile:
                args.metrics_textfile.write_text(
                    stats.to_prometheus(job=f"{args.model}-{args.job}")
                )
    except Exception as exc:  # reported, never lost: the result and the console say it
        message = str(exc) or repr(exc)
        result.error = {
            "type": type(exc).__name__,
            "message": message,
            "job": args.job,
            "attempt": args.attempt,
        }
        print(f"job {args.job} ({args.model}): {type(exc).__name__}: {message}", file=sys.stderr)
        traceback.print_exc()
    state = read_journal(journal_path)
    reason = f"{result.error['type']}: {result.error['message']}" if result.error else ""
    result.fill(state, reason)
    write_result(result, args.out)
    stop_beating()
    return EXIT_FAILED if result.error else 0


if __name__ == "__main__":
    sys.exit(main())

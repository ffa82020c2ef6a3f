"""One worker job: stream a sample's events through the site and check every answer.

Run as `python -m sonicsite.worker ...` by the job-stream driver, as a batch job would be.
Each request picks a server (round robin from a per-job offset); a server that refuses or
drops the connection costs a retry on another server, never an event. Progress goes to
stdout, one line per request; the result (every event id answered, every request's timing)
goes to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from .samples import DEFAULT_BATCH, AnswerError, generate
from .state import SiteState

# gRPC status codes after which the same request is tried on another server.
RETRYABLE = {
    "StatusCode.UNAVAILABLE",
    "StatusCode.DEADLINE_EXCEEDED",
    "StatusCode.CANCELLED",
    "StatusCode.RESOURCE_EXHAUSTED",
    "StatusCode.INTERNAL",
}


@dataclass
class JobResult:
    job: int
    model: str
    first_event: int
    events: int
    answered: dict[int, int] = field(default_factory=dict)  # event id -> verified answers
    failed: dict[int, str] = field(default_factory=dict)  # event id -> last error
    requests: list[tuple[float, float, str, int, bool]] = field(default_factory=list)
    retries: int = 0


def _inputs(arrays: dict[str, np.ndarray]) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in arrays.items():
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        tensor.set_data_from_numpy(np.ascontiguousarray(array))
        inputs.append(tensor)
    return inputs


def run_job(
    servers: dict[str, str],
    model: str,
    job: int,
    events: int,
    batch: int,
    seed: int,
    timeout_s: float = 60.0,
    max_tries: int = 6,
    progress=None,
) -> JobResult:
    """Send events [job*events, (job+1)*events) in requests of `batch` events."""
    sample = generate(model, events, seed + job)
    first = job * events
    result = JobResult(job=job, model=model, first_event=first, events=events)
    clients = {sid: grpcclient.InferenceServerClient(addr) for sid, addr in servers.items()}
    order = sorted(clients)
    turn = random.Random(seed * 7919 + job).randrange(len(order))
    outputs = [grpcclient.InferRequestedOutput(n) for n in sample.outputs]
    for lo in range(0, events, batch):
        hi = min(lo + batch, events)
        inputs = _inputs(sample.request(lo, hi))
        error = ""
        for attempt in range(max_tries):
            sid = order[turn % len(order)]
            turn += 1
            start = time.time()
            try:
                reply = clients[sid].infer(model, inputs, outputs=outputs, client_timeout=timeout_s)
            except InferenceServerException as exc:
                result.requests.append((start, time.time() - start, sid, hi - lo, False))
                error = f"{sid}: {exc.status()}: {exc.message()}"
                if exc.status() not in RETRYABLE:
                    break
                result.retries += 1
                time.sleep(min(0.05 * 2**attempt, 1.0) * (0.5 + random.random()))
                continue
            result.requests.append((start, time.time() - start, sid, hi - lo, True))
            answer = {name: reply.as_numpy(name) for name in sample.outputs}
            try:
                sample.check(lo, hi, answer)
            except AnswerError as exc:
                error = str(exc)
                break
            for i in range(first + lo, first + hi):
                result.answered[i] = result.answered.get(i, 0) + 1
            error = ""
            break
        if error:
            for i in range(first + lo, first + hi):
                result.failed[i] = error
        if progress:
            progress(hi)
    for client in clients.values():
        client.close()
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sonicsite.worker")
    parser.add_argument("--site", type=Path, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--events", type=int, required=True)
    parser.add_argument("--batch", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    state = SiteState.load(args.site)
    servers = {s.id: s.grpc_address for s in state.servers if args.model in s.models}
    if not servers:
        print(f"no server of the site serves model {args.model!r}", file=sys.stderr)
        return 2
    batch = args.batch or DEFAULT_BATCH.get(args.model, 8)

    def progress(done: int) -> None:
        print(f"progress {done}", flush=True)

    result = run_job(
        servers, args.model, args.job, args.events, batch, args.seed, progress=progress
    )
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(result)))
    tmp.replace(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())

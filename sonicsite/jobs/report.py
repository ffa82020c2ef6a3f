"""The job-stream report: `report.json` (numbers) and `report.png` (report_plot.py), and the
console summary.

Figures for the whole stream and per model (`per_model`, the same keys): events ok, failed,
answered twice (`events_duplicated`, as the client saw it) and executed twice
(`events_executed_twice`, as the servers' execution logs saw it; None when the site keeps no
logs), throughput (the stream's over its duration, `duration_s`: the sum of its runs, a
resume's gap left out; a model's over its own active time, `active_s`: from its first
request to its last answer, within the runs), latency (None without an answer), events per
server and per path (`per_path`: envoy, gateway or direct, when the client reports
`rows_per_path`), retries, sheds (`overloaded`: RESOURCE_EXHAUSTED / 429 replies honoured),
reruns of jobs whose worker died, the tries that failed (`failed_tries`: path -> error
kind -> count, what the retries were for and where). Requests, latency, retries, sheds,
failed tries, `per_server` and `per_path` come from every attempt of a job that left a
result (its last, and the figures of earlier ones, `earlier`: a rerun, or a run before
`--resume`): the events answered by an attempt killed before it wrote one are
`events_server_unknown`. `errors`: the first
ERRORS_KEPT kinds of worker failures (type, message, jobs) and event errors, one kind for a
failure whatever its figures and detail (error_kinds.py: `kind`, an example `error`,
`variants`); `errors_total` counts every kind, `errors_left_out` and
`errors_left_out_events` those beyond.
Events of jobs that never started (submit stopped first) are `events_not_started`, apart
from `events_failed`, and in no error kind (`jobs_not_started` names the jobs). Where no
request was timed, `latency_unmeasured` says why (nothing answered, or the answers came to
attempts that ended without writing a result: their timings went with them).
`per_backend`: the events the site answered and those the workers' models ran in process
(`submit --backend local|auto`); `switches`: every switch of backend "auto", with its job,
time and reason. Events run in process are not looked for in the servers' execution logs.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from sonicsite.client.stats import StreamStats, latency_percentiles

from .error_kinds import error_kind
from .executions import Executions, summarize
from .report_plot import plot
from .result import NOT_STARTED, attempts_of
from .summary import print_summary as print_summary  # the console's view of the report

ERRORS_KEPT = 10  # error groups listed in report.json (the count says how many in all)


def _not_started(message: str) -> bool:
    """An event's failure that says it never went out (stream_run.py's NOT_STARTED)."""
    return message.startswith(f"{NOT_STARTED}: ")


def _events_not_started(results: list[dict]) -> int:
    """The events of these jobs that never went out: submit was stopped before their job
    started (in this run; what an earlier run answered or failed keeps its outcome)."""
    return sum(1 for r in results for m in r["failed"].values() if _not_started(m))


def _unmeasured(timed: int, answered: int, untimed: int) -> str | None:
    """Why there is no latency; None when `timed` requests were answered."""
    if timed:
        return None
    if not answered:
        return "no answers"
    if not untimed:
        return f"not measured: none of the {answered} events answered had its request timed"
    return (
        f"not measured: the {untimed} events answered were answered to attempts that ended "
        "without writing their results (stopped or killed): their requests' timings went "
        "with them"
    )


def _events(results: list[dict]) -> set[int]:
    return {e for r in results for e in range(r["first_event"], r["first_event"] + r["events"])}


def active_seconds(results: list[dict], runs: list[list[float]] | None = None) -> float:
    """From the first request's start to the last answer over these jobs (0 without any);
    with `runs` (a resumed stream's), only the time within them."""
    spans = [r["span"] for r in results if r.get("span")]
    if not spans:
        return 0.0
    first, last = min(s[0] for s in spans), max(s[1] for s in spans)
    if not runs:
        return last - first
    return sum(max(0.0, min(last, end) - max(first, start)) for start, end in runs)


def _reruns(result: dict) -> int:
    """The job's attempts that reran it after a worker left without a result: the driver's
    count (`reruns`), which leaves out a resume's first attempt; else all but the first."""
    return result.get("reruns", max(result.get("attempt", 1) - 1, 0))


def _server_unknown(result: dict) -> int:
    """Answers of a job that no request of its attempts accounts for: those of an attempt
    killed before it wrote its result (its requests went with it)."""
    answers = sum(result["answered"].values())
    recorded = sum(q[3] for a in attempts_of([result]) for q in a["requests"] if q[4])
    return max(0, answers - recorded)


def _summary(
    results: list[dict],
    duration: float,
    executions: Executions | None,
    own_time: bool,
    runs: list[list[float]] | None = None,
) -> dict:
    """The figures of `results`; throughput over `duration`, or over their own active time
    when `own_time` (a model's)."""
    expected = sum(r["events"] for r in results)
    answered: Counter[int] = Counter()
    for r in results:
        answered.update({int(k): v for k, v in r["answered"].items()})
    ok = sum(1 for v in answered.values() if v == 1)
    duplicated = sum(1 for v in answered.values() if v > 1)
    attempts = attempts_of(results)
    requests = [q for a in attempts for q in a["requests"]]
    good = [q for q in requests if q[4]]
    per_server: Counter[str] = Counter()
    for q in good:
        per_server[q[2]] += q[3]
    per_path: Counter[str] = Counter()
    per_backend: Counter[str] = Counter({"site": 0, "local": 0})
    for a in attempts:
        per_path.update((a.get("client") or {}).get("rows_per_path", {}))
        per_backend.update((a.get("client") or {}).get("rows_per_backend", {}))
    active = active_seconds(results, runs)
    over = active if own_time and active > 0 else duration
    in_process = {e for a in attempts for e in _local_events(a)}
    served = set(answered) - in_process
    checked = summarize(executions, served, _events(results) - in_process) if executions else None
    unstarted = _events_not_started(results)
    untimed = sum(_server_unknown(r) for r in results)
    return {
        "events_total": expected,
        "events_ok": ok,
        "events_failed": expected - ok - unstarted,
        "events_not_started": unstarted,
        "events_duplicated": duplicated,
        "events_executed_twice": checked["events_executed_twice"]
        if checked and checked["checked"]
        else None,
        "throughput_eps": round(ok / over, 2) if over > 0 else 0.0,
        "active_s": round(active, 3),
        "latency_ms": latency_percentiles([q[1] * 1e3 for q in good]),
        "latency_unmeasured": _unmeasured(len(good), len(answered), untimed),
        "requests": len(requests),
        "requests_failed": len(requests) - len(good),
        "retries": sum(a["retries"] or 0 for a in attempts),
        "failed_tries": _failed_tries(attempts),
        "overloaded": sum(a.get("overloaded") or 0 for a in attempts),
        "reruns": sum(_reruns(r) for r in results),
        "per_server": dict(sorted(per_server.items())),
        "events_server_unknown": untimed,
        "per_path": dict(sorted(per_path.items())),
        "per_backend": dict(sorted(per_backend.items())),
        "switches": _switches(attempts),
        "client": _client_totals(attempts),
        **({"executions": checked} if checked else {}),
    }


def _failed_tries(attempts: list[dict]) -> dict[str, dict[str, int]]:
    """The tries that failed (each retried, or its chunk's last), path -> error kind ->
    count: what the retries were for, and where (a client that kept no paths: `unknown`)."""
    tries: dict[str, Counter] = {}
    for a in attempts:
        client = a.get("client") or {}
        per_path = client.get("errors_per_path")
        if per_path is None and client.get("errors"):
            per_path = {"unknown": client["errors"]}
        for path, kinds in (per_path or {}).items():
            tries.setdefault(path, Counter()).update(kinds)
    return {path: dict(sorted(k.items())) for path, k in sorted(tries.items())}


def _local_events(result: dict) -> list[int]:
    """The events of a job that its worker's model ran in process."""
    chunks = (result.get("client") or {}).get("local_events", [])
    return [e for lo, hi in chunks for e in range(lo, hi)]


def _switches(results: list[dict]) -> dict:
    """Backend "auto"'s switches: how many each way, and each with its job, in time order."""
    every = [
        {"job": r["job"], **s} for r in results for s in (r.get("client") or {}).get("switches", [])
    ]
    every.sort(key=lambda s: s["at"])
    counts = Counter(f"{s['from']}->{s['to']}" for s in every)
    return {"count": dict(sorted(counts.items())), "first": every[:20]}


def _client_totals(results: list[dict]) -> dict:
    """The client's own accounting, summed over jobs: where the time went per request stage,
    payload copies, and Triton's queue and compute time per request on each server."""
    stats = [r["client"] for r in results if r.get("client")]
    totals = {
        key: round(sum(s.get(key, 0) for s in stats), 6)
        for key in ("pack_s", "serialize_s", "network_s", "payload_copies")
    }
    servers = StreamStats()
    for s in stats:  # request-weighted over the jobs, rounded once, as shown
        servers.merge(StreamStats(server_times=s.get("server_times", {})))
    totals["server_times_us"] = servers.server_times_us()
    return totals


def _errors(results: list[dict]) -> list[dict]:
    """Every kind of error (error_kinds.py): worker failures first (type, message, jobs),
    then event errors, most events first. `error` is the kind's most common message,
    `variants` how many distinct messages it had."""
    groups: dict[str, dict] = {}

    def group_of(message: str, **extra) -> dict:
        kind = error_kind(message)
        group = groups.setdefault(kind, {"kind": kind, "events": 0, "said": Counter()})
        if extra and "type" not in group:  # a worker's failure names the kind's type
            group.update(extra)
        return group

    for r in results:
        if r.get("error") and r["error"]["type"] != NOT_STARTED:  # counted apart, no error
            e = r["error"]
            message = f"{e['type']}: {e['message']}"
            group = group_of(message, type=e["type"])
            group["said"][message] += 1
            group.setdefault("jobs", set()).add(r["job"])
            group.setdefault("models", set()).add(r["model"])
        for error, n in Counter(r["failed"].values()).items():
            if _not_started(error):
                continue
            group = group_of(error)
            group["said"][error] += n
            group["events"] += n
            group.setdefault("jobs", set()).add(r["job"])
            group.setdefault("models", set()).add(r["model"])
    ordered = sorted(groups.values(), key=lambda g: ("type" not in g, -g["events"]))
    for group in ordered:
        said: Counter = group.pop("said")
        group["error"] = said.most_common(1)[0][0]
        if "type" in group:
            group["message"] = group["error"].removeprefix(f"{group['type']}: ")
        group["variants"] = len(said)
        group["jobs_total"] = len(group["jobs"])
        group["jobs"] = sorted(group["jobs"])[:20]
        group["models"] = sorted(group["models"])
    return ordered


def build_report(
    results: list[dict],
    started: float,
    finished: float,
    spec: dict,
    executions: Executions | None = None,
    runs: list[list[float]] | None = None,
) -> dict:
    """The report of a stream from its jobs' results (and the servers' executions of it).
    `runs`: the [start, end] of each run of a resumed stream; its duration is theirs."""
    duration = sum(end - start for start, end in runs) if runs else finished - started
    report = {
        "spec": spec,
        "duration_s": round(duration, 3),
        "runs": [[round(a, 3), round(b, 3)] for a, b in runs or [[started, finished]]],
        **_summary(results, duration, executions, own_time=False, runs=runs),
    }
    by_model: dict[str, list[dict]] = {}
    for r in results:
        by_model.setdefault(r["model"], []).append(r)
    report["per_model"] = {
        m: _summary(rs, duration, executions, own_time=True, runs=runs)
        for m, rs in sorted(by_model.items())
    }
    report["reruns_per_job"] = {str(r["job"]): _reruns(r) for r in results if _reruns(r)}
    report["jobs_without_result"] = [r["job"] for r in results if r.get("from_journal")]
    report["jobs_not_started"] = sorted(
        r["job"] for r in results if any(_not_started(m) for m in r["failed"].values())
    )
    errors = _errors(results)
    report["errors"] = errors[:ERRORS_KEPT]
    report["errors_total"] = len(errors)
    report["errors_left_out"] = len(errors[ERRORS_KEPT:])
    report["errors_left_out_events"] = sum(g["events"] for g in errors[ERRORS_KEPT:])
    return report


def write_report(report: dict, results: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, results, out / "report.png")

"""One failure, one kind: the report groups errors whatever their figures and detail."""

from __future__ import annotations

from pathlib import Path

from job_results import failed_job

from sonicsite.jobs.error_kinds import error_kind
from sonicsite.jobs.report import build_report, print_summary


def _unreachable(seconds: float, last: str) -> str:
    return (
        "site unreachable: no endpoint (envoy, gateway, triton-0, triton-1) has answered for "
        f"{seconds} s, since a chunk's tries began, and a chunk used up its tries on them; "
        f"the chunks left are not tried (last error: {last})"
    )


def test_figures_addresses_and_a_closing_detail_are_not_the_kind():
    a = _unreachable(10.5, "gateway: connection: ConnectionRefusedError(111, 'refused')")
    b = _unreachable(8.9, "triton-1: UNAVAILABLE: ipv4:127.0.0.1:36237: Connection refused")
    assert error_kind(a) == error_kind(b)
    assert "(last error" not in error_kind(a) and "N s" in error_kind(a)
    addresses = "ipv6:[::1]:8001 and 10.0.0.7:80 refused"
    assert error_kind(addresses) == "ipvN:<address> and <address> refused"
    # a parenthesis that is part of the words, not a detail after them, stays
    words = "ConnectionRefusedError(111, 'refused')"
    assert error_kind(words) == "ConnectionRefusedError(N, 'refused')"
    assert error_kind("model simple (version 2) not ready") == "model simple (version N) not ready"
    # what differs in words is another kind
    assert error_kind("timeout") != error_kind("unknown model")


def test_a_site_gone_for_every_job_is_one_kind_with_its_most_common_message(capsys):
    results = []
    for job, seconds in enumerate((10.5, 8.9, 10.0, 10.7)):
        message = _unreachable(seconds, f"triton-{job % 2}: UNAVAILABLE: refused")
        failed = {str(job * 10 + i): message for i in range(10 + job)}
        failed[str(job * 10 + 99)] = "envoy: UNAVAILABLE: [Errno 111] Connection refused"
        results.append(failed_job(job, failed))
    report = build_report(results, 0.0, 10.0, {})
    assert report["errors_total"] == 2
    gone, refused = report["errors"]
    assert gone["events"] == 10 + 11 + 12 + 13 and gone["jobs"] == [0, 1, 2, 3]
    assert gone["variants"] == 4  # the example: job 3's, the most events
    assert gone["error"] == _unreachable(10.7, "triton-1: UNAVAILABLE: refused")
    assert gone["kind"] == error_kind(gone["error"])
    assert refused["events"] == 4 and refused["variants"] == 1
    report["stopped_by"] = None
    print_summary(report, Path("out"))
    said = capsys.readouterr().out
    assert "(46 events; jobs [0, 1, 2, 3]; the most common of 4 messages of this kind)" in said


def test_a_worker_failure_kind_keeps_its_type_and_one_message():
    results = []
    for job, rows in enumerate((16, 32)):
        message = f"{rows} rows, at most 8"
        crash = {"type": "SpecError", "message": message, "job": job, "attempt": 1}
        failed = {str(job * 4 + i): f"SpecError: {rows} rows, at most 8" for i in range(4)}
        results.append({**failed_job(job, failed), "error": crash})
    (error,) = build_report(results, 0.0, 10.0, {})["errors"]
    assert error["type"] == "SpecError" and error["events"] == 8 and error["jobs"] == [0, 1]
    assert error["message"] in ("16 rows, at most 8", "32 rows, at most 8")
    assert error["error"] == f"SpecError: {error['message']}" and error["variants"] == 2


def test_a_grpc_status_is_one_kind_whether_or_not_python_prefixed_it(capsys):
    """tritonclient's control calls say "StatusCode.NOT_FOUND", the client's own gRPC
    "NOT_FOUND": one failure of Triton's, one kind, shown as gRPC names it."""
    unknown = "Request for unknown model: 'particlenet_ak4' has no available versions"
    control = {str(i): f"triton-0: StatusCode.NOT_FOUND: {unknown}" for i in range(3)}
    infer = {str(i): f"triton-1: NOT_FOUND: {unknown}" for i in range(3, 5)}
    report = build_report([failed_job(0, control | infer)], 0.0, 10.0, {})
    (error,) = report["errors"]
    assert error["events"] == 5 and error["variants"] == 2, report["errors"]
    assert error["kind"] == f"triton-N: NOT_FOUND: {unknown.replace('ak4', 'akN')}"
    # a word that only looks like it stays
    assert error_kind("MyStatusCode.NOT_FOUND") == "MyStatusCode.NOT_FOUND"

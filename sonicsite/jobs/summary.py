"""The job-stream report as the console shows it (`print_summary`), on one screen: the
headline figures, a line per model, the first errors, what became of the site, where the
files are. The figures are report.py's."""

from __future__ import annotations

from pathlib import Path

ERROR_SHOWN = 160  # characters of an error's message on the console; report.json has it all


def cut_at_word(text: str, limit: int) -> str:
    """`text`, or its start up to `limit` characters and " ...", cut between words, never
    inside one (a limit "16" cut to "1..." reads as another number): after the last whole
    clause ("; ") when that keeps half the room, else after the last whole word; whole when
    no space is near enough to cut at."""
    if len(text) <= limit:
        return text
    head = text[: limit - len(" ...") + 1]
    clause, space = head.rfind("; "), head.rfind(" ")
    at = clause if clause >= len(head) // 2 else space
    if at <= 0:
        return text
    return head[:at].rstrip(" ;,:") + " ..."


def _events_line(report: dict) -> str:
    """Events ok, failed, not started (apart: they never went out), answered twice."""
    unstarted = report.get("events_not_started", 0)
    return (
        f"events: {report['events_ok']}/{report['events_total']} ok, "
        f"{report['events_failed']} failed"
        + (f", {unstarted} not started" if unstarted else "")
        + f", {report['events_duplicated']} delivered twice"
        + (
            ""
            if report["events_executed_twice"] is None
            else f", {report['events_executed_twice']} executed twice"
        )
    )


def _latency(figures: dict) -> str:
    """The request latency's percentiles, or why there are none."""
    latency = figures["latency_ms"]
    if latency["p50"] is not None:
        return f"p50 {latency['p50']} ms, p90 {latency['p90']} ms, p99 {latency['p99']} ms"
    return figures.get("latency_unmeasured") or "no answers"


def _not_started_line(report: dict) -> str:
    """The jobs submit never started (it was stopped first), and how to run them."""
    jobs = report.get("jobs_not_started") or []
    shown = f"jobs {jobs[:8]}" + (f" and {len(jobs) - 8} more" if len(jobs) > 8 else "")
    of = f"job {jobs[0]}" if len(jobs) == 1 else f"{len(jobs)} jobs ({shown})"
    return (
        f"not started: {report['events_not_started']} events of {of}: "
        "submit was stopped before they started; `sonicsite submit --resume` with the same "
        "--out runs them"
    )


def _stopped_line(report: dict) -> str:
    """The site stopped while the stream ran, and what failed with it ('' if it was not):
    said before the errors, which are then the servers' words as they shut down."""
    stopped = report.get("site_stopped")
    if not stopped:
        return ""
    return (
        f"the site was stopped during the stream (state: {stopped['state']}); "
        f"{stopped['events_failed']} events failed as its servers shut down"
    )


def _bare(note: str) -> str:
    """A pre-flight note as the summary repeats it: without `submit: ` and `; going on`."""
    return note.removeprefix("submit: ").removesuffix("; going on")


def _incident_lines(report: dict) -> list[str]:
    """What was wrong with the site as the stream began (the pre-flight's notes: a part
    dead, hung or not listening) and what befell its processes while it ran (restarted,
    silent for a while, died): the cause of its retries, slowness and events executed
    twice, named (at most 3 lines of each, then a count)."""
    shown = []
    for key, head in (("site_at_start", "site at the start"), ("site_incidents", "site")):
        said = [_bare(line) for line in report.get(key) or []]
        shown += [f"{head}: {line}" for line in said[:3]]
        if len(said) > 3:
            shown.append(f"{head}: {len(said) - 3} more in report.json ({key})")
    return shown


def _page_line(report: dict) -> str:
    """The site's status page while it runs, else that it is down ('' for neither known);
    that none was used (backend local, or auto with no site as each job started)."""
    if "no_site" in report:
        return f"site: none used ({report['no_site']})"
    if "links" in report:
        return f"site status page: {report['links']['status_page']}"
    if down := report.get("site_down"):
        return f"site status page: none, the site is down ({down})"
    return ""


def print_summary(report: dict, out: Path) -> None:
    """The report as the console shows it, on one screen: the headline figures, a line per
    model, the first errors, what became of the site, where the files are."""
    print(_events_line(report))
    if report.get("events_not_started"):
        print(_not_started_line(report))
    runs = report.get("runs") or []
    over = f"{report['duration_s']} s" + (f" in {len(runs)} runs" if len(runs) > 1 else "")
    print(f"throughput {report['throughput_eps']} events/s over {over}; latency {_latency(report)}")
    spread = ", ".join(f"{k} {v}" for k, v in report["per_server"].items())
    paths = ", ".join(f"{k} {v}" for k, v in (report.get("per_path") or {}).items())
    unknown = report.get("events_server_unknown", 0)
    print(
        f"events per server: {spread or '-'}; per path: {paths or '-'}"
        + (
            f"; {unknown} answered by attempts killed before their result (server unknown)"
            if unknown
            else ""
        )
    )
    backends = report.get("per_backend") or {}
    if backends.get("local"):
        moves = ", ".join(f"{k} {v}" for k, v in report["switches"]["count"].items())
        print(
            f"events per backend: site {backends.get('site', 0)}, in process "
            f"{backends['local']}; switches: {moves or 'none'}"
        )
        for switch in report["switches"]["first"][:3]:
            print(f"  job {switch['job']} to {switch['to']}: {cut_at_word(switch['reason'], 140)}")
    failed = "; ".join(
        f"{path}: " + ", ".join(f"{kind} {n}" for kind, n in kinds.items())
        for path, kinds in (report.get("failed_tries") or {}).items()
    )
    print(
        f"retries {report['retries']}, shed {report['overloaded']}, reruns {report['reruns']}"
        + (f"; tries failed on {failed}" if failed else "")
    )
    for model, s in report["per_model"].items():
        twice = s["events_executed_twice"]
        print(
            f"  {model}: {s['events_ok']}/{s['events_total']} ok, {s['events_failed']} failed, "
            + (f"{s['events_not_started']} not started, " if s.get("events_not_started") else "")
            + f"{s['throughput_eps']} events/s over {s['active_s']} s active, "
            + (
                f"p99 {s['latency_ms']['p99']} ms, "
                if s["latency_ms"]["p99"] is not None
                else ("no answers, " if _latency(s) == "no answers" else "latency not measured, ")
            )
            + f"{s['retries']} retries, "
            f"{s['overloaded']} shed, {s['reruns']} reruns"
            + ("" if twice is None else f", {twice} executed twice")
        )
    checked = report.get("executions", {})
    if checked.get("checked"):
        print(
            f"executions (servers' logs): {checked['events_executed_once']} events once, "
            f"{checked['events_executed_twice']} twice or more, "
            f"{checked['events_answered_not_logged']} answered but not logged"
        )
    elif checked:
        print(f"executions not checked: {checked['reason']}")
    if stopped := _stopped_line(report):
        print(stopped)
    for line in _incident_lines(report):
        print(line)
    for k, how in enumerate(report.get("runs_before_ended") or [], 1):
        if how != "finished":
            print(f"run {k} of this stream {how}; this run resumed it")
    for error in report["errors"][:5]:
        text = cut_at_word(error["error"], ERROR_SHOWN)
        jobs = error["jobs"][:8]
        more = error.get("jobs_total", len(jobs)) - len(jobs)
        jobs_said = f"jobs {jobs}" + (f" and {more} more" if more > 0 else "")
        variants = error.get("variants", 1)
        also = f"; the most common of {variants} messages of this kind" if variants > 1 else ""
        print(f"error: {text} ({error['events']} events; {jobs_said}{also})")
    total = report.get("errors_total", len(report["errors"]))
    if total > 5:
        listed = len(report["errors"]) - 5
        left_out = report.get("errors_left_out", 0)
        print(
            f"... {total - 5} more kind(s) of error: {listed} in report.json"
            + (
                f", {left_out} more not listed ({report['errors_left_out_events']} events)"
                if left_out
                else ""
            )
        )
    if report.get("stopped_by"):
        print(f"stopped by {report['stopped_by']}: the report holds what was done until then")
    if page := _page_line(report):
        print(page)
    print(f"report: {out / 'report.json'} and {out / 'report.png'}")

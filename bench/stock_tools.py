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
- `ratio`: perf_analyzer gRPC straight to the server that holds the model (direct) against
  through Envoy without any header, on each model, the paths taking turns within every
  repeat (in the reverse order every other repeat);
  `envoy_no_header_throughput_ratio_<model>` = median through Envoy / median direct. Like for
  like: on a second site of the same servers where triton-1 alone holds each measured model,
  so that Envoy can reach exactly the one server direct reaches (on the first site `simple`
  is on all three: Envoy's extra servers, not Envoy, would move the ratio where the servers
  are the bottleneck). Every Envoy run keeps the requests Envoy sent to each server (its
  admin counters, per cluster and host), and the JSON says which servers each path could
  use. Beside them, in the same turns: Envoy with the header (what finding the model in the
  body costs) and a bare Envoy, the router alone over the same server (`bare_envoy.py`): the
  floor any Envoy stands on here, so that the JSON says how much of the gap to direct is
  Envoy itself.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sonicsite.operator.admission import AdmissionPolicy

from sonicsite.contract.wire import MODEL_HEADER
from sonicsite.local import launcher
from sonicsite.local.state import SiteState

from . import bare_envoy
from .common import (
    Recorder,
    conditions,
    figure,
    in_turn,
    ratio_of_medians,
    sheds,
)
from .envoy_share import envoy_share, requests_per_host
from .perf_analyzer import (
    MAX_TRIALS,
    PINNED,
    STABILITY_PERCENT,
    UNSTABLE,
    Window,
    last3_mean,
    perf_analyzer_env,
    perf_analyzer_run,
    run_figures,
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
        record.update(throughput=last3_mean(windows, 0), p50_ms=last3_mean(windows, 1), p99_ms=None)
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


def holders(state: SiteState, model: str) -> list[str]:
    """The servers of the site that hold `model` (as it started them)."""
    return [s.id for s in state.servers if model in s.models]


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
            found[f"{path}/{model}"] = in_a_row_figures(
                protocol, target, holders(state, model), runs
            )
    return found


def in_a_row_figures(protocol: str, target: str, servers: list[str], runs: list[dict]) -> dict:
    """One path and model's runs in a row (`run_perf_analyzer`'s records): where they went,
    how many were ok, and the figures (`run_figures`: the runs each rests on, the unstable)."""
    return {
        "protocol": protocol,
        "target": target,
        "servers_it_could_use": servers,
        "runs_ok": sum(r["ok"] for r in runs),
        **run_figures(runs),
    }


def _one_turn(
    state: SiteState,
    model: str,
    targets: dict[str, str],
    runs: dict[str, list[dict]],
    repeat: int,
    options: Options,
    env: dict,
    workdir: Path,
) -> None:
    """One repeat: direct, the site's Envoy without and with the header, the bare Envoy
    (`targets`: each path's address), in the reverse order every other repeat."""
    headers = {"envoy_no_header": (), "envoy_with_header": (f"{MODEL_HEADER}:{model}",)}
    for path in in_turn(RATIO_PATHS, repeat):
        before = requests_per_host(state.envoy_admin) if path in headers else None
        record = run_perf_analyzer(
            targets[path], model, "grpc", options, env, workdir, headers.get(path, ())
        )
        if before is not None:
            record["envoy"] = envoy_share(state, before, requests_per_host(state.envoy_admin))
        runs[path].append(record)


def _ratio(state: SiteState, options: Options, env: dict, workdir: Path) -> dict[str, dict]:
    """Each model: direct gRPC to the server holding it vs through Envoy without a header
    (able to reach that one server only), taking turns within each repeat."""
    direct_server = state.server(HOLDER)
    found: dict[str, dict] = {}
    for model in options.models:
        runs: dict[str, list[dict]] = {p: [] for p in RATIO_PATHS}
        servers = [state.server(s).grpc for s in holders(state, model)]
        with bare_envoy.running(workdir, servers) as bare:
            targets = {
                "direct": direct_server.grpc,
                "envoy_no_header": state.grpc,
                "envoy_with_header": state.grpc,
                "envoy_bare": bare,
            }
            for repeat in range(options.repeats):
                _one_turn(state, model, targets, runs, repeat, options, env, workdir)
        figures = {path: run_figures(r) for path, r in runs.items()}

        shares = [r["envoy"]["share_per_server"] for r in runs["envoy_no_header"]]
        found[model] = {
            "servers_it_could_use": {
                "direct": [direct_server.id],
                "envoy_no_header": holders(state, model),
                "envoy_with_header": holders(state, model),
                "envoy_bare": holders(state, model),
            },
            "throughput_ratio_of_medians": ratio_of_medians(figures, "direct", "envoy_no_header"),
            "with_header_throughput_ratio_of_medians": ratio_of_medians(
                figures, "direct", "envoy_with_header"
            ),
            "bare_envoy_throughput_ratio_of_medians": ratio_of_medians(
                figures, "direct", "envoy_bare"
            ),
            "no_header_over_bare_envoy": ratio_of_medians(figures, "envoy_bare", "envoy_no_header"),
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
            **figures,
        }
    return found


@contextmanager
def _site(site_dir: Path, options: Options, holding: dict[str, list[str]]) -> Iterator[SiteState]:
    """A site of SERVERS servers with MODELS (`holding`: models some servers hold alone),
    admission at its defaults, no autoscaling; stopped however the block ends."""
    state = launcher.up(
        site_dir,
        servers=SERVERS,
        models=MODELS,
        build_dir=options.build_dir,
        admission=AdmissionPolicy(),  # the defaults, as the issue asks
        scaling=None,
        holding=holding,
    )
    try:
        yield state
    finally:
        launcher.down(site_dir)


def run(json_path: Path, options: Options | None = None) -> dict:
    """The runs in a row on a site where `simple` is on every server, then the ratio on
    one where triton-1 alone holds each measured model (like for like with direct); a run
    that fails part-way writes what it measured."""
    options = options or Options()
    record = Recorder(json_path, "stock_tools")
    record.site = {**conditions(AdmissionPolicy()), "sheds": None}
    in_a_row: dict = {}
    ratio: dict = {}
    record.details = {
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
            "pinned": PINNED,
            "headers": "none: perf_analyzer sends no sonicsite-model header",
        },
        "site": {
            "servers": [f"triton-{k}" for k in range(SERVERS)],
            "models": MODELS,
            "holding": {HELD: [HOLDER], "others": "every server"},
            "ratio_site_holding": {m: [HOLDER] for m in options.models},
            "admission": "defaults (AdmissionPolicy())",
            "autoscaling": "off",
        },
        "runs_in_a_row": in_a_row,
        "ratio": ratio,
        "figures": "runs_in_a_row: each path/model, every run as it came and figures of "
        "throughput (inferences/s), p50_ms, p99_ms; ratio: each model, direct (the one server "
        "that holds it on the ratio's site) vs Envoy without a header, turns within each "
        "repeat, Envoy's requests per server in every run; the summary's ratio: of medians",
    }
    shed = 0
    with record.measuring(), tempfile.TemporaryDirectory(prefix="sonicsite-bench-") as tmp:
        workdir = Path(tmp)
        env = perf_analyzer_env(workdir)
        with _site(workdir / "site", options, {HELD: [HOLDER]}) as state:
            in_a_row.update(_runs_in_a_row(state, options, env, workdir))
            shed += sheds(state)  # before the site stops: its counters go with it
        alone = {m: [HOLDER] for m in options.models}
        with _site(workdir / "ratio-site", options, alone) as state:
            ratio.update(_ratio(state, options, env, workdir))
            shed += sheds(state)
        record.site["sheds"] = shed
        return record.write(_summary(in_a_row, ratio, options, shed))


def _summary(in_a_row: dict, ratio: dict, options: Options, shed: int) -> dict:
    all_runs = [r for case in in_a_row.values() for r in case["runs"]]
    ratio_runs = [r for m in ratio.values() for p in RATIO_PATHS for r in m[p]["runs"]]
    return {
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

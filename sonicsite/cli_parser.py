"""The `sonicsite` command line's arguments: every command, its options and their checks
(cli.py dispatches them), and the site's tracing settings from `up`'s options."""

from __future__ import annotations

import argparse
from pathlib import Path

from .bench.commands import add_bench_parser
from .cli_placement import add_autoscale_arg, add_placement_args, add_tracing_args
from .cli_usage import (
    CHECK_EXIT,
    DEMO_EXIT,
    SUBMIT_EXIT,
    UP_EXIT,
    any_models,
    build_folder,
    held_models,
    host_port,
    model_list,
    option_conflicts,
    site_folder,
    tokens_file,
)
from .contract.options import at_least, non_negative, out_folder, zero_or_at_least
from .jobs.spawn import STILL_SAID_S
from .local.state import DEFAULT_SITE_DIR
from .models.frameworks import FRAMEWORKS, ONNX
from .operator.balancing import DEFAULT_POLICY, POLICIES
from .sim.commands import add_simulate_parser

DESCRIPTION = (
    "The `sonicsite` command line: parse the arguments, dispatch to the room that does the work."
)

DEMO_MODELS = ["particlenet_ak4", "deepmet"]


def _site_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir",
        type=site_folder,
        default=DEFAULT_SITE_DIR,
        help="site folder holding state.json, logs and the local repository (default "
        f"{DEFAULT_SITE_DIR})",
    )


def _up_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--servers", type=at_least(1), default=2, help="Triton servers to start (default 2)"
    )
    p.add_argument(
        "--build-dir",
        type=Path,
        default=Path("build/models"),
        help="where `sonicsite models build` wrote the ONNX files (default build/models)",
    )
    p.add_argument(
        "--ort-threads",
        type=at_least(1),
        default=1,
        help="onnxruntime threads per model instance (default 1)",
    )
    p.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default=ONNX,
        help="serve each model from its ONNX file (onnx, the default), or (pytorch) the models "
        "built from PyTorch from their TorchScript file (the others from ONNX)",
    )
    p.add_argument(
        "--balancing",
        choices=sorted(POLICIES),
        default=DEFAULT_POLICY,
        help="how Envoy spreads requests over a model's servers",
    )


def _stream_args(p: argparse.ArgumentParser, jobs: int, wave: int, events: int) -> None:
    p.add_argument(
        "--jobs", type=at_least(1), default=jobs, help=f"worker jobs in the stream (default {jobs})"
    )
    p.add_argument(
        "--wave", type=at_least(1), default=wave, help=f"jobs running at once (default {wave})"
    )
    p.add_argument(
        "--events", type=at_least(1), default=events, help=f"events per job (default {events})"
    )
    p.add_argument(
        "--batch", type=at_least(0), default=0, help="events per request (0: the model's default)"
    )
    p.add_argument(
        "--seed", type=at_least(0), default=1, help="the events' inputs: job J draws SEED + J"
    )
    p.add_argument(
        "--transport",
        choices=["grpc", "http", "shm", "cuda"],
        default="grpc",
        help="how workers send: hand-framed gRPC (to Envoy), HTTP binary (to the gateway), "
        "system or CUDA shared memory (to a server; --mode direct) (default grpc)",
    )
    p.add_argument(
        "--window", type=at_least(1), default=2, help="requests in flight per job (default 2)"
    )
    p.add_argument(
        "--max-attempts",
        type=at_least(1),
        default=3,
        help="runs of a job in all when its worker dies (the rerun sends only what is left; "
        "default 3)",
    )
    p.add_argument(
        "--worker-silence",
        type=at_least(10),
        default=60,
        metavar="SECONDS",
        help="a worker not heard from this long (it says it is alive every second) is "
        "frozen: killed, and its job rerun (default 60)",
    )
    p.add_argument(
        "--job-stall",
        type=zero_or_at_least(10),
        default=None,
        metavar="SECONDS",
        help="a worker that beats but has had no event answered this long (since its first "
        "line) is stuck (a deadlock, a loop that never ends): killed, and its job rerun. "
        "Default: an hour (3 times the longest wait of a healthy request: its tries, a "
        "shed, a model loading) plus the job's own work for all its events and, with "
        "--rate, its schedule's span; the report's spec says the one applied. 0: never. "
        f"Either way one standing still is named every {STILL_SAID_S:g} s",
    )
    p.add_argument(
        "--cpu-ms-per-event",
        type=non_negative,
        default=0.0,
        metavar="MS",
        help="each job's own CPU work per event before it is sent (a stand-in for its "
        "reconstruction), in ms of CPU time (default 0)",
    )
    p.add_argument(
        "--rate",
        type=non_negative,
        default=0.0,
        help="open loop: events per second offered by each wave, in requests at Poisson "
        "arrivals, each sent at its arrival or, when all --window requests of its job are "
        "out, once one is back (the report's latency counts from each try); 0: closed loop",
    )
    p.add_argument(
        "--mode",
        choices=["site", "direct"],
        default=None,
        help="site (default): through the site's endpoint, Envoy for --transport grpc (then "
        "the gateway) and the gateway for http, a server itself when those fail; direct: "
        "straight to the servers, balanced in the client (shared memory: always)",
    )
    p.add_argument(
        "--out",
        type=out_folder,
        default=Path("sonicsite-out"),
        help="where report.json, report.png and the job files go",
    )


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, parsed and checked: an option that needs another one it is given
    without is an error of the command's parser (exit status 2), naming both."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if why := option_conflicts(args):
        chosen = parser
        for name in (args.command, getattr(args, "models_command", None)):  # `models build`
            commands = [a for a in chosen._actions if isinstance(a, argparse._SubParsersAction)]
            chosen = commands[0].choices[name] if commands and name else chosen
        chosen.error(why)
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sonicsite", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="start a local site", epilog=UP_EXIT)
    _site_args(p)
    _up_args(p)
    p.add_argument(
        "--models",
        type=model_list,
        default=None,
        help="comma-separated models to serve (default: all)",
    )
    p.add_argument(
        "--no-supervise",
        action="store_true",
        help="start no supervisor: a process of the site that dies stays dead",
    )
    p.add_argument(
        "--hold",
        type=held_models,
        action="append",
        default=[],
        metavar="MODEL=SERVER[,SERVER]",
        help="a model only these servers load (repeatable; every server loads the others)",
    )
    add_placement_args(p)
    add_autoscale_arg(p)
    add_tracing_args(p)
    p.add_argument(
        "--tokens",
        type=tokens_file,
        default=None,
        metavar="FILE",
        help="bearer tokens, one per line: the gateway (the site's HTTP endpoint) answers only "
        "requests with `Authorization: Bearer <one of them>` (health and /metrics stay open); "
        "the sonicsite client sends SONICSITE_TOKEN",
    )

    p = sub.add_parser(
        "down",
        help="stop the local site",
        epilog="exit status: 0 when every process of the site stopped, or there was nothing "
        "to stop (no site in DIR, or none of its processes running); 1 when an `up` or `down` "
        "is under way there (its PID named), its state.json is not a site's, or a process "
        "outlived SIGKILL (named, and kept in state.json for the next `down`)",
    )
    _site_args(p)

    p = sub.add_parser(
        "supervise",
        help="start the site's supervisor again once it died (its processes run unwatched)",
        epilog="exit status: 0 once the supervisor answers; 1 when it is alive, the site is "
        "stopping, not started in full, or was started without one",
    )
    _site_args(p)

    from .local.placement_status import MODELS_STATUS_EXIT
    from .local.status import EXIT_HELP

    p = sub.add_parser(
        "status",
        help="show the local site: every process with its state and restarts",
        epilog=EXIT_HELP,
    )
    _site_args(p)
    p.add_argument("--json", action="store_true", help="print the site state as JSON")

    p = sub.add_parser(
        "submit", help="run a stream of worker jobs against the site", epilog=SUBMIT_EXIT
    )
    _site_args(p)
    p.add_argument(
        "--model",
        type=model_list,
        required=True,
        help="model, or comma-separated models that jobs take in turn",
    )
    _stream_args(p, jobs=4, wave=2, events=100)
    again = p.add_mutually_exclusive_group()
    again.add_argument(
        "--resume",
        action="store_true",
        help="finish the stream in --out (its submit was killed, or events failed): only what "
        "has no answer is sent; jobs with every event answered (or answered wrong) are kept, "
        "the others rerun for their events without an answer, failed ones included; "
        "--model, --jobs, --events, --seed, --batch and --dir must be the first run's",
    )
    again.add_argument(
        "--fresh",
        action="store_true",
        help="start a new stream in --out even though it holds an unfinished one (its journals "
        "are cleared); without it that is refused",
    )
    p.add_argument(
        "--backend",
        choices=["site", "local", "auto"],
        default="site",
        help="where the workers' models run: the site (default), in each worker's process "
        "(local: the TorchScript files of `models build`), or the site with the process as "
        "fallback when it does not answer or keeps shedding (auto)",
    )
    p.add_argument(
        "--models-dir",
        type=Path,
        default=None,
        help="with --backend local or auto: the repository `models build` wrote, where the "
        "workers find each model's PyTorch files (default build/models)",
    )
    p.add_argument(
        "--compile",
        choices=["jit", "aot"],
        default=None,
        help="with --backend local or auto: TorchScript (jit, the default) or the AOTInductor "
        "package (aot; compile it first with `models build --aot`, or submit compiles it)",
    )

    p = sub.add_parser(
        "demo", help="up + a ParticleNet and DeepMET job stream + down", epilog=DEMO_EXIT
    )
    _site_args(p)
    _up_args(p)
    _stream_args(p, jobs=8, wave=4, events=300)
    p.set_defaults(model=DEMO_MODELS)  # the stream's models, as --model names submit's

    add_bench_parser(sub)
    add_simulate_parser(sub)

    p = sub.add_parser("models", help="the model repository")
    msub = p.add_subparsers(dest="models_command", required=True)
    b = msub.add_parser("build", help="build the ONNX files deterministically")
    b.add_argument(
        "--out",
        type=build_folder,
        default=Path("build/models"),
        help="the folder the models are written to, OUT/<model>/1/ (default build/models)",
    )
    b.add_argument("--only", type=model_list, default=None, help="comma-separated models")
    b.add_argument(
        "--configs",
        action="store_true",
        help="also copy each config.pbtxt: OUT becomes a model repository for Triton's "
        "onnxruntime backend (the chart's demo models)",
    )
    b.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default=None,
        help="with --configs (default onnx): pytorch writes the PyTorch-backend config "
        "(TorchScript model.pt) for the models built from PyTorch, onnxruntime's for the others",
    )
    b.add_argument(
        "--aot",
        action="store_true",
        help="also compile each PyTorch model's exported program with AOTInductor (cached "
        "by program, torch and CPU; backend local compile='aot' compiles on first use else)",
    )

    st = msub.add_parser(
        "status",
        help="per model: the servers holding it, its footprint, its idle time",
        epilog=MODELS_STATUS_EXIT,
    )
    _site_args(st)
    st.add_argument(
        "--json",
        action="store_true",
        help="as JSON: the operator's /v1/placement as is; with placement off, each model's "
        "servers from the state file and which of them are ready, probed live",
    )

    p = sub.add_parser(
        "check", help="one verified inference per model through a gRPC endpoint", epilog=CHECK_EXIT
    )
    p.add_argument(
        "--grpc", type=host_port, required=True, help="host:port of the site's gRPC endpoint"
    )
    p.add_argument(
        "--models",
        type=any_models,
        required=True,
        help="comma-separated models (the site's own need a request in --inputs)",
    )
    p.add_argument("--events", type=at_least(1), default=4, help="events per model (default 4)")
    p.add_argument(
        "--inputs",
        type=Path,
        default=None,
        help="a JSON file of requests for models with no demo sample: {model: {inputs: "
        "[KServe v2 tensors], outputs: {name: expected values}, tolerance}}",
    )
    return parser

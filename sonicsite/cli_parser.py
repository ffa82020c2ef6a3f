"""The `sonicsite` command line's arguments: every command, its options and their checks
(cli.py dispatches them), and the site's tracing settings from `up`'s options."""

from __future__ import annotations

import argparse
from pathlib import Path

from .bench.commands import add_bench_parser
from .cli_placement import add_placement_args, add_tracing_args, site_option_orphans
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


def _model_list(text: str) -> list[str]:
    from .models.repository import model_names

    names = [n for n in text.split(",") if n]
    known = model_names()
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise argparse.ArgumentTypeError(
            f"unknown model(s) {unknown or [text]}; "
            f"expected a comma-separated list of: {', '.join(known)}"
        )
    return names


def _any_models(text: str) -> list[str]:
    """Model names as a site may have them (`check`: not only the demo models)."""
    names = [n for n in text.split(",") if n]
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated model names, got {text!r}")
    return names


def _host_port(text: str) -> str:
    """HOST:PORT (`check --grpc`): a host, and a port from 1 to 65535."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT with a port from 1 to 65535, e.g. 127.0.0.1:8001, got {text!r}"
        )
    if host.startswith("[") != host.endswith("]") or any(c.isspace() for c in host):
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}: bad host {host!r}")
    return text


def _tokens_file(text: str) -> Path:
    """`up --tokens FILE`: a readable file of bearer tokens, one per line, at least one."""
    path = Path(text).resolve()  # the gateway runs in the site's folder
    try:
        tokens = [t for t in path.read_text().splitlines() if t.strip()]
    except (OSError, UnicodeDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise argparse.ArgumentTypeError(f"{text}: cannot read a file of tokens: {why}") from None
    if not tokens:
        raise argparse.ArgumentTypeError(
            f"{text}: no token in it (one per line); it would refuse every request"
        )
    return path


def _site_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_SITE_DIR,
        help="site directory holding state.json, logs and the local repository",
    )


def _held(text: str) -> tuple[str, list[str]]:
    """MODEL=SERVER[,SERVER...]: a model that only the named servers hold."""
    model, sep, servers = text.partition("=")
    chosen = [s for s in servers.split(",") if s]
    if not sep or not model or not chosen:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected MODEL=SERVER[,SERVER...], e.g. particlenet_ak4=triton-0"
        )
    return _model_list(model)[0], chosen


def _up_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", type=at_least(1), default=2, help="Triton servers to start")
    p.add_argument(
        "--build-dir",
        type=Path,
        default=Path("build/models"),
        help="where `sonicsite models build` wrote the ONNX files",
    )
    p.add_argument(
        "--ort-threads", type=at_least(1), default=1, help="onnxruntime threads per model instance"
    )
    p.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default=ONNX,
        help="serve each model from its ONNX file, or (pytorch) the models built from "
        "PyTorch from their TorchScript file (the others from ONNX)",
    )
    p.add_argument(
        "--balancing",
        choices=sorted(POLICIES),
        default=DEFAULT_POLICY,
        help="how Envoy spreads requests over a model's servers",
    )


def _stream_args(p: argparse.ArgumentParser, jobs: int, wave: int, events: int) -> None:
    p.add_argument("--jobs", type=at_least(1), default=jobs, help="worker jobs in the stream")
    p.add_argument("--wave", type=at_least(1), default=wave, help="jobs running at once")
    p.add_argument("--events", type=at_least(1), default=events, help="events per job")
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
        help="how workers send: hand-framed gRPC, HTTP binary, system or CUDA shared memory",
    )
    p.add_argument("--window", type=at_least(1), default=2, help="requests in flight per job")
    p.add_argument(
        "--max-attempts",
        type=at_least(1),
        default=3,
        help="runs of a job in all when its worker dies (the rerun sends only what is left)",
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
        help="through the site's Envoy (default) or straight to the servers",
    )
    p.add_argument(
        "--out",
        type=out_folder,
        default=Path("sonicsite-out"),
        help="where report.json, report.png and the job files go",
    )


# submit's options for the models run in the workers (not with --backend site)
LOCAL_BACKEND_OPTIONS = ("compile", "models_dir")


def _option(dest: str) -> str:
    return "--" + dest.replace("_", "-")


SHARED_MEMORY_TRANSPORTS = ("shm", "cuda")


def option_conflicts(args: argparse.Namespace) -> str:
    """An option given without the one it belongs to (it would be ignored), or with one it
    cannot go with, in words; '' when there is none."""
    if args.command == "up" and (why := site_option_orphans(args)):
        return why
    shared = args.command in ("submit", "demo") and args.transport in SHARED_MEMORY_TRANSPORTS
    if shared and args.mode == "site":
        return (
            f"argument --transport {args.transport}: needs --mode direct (shared memory is "
            "written by the worker and read by a server on the same machine, not through "
            "Envoy); leave --mode out to get it"
        )
    if args.command == "submit" and args.backend == "site":
        for dest in LOCAL_BACKEND_OPTIONS:
            if getattr(args, dest) is not None:
                return (
                    f"argument {_option(dest)}: needs --backend local or auto (with --backend "
                    "site the models run on the site, not in the workers)"
                )
    return ""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, parsed and checked: an option that needs another one it is given
    without is an error of the command's parser (exit status 2), naming both."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if why := option_conflicts(args):
        commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        commands.choices[args.command].error(why)
    return args


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sonicsite", description=DESCRIPTION)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("up", help="start a local site")
    _site_args(p)
    _up_args(p)
    p.add_argument(
        "--models",
        type=_model_list,
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
        type=_held,
        action="append",
        default=[],
        metavar="MODEL=SERVER[,SERVER]",
        help="a model only these servers load (repeatable; every server loads the others)",
    )
    add_placement_args(p)
    add_tracing_args(p)
    p.add_argument(
        "--tokens",
        type=_tokens_file,
        default=None,
        metavar="FILE",
        help="bearer tokens, one per line: the gateway (the site's HTTP endpoint) answers only "
        "requests with `Authorization: Bearer <one of them>` (health and /metrics stay open); "
        "the sonicsite client sends SONICSITE_TOKEN",
    )

    p = sub.add_parser(
        "down",
        help="stop the local site",
        epilog="exit status: 0 when every process of the site stopped; 1 when there is no "
        "site in DIR, an `up` or `down` is under way there (its PID named), or a process "
        "outlived SIGKILL (named, and kept in state.json for the next `down`)",
    )
    _site_args(p)

    from .local.status import EXIT_HELP

    p = sub.add_parser(
        "status",
        help="show the local site: every process with its state and restarts",
        epilog=EXIT_HELP,
    )
    _site_args(p)
    p.add_argument("--json", action="store_true", help="print the site state as JSON")

    p = sub.add_parser("submit", help="run a stream of worker jobs against the site")
    _site_args(p)
    p.add_argument(
        "--model",
        type=_model_list,
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

    p = sub.add_parser("demo", help="up + a ParticleNet and DeepMET job stream + down")
    _site_args(p)
    _up_args(p)
    _stream_args(p, jobs=8, wave=4, events=300)

    add_bench_parser(sub)
    add_simulate_parser(sub)

    p = sub.add_parser("models", help="the model repository")
    msub = p.add_subparsers(dest="models_command", required=True)
    b = msub.add_parser("build", help="build the ONNX files deterministically")
    b.add_argument("--out", type=Path, default=Path("build/models"))
    b.add_argument("--only", type=_model_list, default=None, help="comma-separated models")
    b.add_argument(
        "--configs",
        action="store_true",
        help="also copy each config.pbtxt: OUT becomes a model repository for Triton's "
        "onnxruntime backend (the chart's demo models)",
    )
    b.add_argument(
        "--framework",
        choices=FRAMEWORKS,
        default=ONNX,
        help="with --configs: pytorch writes the PyTorch-backend config (TorchScript "
        "model.pt) for the models built from PyTorch, onnxruntime's for the others",
    )
    b.add_argument(
        "--aot",
        action="store_true",
        help="also compile each PyTorch model's exported program with AOTInductor (cached "
        "by program, torch and CPU; backend local compile='aot' compiles on first use else)",
    )

    st = msub.add_parser(
        "status", help="per model: the servers holding it, its footprint, its idle time"
    )
    _site_args(st)
    st.add_argument("--json", action="store_true", help="the operator's /v1/placement as is")

    p = sub.add_parser("check", help="one verified inference per model through a gRPC endpoint")
    p.add_argument(
        "--grpc", type=_host_port, required=True, help="host:port of the site's gRPC endpoint"
    )
    p.add_argument(
        "--models",
        type=_any_models,
        required=True,
        help="comma-separated models (the site's own need a request in --inputs)",
    )
    p.add_argument("--events", type=at_least(1), default=4, help="events per model")
    p.add_argument(
        "--inputs",
        type=Path,
        default=None,
        help="a JSON file of requests for models with no demo sample: {model: {inputs: "
        "[KServe v2 tensors], outputs: {name: expected values}, tolerance}}",
    )
    return parser

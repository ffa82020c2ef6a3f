"""The `sonicsite` command line: parse the arguments, dispatch to the room that does the work."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from .local.state import DEFAULT_SITE_DIR
from .operator.balancing import DEFAULT_POLICY, POLICIES

DEMO_MODELS = ["particlenet_ak4", "deepmet"]


def _at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"expected an integer ≥ {minimum}, got {text!r}"
            ) from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer ≥ {minimum}, got {value}")
        return value

    return parse


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


def _site_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--dir",
        type=Path,
        default=DEFAULT_SITE_DIR,
        help="site directory holding state.json, logs and the local repository",
    )


def _up_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--servers", type=_at_least(1), default=2, help="Triton servers to start")
    p.add_argument(
        "--build-dir",
        type=Path,
        default=Path("build/models"),
        help="where `sonicsite models build` wrote the ONNX files",
    )
    p.add_argument(
        "--ort-threads", type=_at_least(1), default=1, help="onnxruntime threads per model instance"
    )
    p.add_argument(
        "--balancing",
        choices=sorted(POLICIES),
        default=DEFAULT_POLICY,
        help="how Envoy spreads requests over a model's servers",
    )


def _stream_args(p: argparse.ArgumentParser, jobs: int, wave: int, events: int) -> None:
    p.add_argument("--jobs", type=_at_least(1), default=jobs, help="worker jobs in the stream")
    p.add_argument("--wave", type=_at_least(1), default=wave, help="jobs running at once")
    p.add_argument("--events", type=_at_least(1), default=events, help="events per job")
    p.add_argument(
        "--batch", type=_at_least(0), default=0, help="events per request (0: the model's default)"
    )
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--transport",
        choices=["grpc", "http", "shm", "cuda"],
        default="grpc",
        help="how workers send: hand-framed gRPC, HTTP binary, system or CUDA shared memory",
    )
    p.add_argument("--window", type=_at_least(1), default=2, help="requests in flight per job")
    p.add_argument(
        "--max-attempts",
        type=_at_least(1),
        default=3,
        help="runs of a job in all when its worker dies (the rerun sends only what is left)",
    )
    p.add_argument(
        "--rate",
        type=_non_negative,
        default=0.0,
        help="open loop: events per second offered by each wave, in requests at Poisson "
        "arrivals (latency counts from each request's arrival); 0: closed loop (--window)",
    )
    p.add_argument(
        "--mode",
        choices=["site", "direct"],
        default=None,
        help="through the site's Envoy (default) or straight to the servers",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("sonicsite-out"),
        help="where report.json, report.png and the job files go",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sonicsite", description=__doc__)
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

    p = sub.add_parser("down", help="stop the local site")
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
    p.add_argument(
        "--resume",
        action="store_true",
        help="go on with the stream in --out that a killed submit left: jobs with every "
        "event answered are kept, the others rerun for the events without a result",
    )

    p = sub.add_parser("demo", help="up + a ParticleNet and DeepMET job stream + down")
    _site_args(p)
    _up_args(p)
    _stream_args(p, jobs=8, wave=4, events=300)

    p = sub.add_parser("bench", help="benchmarks that write JSON with a summary of ratios")
    bsub = p.add_subparsers(dest="bench_command", required=True)
    b = _bench_parser(bsub, "client", "the sonicsite client vs the stock tritonclient way", 7)
    b.add_argument(
        "--sizes",
        type=_positive_list,
        default=(1, 16, 64),
        help="payload sizes in MB, comma-separated",
    )
    _bench_parser(bsub, "dataplane", "direct to Triton vs through Envoy", 3)
    _bench_parser(bsub, "gateway", "direct Triton HTTP vs through the gateway", 3)
    b = _bench_parser(
        bsub, "balancing", "round robin vs least request vs load-aware, one server slowed", 3
    )
    # defaults: bench/balancing.py's Options
    b.add_argument(
        "--slowdowns",
        type=lambda t: tuple(float(x) for x in t.split(",") if x),
        help="how many times slower the slow server is, comma-separated (1.25,1.5,2,3,5)",
    )
    b.add_argument("--work-ms", type=_non_negative, help="CPU work per request, every server")
    b.add_argument("--concurrency", type=_at_least(1), help="closed loop: requests in flight")
    b.add_argument("--requests", type=_at_least(50), help="closed loop: requests per turn")
    b.add_argument("--open-seconds", type=_non_negative, help="open loop: seconds per turn")
    b = _bench_parser(
        bsub, "faults", "strike each process of a local site mid-stream: lost, twice, recovery"
    )
    b.add_argument(
        "--scenarios",
        type=lambda t: tuple(x for x in t.split(",") if x),
        default=(),
        help="comma-separated scenarios (default: all)",
    )
    b.add_argument(
        "--duration", type=_at_least(20), default=40, help="seconds of arrivals per scenario"
    )
    b.add_argument(
        "--rate",
        type=_non_negative,
        default=0.0,
        help="offered events per second (default: half the capacity measured first)",
    )

    b = bsub.add_parser("report", help="the benches' JSON files as one Markdown page with plots")
    b.add_argument("inputs", type=Path, nargs="+", help="JSON files the benches wrote")
    b.add_argument(
        "--out", type=Path, default=Path("docs/bench"), help="where REPORT.md and the PNGs go"
    )

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

    p = sub.add_parser("check", help="one verified inference per model through a gRPC endpoint")
    p.add_argument("--grpc", required=True, help="host:port of the site's gRPC endpoint (Envoy)")
    p.add_argument("--models", type=_model_list, required=True, help="comma-separated models")
    p.add_argument("--events", type=_at_least(1), default=4, help="events per model")
    return parser


def _bench_parser(bsub, name: str, help: str, repeats: int = 0) -> argparse.ArgumentParser:
    """A bench's parser with what every bench takes: --json, --build-dir (and --repeats)."""
    b = bsub.add_parser(name, help=help)
    b.add_argument("--json", type=Path, required=True, help="where to write the result")
    if repeats:
        b.add_argument("--repeats", type=_at_least(1), default=repeats, help="timed repeats")
    b.add_argument("--build-dir", type=Path, default=Path("build/models"))
    return b


def _non_negative(text: str) -> float:
    """A number ≥ 0 (an argparse type)."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"expected a number ≥ 0, got {text!r}")
    return value


def _positive_list(text: str) -> tuple[int, ...]:
    """Comma-separated positive integers (an argparse type)."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated positive integers, got {text!r}"
        )
    return values


def _bench(args: argparse.Namespace) -> dict:
    if args.bench_command == "client":
        from .bench import client

        return client.run(args.json, args.repeats, args.sizes, args.build_dir)
    if args.bench_command == "dataplane":
        from .bench import dataplane

        return dataplane.run(args.json, args.repeats, args.build_dir)
    if args.bench_command == "gateway":
        from .bench import gateway

        return gateway.run(args.json, args.repeats, args.build_dir)
    if args.bench_command == "faults":
        from .bench import faults

        return faults.run(args.json, args.scenarios, args.duration, args.build_dir, args.rate)
    from .bench import balancing

    given = {
        "repeats": args.repeats,
        "work_ms": args.work_ms,
        "slowdowns": args.slowdowns,
        "concurrency": args.concurrency,
        "closed_requests": args.requests,
        "open_s": args.open_seconds,
        "build_dir": args.build_dir,
    }
    options = balancing.Options(**{k: v for k, v in given.items() if v is not None})
    return balancing.run(args.json, options)


def _models(args: argparse.Namespace) -> int:
    from .models.builders import build
    from .models.repository import copy_configs

    manifest = build(args.out, args.only)
    for name, files in sorted(manifest.items()):
        for fname, digest in files.items():
            print(f"{name}/1/{fname}  sha256 {digest[:16]}")
    if args.configs:
        for path in copy_configs(args.out, args.only):
            print(f"{path.relative_to(args.out)}")
    return 0


def _submit(args: argparse.Namespace, models: list[str]) -> int:
    """Run the job stream; 0 when every event was answered exactly once, 1 otherwise, and
    128 + the signal when SIGINT or SIGTERM stopped it."""
    from .jobs.driver import StreamSpec, submit
    from .jobs.progress import progress_bar
    from .jobs.report import print_summary

    same = ("jobs", "wave", "events", "out", "batch", "seed", "transport", "window", "mode")
    spec = StreamSpec(
        site_dir=args.dir.resolve(),
        models=models,
        max_attempts=args.max_attempts,
        rate=args.rate,
        resume=getattr(args, "resume", False),  # submit only
        **{name: getattr(args, name) for name in same},
    )
    bar = progress_bar()
    report = submit(spec, bar, bar.note)
    bar.end()
    print_summary(report, args.out)
    if report["stopped_by"]:
        print(
            f"sonicsite {args.command}: stopped by {report['stopped_by']} after "
            f"{report['events_ok']}/{report['events_total']} events; every worker was "
            f"stopped; the report of what was done: {args.out / 'report.json'}",
            file=sys.stderr,
        )
        return 128 + signal.Signals[report["stopped_by"]].value
    return 0 if report["events_ok"] == report["events_total"] else 1


def _site(args: argparse.Namespace) -> int:
    """up, down, submit and demo: the commands that start or use a local site."""
    from .local.launcher import down, up
    from .local.status import print_status

    def start(models: list[str] | None):
        return up(
            args.dir,
            args.servers,
            models,
            args.build_dir,
            args.ort_threads,
            balancing=args.balancing,
            supervise=not getattr(args, "no_supervise", False),
        )

    if args.command == "up":
        state = start(args.models)
        print(f"site up in {state.site_dir}: {len(state.servers)} servers")
        return print_status(args.dir)
    if args.command == "down":
        stopped = down(args.dir)
        print(f"stopped {len(stopped)} server(s): {' '.join(map(str, stopped))}")
        return 0
    if args.command == "submit":
        return _submit(args, args.model)
    start(DEMO_MODELS)  # demo
    try:
        print_status(args.dir)
        code = _submit(args, DEMO_MODELS)
    finally:
        stopped = down(args.dir)
        print(f"site stopped ({len(stopped)} servers)")
    return code


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "models":
        return _models(args)
    if args.command == "check":
        from .jobs.check import check

        return check(args.grpc, args.models, args.events)
    if args.command == "status":
        from .local.status import print_status

        return print_status(args.dir, args.json)
    if args.command == "bench" and args.bench_command == "report":
        from .bench import report

        try:
            print(f"written: {report.run(args.inputs, args.out)}")
        except ValueError as exc:
            print(f"sonicsite bench report: {exc}", file=sys.stderr)
            return 1
        return 0
    if args.command == "bench":
        result = _bench(args)
        print(json.dumps(result["summary"], indent=2))
        print(f"written: {args.json}")
        return 0
    from .local.errors import SiteError

    try:
        return _site(args)
    except (SiteError, FileNotFoundError, ValueError) as exc:
        print(f"sonicsite {args.command}: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

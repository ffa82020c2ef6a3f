"""The `sonicsite` command line."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .operator.balancing import DEFAULT_POLICY, POLICIES
from .state import DEFAULT_SITE_DIR, SiteState

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

    p = sub.add_parser("down", help="stop the local site")
    _site_args(p)

    p = sub.add_parser("status", help="show the local site")
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

    p = sub.add_parser("demo", help="up + a ParticleNet and DeepMET job stream + down")
    _site_args(p)
    _up_args(p)
    _stream_args(p, jobs=8, wave=4, events=300)

    p = sub.add_parser("bench", help="benchmarks that write JSON with a summary of ratios")
    bsub = p.add_subparsers(dest="bench_command", required=True)
    b = bsub.add_parser("client", help="the sonicsite client vs the stock tritonclient way")
    b.add_argument("--json", type=Path, required=True, help="where to write the result")
    b.add_argument("--repeats", type=_at_least(1), default=7, help="timed repeats per case")
    b.add_argument("--sizes", default="1,16,64", help="payload sizes in MB, comma-separated")
    b.add_argument("--build-dir", type=Path, default=Path("build/models"))
    b = bsub.add_parser("dataplane", help="direct to Triton vs through Envoy")
    b.add_argument("--json", type=Path, required=True, help="where to write the result")
    b.add_argument("--repeats", type=_at_least(1), default=3, help="repeats per case")
    b.add_argument("--build-dir", type=Path, default=Path("build/models"))
    b = bsub.add_parser("gateway", help="direct Triton HTTP vs through the gateway")
    b.add_argument("--json", type=Path, required=True, help="where to write the result")
    b.add_argument("--repeats", type=_at_least(1), default=3, help="repeats per case")
    b.add_argument("--build-dir", type=Path, default=Path("build/models"))
    b = bsub.add_parser(
        "balancing", help="round robin vs least request vs load-aware weights, one slow server"
    )
    b.add_argument("--json", type=Path, required=True, help="where to write the result")
    b.add_argument("--repeats", type=_at_least(1), default=3, help="repeats per policy")
    b.add_argument(
        "--delay-ms", type=_at_least(1), default=40, help="how much slower the slow server is"
    )
    b.add_argument(
        "--concurrency",
        default="2,8",
        help="requests the stream keeps in flight, comma-separated",
    )
    b.add_argument("--build-dir", type=Path, default=Path("build/models"))

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


def cmd_status(args: argparse.Namespace) -> int:
    from .site import alive
    from .triton import is_ready

    try:
        state = SiteState.load(args.dir)
    except FileNotFoundError as exc:
        print(exc, file=sys.stderr)
        return 1
    live = {s.id: alive(s.pid) and is_ready(s.http_address) for s in state.servers}
    if args.json:
        data = json.loads(state.to_json())
        for server in data["servers"]:
            server["ready"] = live[server["id"]]
        print(json.dumps(data, indent=2))
        return 0
    print(f"site {state.site_dir}: {sum(live.values())}/{len(state.servers)} servers ready")
    for s in state.servers:
        print(
            f"  {s.id:<10} pid {s.pid:<7} grpc {s.grpc_address:<22} http {s.http_address:<22} "
            f"metrics {s.metrics_url}  {'ready' if live[s.id] else 'NOT READY'}"
        )
    print(f"  models: {', '.join(state.models)}")
    if state.grpc:
        print(f"  gRPC endpoint (Envoy): {state.grpc}   Envoy admin: http://{state.envoy_admin}")
        print(f"  operator: http://{state.operator}/v1/state  http://{state.operator}/metrics")
    if state.http:
        print(
            f"  gateway (KServe v2 HTTP): {state.http}   status page: http://{state.http}/   "
            f"discovery: SONICSITE_URL=http://{state.http}"
        )
    if state.prometheus:
        print(f"  Prometheus (site rules, every target): http://{state.prometheus}/")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """What the chart's `helm test` runs: the sonicsite client through Envoy, answers checked."""
    from .client import Client
    from .client.discovery import SiteInfo
    from .samples import generate

    failed = 0
    with Client(SiteInfo((), grpc=args.grpc, source="--grpc"), "grpc", "site") as client:
        for model in args.models:
            sample = generate(model, args.events, seed=7)
            result = client.stream(model, sample.spec, batch=args.events).run(
                sample, lambda lo, hi, outputs, s=sample: s.check(lo, hi, outputs)
            )
            ok = result.events_ok == args.events and not result.failed
            failed += not ok
            print(
                f"{model}: {result.events_ok}/{args.events} events answered and checked"
                + ("" if ok else f"; failed: {result.failed}")
            )
    return 1 if failed else 0


def _positive_list(text: str, option: str) -> tuple[int, ...] | None:
    """Comma-separated positive integers, or None after saying what was wrong."""
    try:
        values = tuple(int(v) for v in text.split(","))
        if all(v > 0 for v in values):
            return values
    except ValueError:
        pass
    print(
        f"sonicsite bench: {option}: expected comma-separated positive integers, got {text!r}",
        file=sys.stderr,
    )
    return None


def cmd_bench(args: argparse.Namespace) -> int:
    if args.bench_command in ("dataplane", "balancing", "gateway"):
        from .bench import balancing, dataplane, gateway

        if args.bench_command == "dataplane":
            result = dataplane.run(args.json, args.repeats, args.build_dir)
        elif args.bench_command == "gateway":
            result = gateway.run(args.json, args.repeats, args.build_dir)
        else:
            concurrencies = _positive_list(args.concurrency, "--concurrency")
            if concurrencies is None:
                return 2
            result = balancing.run(
                args.json,
                args.repeats,
                args.delay_ms,
                concurrencies=concurrencies,
                build_dir=args.build_dir,
            )
        print(json.dumps(result["summary"], indent=2))
        print(f"written: {args.json}")
        return 0
    from .bench import client as bench_client

    sizes = _positive_list(args.sizes, "--sizes")
    if sizes is None:
        return 2
    result = bench_client.run(args.json, args.repeats, sizes, args.build_dir)
    print(json.dumps(result["summary"], indent=2))
    print(f"written: {args.json}")
    return 0


def _print_report(report: dict, out: Path) -> None:
    keys = [
        "events_total",
        "events_ok",
        "events_failed",
        "events_duplicated",
        "throughput_eps",
        "latency_ms",
        "per_server",
        "retries",
        "duration_s",
    ]
    print(json.dumps({k: report[k] for k in keys}, indent=2))
    for model, summary in report["per_model"].items():
        print(
            f"  {model}: {summary['events_ok']}/{summary['events_total']} ok, "
            f"{summary['throughput_eps']} events/s, p99 {summary['latency_ms']['p99']} ms"
        )
    if "links" in report:
        print(f"site status page: {report['links']['status_page']}")
    print(f"report: {out / 'report.json'} and {out / 'report.png'}")


def _submit(args: argparse.Namespace, models: list[str]) -> dict:
    from .jobs import StreamSpec, progress_bar, submit

    spec = StreamSpec(
        site_dir=args.dir.resolve(),
        models=models,
        jobs=args.jobs,
        wave=args.wave,
        events=args.events,
        out=args.out,
        batch=args.batch,
        seed=args.seed,
        transport=args.transport,
        window=args.window,
        mode=args.mode,
    )
    report = submit(spec, progress_bar())
    _print_report(report, args.out)
    return report


def _stream_ok(report: dict) -> bool:
    return report["events_ok"] == report["events_total"]


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "models":
        from .models.builders import build

        manifest = build(args.out, args.only)
        for name, files in sorted(manifest.items()):
            for fname, digest in files.items():
                print(f"{name}/1/{fname}  sha256 {digest[:16]}")
        if args.configs:
            from .models.repository import copy_configs

            for path in copy_configs(args.out, args.only):
                print(f"{path.relative_to(args.out)}")
        return 0
    if args.command == "check":
        return cmd_check(args)
    if args.command == "status":
        return cmd_status(args)
    if args.command == "bench":
        return cmd_bench(args)

    from .site import SiteError, down, up
    from .triton import TritonError

    try:
        if args.command == "up":
            state = up(
                args.dir,
                args.servers,
                args.models,
                args.build_dir,
                args.ort_threads,
                balancing=args.balancing,
            )
            print(f"site up in {state.site_dir}: {len(state.servers)} servers")
            return cmd_status(argparse.Namespace(dir=args.dir, json=False))
        if args.command == "down":
            stopped = down(args.dir)
            print(f"stopped {len(stopped)} server(s): {' '.join(map(str, stopped))}")
            return 0
        if args.command == "submit":
            return 0 if _stream_ok(_submit(args, args.model)) else 1
        if args.command == "demo":
            up(
                args.dir,
                args.servers,
                DEMO_MODELS,
                args.build_dir,
                args.ort_threads,
                balancing=args.balancing,
            )
            try:
                cmd_status(argparse.Namespace(dir=args.dir, json=False))
                report = _submit(args, DEMO_MODELS)
            finally:
                stopped = down(args.dir)
                print(f"site stopped ({len(stopped)} servers)")
            return 0 if _stream_ok(report) else 1
    except (SiteError, TritonError, FileNotFoundError, ValueError) as exc:
        print(f"sonicsite {args.command}: {exc}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    sys.exit(main())

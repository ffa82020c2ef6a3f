"""`sonicsite bench ...`: the bench subcommands' parsers and what each one runs. Every bench
writes its JSON and prints its summary; `report` turns those files into one page. The
command line (`sonicsite.cli`) adds these parsers and hands a parsed `bench` over here."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path

from ..contract.options import at_least, names, names_of, non_negative, positive, positive_list
from ..sim.output import unwritable
from .targets import line as targets_line

STOCK_TOOLS_MODELS = ("simple", "particlenet_ak4")  # bench/stock_tools.py's Options.windows


def factors(text: str) -> tuple[float, ...]:
    """Comma-separated finite numbers ≥ 1, at least one (an argparse type): how many times
    slower (an infinitely slow server is one that is down: the faults bench's)."""
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or not all(math.isfinite(v) and v >= 1 for v in values):
        raise argparse.ArgumentTypeError(
            f"expected comma-separated finite numbers ≥ 1 (at least one), got {text!r}"
        )
    return values


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """The `bench` command and its subcommands, under the command line's subparsers."""
    p = sub.add_parser("bench", help="benchmarks that write JSON with a summary of ratios")
    bsub = p.add_subparsers(dest="bench_command", required=True)
    b = _bench_parser(bsub, "client", "the sonicsite client vs the stock tritonclient way", 15)
    b.add_argument(
        "--sizes",
        type=positive_list,
        default=(1, 16, 64),
        help="payload sizes in MB, comma-separated",
    )
    _bench_parser(bsub, "dataplane", "direct to Triton vs through Envoy", 3)
    _bench_parser(bsub, "gateway", "direct Triton HTTP vs through the gateway", 3)
    b = _bench_parser(
        bsub,
        "stock-tools",
        "perf_analyzer through Envoy (no header) and the gateway on a 3-server site",
        3,
    )
    # defaults: bench/stock_tools.py's Options
    b.add_argument("--runs", type=at_least(1), help="perf_analyzer runs in a row per path, model")
    b.add_argument(
        "--models",
        type=names_of(STOCK_TOOLS_MODELS, "model"),
        help="comma-separated, of simple,particlenet_ak4 (default: both)",
    )
    b.add_argument("--concurrency", type=at_least(1), help="perf_analyzer's concurrency")
    b = _bench_parser(
        bsub, "balancing", "round robin vs least request vs load-aware, one server slowed", 5
    )
    # defaults: bench/balancing.py's Options
    b.add_argument(
        "--slowdowns",
        type=factors,
        help="how many times slower the slow server is, comma-separated (1.25,1.5,2,3,5)",
    )
    b.add_argument("--work-ms", type=positive, help="CPU work per request, every server")
    b.add_argument("--concurrency", type=at_least(1), help="closed loop: requests in flight")
    b.add_argument("--requests", type=at_least(50), help="closed loop: requests per turn")
    b.add_argument("--open-seconds", type=positive, help="open loop: seconds per turn")
    b = _bench_parser(
        bsub, "faults", "strike each process of a local site mid-stream: lost, twice, recovery"
    )
    b.add_argument(
        "--scenarios", type=names, default=(), help="comma-separated scenarios (default: all)"
    )
    b.add_argument(
        "--duration", type=at_least(20), default=40, help="seconds of arrivals per scenario"
    )
    b.add_argument(
        "--rate",
        type=non_negative,
        default=0.0,
        help="offered events per second (default: half the capacity measured first)",
    )

    b = _bench_parser(
        bsub, "inprocess", "SoA to torch tensors in process: copies, conversion, inference", 7
    )
    # defaults: bench/inprocess.py's Options
    b.add_argument(
        "--batches",
        type=positive_list,
        help="direct-inference sweep, comma-separated (4,16,64,256,1024,2048)",
    )
    b.add_argument("--device", help="cpu (default) or cuda[:N]: the sweep's device")
    b.add_argument("--threads", type=at_least(1), help="torch threads (default 1)")
    b.add_argument(
        "--workflow-repeats", type=at_least(1), help="workflow runs per backend (default 3)"
    )

    b = _bench_parser(
        bsub, "placement", "models loaded on demand vs the best static placement, in phases", 1
    )
    # defaults: bench/placement.py's Options
    b.add_argument("--phase-s", type=positive, help="each phase's seconds (at most 60)")
    b.add_argument("--window", type=at_least(1), help="requests in flight per active model")

    b = bsub.add_parser(
        "report",
        help="the benches' JSON files as one Markdown page with plots",
        epilog="exit status: 0 written; 1 an input not a bench result or damaged, or --out "
        "not a folder that can take the page (the message names the file and why)",
    )
    b.add_argument("inputs", type=Path, nargs="+", help="JSON files the benches wrote")
    b.add_argument(
        "--out", type=Path, default=Path("docs/bench"), help="where REPORT.md and the PNGs go"
    )


def _bench_parser(
    bsub: argparse._SubParsersAction, name: str, help: str, repeats: int = 0
) -> argparse.ArgumentParser:
    """A bench's parser with what every bench takes: --json, --build-dir (and --repeats)."""
    b = bsub.add_parser(name, help=help)
    b.add_argument("--json", type=Path, required=True, help="where to write the result")
    if repeats:
        b.add_argument("--repeats", type=at_least(1), default=repeats, help="timed repeats")
    b.add_argument(
        "--build-dir",
        type=Path,
        default=Path("build/models"),
        help="the built model repository (`sonicsite models build`; default: %(default)s)",
    )
    return b


def run_bench(args: argparse.Namespace) -> int:
    """Run the parsed `bench` subcommand: print the summary and where the JSON went, or,
    for `report`, where the page went (1, naming the file and why, when an input is not a
    bench result or is damaged, or --out cannot take the page). A --json that cannot be
    written (a folder, a device, a FIFO: sim/output.py) and option values a bench refuses
    are a usage error (2), said before anything starts; a bench that fails part-way has
    written what it measured (common.Recorder), and its error is said in words (1; the
    traceback is in the JSON's details)."""
    if args.bench_command == "report":
        from . import report

        try:
            print(f"written: {report.run(args.inputs, args.out)}")
        except (ValueError, OSError) as exc:  # ReportError names the file; OSError its own
            print(f"sonicsite bench report: {exc}", file=sys.stderr)
            return 1
        return 0
    if why := unwritable(args.json):
        print(
            f"sonicsite bench {args.bench_command}: --json {args.json}: cannot write: {why}",
            file=sys.stderr,
        )
        return 2
    try:
        bench = _prepared(args)
    except ValueError as exc:  # the bench's Options refused a value
        print(f"sonicsite bench {args.bench_command}: {exc}", file=sys.stderr)
        return 2
    try:
        result = bench()
    except Exception as exc:  # in words, with where the result went (Recorder's note)
        notes = "".join(f"\n  {note}" for note in getattr(exc, "__notes__", []))
        print(
            f"sonicsite bench {args.bench_command}: failed: {type(exc).__name__}: {exc}{notes}",
            file=sys.stderr,
        )
        return 1
    print(said(result["summary"], args.json))
    return 0


def said(summary: dict, written: str) -> str:
    """What a bench that measured prints: its summary, whether it met its targets (a miss
    named with its figure and target), and where its JSON went."""
    return f"{json.dumps(summary, indent=2)}\n{targets_line(summary)}\nwritten: {written}"


def _prepared(args: argparse.Namespace) -> Callable[[], dict]:
    """The bench the arguments name, its options checked (ValueError: refused), ready to
    run; imported only here, so that the command line starts without the benches'
    packages."""
    if args.bench_command == "client":
        from . import client

        return lambda: client.run(args.json, args.repeats, args.sizes, args.build_dir)
    if args.bench_command == "dataplane":
        from . import dataplane

        return lambda: dataplane.run(args.json, args.repeats, args.build_dir)
    if args.bench_command == "gateway":
        from . import gateway

        return lambda: gateway.run(args.json, args.repeats, args.build_dir)
    if args.bench_command == "stock-tools":
        from . import stock_tools

        options = _options(
            stock_tools.Options,
            runs=args.runs,
            repeats=args.repeats,
            models=args.models,
            concurrency=args.concurrency,
            build_dir=args.build_dir,
        )
        return lambda: stock_tools.run(args.json, options)
    if args.bench_command == "faults":
        from . import faults

        faults.check_scenarios(args.scenarios)
        return lambda: faults.run(
            args.json, args.scenarios, args.duration, args.build_dir, args.rate
        )
    if args.bench_command == "inprocess":
        from . import inprocess

        options = _options(
            inprocess.Options,
            repeats=args.repeats,
            build_dir=args.build_dir,
            batches=args.batches,
            device=args.device,
            threads=args.threads,
            workflow_repeats=args.workflow_repeats,
        )
        return lambda: inprocess.run(args.json, options)
    if args.bench_command == "placement":
        from . import placement

        options = _options(
            placement.Options,
            repeats=args.repeats,
            phase_s=args.phase_s,
            window=args.window,
            build_dir=args.build_dir,
        )
        return lambda: placement.run(args.json, options)
    from . import balancing

    options = _options(
        balancing.Options,
        repeats=args.repeats,
        work_ms=args.work_ms,
        slowdowns=args.slowdowns,
        concurrency=args.concurrency,
        closed_requests=args.requests,
        open_s=args.open_seconds,
        build_dir=args.build_dir,
    )
    return lambda: balancing.run(args.json, options)


def _options(cls, **given):
    """A bench's Options from the command line: the options given, defaults for the rest."""
    return cls(**{k: v for k, v in given.items() if v is not None})

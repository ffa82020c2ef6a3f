"""The `sonicsite` command line: parse the arguments, dispatch to the room that does the work."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from .bench.commands import run_bench
from .cli_parser import DEMO_MODELS, parse_args
from .cli_parser import build_parser as build_parser  # the parser, unchecked (tests)
from .cli_placement import placement_settings, server_pools, tracing_config
from .sim.commands import CHECK_LOCAL, run_simulate


def _models(args: argparse.Namespace) -> int:
    if args.models_command == "status":
        from .local.placement_status import print_placement

        return print_placement(args.dir, args.json)
    from .models.builders import build
    from .models.frameworks import ONNX
    from .models.repository import copy_configs

    manifest = build(args.out, args.only)
    for name, files in sorted(manifest.items()):
        for fname, digest in files.items():
            print(f"{name}/1/{fname}  sha256 {digest[:16]}")
    if args.configs:
        for path in copy_configs(args.out, args.only, args.framework or ONNX):
            print(f"{path.relative_to(args.out)}")
    if args.aot:
        from .client.aot import aot_package, stale_packages
        from .models.builders import TORCH_BUILT

        for name in [n for n in sorted(args.only or manifest) if n in TORCH_BUILT]:
            package = aot_package(args.out / name / "1")
            done = f"compiled in {package.seconds:.0f} s" if package.compiled else "cached"
            print(f"{name}/1/aot/{package.key}/model.pt2  {done}")
            for stale in stale_packages(args.out / name / "1", package.key):
                print(f"  (also {stale.name}: another torch, CPU or program)")
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
        worker_silence_s=args.worker_silence,
        job_stall_s=args.job_stall,
        cpu_ms_per_event=args.cpu_ms_per_event,
        rate=args.rate,
        resume=getattr(args, "resume", False),  # submit only
        fresh=getattr(args, "fresh", args.command == "demo"),  # demo: a stream of its own site
        backend=getattr(args, "backend", "site"),  # submit only
        models_dir=getattr(args, "models_dir", None) or Path("build/models"),  # submit only
        compile=getattr(args, "compile", None) or "jit",  # submit only
        **{name: getattr(args, name) for name in same},
    )
    bar = progress_bar()
    report = submit(spec, bar, bar.note)
    bar.end()
    if args.command == "demo":  # its site stops right after: no page to visit
        report.pop("links", None)
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
    from .local.supervision import supervise_again
    from .models.kept_settings import kept_settings

    def start(models: list[str] | None):
        kept_settings(os.environ)  # the servers' runners read it: refused before they start
        pools = server_pools(args)
        return up(
            args.dir,
            len(pools) if pools else args.servers,
            models,
            args.build_dir,
            args.ort_threads,
            balancing=args.balancing,
            supervise=not getattr(args, "no_supervise", False),
            holding=dict(getattr(args, "hold", [])),
            tracing=tracing_config(args),
            placing=placement_settings(args),
            scaling=getattr(args, "autoscale", None),  # up only
            framework=args.framework,
            server_pools=server_pools(args),
            tokens=getattr(args, "tokens", None),  # up only
        )

    if args.command == "up":
        state = start(args.models)
        for number in (signal.SIGTERM, signal.SIGINT):  # up now: a signal leaves the site up
            signal.signal(number, signal.SIG_DFL)
        print(f"site up in {state.site_dir}: {len(state.servers)} servers")
        return print_status(args.dir)
    if args.command == "down":
        return _down(args.dir, down)
    if args.command == "supervise":
        record = supervise_again(args.dir)
        print(f"supervisor started again as pid {record.pid}: it watches the site's processes")
        return 0
    if args.command == "submit":
        return _submit(args, args.model)
    start(DEMO_MODELS)  # demo
    try:
        print_status(args.dir)
        code = _submit(args, DEMO_MODELS)
    finally:
        stopped = down(args.dir)
        print(f"site stopped ({len(stopped)} processes)")
    return code


def _down(site_dir: Path, down: Callable[..., dict[int, str]]) -> int:
    """`down`: 0 when the site is stopped, or when there was nothing to stop (a cleanup
    script or trap may call it twice); each process it had to SIGKILL said on stderr."""
    from .contract.wire import STATE_FILE

    recorded = (site_dir / STATE_FILE).is_file()
    stopped = down(site_dir, say=lambda note: print(f"sonicsite down: {note}", file=sys.stderr))
    if not stopped:
        why = "none of its site's processes was running" if recorded else "no site runs there"
        print(f"sonicsite down: nothing to stop in {site_dir}: {why}")
        return 0
    shown = ", ".join(f"{name} (pid {pid})" for pid, name in stopped.items())
    print(f"stopped {len(stopped)} process(es) of the site: {shown}")
    return 0


class Terminated(BaseException):
    """SIGTERM, raised where the main thread is: not an error for `except Exception` to
    take, it unwinds the command so that its `finally` blocks run."""


def _unwind_on_sigterm() -> None:
    """SIGTERM (a batch system's kill, `timeout`) unwinds a command as Ctrl-C does: the
    `finally` blocks that stop a bench's or the demo's own site run. Python's default would
    end the process at once and leave that site's servers, Envoy and the rest running."""

    def terminated(signum: int, _frame) -> None:
        raise Terminated(signum)

    signal.signal(signal.SIGTERM, terminated)


def _unwinding(command: str, run: Callable[[], int], starts_site: bool = True) -> int:
    """`run`, a command that must unwind if it is stopped (every bench, simulate, demo, and
    `up` until the site is up: those that start a site stop it), stopped by SIGTERM as by
    Ctrl-C (`submit`'s driver takes SIGTERM itself, stopping its workers); says so, and
    returns 128 + the signal."""
    _unwind_on_sigterm()
    try:
        return run()
    except (Terminated, KeyboardInterrupt) as exc:
        number = signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT
        stopped = "; the site it had started was stopped" if starts_site else ""
        said = "".join(f"\n  {note}" for note in getattr(exc, "__notes__", []))  # a bench's
        print(
            f"sonicsite {command}: stopped by {number.name} before it finished{stopped}{said}",
            file=sys.stderr,
        )
        return 128 + number.value


EXIT_READER_GONE = 141  # as a shell reports a command killed by SIGPIPE (128 + 13)


def main(argv: list[str] | None = None) -> int:
    """The command's exit status. The reader of its output gone (`sonicsite status | head
    -1`): what it read stands, no traceback, and not a status of the command's own (status's
    1 says there is no site)."""
    try:
        return _run(argv)
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # nothing at exit
        return EXIT_READER_GONE


def _run(argv: list[str] | None) -> int:
    args = parse_args(argv)
    if args.command == "models":
        try:
            return _models(args)
        except OSError as exc:  # --out cannot be written: the path and why, no traceback
            print(f"sonicsite models {args.models_command}: {said(exc)}", file=sys.stderr)
            return 1
    if args.command == "status":
        from .local.status import print_status

        return print_status(args.dir, args.json)
    if args.command == "bench":
        starts = args.bench_command != "report"
        return _unwinding(args.command, lambda: run_bench(args), starts_site=starts)
    if args.command == "simulate":
        if args.scenario == CHECK_LOCAL:
            from .bench.sim_check import run_command

            return _unwinding(args.command, lambda: run_command(args))
        return _unwinding(args.command, lambda: run_simulate(args), starts_site=False)
    from .local.errors import SiteError
    from .local.up_log import up_log

    try:
        if args.command == "check":
            from .jobs.check import check

            return check(args.grpc, args.models, args.events, args.inputs)
        if args.command in ("demo", "up"):
            return _unwinding(args.command, lambda: _site(args))
        return _site(args)
    except (SiteError, ValueError, OSError) as exc:  # FileNotFoundError: no site, say so
        notes = "".join(f"\n  {note}" for note in getattr(exc, "__notes__", []))
        print(f"sonicsite {args.command}: {said(exc)}{notes}", file=sys.stderr)
        if args.command == "up" and (log := up_log(Path(args.dir))).is_file():
            print(f"  (logged in {log.resolve()})", file=sys.stderr)
        return 1


def said(exc: Exception) -> str:
    """An error in words: an OSError as `path: why` (not "[Errno 1] Operation not
    permitted: 'path'"), with the second path where there is one (a rename)."""
    if not isinstance(exc, OSError) or not exc.strerror or exc.filename is None:
        return str(exc)
    second = f" -> {exc.filename2}" if exc.filename2 is not None else ""
    return f"{exc.filename}{second}: {exc.strerror}"


if __name__ == "__main__":
    sys.exit(main())

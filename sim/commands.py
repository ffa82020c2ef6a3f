"""`sonicsite simulate SCENARIO --json F [--seed N] [--seeds N] [--workers N] [--plot DIR]`
and `sonicsite simulate --list`: the parser and what it runs. The command line
(`sonicsite.cli`) adds the parser and hands a parsed `simulate` over here."""

from __future__ import annotations

import argparse
import json
import os
import sys
from functools import partial
from pathlib import Path

from ..contract.options import at_least
from .output import OutputError, unwritable

# not a scenario: the simulator checked against a local site (bench/sim_check.py, which
# the command line runs for this name: starting a site is not the simulator's room)
CHECK_LOCAL = "check-local"

# the exit statuses (the parser's epilog says them)
NOT_COMPARABLE = 3
INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C
EXIT_STATUSES = (
    "exit status: 0 the runs compared (ratios in the JSON); 1 the scenario refused, the "
    "summary failed or the JSON could not be written; 2 a usage error (SCENARIO or --json "
    f"missing, an output that cannot be written), said before any run; {NOT_COMPARABLE} "
    "the runs ended but a comparison cannot be compared (a job unfinished by limit_s or a "
    "request failed): its ratios are null, why is said, each policy set's figures are in "
    f"the JSON; {INTERRUPTED} stopped by Ctrl-C (its workers too; it says whether the JSON "
    "was written yet), 143 by SIGTERM"
)


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="a large site in simulated time, sonicsite's policies against the reference's",
        epilog=EXIT_STATUSES,
    )
    p.add_argument(
        "scenario",
        nargs="?",
        help=f"a shipped scenario's name or a YAML file (./NAME: a file named like a shipped "
        f"scenario); {CHECK_LOCAL}: the simulator against a local site",
    )
    p.add_argument("--list", action="store_true", help="the shipped scenarios")
    p.add_argument("--json", type=Path, help="where to write the result")
    p.add_argument("--seed", type=at_least(0), default=1, help="the random seed (default 1)")
    p.add_argument(  # defaults None: check-local refuses the option given at all
        "--seeds",
        type=at_least(1),
        help="runs with seeds SEED.. SEED+N-1: ratios as median, mean, lowest, highest, each "
        "seed's (default 1)",
    )
    p.add_argument(
        "--workers",
        type=at_least(1),
        help="runs at a time, each in a process of its own (default: this machine's cores)",
    )
    p.add_argument("--plot", type=Path, help="a folder for the plots (PNG), made if need be")


def run_simulate(args: argparse.Namespace) -> int:
    """The command's exit status (EXIT_STATUSES)."""
    from . import results, scenario

    if args.list and (given := [o for o in ("scenario", "json", "plot") if getattr(args, o)]):
        named = ", ".join("SCENARIO" if o == "scenario" else f"--{o}" for o in given)
        print(
            f"sonicsite simulate: --list only lists the shipped scenarios; it runs nothing, so "
            f"{named} would be ignored: give one or the other",
            file=sys.stderr,
        )
        return 2
    if args.list:
        for name in scenario.shipped():
            print(f"{name}: {scenario.load(name).description}")
        print(
            f"{CHECK_LOCAL}: not a scenario; runs a local site of 3 CPU servers and the "
            "simulator on the same load, and compares them"
        )
        return 0
    if not args.scenario or not args.json:
        print("sonicsite simulate: expected SCENARIO and --json F (or --list)", file=sys.stderr)
        return 2
    try:
        chosen, source = scenario.read(args.scenario)
    except scenario.ScenarioError as exc:
        print(f"sonicsite simulate: {exc}", file=sys.stderr)
        return 1
    if "not_used" in source:
        print(
            f"sonicsite simulate: {args.scenario}: the shipped scenario ({source['resolved']}), "
            f"not the file {source['not_used']}; to run that file, give ./{args.scenario}",
            file=sys.stderr,
        )
    if why := _outputs_refused(args, chosen, source):
        print(f"sonicsite simulate: {why}", file=sys.stderr)
        return 2
    written = False
    try:
        seeds, workers = args.seeds or 1, args.workers or len(os.sched_getaffinity(0))
        told = partial(print, file=sys.stderr, flush=True)  # a run ends every few minutes
        result = results.write(args.json, chosen, args.seed, seeds, workers, source, told)
        written = True
        hidden = ("fixed_pool", "autoscaled", "over_seeds", "sweep")
        print(json.dumps({k: v for k, v in result["summary"].items() if k not in hidden}, indent=2))
        if args.plot:
            from .plots import plot

            for path in plot(result, args.plot):
                print(f"plot: {path}")
    except KeyboardInterrupt:
        said = f"{args.json} was written" if written else "nothing was written"
        print(
            f"sonicsite simulate: stopped by SIGINT before it finished; its runs were "
            f"stopped, {said}",
            file=sys.stderr,
        )
        return INTERRUPTED
    except (results.SummaryError, OutputError) as exc:
        print(f"sonicsite simulate: {exc}", file=sys.stderr)
        return 1
    print(f"written: {args.json}")
    if unlike := results.not_comparable(result["summary"]):
        print(
            f"sonicsite simulate: not comparable, so no ratio is given (null): "
            f"{'; '.join(unlike)}. Each policy set's figures are in {args.json} "
            "(summary.<comparison>.sonicsite and .reference)",
            file=sys.stderr,
        )
        return NOT_COMPARABLE
    return 0


def _outputs_refused(args: argparse.Namespace, chosen, source: dict) -> str:
    """Why the outputs cannot be written (empty: they can), checked before any run: a path
    found unwritable only after the runs lost every one. --json the scenario file itself
    (through a symlink too) would write the result over it."""
    if args.json.exists() and os.path.samefile(args.json, source["resolved"]):
        return f"--json {args.json}: the scenario file itself: the result would replace it"
    wanted = [("--json", args.json, args.json)]
    if args.plot is not None and args.plot.exists() and not args.plot.is_dir():
        return f"--plot {args.plot}: is a file, not a folder (the plots are written into a folder)"
    if args.plot is not None:  # each plot's file in the folder
        from .plots import file_name
        from .results import cases

        shown = [*cases(chosen), *(["sweep"] if chosen.pool.sweep else [])]
        wanted += [("--plot", args.plot, args.plot / file_name(chosen.name, x)) for x in shown]
    for option, given, probe in wanted:
        if why := unwritable(probe):
            at = "" if probe == given else f"{probe.name}: "
            return f"{option} {given}: cannot write: {at}{why}"
    return ""

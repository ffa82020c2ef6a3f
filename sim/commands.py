"""`sonicsite simulate SCENARIO --json F [--seed N] [--seeds N] [--workers N] [--plot DIR]`
and `sonicsite simulate --list`: the parser and what it runs. The command line
(`sonicsite.cli`) adds the parser and hands a parsed `simulate` over here."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from ..contract.options import at_least

# not a scenario: the simulator checked against a local site (bench/sim_check.py, which
# the command line runs for this name: starting a site is not the simulator's room)
CHECK_LOCAL = "check-local"


def add_simulate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "simulate",
        help="a large site in simulated time, sonicsite's policies against the reference's",
    )
    p.add_argument(
        "scenario",
        nargs="?",
        help=f"a shipped scenario's name or a YAML file; {CHECK_LOCAL}: the simulator "
        "against a local site",
    )
    p.add_argument("--list", action="store_true", help="the shipped scenarios")
    p.add_argument("--json", type=Path, help="where to write the result")
    p.add_argument("--seed", type=int, default=1, help="the random seed (default 1)")
    p.add_argument(
        "--seeds",
        type=at_least(1),
        default=1,
        help="runs with seeds SEED.. SEED+N-1: ratios as mean, lowest, highest (default 1)",
    )
    p.add_argument(
        "--workers",
        type=at_least(1),
        default=len(os.sched_getaffinity(0)),
        help="runs at a time, each in a process of its own (default: this machine's cores)",
    )
    p.add_argument("--plot", type=Path, help="a folder for the plots (PNG)")


def run_simulate(args: argparse.Namespace) -> int:
    from . import results, scenario

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
        chosen = scenario.load(args.scenario)
    except scenario.ScenarioError as exc:
        print(f"sonicsite simulate: {exc}", file=sys.stderr)
        return 1
    # checked before any run: a path found unwritable only after them lost every run
    wanted = [("--json", args.json, args.json)]
    if args.plot is not None:  # a plot's file in the folder
        wanted.append(("--plot", args.plot, args.plot / f"{chosen.name}-fixed_pool.png"))
    for option, given, probe in wanted:
        if why := unwritable(probe):
            print(f"sonicsite simulate: {option} {given}: cannot write: {why}", file=sys.stderr)
            return 2
    try:
        result = results.write(args.json, chosen, args.seed, args.seeds, args.workers)
    except results.SummaryError as exc:
        print(f"sonicsite simulate: {exc}", file=sys.stderr)
        return 1
    hidden = ("fixed_pool", "autoscaled", "over_seeds", "sweep")
    shown = {k: v for k, v in result["summary"].items() if k not in hidden}
    print(json.dumps(shown, indent=2))
    if args.plot:
        from .plots import plot

        for path in plot(result, args.plot):
            print(f"plot: {path}")
    print(f"written: {args.json}")
    return 0


def unwritable(path: Path) -> str:
    """Why a file cannot be written at `path` (empty: it can): a folder there, a parent that
    cannot be made, a folder where no file can be created.
    Its parent folders are made; a probe file is written beside it and removed (the file
    itself is written beside it too, then renamed over it)."""
    if path.is_dir():
        return "it is a folder"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=f".{path.name}.", suffix=".probe"):
            pass
    except OSError as exc:
        return f"{exc.strerror or exc} ({exc.filename or path.parent})"
    return ""

"""The operator's log: every line `<time> operator: <what>` (the supervisor's style), and
one line at each start saying what runs, as which PID, on which ports, reading what, under
which policies, so that a restart is seen as one in the log and not guessed from its effects.

The operator says what it decides and what it sees change, once per change (transitions.py,
admission, scaling, placement, xDS), at INFO; what went wrong, at WARNING or above. Other
libraries' own lines are left at WARNING (their INFO is per request)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from .controller import Operator

PROCESS = "operator"
PACKAGE_LOGGER = "sonicsite"  # the operator's loggers are under it: sonicsite.operator.*
LOG = logging.getLogger("sonicsite.operator")


def configure(process: str = PROCESS) -> None:
    """Timestamped lines to stderr (the site's log file), `<time> <process>: <message>`;
    the project's own INFO lines kept, other libraries' from WARNING. Leaves a logging
    already configured as it is (a test that builds the operator in its own process)."""
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s {process}: %(message)s", stream=sys.stderr
    )
    logging.getLogger(PACKAGE_LOGGER).setLevel(logging.INFO)


def _servers_from(args: argparse.Namespace) -> str:
    if args.site:
        return f"servers from the site's state file in {args.site}"
    pools = f", pools {', '.join(args.pool_service)}" if args.pool_service else ""
    return f"servers from Kubernetes Service {args.kubernetes}{pools}"


def _admission(operator: Operator) -> str:
    p = operator.policy
    return (
        f"admission: shed above {p.shed_above_ms:g} ms, open below {p.open_below_ms:g} ms of "
        f"queue time per request (at least {p.compute_multiple:g}× compute), hold "
        f"{p.min_hold_s:g} s, retry-after {p.retry_after_s} s, shed TTL "
        f"{operator.shed_ttl_s:g} s, fail-open cap {p.inflight_cap}"
    )


def _scaling(operator: Operator) -> str:
    if operator.scaling is None:
        return "autoscaling off"
    p = operator.scaling.policy
    pools = "".join(f", {pool} {lo}..{hi}" for pool, (lo, hi) in operator.scaling.limits.items())
    return (
        f"autoscaling {p.min_servers}..{p.max_servers} servers{pools}, target "
        f"{p.target_ms:g} ms, windows up {p.up_window_s:g} s / down {p.down_window_s:g} s"
    )


def _placement(operator: Operator) -> str:
    if operator.placement is None:
        return "placement off"
    s = operator.placement.settings
    budget = "no budget" if s.budget_models is None else f"{s.budget_models} models a server"
    return (
        f"placement on ({len(operator.placement.catalogue.models)} models in the catalogue, "
        f"idle unload {s.idle_unload_s:g} s, {budget}, keep warm "
        f"{'on' if s.keep_warm else 'off'}, hold deadline {s.hold_deadline_s:g} s)"
    )


def start_line(args: argparse.Namespace, operator: Operator) -> str:
    """One line: what starts, its PID, its ports, what it reads and its policies."""
    tries = operator.tries.policy
    return (
        f"operator started: pid {os.getpid()}; API {args.host}:{args.port}, xDS "
        f"{args.host}:{args.xds_port}, Envoy listener {args.envoy_listen}; "
        f"{_servers_from(args)}, scraped every {operator.interval_s:g} s (out of the view "
        f"after {operator.loadview.grace} failed scrapes); {_admission(operator)}; balancing "
        f"{operator.balancing.policy}; per-try timeouts {tries.floor_s:g}..{tries.cap_s:g} s"
        f"{', hedged' if tries.hedge else ''}; {_scaling(operator)}; {_placement(operator)}; "
        f"admission passes {'on' if operator.passes is not None else 'off'}"
    )

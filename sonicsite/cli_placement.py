"""`sonicsite up`'s placement options: models loaded on demand, their budget and hold
deadline, and the site's pools (each a number of servers and the models pinned to it)."""

from __future__ import annotations

import argparse

from .contract.options import at_least, non_negative
from .contract.wire import HOLD_DEADLINE_S
from .operator.placement_settings import PlacementSettings


def add_placement_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--placement",
        action="store_true",
        help="the operator loads and unloads models as their use asks (off: every server "
        "keeps the models it starts with)",
    )
    p.add_argument(
        "--idle-unload-s",
        type=non_negative,
        default=300.0,
        help="with --placement: a model unused this long, nothing in flight, is unloaded",
    )
    p.add_argument(
        "--keep-warm",
        action="store_true",
        help="with --placement: every model stays loaded where room allows (its last replica "
        "is not unloaded for being idle; one with none loads where a server has room to "
        "spare); room another model needs is still made",
    )
    p.add_argument(
        "--budget-models",
        type=at_least(1),
        default=None,
        help="with --placement: models each server may hold (default: no limit)",
    )
    p.add_argument(
        "--hold-deadline-s",
        type=at_least(1),
        default=None,
        help="with --placement: how long a request for a model no server holds waits for "
        f"one to load it before it fails, naming the model and why (default: {HOLD_DEADLINE_S:g})",
    )
    p.add_argument(
        "--pool",
        action="append",
        default=[],
        type=_pool,
        metavar="NAME=SERVERS[:MODEL,...]",
        help="with --placement: a pool of SERVERS servers that alone load the MODELs pinned to "
        "it (none: every model no other pool names); repeatable; the pools' servers replace "
        "--servers",
    )


def placement_settings(args: argparse.Namespace) -> PlacementSettings | None:
    """`up --placement`: the operator's placement settings; None without it."""
    if not getattr(args, "placement", False):
        return None
    held = {} if args.hold_deadline_s is None else {"hold_deadline_s": args.hold_deadline_s}
    pools = tuple((name, models) for name, _, models in args.pool)
    return PlacementSettings(
        idle_unload_s=args.idle_unload_s,
        budget_models=args.budget_models,
        keep_warm=args.keep_warm,
        pools=pools,
        **held,
    )


def server_pools(args: argparse.Namespace) -> list[str] | None:
    """`up --pool`: each server's pool, the pools' servers in order; None without pools."""
    pools = getattr(args, "pool", [])
    return [name for name, servers, _ in pools for _ in range(servers)] or None


def _pool(text: str) -> tuple[str, int, tuple[str, ...]]:
    """`--pool NAME=SERVERS[:MODEL,...]` as (name, servers, pinned models)."""
    name, _, rest = text.partition("=")
    count, _, models = rest.partition(":")
    pinned = tuple(m for m in models.split(",") if m)
    if not name or not count.isdigit() or int(count) < 1 or (models and not pinned):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=SERVERS[:MODEL,...], e.g. gpu=1:particle_transformer"
        )
    return name, int(count), pinned

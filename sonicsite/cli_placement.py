"""`sonicsite up`'s options for parts of the site that are off by default: placement (models
loaded on demand, their budget and hold deadline, the site's pools: each a number of
servers and the models pinned to it), autoscaling (`--autoscale MIN:MAX`) and tracing; each
part's settings from them, their values checked at parse time by the part's own rule, and
the check that none of its options is given without the option that turns it on."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from .contract.options import at_least, named_twice, non_negative, split_names
from .contract.wire import HOLD_DEADLINE_S
from .operator.autoscaler import ScalingPolicy, server_bounds, zero_needs
from .operator.placement_settings import PlacementSettings
from .operator.placement_state import PlacementPolicy

IDLE_UNLOAD_S = PlacementPolicy.idle_unload_s  # `up --placement`'s default: the policy's own
# up's options that mean something only with --placement, and those only with --tracing
PLACEMENT_OPTIONS = ("idle_unload_s", "keep_warm", "budget_models", "hold_deadline_s", "pool")
TRACING_OPTIONS = (
    "tracing_export",
    "tracing_envoy_sampling",
    "tracing_gateway_sampling",
    "tracing_triton_rate",
)


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
        default=None,
        help=f"with --placement: a model unused this long, nothing in flight, is unloaded "
        f"(default {IDLE_UNLOAD_S:g})",
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
        help="with --placement: models each server may hold, at start too (default: no limit)",
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


def add_autoscale_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--autoscale",
        type=_autoscale,
        default=None,
        metavar="MIN:MAX",
        help="the operator scales the servers between MIN and MAX on their queue time per "
        "request (its default target and windows: docs/admission-and-scaling.md); with "
        "--pool each pool scales on its own models, between MIN and MAX; MIN 0 needs "
        "--placement (a request wakes a pool at zero). Default: off, the servers started "
        "are the servers there are",
    )


def _autoscale(text: str) -> ScalingPolicy:
    """`--autoscale MIN:MAX` as the operator's scaling policy (its other fields default)."""
    try:
        low, high = server_bounds(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return ScalingPolicy(min_servers=low, max_servers=high)


def placement_settings(args: argparse.Namespace) -> PlacementSettings | None:
    """`up --placement`: the operator's placement settings; None without it."""
    if not getattr(args, "placement", False):
        return None
    held = {} if args.hold_deadline_s is None else {"hold_deadline_s": args.hold_deadline_s}
    pools = tuple((name, models) for name, _, models in args.pool)
    idle = IDLE_UNLOAD_S if args.idle_unload_s is None else args.idle_unload_s
    return PlacementSettings(
        idle_unload_s=idle,
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
    pinned = split_names(models)
    if not name or not count.isdigit() or int(count) < 1 or (models and not pinned):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected NAME=SERVERS[:MODEL,...], e.g. gpu=1:particle_transformer"
        )
    if twice := named_twice(pinned):
        raise argparse.ArgumentTypeError(f"{text!r}: {', '.join(twice)} named twice")
    return name, int(count), pinned


def add_tracing_args(p: argparse.ArgumentParser) -> None:
    """`up --tracing`: the site's collector, and every part tracing (sonicsite/local/tracing.py)."""
    p.add_argument(
        "--tracing",
        action="store_true",
        help="start an OpenTelemetry collector (rotel) and have Envoy, the gateway and Triton "
        "trace to it; workers trace with OTEL_EXPORTER_OTLP_ENDPOINT=http://<its address>",
    )
    p.add_argument(
        "--tracing-export",
        type=_tracing_value("export", str),
        default=None,
        metavar="URL",
        help="with --tracing: the OTLP/HTTP base URL the collector sends spans on to "
        "(default: its log, logs/collector.log)",
    )
    p.add_argument(
        "--tracing-envoy-sampling",
        type=_tracing_value("envoy_sampling", float),
        default=None,
        metavar="PERCENT",
        help="with --tracing: percent of requests without a traceparent that Envoy traces "
        "(default 100)",
    )
    p.add_argument(
        "--tracing-gateway-sampling",
        type=_tracing_value("gateway_sampling", float),
        default=None,
        metavar="RATIO",
        help="with --tracing: ratio of requests without a traceparent the gateway traces "
        "(default 1)",
    )
    p.add_argument(
        "--tracing-triton-rate",
        type=at_least(1),
        default=None,
        metavar="N",
        help="with --tracing: Triton traces one in N requests without a trace context (default 1)",
    )


def _tracing_value(field: str, convert: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type for one of TracingConfig's fields: the value converted, then checked
    by TracingConfig's own rule (sonicsite/local/tracing.py), so that a bad one is a usage
    error naming the option."""

    def parse(text: str) -> Any:
        from .local.tracing import TracingConfig

        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        try:
            TracingConfig(**{field: value})
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return parse


def tracing_config(args: argparse.Namespace):
    """The site's TracingConfig from `up`'s options; None without --tracing."""
    from .local.tracing import TracingConfig

    if not getattr(args, "tracing", False):
        return None
    given = {
        "export": args.tracing_export,
        "envoy_sampling": args.tracing_envoy_sampling,
        "gateway_sampling": args.tracing_gateway_sampling,
        "triton_rate": args.tracing_triton_rate,
    }
    return TracingConfig(**{k: v for k, v in given.items() if v is not None})


def site_option_orphans(args: argparse.Namespace) -> str:
    """`up`: an option of placement given without --placement, or of tracing without
    --tracing (it would be ignored), in words naming both; '' when there is none."""
    for parent, options in (("placement", PLACEMENT_OPTIONS), ("tracing", TRACING_OPTIONS)):
        if getattr(args, parent, False):
            continue
        for dest in options:
            if getattr(args, dest, None) not in (None, False, []):
                option = "--" + dest.replace("_", "-")
                return (
                    f"argument {option}: needs --{parent} (without it the site has no "
                    f"{parent} for it to set)"
                )
    scaling = getattr(args, "autoscale", None)
    if scaling is not None and scaling.min_servers == 0 and not getattr(args, "placement", False):
        return f"argument --autoscale: {zero_needs('--placement')}"
    return ""

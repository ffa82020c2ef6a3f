"""What the operator's options decode to: its policies, discovery and placement settings
from the parsed command line (options.py), each bad value named through `parser.error`."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from sonicsite.contract.wire import DEFAULT_POOL

from .autoscaler import Autoscaler, ScalingPolicy, server_bounds, zero_needs
from .discovery import Discovery, KubernetesDiscovery, LocalDiscovery, kubernetes_api
from .placement_settings import PlacementSettings
from .xds_jwt import JwtPolicy
from .xds_tracing import EnvoyTracing

T = TypeVar("T")


def checked(parser: argparse.ArgumentParser, make: Callable[[], T], prefix: str = "") -> T:
    """`make()`, its ValueError turned into the command line's error (`prefix` first)."""
    try:
        return make()
    except ValueError as exc:
        parser.error(f"{prefix}{exc}")


def autoscaler(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Autoscaler | None:
    """`--autoscale MIN:MAX` and the scaling policy's options (None without it)."""
    if not args.autoscale:
        return None

    def make() -> Autoscaler:
        low, high = server_bounds(args.autoscale)
        return Autoscaler(
            ScalingPolicy(
                low,
                high,
                args.target_ms,
                args.up_window,
                args.down_window,
                args.scaling_window,
                busy_over_start=args.busy_over_start,
                server_start_s=args.server_start_s,
            )
        )

    scaler = checked(parser, make, "--autoscale: ")
    if scaler.policy.min_servers == 0 and not args.placement:
        parser.error(f"--autoscale {args.autoscale}: {zero_needs('--placement')}")
    return scaler


def pool_limits(
    args: argparse.Namespace, parser: argparse.ArgumentParser, policy: ScalingPolicy | None
) -> dict[str, tuple[int, int]]:
    """`--pool-autoscale POOL=MIN:MAX` values: each pool's own min and max servers, checked
    as a scaling policy's (and min 0 only with --placement); POOL one of the site's pools
    (`--pool`'s, else the one pool, 'default')."""
    if not args.pool_autoscale:
        return {}
    if policy is None:
        parser.error("--pool-autoscale: expected --autoscale too")
    names = [name for name, _ in checked(parser, lambda: pools(args.pool))] or [DEFAULT_POOL]
    limits: dict[str, tuple[int, int]] = {}
    for value in args.pool_autoscale:
        pool, _, bounds = value.partition("=")
        if pool not in names or pool in limits:
            parser.error(
                f"--pool-autoscale {value!r}: expected POOL=MIN:MAX, POOL one of {names} "
                "(once each)"
            )
        prefix = f"--pool-autoscale {value!r}: "
        try:
            least, most = server_bounds(bounds)
            replace(policy, min_servers=least, max_servers=most)
        except ValueError as exc:
            parser.error(f"{prefix}{exc}")
        if least == 0 and not args.placement:
            parser.error(f"{prefix}{zero_needs('--placement')}")
        limits[pool] = (least, most)
    return limits


def jwt_policy(args: argparse.Namespace, parser: argparse.ArgumentParser) -> JwtPolicy | None:
    """Envoy's bearer-JWT check from the `--jwt-*` options (None without them)."""
    if not (args.jwt_issuer or args.jwt_jwks_file or args.jwt_jwks_uri):
        return None
    if not args.jwt_issuer:
        parser.error("--jwt-jwks-file/--jwt-jwks-uri: expected --jwt-issuer too")
    audiences = tuple(a for a in args.jwt_audiences.split(",") if a)
    return checked(
        parser,
        lambda: JwtPolicy(
            args.jwt_issuer,
            args.jwt_jwks_file,
            audiences,
            jwks_uri=args.jwt_jwks_uri,
            jwks_cache_s=args.jwt_jwks_cache,
            jwks_ca_file=args.jwt_jwks_ca,
        ),
        "--jwt-jwks-file/--jwt-jwks-uri: ",
    )


def envoy_tracing(args: argparse.Namespace, parser: argparse.ArgumentParser) -> EnvoyTracing | None:
    """Envoy's tracer from the `--tracing-*` options (None without an endpoint)."""
    if not args.tracing_endpoint:
        return None
    return checked(
        parser,
        lambda: EnvoyTracing(
            args.tracing_endpoint, args.tracing_sampling, args.tracing_service_name
        ),
    )


def discovery(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Discovery:
    """Exactly one of `--site` (the local state file) or `--kubernetes` with `--models`."""
    if bool(args.site) == bool(args.kubernetes):
        parser.error("give exactly one of --site (local) or --kubernetes NAMESPACE/SERVICE")
    if not args.kubernetes:
        return LocalDiscovery(args.site)
    namespace, _, service = args.kubernetes.partition("/")
    models = tuple(m for m in args.models.split(",") if m)
    if not namespace or not service or not models:
        parser.error("--kubernetes: expected NAMESPACE/SERVICE and --models a,b")
    services = []
    for value in args.pool_service:
        pool, _, name = value.partition("=")
        if not pool or not name:
            parser.error(f"--pool-service {value!r}: expected POOL=SERVICE")
        services.append((name, pool))
    api = kubernetes_api(args.kube_api)
    return KubernetesDiscovery(api, namespace, service, models, pools=tuple(services))


def placement_settings(
    args: argparse.Namespace, parser: argparse.ArgumentParser
) -> PlacementSettings:
    """The `--placement` options' settings (their policy checked)."""

    def make() -> PlacementSettings:
        default, deadlines = hold_deadlines(args.hold_deadline_s)
        settings = PlacementSettings(
            idle_unload_s=args.idle_unload_s,
            budget_models=args.budget_models,
            queue_ms=args.placement_queue_ms,
            pressure_s=args.placement_pressure_s,
            evict_idle_s=args.evict_idle_s,
            min_resident_s=args.min_resident_s,
            keep_warm=args.keep_warm,
            hold_deadline_s=default,
            hold_deadlines=deadlines,
            pools=pools(args.pool),
        )
        settings.catalogue_pools()
        settings.policy()
        return settings

    return checked(parser, make, "--placement: ")


def pools(values: list[str]) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """`--pool` values as (name, pinned models); ValueError names a bad one. The catalogue
    checks the rest (distinct names, a model in one pool, at most one catch-all)."""
    found = []
    for value in values:
        name, _, models = value.partition("=")
        pinned = tuple(m for m in models.split(",") if m)
        if not name.strip() or (models and not pinned):
            raise ValueError(f"--pool {value!r}: expected NAME or NAME=MODEL[,MODEL...]")
        found.append((name.strip(), pinned))
    return tuple(found)


def hold_deadlines(values: list[str]) -> tuple[float, tuple[tuple[str, float], ...]]:
    """`--hold-deadline-s` values: the default (the last bare SECONDS) and the per-model
    ones (MODEL=SECONDS); ValueError names a bad one."""
    default, per_model = PlacementSettings.hold_deadline_s, {}
    for value in values:
        model, _, text = value.rpartition("=")
        try:
            seconds = float(text)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ValueError(f"--hold-deadline-s {value!r}: expected [MODEL=]SECONDS > 0")
        if model:
            per_model[model] = seconds
        else:
            default = seconds
    return default, tuple(sorted(per_model.items()))

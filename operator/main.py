"""`python -P -m sonicsite.operator.main`: run the operator (on Kubernetes, or for a local
site without autoscaling; the local site runs it through sonicsite.local.operator_main,
which hands it the actuator that starts and stops servers)."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from sonicsite.contract.wire import SHED_TTL_S

from .admission import AdmissionPolicy
from .api import make_server
from .autoscaler import Autoscaler, ScalingPolicy
from .balancing import DEFAULT_POLICY, POLICIES, Balancing
from .controller import STEP_INTERVAL_S, Actuate, Operator
from .discovery import KubernetesDiscovery, LocalDiscovery, kubernetes_api
from .loadview import SCRAPE_GRACE, LoadView
from .metrics import OperatorMetrics
from .placement_loop import (
    PlacementLoop,
    PlacementSettings,
    local_catalogue,
    local_pids,
    read_admin_key,
)
from .try_timeouts import TryPolicy, TryTimeouts
from .xds_resources import SYSTEM_CA_FILE, JwtPolicy
from .xds_tracing import EnvoyTracing


def parser() -> argparse.ArgumentParser:
    """The operator's options; every default of a policy is the policy's own."""
    parser = argparse.ArgumentParser(prog="sonicsite-operator")
    parser.add_argument(
        "--site", type=Path, default=None, help="the local site directory (local discovery)"
    )
    parser.add_argument(
        "--kubernetes",
        default="",
        help="NAMESPACE/SERVICE: discover Triton from the Service's EndpointSlices",
    )
    parser.add_argument(
        "--kube-api", default=None, help="API server URL (default: in-cluster service account)"
    )
    parser.add_argument(
        "--models",
        default="",
        help="comma-separated models every replica serves (with --kubernetes)",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="the operator's HTTP port")
    parser.add_argument(
        "--envoy-listen",
        required=True,
        help="host:port of Envoy's gRPC listener, published over LDS",
    )
    parser.add_argument(
        "--public-grpc",
        default="",
        help="the gRPC endpoint clients use (published in the state; default --envoy-listen)",
    )
    parser.add_argument(
        "--interval", type=float, default=STEP_INTERVAL_S, help="seconds between steps"
    )
    parser.add_argument(
        "--site-view",
        default="",
        help="host:port of the site's one-server view over gRPC (the gateway's --grpc-port): "
        "Envoy sends server metadata, statistics and the repository index there",
    )
    parser.add_argument(
        "--site-view-http",
        default="",
        help="host:port of the gateway's HTTP (without bearer tokens): Envoy sends the REST "
        "server metadata, statistics and repository index there",
    )
    parser.add_argument(
        "--jwt-issuer", default="", help="Envoy requires bearer JWTs from this issuer"
    )
    parser.add_argument(
        "--jwt-jwks-file", default="", help="the JWKS file, as Envoy sees it (with --jwt-issuer)"
    )
    parser.add_argument(
        "--jwt-audiences", default="", help="comma-separated accepted audiences (default: any)"
    )
    parser.add_argument(
        "--jwt-jwks-uri",
        default="",
        help="the issuer's JWKS URI, which Envoy fetches (instead of --jwt-jwks-file)",
    )
    parser.add_argument(
        "--jwt-jwks-cache",
        type=int,
        default=300,
        help="seconds Envoy keeps a fetched JWKS before fetching it again (rotated keys)",
    )
    parser.add_argument(
        "--jwt-jwks-ca",
        default=SYSTEM_CA_FILE,
        help="CA file, as Envoy sees it, for an https JWKS URI's certificate",
    )
    parser.add_argument(
        "--tracing-endpoint",
        default="",
        help="Envoy exports OpenTelemetry spans to this OTLP/HTTP traces URL "
        "(http(s)://host:port/v1/traces); default: Envoy does not trace",
    )
    parser.add_argument(
        "--tracing-sampling",
        type=float,
        default=100.0,
        help="percent of requests arriving without a W3C traceparent that Envoy traces "
        "(a request with one is traced as its caller decided)",
    )
    parser.add_argument(
        "--tracing-service-name",
        default="sonicsite-envoy",
        help="the service.name of Envoy's spans",
    )
    parser.add_argument(
        "--balancing",
        choices=sorted(POLICIES),
        default=DEFAULT_POLICY,
        help="how Envoy spreads requests over a model's servers (operator/balancing.py)",
    )
    defaults = AdmissionPolicy()
    parser.add_argument(
        "--shed-above-ms",
        type=float,
        default=defaults.shed_above_ms,
        help="shed a model when queue time per request is above this everywhere",
    )
    parser.add_argument(
        "--open-below-ms",
        type=float,
        default=defaults.open_below_ms,
        help="reopen once some server is below this (hysteresis)",
    )
    parser.add_argument(
        "--min-hold",
        type=float,
        default=defaults.min_hold_s,
        help="seconds an admission decision holds at least",
    )
    parser.add_argument(
        "--retry-after",
        type=int,
        default=defaults.retry_after_s,
        help="seconds clients are told to wait when shed",
    )
    parser.add_argument(
        "--inflight-cap",
        type=int,
        default=defaults.inflight_cap,
        help="requests in flight per model while failing open",
    )
    parser.add_argument(
        "--compute-multiple",
        type=float,
        default=defaults.compute_multiple,
        help="thresholds at least this many times a model's compute time per request "
        "(a slow model queues longer before it is overloaded); 0: the ms thresholds alone",
    )
    parser.add_argument(
        "--shed-ttl",
        type=float,
        default=SHED_TTL_S,
        help="seconds a shed holds unless the operator renews it (renewed at half of it); "
        f"at most {SHED_TTL_S:g}, the bound Envoy, the gateway and clients rely on",
    )
    parser.add_argument(
        "--scrape-grace",
        type=int,
        default=SCRAPE_GRACE,
        help="failed scrapes in a row after which a server leaves the load view",
    )
    tries = TryPolicy()
    parser.add_argument(
        "--per-try-floor",
        type=float,
        default=tries.floor_s,
        help="Envoy's shortest per-try timeout in seconds",
    )
    parser.add_argument(
        "--per-try-cap",
        type=float,
        default=tries.cap_s,
        help="Envoy's longest per-try timeout in seconds (models never measured get it)",
    )
    parser.add_argument(
        "--per-try-multiplier",
        type=float,
        default=tries.multiplier,
        help="per-try timeout: this many times the model's time per request",
    )
    parser.add_argument(
        "--hedge",
        action="store_true",
        default=tries.hedge,
        help="on a per-try timeout, send a second copy to another server (first answer "
        "wins) instead of abandoning the first try",
    )
    parser.add_argument(
        "--autoscale",
        default="",
        help="min,max servers: scale the local site on queue time per request",
    )
    scaling = ScalingPolicy()
    parser.add_argument(
        "--target-ms",
        type=float,
        default=scaling.target_ms,
        help="queue time per request the autoscaler aims at",
    )
    parser.add_argument(
        "--up-window",
        type=float,
        default=scaling.up_window_s,
        help="scale-up stabilisation window in seconds",
    )
    parser.add_argument(
        "--down-window",
        type=float,
        default=scaling.down_window_s,
        help="scale-down stabilisation window in seconds",
    )
    parser.add_argument(
        "--scaling-window",
        type=float,
        default=scaling.window_s,
        help="seconds of counters the scaling metric is computed over",
    )
    placing = PlacementSettings()
    parser.add_argument(
        "--placement",
        action="store_true",
        help="load and unload models on the servers as their use asks (operator/"
        "placement_loop.py; with --site); off: every server keeps the models it started with",
    )
    parser.add_argument(
        "--idle-unload-s",
        type=float,
        default=placing.idle_unload_s,
        help="with --placement: a model unused this long, nothing in flight, is unloaded",
    )
    parser.add_argument(
        "--budget-models",
        type=int,
        default=None,
        help="with --placement: models each server may hold (default: no limit)",
    )
    parser.add_argument(
        "--placement-queue-ms",
        type=float,
        default=placing.queue_ms,
        help="with --placement: queue time per request over which a model gets a replica more",
    )
    parser.add_argument(
        "--placement-pressure-s",
        type=float,
        default=placing.pressure_s,
        help="with --placement: seconds the queue time stays over it before that replica",
    )
    parser.add_argument(
        "--evict-idle-s",
        type=float,
        default=placing.evict_idle_s,
        help="with --placement: a model unused this long may be unloaded for another",
    )
    parser.add_argument(
        "--min-resident-s",
        type=float,
        default=placing.min_resident_s,
        help="with --placement: a model loaded less long ago is never unloaded for another",
    )
    return parser


def placement_loop(
    args: argparse.Namespace, parser: argparse.ArgumentParser, metrics: OperatorMetrics
) -> PlacementLoop | None:
    """The placement actuator the options ask for (None without --placement)."""
    if not args.placement:
        return None
    if not args.site:
        parser.error("--placement: expected --site (placement reads the site's repository)")
    try:
        settings = PlacementSettings(
            idle_unload_s=args.idle_unload_s,
            budget_models=args.budget_models,
            queue_ms=args.placement_queue_ms,
            pressure_s=args.placement_pressure_s,
            evict_idle_s=args.evict_idle_s,
            min_resident_s=args.min_resident_s,
        )
        settings.policy()
        catalogue = local_catalogue(args.site, settings)
        key = read_admin_key(args.site)
    except (ValueError, OSError) as exc:  # CatalogueError is a ValueError
        parser.error(f"--placement: {exc}")
    site = args.site
    return PlacementLoop(catalogue, settings, key, metrics, pids=lambda: local_pids(site))


def build(
    args: argparse.Namespace, parser: argparse.ArgumentParser, actuate: Actuate | None = None
) -> Operator:
    """The operator the options describe (parser.error names what is wrong); `actuate` is
    what the site hands it to change the number of servers, if anything."""
    scaler = None
    if args.autoscale:
        try:
            low, high = (int(v) for v in args.autoscale.split(","))
            scaler = Autoscaler(
                ScalingPolicy(
                    low, high, args.target_ms, args.up_window, args.down_window, args.scaling_window
                )
            )
        except ValueError as exc:
            parser.error(f"--autoscale: expected min,max servers: {exc}")
    try:
        policy = AdmissionPolicy(
            shed_above_ms=args.shed_above_ms,
            open_below_ms=args.open_below_ms,
            min_hold_s=args.min_hold,
            retry_after_s=args.retry_after,
            inflight_cap=args.inflight_cap,
            compute_multiple=args.compute_multiple,
        )
        tries = TryPolicy(args.per_try_floor, args.per_try_cap, args.per_try_multiplier, args.hedge)
        loadview = LoadView(grace=args.scrape_grace)
    except ValueError as exc:
        parser.error(str(exc))
    if not 0 < args.shed_ttl <= SHED_TTL_S:
        parser.error(f"--shed-ttl: expected 0 < seconds ≤ {SHED_TTL_S:g}, got {args.shed_ttl:g}")
    jwt = None
    if args.jwt_issuer or args.jwt_jwks_file or args.jwt_jwks_uri:
        if not args.jwt_issuer:
            parser.error("--jwt-jwks-file/--jwt-jwks-uri: expected --jwt-issuer too")
        audiences = tuple(a for a in args.jwt_audiences.split(",") if a)
        try:
            jwt = JwtPolicy(
                args.jwt_issuer,
                args.jwt_jwks_file,
                audiences,
                jwks_uri=args.jwt_jwks_uri,
                jwks_cache_s=args.jwt_jwks_cache,
                jwks_ca_file=args.jwt_jwks_ca,
            )
        except ValueError as exc:
            parser.error(f"--jwt-jwks-file/--jwt-jwks-uri: {exc}")
    tracing = None
    if args.tracing_endpoint:
        try:
            tracing = EnvoyTracing(
                args.tracing_endpoint, args.tracing_sampling, args.tracing_service_name
            )
        except ValueError as exc:
            parser.error(str(exc))
    if bool(args.site) == bool(args.kubernetes):
        parser.error("give exactly one of --site (local) or --kubernetes NAMESPACE/SERVICE")
    if args.kubernetes:
        namespace, _, service = args.kubernetes.partition("/")
        models = tuple(m for m in args.models.split(",") if m)
        if not namespace or not service or not models:
            parser.error("--kubernetes: expected NAMESPACE/SERVICE and --models a,b")
        discovery = KubernetesDiscovery(kubernetes_api(args.kube_api), namespace, service, models)
    else:
        discovery = LocalDiscovery(args.site)
    for flag, value in (("--site-view", args.site_view), ("--site-view-http", args.site_view_http)):
        if value and not value.rpartition(":")[2].isdigit():
            parser.error(f"{flag}: expected host:port, got {value!r}")
    metrics = OperatorMetrics()
    placement = placement_loop(args, parser, metrics)
    listen_host, listen_port = args.envoy_listen.rsplit(":", 1)
    operator = Operator(
        discovery,
        listen_host,
        int(listen_port),
        args.interval,
        envoy_grpc=args.public_grpc or args.envoy_listen,
        policy=policy,
        balancing=Balancing(args.balancing),
        jwt=jwt,
        scaler=scaler,
        actuate=actuate if scaler else None,
        loadview=loadview,
        tries=TryTimeouts(tries),
        shed_ttl_s=args.shed_ttl,
        site_view=args.site_view,
        site_view_http=args.site_view_http,
        tracing=tracing,
        metrics=metrics,
        placement=placement,
    )
    operator.step()  # serve a full snapshot from the first request on
    return operator


def serve(operator: Operator, host: str, port: int) -> int:
    """Run the control loop and the HTTP API until SIGTERM or SIGINT."""
    server = make_server(operator, host, port)
    stop = threading.Event()
    loop = threading.Thread(target=operator.run, args=(stop,), daemon=True)
    loop.start()

    def shutdown(*_) -> None:
        stop.set()
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    server.serve_forever()
    loop.join(timeout=5)
    return 0


def main(argv: list[str] | None = None) -> int:
    options = parser()
    args = options.parse_args(argv)
    return serve(build(args, options), args.host, args.port)


if __name__ == "__main__":
    sys.exit(main())

"""The operator's command line: its options, every default of a policy being the policy's
own; their value types are the command line's own (sonicsite/contract/options.py). What
they decode to is option_policies.py."""

from __future__ import annotations

import argparse
from pathlib import Path

from sonicsite.contract.options import finite, non_negative, positive
from sonicsite.contract.wire import SHED_TTL_S

from .admission import AdmissionPolicy
from .autoscaler import ScalingPolicy
from .balancing import DEFAULT_POLICY, POLICIES
from .controller import STEP_INTERVAL_S
from .loadview import SCRAPE_GRACE
from .placement_settings import PlacementSettings
from .try_timeouts import TryPolicy
from .xds_ads import XDS_PORT
from .xds_jwt import SYSTEM_CA_FILE


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
        "--xds-port",
        type=int,
        default=XDS_PORT,
        help=f"the port of Envoy's configuration stream (gRPC ADS; default {XDS_PORT})",
    )
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
        "--interval", type=finite, default=STEP_INTERVAL_S, help="seconds between steps"
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
        type=finite,
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
    parser.add_argument(
        "--balancing-file",
        default="",
        help="where a PUT /v1/balancing's policy is kept; read back at start, over "
        "--balancing (operator/policy_file.py). Empty: a PUT lasts until a restart",
    )
    defaults = AdmissionPolicy()
    parser.add_argument(
        "--shed-above-ms",
        type=positive,
        default=defaults.shed_above_ms,
        help="shed a model when queue time per request is above this everywhere",
    )
    parser.add_argument(
        "--open-below-ms",
        type=non_negative,
        default=defaults.open_below_ms,
        help="reopen once some server is below this (hysteresis)",
    )
    parser.add_argument(
        "--min-hold",
        type=non_negative,
        default=defaults.min_hold_s,
        help="seconds an admission decision holds at least (a shed ends sooner when a "
        "server has none of the model's requests waiting)",
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
        type=non_negative,
        default=defaults.compute_multiple,
        help="thresholds at least this many times a model's compute time per request "
        "(a slow model queues longer before it is overloaded); 0: the ms thresholds alone",
    )
    parser.add_argument(
        "--shed-ttl",
        type=finite,
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
        type=finite,
        default=tries.floor_s,
        help="Envoy's shortest per-try timeout in seconds",
    )
    parser.add_argument(
        "--per-try-cap",
        type=finite,
        default=tries.cap_s,
        help="Envoy's longest per-try timeout in seconds (models never measured get it)",
    )
    parser.add_argument(
        "--per-try-multiplier",
        type=finite,
        default=tries.multiplier,
        help="per-try timeout: this many times the model's time per request",
    )
    parser.add_argument(
        "--hedge",
        action=argparse.BooleanOptionalAction,
        default=tries.hedge,
        help="on a per-try timeout, send a second copy to another server (first answer "
        "wins) instead of abandoning the first try; --no-hedge abandons it (a burst queued "
        "past the timeout then fails after its retries)",
    )
    parser.add_argument(
        "--autoscale",
        default="",
        metavar="MIN:MAX",
        help="scale the servers between MIN and MAX on queue time per request",
    )
    scaling = ScalingPolicy()
    parser.add_argument(
        "--target-ms",
        type=finite,
        default=scaling.target_ms,
        help="queue time per request the autoscaler aims at",
    )
    parser.add_argument(
        "--up-window",
        type=finite,
        default=scaling.up_window_s,
        help="scale-up stabilisation window in seconds",
    )
    parser.add_argument(
        "--down-window",
        type=finite,
        default=scaling.down_window_s,
        help="scale-down stabilisation window in seconds",
    )
    parser.add_argument(
        "--scaling-window",
        type=finite,
        default=scaling.window_s,
        help="seconds of counters the scaling metric is computed over",
    )
    parser.add_argument(
        "--busy-over-start",
        type=finite,
        default=scaling.busy_over_start,
        help="a scale-up starts only servers that the work clients declare keeps busy this "
        "many times a server's start (0: queue time alone decides)",
    )
    parser.add_argument(
        "--server-start-s",
        type=finite,
        default=scaling.server_start_s,
        help="a server's start to ready in seconds, until a scale-up has measured one",
    )
    placing = PlacementSettings()
    parser.add_argument(
        "--placement",
        action="store_true",
        help="load and unload models on the servers as their use asks (operator/"
        "placement_loop.py); off: every server keeps the models it started with",
    )
    parser.add_argument(
        "--admission-key-file",
        default="",
        help="the file holding the site's admission key: Envoy's inference replies carry "
        "each model's admission pass, and a shed spares the callers that bring one back "
        "(the gateway holds the same key); none: a shed refuses every caller",
    )
    parser.add_argument(
        "--admin-key-file",
        default="",
        help="with --placement and --kubernetes: the file holding the site's administrative "
        "key (the chart mounts its Secret); locally the site's own key is read",
    )
    parser.add_argument(
        "--idle-unload-s",
        type=finite,
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
        type=finite,
        default=placing.queue_ms,
        help="with --placement: queue time per request over which a model gets a replica more",
    )
    parser.add_argument(
        "--placement-pressure-s",
        type=finite,
        default=placing.pressure_s,
        help="with --placement: seconds the queue time stays over it before that replica",
    )
    parser.add_argument(
        "--evict-idle-s",
        type=finite,
        default=placing.evict_idle_s,
        help="with --placement: a model unused this long may be unloaded for another",
    )
    parser.add_argument(
        "--min-resident-s",
        type=finite,
        default=placing.min_resident_s,
        help="with --placement: a model loaded less long ago is never unloaded for another",
    )
    parser.add_argument(
        "--keep-warm",
        action="store_true",
        help="with --placement: a model's last replica is not unloaded for being idle, and a "
        "model with none is loaded where a server has room to spare (room another model "
        "needs is still made by unloading the least recently used)",
    )
    parser.add_argument(
        "--pool",
        action="append",
        default=[],
        metavar="NAME[=MODEL,...]",
        help="with --placement: a pool of servers and the models pinned to it (none: the pool "
        "of every model no other pool names); repeatable; default one pool, 'default'",
    )
    parser.add_argument(
        "--pool-service",
        action="append",
        default=[],
        metavar="POOL=SERVICE",
        help="with --kubernetes: the servers behind SERVICE (in the same namespace) are pool "
        "POOL; repeatable; none: the --kubernetes Service's servers, pool 'default'",
    )
    parser.add_argument(
        "--pool-autoscale",
        action="append",
        default=[],
        metavar="POOL=MIN:MAX",
        help="with --autoscale: pool POOL scales between MIN and MAX servers (the chart's "
        "pools' minReplicas and maxReplicas, as their ScaledObjects); repeatable; a pool "
        "not named: --autoscale's",
    )
    parser.add_argument(
        "--hold-deadline-s",
        action="append",
        default=[],
        metavar="[MODEL=]SECONDS",
        help="with --placement: how long a request for a model that no server holds is held "
        f"until a server holds it (default {placing.hold_deadline_s:g} s); MODEL=SECONDS sets "
        "one model's; repeatable",
    )
    return parser

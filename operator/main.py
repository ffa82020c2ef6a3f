"""`python -P -m sonicsite.operator.main`: run the operator (on Kubernetes, or for a local
site without autoscaling; the local site runs it through sonicsite.local.operator_main,
which hands it the actuator that starts and stops servers). Its options: options.py
(`parser` is importable from here too); what they decode to: option_policies.py."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
from pathlib import Path

from sonicsite.contract.admission_pass import AdmissionPasses
from sonicsite.contract.wire import SHED_TTL_S

from . import logs, option_policies, policy_file, xds_ads
from .admission import AdmissionPolicy
from .api import make_server
from .balancing import Balancing
from .controller import Operator
from .loadview import LoadView
from .metrics import OperatorMetrics
from .options import parser
from .placement_loop import PlacementLoop
from .placement_settings import local_catalogue, local_pids, named_catalogue, read_admin_key
from .pool_scaling import Actuate, PoolScaling
from .try_timeouts import TryPolicy, TryTimeouts

LOG = logging.getLogger("sonicsite.operator")

# how often the API server looks for a shutdown (the standard library polls, 0.5 s by default)
SHUTDOWN_POLL_S = 0.1


def placement_loop(
    args: argparse.Namespace, parser: argparse.ArgumentParser, metrics: OperatorMetrics
) -> PlacementLoop | None:
    """The placement actuator the options ask for (None without --placement): locally the
    site's repository is the catalogue and its key file the key; on Kubernetes the
    catalogue is `--models` (footprints are measured at load) and the key the mounted
    Secret's file (`--admin-key-file`)."""
    if not args.placement:
        return None
    settings = option_policies.placement_settings(args, parser)
    try:
        if args.site:
            catalogue = local_catalogue(args.site, settings)
            key = read_admin_key(args.site)
            site = args.site
            return PlacementLoop(catalogue, settings, key, metrics, pids=lambda: local_pids(site))
        names = [m for m in args.models.split(",") if m]
        if not args.admin_key_file:
            parser.error("--placement: expected --admin-key-file (model control is restricted)")
        catalogue = named_catalogue(names, settings)
        key = Path(args.admin_key_file).read_text().strip()
    except (ValueError, OSError) as exc:  # CatalogueError is a ValueError
        parser.error(f"--placement: {exc}")
    if not key:
        parser.error(f"--placement: the admin key file {args.admin_key_file} is empty")
    return PlacementLoop(catalogue, settings, key, metrics)


def _balancing(args: argparse.Namespace) -> str:
    """The policy to start with: the one a PUT kept in the balancing file, else --balancing
    (a file that cannot be read is said, and the site runs on: the policy is advice)."""
    if not args.balancing_file:
        return args.balancing
    try:
        kept = policy_file.read_kept(args.balancing_file)
    except ValueError as exc:
        LOG.error("%s; balancing by --balancing=%s", exc, args.balancing)
        return args.balancing
    if kept and kept != args.balancing:
        LOG.info(
            "balancing policy %s, as a PUT kept it in %s (over --balancing=%s)",
            kept,
            args.balancing_file,
            args.balancing,
        )
    return kept or args.balancing


def build(
    args: argparse.Namespace, parser: argparse.ArgumentParser, actuate: Actuate | None = None
) -> Operator:
    """The operator the options describe (parser.error names what is wrong); `actuate` is
    what the site hands it to change the number of servers, if anything. Its log is set up
    first (logs.py) and told that it starts, with what, before its first step."""
    logs.configure()
    scaler = option_policies.autoscaler(args, parser)
    limits = option_policies.pool_limits(args, parser, scaler.policy if scaler else None)
    policy = option_policies.checked(
        parser,
        lambda: AdmissionPolicy(
            shed_above_ms=args.shed_above_ms,
            open_below_ms=args.open_below_ms,
            min_hold_s=args.min_hold,
            retry_after_s=args.retry_after,
            inflight_cap=args.inflight_cap,
            compute_multiple=args.compute_multiple,
        ),
    )
    tries = option_policies.checked(
        parser,
        lambda: TryPolicy(
            args.per_try_floor, args.per_try_cap, args.per_try_multiplier, args.hedge
        ),
    )
    loadview = option_policies.checked(parser, lambda: LoadView(grace=args.scrape_grace))
    if not 0 < args.shed_ttl <= SHED_TTL_S:
        parser.error(f"--shed-ttl: expected 0 < seconds ≤ {SHED_TTL_S:g}, got {args.shed_ttl:g}")
    jwt = option_policies.jwt_policy(args, parser)
    tracing = option_policies.envoy_tracing(args, parser)
    discovery = option_policies.discovery(args, parser)
    for flag, value in (("--site-view", args.site_view), ("--site-view-http", args.site_view_http)):
        if value and not value.rpartition(":")[2].isdigit():
            parser.error(f"{flag}: expected host:port, got {value!r}")
    passes = None
    if args.admission_key_file:
        passes = option_policies.checked(
            parser,
            lambda: AdmissionPasses.from_file(args.admission_key_file),
            "--admission-key-file: ",
        )
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
        balancing=Balancing(_balancing(args)),
        balancing_file=args.balancing_file,
        jwt=jwt,
        passes=passes,
        scaling=PoolScaling(scaler.policy, actuate, metrics, limits) if scaler else None,
        loadview=loadview,
        tries=TryTimeouts(tries),
        shed_ttl_s=args.shed_ttl,
        site_view=args.site_view,
        site_view_http=args.site_view_http,
        tracing=tracing,
        metrics=metrics,
        placement=placement,
    )
    logs.LOG.info("%s", logs.start_line(args, operator))
    operator.step()  # serve a full snapshot from the first request on
    return operator


def serve(operator: Operator, host: str, port: int, xds_port: int) -> int:
    """Run the control loop, the HTTP API and Envoy's ADS stream until SIGTERM or SIGINT."""
    server = make_server(operator, host, port)
    ads, _ = xds_ads.serve(xds_ads.AdsServer.of(operator), host, xds_port)
    stop = threading.Event()
    loop = threading.Thread(target=operator.run, args=(stop,), daemon=True)
    loop.start()

    def shutdown(*_) -> None:
        stop.set()
        operator.wakeup.set()  # the loop's wait between steps ends now, not at the interval
        threading.Thread(target=server.shutdown, daemon=True).start()

    signal.signal(signal.SIGTERM, shutdown)
    signal.signal(signal.SIGINT, shutdown)
    server.serve_forever(poll_interval=SHUTDOWN_POLL_S)
    ads.stop(grace=1)
    loop.join(timeout=5)
    return 0


def main(argv: list[str] | None = None) -> int:
    command_line = parser()
    args = command_line.parse_args(argv)
    return serve(build(args, command_line), args.host, args.port, args.xds_port)


if __name__ == "__main__":
    sys.exit(main())

"""`python -P -m sonicsite.gateway.main`: run the gateway with uvicorn (server.py: bodies
passed through, read into one shared buffer, freed memory kept). Its log's start line is
written once its ports are bound (`Started`): a gateway whose port is taken logs uvicorn's
bind error and exits 3, and no "gateway started" line before it misleads the reader."""

from __future__ import annotations

import argparse
import functools
import socket
import sys
from pathlib import Path

import uvicorn

from sonicsite.contract.admission_pass import AdmissionPasses

from . import logs
from .app import GatewayConfig, create_app
from .freed_memory import keep_freed_memory
from .jwks import JwksSettings
from .server import READ_SIZE, PassThroughProtocol
from .splicing import Pipes
from .tracing import TracingSettings

STARTUP_FAILURE = 3  # uvicorn's exit status when the app's start or a bind fails


class Started(uvicorn.Server):
    """uvicorn's server, logging `line` once the app has started (its gRPC view bound, in
    the lifespan) and the HTTP port is bound: a failed start exits before it."""

    def __init__(self, config: uvicorn.Config, line: str) -> None:
        super().__init__(config)
        self.line = line

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        if self.started:
            logs.LOG.info("%s", self.line)


def configured(argv: list[str] | None = None) -> tuple[argparse.Namespace, GatewayConfig]:
    """The command line read into the gateway's settings, with the files it names (the
    admission key, the JWKS settings) read and checked: a usage error names the option."""
    parser = argparse.ArgumentParser(prog="sonicsite-gateway")
    parser.add_argument("--operator", required=True, help="the operator's API, http://host:port")
    parser.add_argument(
        "--name", default="sonicsite", help="the site's name: what stock tools see at /v2"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=0,
        help="serve the site's one-server view over gRPC (server metadata, statistics, "
        "repository index) on this port, for Envoy's routes (0: not served)",
    )
    parser.add_argument(
        "--public", default="", help="host:port clients use for this gateway (default host:port)"
    )
    parser.add_argument(
        "--tokens", type=Path, default=None, help="bearer tokens file, one per line (enables auth)"
    )
    parser.add_argument(
        "--jwt-issuer", default="", help="accept bearer JWTs from this issuer (with a JWKS)"
    )
    parser.add_argument(
        "--jwt-audiences", default="", help="comma-separated accepted audiences (default: any)"
    )
    parser.add_argument(
        "--jwks-uri", default="", help="the issuer's JWKS URI (refetched as its keys rotate)"
    )
    parser.add_argument("--jwks-file", type=Path, default=None, help="the issuer's JWKS file")
    parser.add_argument(
        "--jwks-ca", type=Path, default=None, help="a CA file for the JWKS URI's host"
    )
    parser.add_argument(
        "--jwks-max-age", type=float, default=300.0, help="seconds a fetched JWKS is kept"
    )
    parser.add_argument(
        "--site-state",
        type=Path,
        default=None,
        help="a local site's state file: /v1/status and the status page list the site's "
        "processes (leave out on Kubernetes, where the cluster restarts pods)",
    )
    parser.add_argument(
        "--admission-key-file",
        default="",
        help="the file holding the site's admission key (the operator holds it too): "
        "inference replies carry each model's admission pass, and a shed spares the "
        "callers that bring one back; none: a shed refuses every caller",
    )
    parser.add_argument("--refresh", type=float, default=0.5, help="seconds between state reads")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per upstream request")
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=GatewayConfig.max_body_bytes,
        help="the most an inference body may be (binary data past its JSON part is streamed)",
    )
    parser.add_argument(
        "--max-json-bytes",
        type=int,
        default=GatewayConfig.max_json_bytes,
        help="the most the gateway reads of a body into memory: a binary request's JSON part, "
        "a JSON or compressed body whole (keep it well under the gateway's memory limit)",
    )
    parser.add_argument(
        "--tracing-endpoint",
        default="",
        help="export OpenTelemetry spans to this OTLP/HTTP traces URL "
        "(http(s)://host:port/v1/traces); default: the gateway does not trace",
    )
    parser.add_argument(
        "--tracing-sampling",
        type=float,
        default=1.0,
        help="ratio (0 to 1) of requests without a W3C traceparent that are traced "
        "(a request with one is traced as its caller decided)",
    )
    parser.add_argument(
        "--tracing-service-name", default="sonicsite-gateway", help="service.name of its spans"
    )
    parser.add_argument(
        "--tracing-export-delay-ms",
        type=int,
        default=5000,
        help="milliseconds spans are batched before they are exported",
    )
    args = parser.parse_args(argv)
    sizes = {"--max-body-bytes": args.max_body_bytes, "--max-json-bytes": args.max_json_bytes}
    for flag, value in sizes.items():
        if value < 1:
            parser.error(f"{flag}: expected a count of bytes of at least 1, got {value}")
    if args.tokens is not None and not args.tokens.is_file():
        parser.error(f"--tokens: expected a file of bearer tokens, {args.tokens} does not exist")
    if args.site_state is not None and not args.site_state.is_file():
        parser.error(
            f"--site-state: expected a site's state.json, {args.site_state} does not exist"
        )
    jwks = None
    if args.jwt_issuer:
        try:
            jwks = JwksSettings(
                uri=args.jwks_uri,
                file=args.jwks_file,
                max_age_s=args.jwks_max_age,
                ca_file=args.jwks_ca,
            )
        except ValueError as exc:
            parser.error(f"--jwks-uri/--jwks-file: {exc}")
    elif args.jwks_uri or args.jwks_file:
        parser.error("--jwks-uri/--jwks-file: expected --jwt-issuer too")
    tracing = None
    if args.tracing_endpoint:
        try:
            tracing = TracingSettings(
                args.tracing_endpoint,
                args.tracing_sampling,
                args.tracing_service_name,
                args.tracing_export_delay_ms,
            )
        except ValueError as exc:
            parser.error(str(exc))
    passes = None
    if args.admission_key_file:
        try:
            passes = AdmissionPasses.from_file(args.admission_key_file)
        except ValueError as exc:
            parser.error(f"--admission-key-file: {exc}")
    config = GatewayConfig(
        operator=args.operator,
        name=args.name,
        grpc=f"{args.host}:{args.grpc_port}" if args.grpc_port else "",
        http=args.public or f"{args.host}:{args.port}",
        tokens=args.tokens,
        jwt_issuer=args.jwt_issuer,
        jwt_audiences=tuple(a for a in args.jwt_audiences.split(",") if a),
        jwks=jwks,
        site_state=args.site_state,
        refresh_s=args.refresh,
        timeout_s=args.timeout,
        max_body_bytes=args.max_body_bytes,
        max_json_bytes=args.max_json_bytes,
        tracing=tracing,
        passes=passes,
    )
    return args, config


def main(argv: list[str] | None = None) -> int:
    """Serve until stopped: 0, or STARTUP_FAILURE when the app's start or a bind failed."""
    args, config = configured(argv)
    logs.configure()  # uvicorn's lines too (log_config=None: they reach the root logger)
    keep_freed_memory()
    served = uvicorn.Config(
        create_app(config),
        host=args.host,
        port=args.port,
        # one read buffer and one set of pipes for every client connection: the event
        # loop's (server.py, splicing.py)
        http=functools.partial(
            PassThroughProtocol, read_buffer=bytearray(READ_SIZE), pipes=Pipes()
        ),
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )
    server = Started(served, logs.start_line(args))
    server.run()
    return 0 if server.started else STARTUP_FAILURE


if __name__ == "__main__":
    sys.exit(main())

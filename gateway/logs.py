"""The gateway's log: every line `<time> gateway: <what>` (the supervisor's style, uvicorn's
own lines too), and one line at each start saying what runs, as which PID, on which ports,
following which operator, so that a restart is seen as one in the log.

The gateway says what it decides and sees change, once per change (siteview.py, holding.py,
forwarding.py through transitions.py), at INFO or WARNING; other libraries' lines from
WARNING (httpx2's INFO is a line per request)."""

from __future__ import annotations

import argparse
import logging
import os
import sys

PROCESS = "gateway"
PACKAGE_LOGGER = "sonicsite"  # the gateway's loggers are under it: sonicsite.gateway.*
LOG = logging.getLogger("sonicsite.gateway")


def configure(process: str = PROCESS) -> None:
    """Timestamped lines to stderr (the site's log file), `<time> <process>: <message>`;
    the project's own INFO lines kept, other libraries' from WARNING. Leaves a logging
    already configured as it is."""
    logging.basicConfig(
        level=logging.WARNING, format=f"%(asctime)s {process}: %(message)s", stream=sys.stderr
    )
    logging.getLogger(PACKAGE_LOGGER).setLevel(logging.INFO)


def _auth(args: argparse.Namespace) -> str:
    said = [f"tokens {args.tokens}"] if args.tokens else []
    if args.jwt_issuer:
        said.append(f"JWTs of {args.jwt_issuer} (keys {args.jwks_uri or args.jwks_file})")
    return ", ".join(said) if said else "open (no tokens)"


def start_line(args: argparse.Namespace) -> str:
    """One line: what starts, its PID, its ports, what it follows and how it is set."""
    grpc = f"{args.host}:{args.grpc_port}" if args.grpc_port else "off"
    public = f" (clients: {args.public})" if args.public else ""
    return (
        f"gateway started: pid {os.getpid()}; HTTP {args.host}:{args.port}{public}, gRPC "
        f"view {grpc}; following the operator at {args.operator} every {args.refresh:g} s; "
        f"processes from {args.site_state or 'none (no site state)'}; auth {_auth(args)}; "
        f"admission passes {'on' if args.admission_key_file else 'off'}; upstream timeout "
        f"{args.timeout:g} s; tracing {args.tracing_endpoint or 'off'}"
    )

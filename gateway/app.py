"""The gateway's app: KServe v2 over REST (routes_kserve.py), the site's own routes
(routes_site.py), clients' work reports relayed to the operator (routes_work.py), bearer
tokens (auth.py), errors in KServe's shape, and the lifespan that follows the operator's
state (siteview.py), serves the one-server view over gRPC (grpc_view.py) for Envoy and holds
requests for models no server holds (holding.py).

The loops the lifespan starts (following the operator's state, reporting held requests)
handle their own failures and go on; one that ends all the same (a bug outside its
handling) would leave the gateway routing on a frozen state while it looked healthy, so it
is logged with its traceback and `/healthz` fails from then on (`Background`)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import socket
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Receive, Scope, Send

from sonicsite.contract.admission_pass import AdmissionPasses
from sonicsite.contract.wire import CONTROL_HEADER

from . import grpc_view, routes_kserve, routes_refused, routes_site, routes_work
from .auth import Authenticator, BearerAuth, Tokens
from .forwarding import Forwarder, error
from .holding import Holder
from .jwks import JwksCache, JwksSettings
from .jwt_auth import JwtVerifier
from .metrics import GatewayMetrics
from .siteview import SiteView
from .tracing import GatewayTracing, TracingSettings

LOG = logging.getLogger(__name__)


@dataclass
class GatewayConfig:
    operator: str  # base URL of the operator's API, e.g. http://127.0.0.1:8081
    name: str = "sonicsite"  # the site's name: the one server name stock tools see at /v2
    http: str = ""  # this gateway's own address as clients reach it (published in /v1/site)
    tokens: Path | None = None  # bearer tokens file; None disables authentication
    # bearer JWTs of the site's identity provider: its issuer ("" = no JWTs), the accepted
    # audiences (empty: any) and where its keys are (a URI, refetched as keys rotate, or a file)
    jwt_issuer: str = ""
    jwt_audiences: tuple[str, ...] = ()
    jwks: JwksSettings | None = None
    site_state: Path | None = None  # a local site's state file: its processes for /v1/status
    refresh_s: float = 0.5  # how often the operator's state is read
    timeout_s: float = 60.0  # per upstream request
    max_body_bytes: int = 1 << 30  # a request's body, streamed on past its JSON part
    # what the gateway reads of a body into memory: a binary request's JSON part, a JSON or
    # compressed body whole (kserve.py `check_read`): well under the pod's memory limit
    max_json_bytes: int = 64 << 20
    grpc: str = ""  # host:port of the one-server view over gRPC (grpc_view.py); "" = none
    tracing: TracingSettings | None = None  # the gateway's own tracer (tracing.py); None: off
    # the admission passes its inference replies carry and a shed accepts (None: none given,
    # a shed refuses every caller): sonicsite/contract/admission_pass.py
    passes: AdmissionPasses | None = None


@dataclass
class Background:
    """The lifespan's loops, watched: one that ends other than by being cancelled at
    shutdown is logged and recorded in `ended` (loop's name: why), which /healthz reports."""

    tasks: dict[str, asyncio.Task] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)  # loop's name: why it ended

    def start(self, name: str, loop: Coroutine[Any, Any, None]) -> asyncio.Task:
        """Run `loop` as a task, watched: its end is told, never silent."""
        task = asyncio.create_task(loop, name=name)
        self.tasks[name] = task
        task.add_done_callback(lambda done: self._ended(name, done))
        return task

    def _ended(self, name: str, task: asyncio.Task) -> None:
        if task.cancelled():  # shutdown
            return
        exc = task.exception()
        why = f"raised {exc!r}" if exc is not None else "returned"
        self.ended[name] = why
        LOG.error(
            "the gateway's %s loop stopped (%s): it no longer runs, /healthz fails until the "
            "gateway is restarted",
            name,
            why,
            exc_info=exc,
        )

    def cancel(self) -> None:
        for task in self.tasks.values():
            task.cancel()


class GatewayApp(FastAPI):
    """FastAPI, but an inference POST goes to `infer` (routes_kserve.py `serve_infer`,
    behind authentication when the site has tokens) before FastAPI's own layers: their
    telemetry check, error and body-limit wrappers cost a tenth of the gateway's time per
    request with 1 MB tensors, on the one route whose every microsecond counts."""

    infer: ASGIApp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scope = routes_kserve.raw_path(scope)  # model names as Triton reads them
        if routes_kserve.is_infer(scope):
            scope["app"] = self  # as Starlette sets it: the handlers read app.state
            await self.infer(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def create_app(config: GatewayConfig) -> GatewayApp:
    # named for the operator's drains: one name per process, as replicas share an address
    view = SiteView(config.operator.rstrip("/"), reader=f"{socket.gethostname()}:{os.getpid()}")
    metrics = GatewayMetrics()
    tracing = GatewayTracing.start(config.tracing) if config.tracing else None
    holder = Holder(view, metrics, answer_s=config.timeout_s)
    forwarder = Forwarder(view, metrics, config.timeout_s, tracing=tracing, holder=holder)
    auth = Authenticator(Tokens(config.tokens), _jwt_verifier(config))
    background = Background()  # loops that must not end unseen: /healthz fails if one does

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx2.Limits(max_connections=16, max_keepalive_connections=4)
        # the operator takes held counts and work reports with the site's control token
        control = {CONTROL_HEADER: config.passes.control_token()} if config.passes else {}
        async with httpx2.AsyncClient(
            limits=limits, timeout=config.timeout_s, headers=control
        ) as client:
            app.state.operator_client = client  # clients' work reports relayed (routes_work.py)
            await view.refresh()
            if auth.jwt is not None:
                await auth.jwt.keys.refresh()  # the first request need not wait for the keys
            background.start("operator state", view.follow(config.refresh_s))
            # each replica reports under its own name: the operator keeps one report a
            # source, and replicas that share the site's public address overwrote each other
            source = f"{config.http or config.name}@{socket.gethostname()}:{os.getpid()}"
            background.start("held counts", holder.report(client, source))
            served = (
                await grpc_view.serve(forwarder, config.name, config.grpc, holder, config.passes)
                if config.grpc
                else None
            )
            # what start-up made lives as long as the process: out of the collector's way
            # (its passes walked all of it: a tenth of the gateway's busy time with 1 MB
            # tensors, measured with py-spy; 2 % after)
            gc.freeze()
            try:
                yield
            finally:
                background.cancel()
                view.close()
                if served is not None:
                    await served.stop(grace=1.0)
                await holder.close()
                forwarder.close()
                if tracing is not None:
                    tracing.close()
                if auth.jwt is not None:
                    await auth.jwt.keys.aclose()

    app = GatewayApp(
        title="sonicsite gateway",
        description="KServe v2 inference over REST for the site's Triton servers, "
        "with per-request balancing and admission; site discovery for clients.",
        lifespan=lifespan,
    )
    app.state.config = config
    app.state.view = view
    app.state.metrics = metrics
    app.state.forwarder = forwarder
    app.state.background = background

    @app.exception_handler(HTTPException)
    async def kserve_error(request: Request, exc: HTTPException) -> Response:
        """Errors in KServe v2's shape, {"error": ...}, which stock clients read; a path
        with no route gets Triton's own 404 body (`{"error":"Not Found"}`), asked of a
        server in tests/compat, so that code matching on it reads the site as a server."""
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404:
            detail = "Not Found"
        return error(exc.status_code, detail, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return error(422, f"{request.url.path}: {exc.errors()}")

    app.infer = routes_kserve.serve_infer
    if auth.enabled:
        app.add_middleware(BearerAuth, auth=auth, metrics=metrics)
        app.infer = BearerAuth(routes_kserve.serve_infer, auth=auth, metrics=metrics)
    app.include_router(routes_kserve.router)
    app.include_router(routes_site.router)
    app.include_router(routes_work.router)
    app.include_router(routes_refused.router)
    return app


def _jwt_verifier(config: GatewayConfig) -> JwtVerifier | None:
    if not config.jwt_issuer:
        return None
    if config.jwks is None:
        raise ValueError("jwt_issuer: expected the issuer's keys too (jwks: a URI or a file)")
    return JwtVerifier(config.jwt_issuer, config.jwt_audiences, JwksCache(config.jwks))

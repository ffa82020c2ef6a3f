"""The gateway's routes: KServe v2 over REST, `/v1/site`, the status page, `/metrics`.

Every inference request is checked against the model (kserve.py), refused at once with 429
and Retry-After while the operator sheds its model, then sent to one server chosen per
request (balancer.py). A request whose connection fails is retried once on another server;
its body is sent as received, binary tensors and all.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import httpx
from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.exceptions import HTTPException

from .auth import Tokens
from .balancer import Upstreams
from .kserve import HEADER, BadRequest, ModelContract, check_infer, split_body
from .metrics import GatewayMetrics
from .siteview import SiteView
from .statistics import merge_statistics
from .status import STATUS_PAGE
from .upstream import BodyMismatch, ConnectFailed, Upstream
from .upstream import Reply as UpstreamReply

PASSED_HEADERS = ("content-type", HEADER)
CONTRACT_TTL_S = 60.0


@dataclass
class GatewayConfig:
    operator: str  # base URL of the operator's API, e.g. http://127.0.0.1:8081
    http: str = ""  # this gateway's own address as clients reach it (published in /v1/site)
    tokens: Path | None = None  # bearer tokens file; None disables authentication
    refresh_s: float = 0.5  # how often the operator's state is read
    timeout_s: float = 60.0  # per upstream request
    max_body_bytes: int = 1 << 30


def _error(status: int, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status, headers=headers)


class BearerAuth:
    """Plain ASGI middleware (no body buffering): 401 unless the bearer token is valid."""

    def __init__(self, app, tokens: Tokens, metrics: GatewayMetrics):
        self.app, self.tokens, self.metrics = app, tokens, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            authorization = headers.get(b"authorization", b"").decode("latin-1") or None
            why = self.tokens.check(scope["path"], authorization)
            if why:
                self.metrics.rejections.labels("", "unauthorized").inc()
                reply = _error(401, why, {"WWW-Authenticate": "Bearer"})
                await reply(scope, receive, send)
                return
        await self.app(scope, receive, send)


def create_app(config: GatewayConfig) -> FastAPI:
    view = SiteView(config.operator.rstrip("/"))
    upstreams = Upstreams(view)
    metrics = GatewayMetrics()
    tokens = Tokens(config.tokens)
    contracts: dict[str, tuple[float, ModelContract]] = {}
    holder: dict[str, httpx.AsyncClient] = {}  # for the operator's state
    upstream = Upstream()  # for the servers

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
        client = httpx.AsyncClient(limits=limits, timeout=config.timeout_s)
        holder["client"] = client
        await view.refresh(client)
        follower = asyncio.create_task(view.follow(client, config.refresh_s))
        try:
            yield
        finally:
            follower.cancel()
            upstream.close()
            await client.aclose()

    app = FastAPI(
        title="sonicsite gateway",
        description="KServe v2 inference over REST for the site's Triton servers, "
        "with per-request balancing and admission; site discovery for clients.",
        lifespan=lifespan,
    )
    app.state.view = view
    app.state.metrics = metrics

    @app.exception_handler(HTTPException)
    async def kserve_error(request: Request, exc: HTTPException) -> Response:
        """Errors in KServe v2's shape, {"error": ...}, which stock clients read."""
        detail = exc.detail if isinstance(exc.detail, str) else json.dumps(exc.detail)
        if exc.status_code == 404:
            detail = f"no route {request.method} {request.url.path}"
        return _error(exc.status_code, detail, getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        return _error(422, f"{request.url.path}: {exc.errors()}")

    if tokens.enabled:
        app.add_middleware(BearerAuth, tokens=tokens, metrics=metrics)

    async def send(
        method: str,
        model: str,
        path: str,
        body: bytes = b"",
        headers: dict | None = None,
        rest: AsyncIterator[bytes] | None = None,
        length: int | None = None,
    ) -> Response:
        """One request to a server of `model` ('' = any server); retried once elsewhere
        when the connection fails. `rest`: the body's remaining chunks, streamed on."""
        tried = ""
        for attempt in range(2):
            endpoint = upstreams.pick(model, avoid=tried) if model else _any(tried)
            if endpoint is None:
                if attempt:
                    break
                served = view.models
                if model and model not in served:
                    metrics.rejections.labels(model, "unknown_model").inc()
                    return _error(404, f"unknown model {model!r}: the site serves {served}")
                return _error(503, f"no ready server serves {model or 'requests'} now")
            started = time.perf_counter()
            try:
                reply = await upstream.request(
                    endpoint.transport, method, path, headers, body, config.timeout_s, rest, length
                )
            except ConnectFailed as exc:
                upstreams.done(endpoint, None)
                metrics.upstream_errors.labels(endpoint.id, "connect").inc()
                if not attempt:
                    metrics.retries.labels(model).inc()
                tried = endpoint.id
                last = f"{endpoint.id}: {exc}"
                continue
            except TimeoutError:
                upstreams.done(endpoint, None)
                metrics.upstream_errors.labels(endpoint.id, "timeout").inc()
                return _error(504, f"{endpoint.id}: no answer within {config.timeout_s} s")
            except BodyMismatch as exc:
                upstreams.done(endpoint, None)
                return _error(400, str(exc))
            except (ConnectionError, OSError, ValueError) as exc:  # failed mid-reply
                upstreams.done(endpoint, None)
                metrics.upstream_errors.labels(endpoint.id, "broken").inc()
                return _error(502, f"{endpoint.id}: the reply broke off: {exc!r}")
            upstreams.done(endpoint, time.perf_counter() - started)
            if reply.status >= 500:
                metrics.upstream_errors.labels(endpoint.id, "5xx").inc()
            passed = {k: v for k, v in reply.headers.items() if k in PASSED_HEADERS}
            passed["sonicsite-server"] = endpoint.id
            return Response(reply.body, reply.status, headers=passed)
        return _error(502, f"no server could be reached: {last}")

    def _any(avoid: str):
        for model in view.models:
            endpoint = upstreams.pick(model, avoid)
            if endpoint is not None:
                return endpoint
        return None

    async def contract(model: str) -> ModelContract | Response:
        cached = contracts.get(model)
        if cached and time.monotonic() - cached[0] < CONTRACT_TTL_S:
            return cached[1]
        metadata = await send("GET", model, _version_path(model, None))
        if metadata.status_code != 200:
            return metadata
        config_reply = await send("GET", model, _version_path(model, None) + "/config")
        if config_reply.status_code != 200:
            return config_reply
        found = ModelContract.from_triton(json.loads(metadata.body), json.loads(config_reply.body))
        contracts[model] = (time.monotonic(), found)
        return found

    def _version_path(model: str, version: str | None) -> str:
        """The server's path for a model (and version), names percent-encoded again: what
        arrived decoded goes on as one path segment, whatever it holds."""
        path = f"/v2/models/{quote(model, safe='')}"
        return path + (f"/versions/{quote(version, safe='')}" if version else "")

    # -- KServe v2 ---------------------------------------------------------------------------

    @app.get("/v2/health/live", tags=["kserve"])
    async def live() -> dict:
        return {"live": True}

    @app.get("/v2/health/ready", tags=["kserve"])
    async def ready() -> Response:
        ok = any(s.ready and not s.draining for s in view.servers)
        return JSONResponse({"ready": ok}, status_code=200 if ok else 503)

    @app.get("/v2", tags=["kserve"])
    async def server_metadata() -> Response:
        return await send("GET", "", "/v2")

    async def _model_get(model: str, version: str | None, suffix: str) -> Response:
        return await send("GET", model, _version_path(model, version) + suffix)

    @app.get("/v2/models/{model}", tags=["kserve"])
    async def model_metadata(model: str) -> Response:
        return await _model_get(model, None, "")

    @app.get("/v2/models/{model}/versions/{version}", tags=["kserve"])
    async def model_version_metadata(model: str, version: str) -> Response:
        return await _model_get(model, version, "")

    @app.get("/v2/models/{model}/ready", tags=["kserve"])
    async def model_ready(model: str) -> Response:
        return await _model_get(model, None, "/ready")

    @app.get("/v2/models/{model}/versions/{version}/ready", tags=["kserve"])
    async def model_version_ready(model: str, version: str) -> Response:
        return await _model_get(model, version, "/ready")

    @app.get("/v2/models/{model}/config", tags=["kserve"])
    async def model_config(model: str) -> Response:
        return await _model_get(model, None, "/config")

    @app.get("/v2/models/{model}/versions/{version}/config", tags=["kserve"])
    async def model_version_config(model: str, version: str) -> Response:
        return await _model_get(model, version, "/config")

    async def _statistics(model: str, version: str | None) -> Response:
        """Triton's statistics summed over every server of the model: the site's view."""
        servers = view.serving(model)
        if not servers:
            return await send("GET", model, _version_path(model, version) + "/stats")
        path = _version_path(model, version) + "/stats"
        replies = await asyncio.gather(
            *(upstream.request(s.http, "GET", path, timeout=10.0) for s in servers),
            return_exceptions=True,
        )
        good = [
            json.loads(r.body) for r in replies if isinstance(r, UpstreamReply) and r.status == 200
        ]
        if not good:
            answered = [r for r in replies if isinstance(r, UpstreamReply)]
            if answered:  # the servers refused the request (e.g. no such version): say why
                kind = answered[0].headers.get("content-type", "application/json")
                return Response(answered[0].body, answered[0].status, media_type=kind)
            return _error(502, f"no server of {model!r} answered its statistics")
        return JSONResponse(merge_statistics(good))

    @app.get("/v2/models/{model}/stats", tags=["kserve"])
    async def model_statistics(model: str) -> Response:
        return await _statistics(model, None)

    @app.get("/v2/models/{model}/versions/{version}/stats", tags=["kserve"])
    async def model_version_statistics(model: str, version: str) -> Response:
        return await _statistics(model, version)

    async def _infer(request: Request, model: str, version: str | None) -> Response:
        started = time.perf_counter()
        route = "infer_binary" if HEADER in request.headers else "infer_json"
        reply = await _infer_reply(request, model, version)
        metrics.latency.labels(model, route, str(reply.status_code)).observe(
            time.perf_counter() - started
        )
        return reply

    async def _infer_reply(request: Request, model: str, version: str | None) -> Response:
        admission = view.admission.get(model)
        if admission is not None and admission.state == "shed":
            metrics.rejections.labels(model, "shed").inc()
            wait = max(1, admission.retry_after_s)
            return _error(
                429,
                f"model {model!r} is shed: {admission.reason}; retry after {wait} s",
                {"Retry-After": str(wait)},
            )
        declared = request.headers.get("content-length")
        total = int(declared) if declared is not None and declared.isdigit() else None
        if total is not None and total > config.max_body_bytes:
            metrics.rejections.labels(model, "bad_request").inc()
            return _error(413, f"body: over {config.max_body_bytes} bytes")
        found = await contract(model)
        if isinstance(found, Response):
            return found
        header_length = request.headers.get(HEADER)
        prefix, rest = await _head_of_body(request, header_length, total)
        try:
            parsed, binary = split_body(prefix, header_length, total)
            check_infer(found, parsed, binary)
        except BadRequest as exc:
            metrics.rejections.labels(model, "bad_request").inc()
            return _error(exc.status, f"model {model!r}: {exc}")
        headers = {k: v for k, v in request.headers.items() if k in PASSED_HEADERS}
        path = _version_path(model, version) + "/infer"
        return await send("POST", model, path, prefix, headers, rest, total)

    async def _head_of_body(
        request: Request, header_length: str | None, total: int | None
    ) -> tuple[bytes, AsyncIterator[bytes] | None]:
        """A binary request's JSON part (and what came with it), and the rest of the body
        still to arrive; any other request's whole body."""
        if header_length is None or total is None or not header_length.isdigit():
            return await request.body(), None
        wanted = int(header_length)
        chunks, have = [], 0
        stream = request.stream()
        async for chunk in stream:
            chunks.append(chunk)
            have += len(chunk)
            if have >= wanted:
                break
        # all of it already here: sent as a whole, so a dead kept-alive connection can retry
        return b"".join(chunks), (stream if have < total else None)

    @app.post("/v2/models/{model}/infer", tags=["kserve"])
    async def infer(request: Request, model: str) -> Response:
        return await _infer(request, model, None)

    @app.post("/v2/models/{model}/versions/{version}/infer", tags=["kserve"])
    async def infer_version(request: Request, model: str, version: str) -> Response:
        return await _infer(request, model, version)

    # -- the site ----------------------------------------------------------------------------

    @app.get("/v1/site", tags=["site"])
    async def site() -> dict:
        """What a client needs: the balanced gRPC endpoint (Envoy), this HTTP endpoint, the
        servers with their models, admission per model."""
        return {
            "grpc": view.grpc,
            "http": config.http,
            "servers": [
                {
                    "id": s.id,
                    "grpc": s.grpc,
                    "http": s.http,
                    "models": list(s.models),
                    "ready": s.ready,
                    "draining": s.draining,
                }
                for s in view.servers
            ],
            "admission": {
                m: {"state": a.state, "retry_after_s": a.retry_after_s, "reason": a.reason}
                for m, a in view.admission.items()
            },
            "updated_at": view.updated_at,
        }

    @app.get("/v1/status", tags=["site"])
    async def status() -> dict:
        """The operator's state as the status page shows it, and how fresh it is."""
        return {"state": view.state, "updated_at": view.updated_at, "error": view.error}

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def status_page() -> str:
        return STATUS_PAGE

    @app.get("/metrics", tags=["site"])
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/healthz", tags=["site"])
    async def healthz() -> Response:
        fresh = time.time() - view.updated_at < 10 * config.refresh_s + 5
        body = {"ok": fresh, "operator_state_age_s": round(time.time() - view.updated_at, 3)}
        if view.error:
            body["error"] = view.error
        return JSONResponse(body, status_code=200 if fresh else 503)

    return app

"""`PUT /v1/work`: a client's work left (contract `WorkReport`), passed on to the operator.

Clients know the gateway, not the operator (which a site need not expose), so the gateway
relays their reports: a bad one is refused here with the field that is wrong, a good one
goes to the operator's own `PUT /v1/work` and its answer comes back as it came. Behind the
gateway's bearer tokens like every route but health (auth.py)."""

from __future__ import annotations

import json
import math

import httpx2
from fastapi import APIRouter, Request, Response

from sonicsite.contract.work_report import WORK_PATH, WorkReport

from .forwarding import error
from .small_bodies import TooLarge, read_small

router = APIRouter(tags=["site"])
RELAY_TIMEOUT_S = 2.0  # as the client's own: a report is advice, renewed every few seconds


@router.put(WORK_PATH)
async def work(request: Request) -> Response:
    """The report checked, then relayed to the operator: its status and body, or 503 when
    the operator cannot be reached."""
    outcomes = request.app.state.metrics.work_reports
    try:
        report = WorkReport.from_dict(_json(await read_small(request)))
    except ValueError as exc:  # TooLarge among them: 413
        outcomes.labels("refused").inc()
        return error(413 if isinstance(exc, TooLarge) else 400, f"PUT {WORK_PATH}: {exc}")
    url = f"{request.app.state.view.operator}{WORK_PATH}"
    client: httpx2.AsyncClient = request.app.state.operator_client
    try:
        reply = await client.put(url, json=report.to_dict(), timeout=RELAY_TIMEOUT_S)
    except httpx2.HTTPError as exc:
        outcomes.labels("operator_unreachable").inc()
        reason = str(exc) or type(exc).__name__
        return error(503, f"PUT {WORK_PATH}: the operator at {url} cannot be reached: {reason}")
    outcomes.labels("relayed" if reply.is_success else "refused").inc()
    media_type = reply.headers.get("content-type", "application/json")
    return Response(reply.content, status_code=reply.status_code, media_type=media_type)


def _json(body: bytes) -> object:
    """The body as JSON; ValueError saying what the body should have been."""
    try:
        return json.loads(body, parse_constant=_not_json, parse_float=_finite)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise ValueError(f"body: expected a WorkReport as JSON ({exc})") from None


def _not_json(name: str) -> float:
    """NaN and Infinity, which Python's parser takes but JSON has not: no count or rate."""
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON number as a float, refused where it overflows one (1e400 would be inf)."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is out of range")
    return value

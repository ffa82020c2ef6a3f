"""Bodies the gateway reads whole before it acts (a client's work report, a repository index
request): a few hundred bytes each, so bounded. One over the bound is refused at its
declared length before a byte is read, or as it streams past the bound without one: a body
of gigabytes read whole first took the gateway, and every request under way in it, past its
memory."""

from __future__ import annotations

from fastapi import Request

SMALL_BODY_BYTES = 1 << 20  # a report names a job's models, an index request a flag or two


class TooLarge(ValueError):
    """The body is over the bound (the route answers 413 with this text)."""


async def read_small(request: Request, limit: int = SMALL_BODY_BYTES) -> bytes:
    """The whole body, at most `limit` bytes; TooLarge saying the size and the bound."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise TooLarge(f"body: expected at most {limit} bytes, got {int(declared)}")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise TooLarge(f"body: expected at most {limit} bytes, got more ({len(body)} so far)")
    return bytes(body)

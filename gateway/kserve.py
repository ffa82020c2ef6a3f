"""KServe v2 inference bodies as the gateway passes them on: as they came, malformed or not,
but for a tensor that would end the server.

A body is the server's to read, and a malformed one gets Triton's own answer, status and
text (a JSON parse error is its 500 "failed to parse the request JSON buffer: ...", a
header length out of range its 400, a header length of 0 its raw binary request: the whole
body is the model's one input), as one Triton server gives it: the gateway once answered
these itself with a 400 of its own words, which a stock tool reading Triton's texts did not
recognise. Whether the request fits the model is the server's to say too.

The gateway's own answers are for what it bounds (`BadRequest`, 413): a body over its
`max_body_bytes`, and one whose JSON declares a tensor of more than MAX_TENSOR_BYTES
(`check_sizes`, which also refuses JSON nested too deeply to look through, 400): Triton
sizes a tensor from its declared shape before it reads the data, and a shape of 2**40
elements ends the server's process (std::bad_alloc, abort), which no client of the site may
do to a shared server. Such a shape is looked for wherever the JSON declares one, even in a
body that then fails to parse: a parser more lenient than Python's must not let one by.

A compressed body (`Content-Encoding: gzip | deflate`, tritonclient's
`request_compression_algorithm`), which Triton takes, is forwarded as it came, with its
Content-Encoding, so the server decompresses it once; the gateway decompresses it to check
the same (`decoded_head`), bounded by `max_body_bytes` as an uncompressed body is: a small
body that inflates past it is refused (413), not inflated into memory. One that does not
decompress, or another coding, goes on as it came: the server says why it cannot take it.
"""

from __future__ import annotations

import json
import math
import re
import zlib
from collections.abc import AsyncIterator

ITEM_BYTES = {
    "BOOL": 1,
    "UINT8": 1,
    "UINT16": 2,
    "UINT32": 4,
    "UINT64": 8,
    "INT8": 1,
    "INT16": 2,
    "INT32": 4,
    "INT64": 8,
    "FP16": 2,
    "BF16": 2,
    "FP32": 4,
    "FP64": 8,
}
MAX_TENSOR_BYTES = 1 << 31  # larger declared tensors are refused: see the docstring
LEADING_INTEGER = re.compile(r"\s*([+-]?\d+)")  # what C's atoi reads, as Triton reads the header


class BadRequest(ValueError):
    """A request the gateway refuses; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def json_length(header_length: str | None, total: int) -> int | None:
    """How much of the body Triton reads as the JSON request: all of it without the binary
    header, the header's leading integer (as atoi reads it) where it is within the body;
    None where Triton reads no JSON (0: a raw binary request) or refuses the length."""
    if header_length is None:
        return total
    found = LEADING_INTEGER.match(header_length)
    n = int(found.group(1)) if found else 0
    return n if 0 < n <= total else None


def _declared_bytes(pairs: list[tuple[str, object]]) -> int:
    """The most bytes an object's `shape` (each one given, as a parser keeping the first or
    the last of repeated keys would read it) declares, at its largest `datatype`'s size."""
    shapes = [v for k, v in pairs if k == "shape" and isinstance(v, list)]
    shapes = [v for v in shapes if v and all(type(d) is int for d in v)]
    if not shapes:
        return 0
    item = max((ITEM_BYTES.get(v, 1) for k, v in pairs if k == "datatype"), default=8)
    return max(math.prod(abs(d) for d in shape) for shape in shapes) * item


def check_sizes(head: bytes, header_length: str | None, total: int) -> None:
    """BadRequest (413) for a body whose JSON part declares a tensor of more than
    MAX_TENSOR_BYTES anywhere (any object's `shape`, repeated keys too, so that no parser's
    reading of it slips by); (400) for JSON nested too deeply to look through. Nothing for
    any other body, well-formed or not: the server's to answer. `head` holds at least the
    JSON part; `total` is the body's length."""
    n = json_length(header_length, total)
    if n is None:
        return
    largest = 0

    def seen(pairs: list[tuple[str, object]]) -> dict:
        nonlocal largest
        largest = max(largest, _declared_bytes(pairs))
        return dict(pairs)

    try:  # invalid UTF-8 replaced: Triton's parser takes such strings
        json.loads(head[:n].decode("utf-8", "replace"), object_pairs_hook=seen)
    except RecursionError:
        raise BadRequest("body: JSON nested too deeply for the gateway to check") from None
    except ValueError:
        pass  # not JSON after all: what was seen before the error still counts
    if largest > MAX_TENSOR_BYTES:
        raise BadRequest(f"body: an input's shape declares more than {MAX_TENSOR_BYTES} bytes", 413)


# -- compressed bodies --------------------------------------------------------------------

ENCODINGS = ("gzip", "deflate")  # what Triton decompresses
PIECE = 1 << 16  # decompressed this much at a time


def encoding_of(value: str | None) -> str:
    """The body's content coding, lower-case, where the gateway measures it (gzip,
    deflate); "" for none, identity or a coding Triton does not take (forwarded as it came:
    the server answers it with its own refusal)."""
    coding = (value or "").strip().lower()
    return coding if coding in ENCODINGS else ""


def check_read(header_length: str | None, total: int | None, memory: int) -> None:
    """BadRequest (413) when the part of a body the gateway reads into memory, a binary
    request's JSON part or a whole JSON body, is declared past `memory` bytes (a body of
    800 MB took the gateway past its pod's memory limit); a binary request's data after its
    JSON part is streamed on, bounded by `max_body_bytes` alone."""
    binary = bool(header_length and header_length.isdigit())
    part = int(header_length) if binary else total
    if part is not None and part > memory:
        what = "JSON part" if binary else "body, all JSON,"
        raise BadRequest(
            f"its {what} is {part} bytes, over the {memory} the gateway reads into memory: "
            "send tensors as binary data (tritonclient's binary_data=True)",
            413,
        )


async def whole_body(chunks: AsyncIterator[bytes], limit: int) -> bytes:
    """The request's whole body, refused past `limit` bytes (413)."""
    parts, size = [], 0
    async for chunk in chunks:
        size += len(chunk)
        if size > limit:
            raise BadRequest(f"body: over {limit} bytes", 413)
        parts.append(chunk)
    return b"".join(parts)


def _inflater(coding: str, body: bytes) -> zlib._Decompress:
    """gzip; deflate as zlib's stream (what tritonclient and Triton write), or raw."""
    if coding == "gzip":
        return zlib.decompressobj(16 + zlib.MAX_WBITS)
    raw = len(body) >= 2 and (body[0] * 256 + body[1]) % 31 != 0
    return zlib.decompressobj(-zlib.MAX_WBITS if raw else zlib.MAX_WBITS)


def decoded_head(body: bytes, coding: str, wanted: int | None, limit: int) -> tuple[bytes, int]:
    """The first `wanted` bytes of the decompressed body (all of it for None) and its whole
    decompressed length; (b"", -1) for a body that does not decompress whole (the server
    says why). BadRequest (413): it decompresses past `limit` bytes."""
    inflater = _inflater(coding, body)
    head, size, pending = bytearray(), 0, body
    try:
        while pending or not inflater.eof:
            piece = inflater.decompress(pending, PIECE)
            pending = inflater.unconsumed_tail
            if not piece and not pending:
                break
            size += len(piece)
            if size > limit:
                raise BadRequest(f"body: decompresses to over {limit} bytes", 413)
            if wanted is None or len(head) < wanted:
                head += piece if wanted is None else piece[: wanted - len(head)]
    except zlib.error:
        return b"", -1
    return (bytes(head), size) if inflater.eof else (b"", -1)

"""KServe v2 inference requests checked for a well-formed body before they reach a server.

The gateway forwards request bodies as they are (binary tensors are never decoded), but it
reads the JSON part and checks it against itself: every input named, of a known datatype,
shaped with non-negative integers, its data or binary size matching its own datatype and
shape, the binary part exactly as long as the inputs declare. A malformed body gets a 400
naming the field and the expected value here, so none can make a server fail with a 5xx.

Whether the request fits the model (input names, datatypes, shapes, batch size, missing
inputs, outputs) is not checked here: the server of the model says so, in Triton's own
words, as one Triton server would.

A compressed body (`Content-Encoding: gzip | deflate`, tritonclient's
`request_compression_algorithm`), which Triton takes, is checked decompressed (`decoded_head`:
the JSON part, whose length the binary header counts uncompressed, and the binary part's
length) and forwarded as it came, with its Content-Encoding, so the server decompresses it
once. What it decompresses to is bounded by the gateway's `max_body_bytes`, as an
uncompressed body is: a small body that inflates past it is refused (413), not inflated
into memory.
"""

from __future__ import annotations

import json
import math
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
    "BYTES": 0,  # variable: 4-byte length prefix per element
}
MAX_TENSOR_BYTES = 1 << 31  # larger declared tensors are refused before anything is read


class BadRequest(ValueError):
    """A request the gateway refuses; `status` is the HTTP status to answer with."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


def split_body(
    body: bytes, header_length: str | None, total: int | None = None
) -> tuple[dict, int]:
    """The JSON request and the length of the binary part after it. `body` holds at least
    the JSON part; `total` is the whole body's length when only its head has been read."""
    total = len(body) if total is None else total
    if header_length is None:
        json_part, binary = body, 0
    else:
        try:
            n = int(header_length)
        except ValueError:
            raise BadRequest(
                f"Inference-Header-Content-Length: expected an integer, got {header_length!r}"
            ) from None
        if not 0 < n <= min(total, len(body)):
            raise BadRequest(
                f"Inference-Header-Content-Length: expected 1 to {total} "
                f"(the body's length), got {n}"
            )
        json_part, binary = body[:n], total - n
    try:
        request = json.loads(json_part)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"body: expected a JSON inference request: {exc}") from None
    except RecursionError:
        raise BadRequest("body: JSON nested too deeply") from None
    if not isinstance(request, dict):
        raise BadRequest(f"body: expected a JSON object, got {type(request).__name__}")
    return request, binary


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _count_elements(data: object, datatype: str, where: str, limit: int) -> int:
    """Elements in a (possibly nested) JSON data list, each of the datatype's JSON kind."""
    if datatype == "BOOL":
        ok = lambda v: isinstance(v, bool)  # noqa: E731
        kind = "booleans"
    elif datatype == "BYTES":
        ok = lambda v: isinstance(v, str)  # noqa: E731
        kind = "strings"
    elif datatype.startswith(("FP", "BF")):
        ok = lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)  # noqa: E731
        kind = "numbers"
    else:
        ok = _is_int
        kind = "integers"
    count, stack = 0, [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
            continue
        if not ok(item):
            raise BadRequest(f"{where}: expected {kind} for {datatype}, got {item!r}"[:300])
        count += 1
        if count > limit:
            raise BadRequest(f"{where}: more elements than the shape declares ({limit})")
    return count


def _check_input(item: object, where: str) -> int:
    """One input checked against its own name, datatype and shape; its binary size."""
    if not isinstance(item, dict):
        raise BadRequest(f"{where}: expected an object with name, datatype and shape")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.name: expected the input's name, got {name!r}"[:300])
    datatype = item.get("datatype")
    if datatype not in ITEM_BYTES:
        raise BadRequest(
            f"{where}.datatype: expected one of {sorted(ITEM_BYTES)}, got {datatype!r}"[:300]
        )
    shape = item.get("shape")
    if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
        raise BadRequest(f"{where}.shape: expected a list of non-negative integers")
    elements = math.prod(shape)
    item_bytes = ITEM_BYTES[datatype]
    if elements * max(item_bytes, 1) > MAX_TENSOR_BYTES:
        raise BadRequest(f"{where}.shape: {shape} declares more than {MAX_TENSOR_BYTES} bytes", 413)
    parameters = item.get("parameters", {})
    if not isinstance(parameters, dict):
        raise BadRequest(f"{where}.parameters: expected an object")
    if "binary_data_size" not in parameters:
        if "data" not in item:
            raise BadRequest(f"{where}.data: expected the tensor's data (or binary data)")
        count = _count_elements(item["data"], datatype, f"{where}.data", elements)
        if count != elements:
            raise BadRequest(
                f"{where}.data: expected {elements} elements for shape {shape}, got {count}"
            )
        return 0
    size = parameters["binary_data_size"]
    if not _is_int(size) or size < 0:
        raise BadRequest(f"{where}.parameters.binary_data_size: expected an integer ≥ 0")
    if item_bytes and size != elements * item_bytes:
        raise BadRequest(
            f"{where}.parameters.binary_data_size: expected {elements * item_bytes} "
            f"bytes for {datatype}{shape}, got {size}"
        )
    if "data" in item:
        raise BadRequest(f"{where}: give either data or binary_data_size, not both")
    return size


def check_infer(request: dict, binary_bytes: int) -> None:
    """Raise BadRequest naming the first field of a malformed request (one a server could
    not parse); a well-formed request goes to the model's server, which checks the rest."""
    inputs = request.get("inputs")
    if not isinstance(inputs, list):
        raise BadRequest("inputs: expected a list of the model's inputs")
    declared = sum(_check_input(item, f"inputs[{k}]") for k, item in enumerate(inputs))
    if declared != binary_bytes:
        raise BadRequest(
            f"body: the binary part is {binary_bytes} bytes, the inputs declare {declared}"
        )
    outputs = request.get("outputs", [])
    if not isinstance(outputs, list):
        raise BadRequest("outputs: expected a list")
    for k, item in enumerate(outputs):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise BadRequest(f"outputs[{k}].name: expected the output's name")
        if not isinstance(item.get("parameters", {}), dict):
            raise BadRequest(f"outputs[{k}].parameters: expected an object")
    if not isinstance(request.get("id", ""), str):
        raise BadRequest("id: expected a string")
    if not isinstance(request.get("parameters", {}), dict):
        raise BadRequest("parameters: expected an object")


# -- compressed bodies --------------------------------------------------------------------

ENCODINGS = ("gzip", "deflate")  # what Triton decompresses
PIECE = 1 << 16  # decompressed this much at a time


def encoding_of(value: str | None) -> str:
    """The body's content coding, lower-case; "" for none or identity. Refused (415,
    naming it) when the servers could not decode it."""
    coding = (value or "").strip().lower()
    if coding in ("", "identity"):
        return ""
    if coding not in ENCODINGS:
        raise BadRequest(
            f"Content-Encoding {coding!r} is not supported (gzip and deflate are)", 415
        )
    return coding


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
    decompressed length. BadRequest: a body that does not decompress (400), or that
    decompresses past `limit` bytes (413)."""
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
    except zlib.error as exc:
        raise BadRequest(f"body: not valid {coding} data (Content-Encoding): {exc}") from None
    if not inflater.eof:
        raise BadRequest(f"body: {coding} data cut short (Content-Encoding)")
    return bytes(head), size

"""Protocol Buffers wire format for Triton's ModelInfer, written and read by hand.

The stock Python client copies a payload about four times (tobytes, into the protobuf
message, serialization, the gRPC slice). Here a request is never joined: the small header
(names, shapes, parameters) is serialized by protobuf, and each input's raw contents field
is a tag and a length followed by the SoA column views themselves, all handed to the socket
as one list of buffers (http2.py). A reply is read from the socket into one `bytes` object,
allocated uninitialised with PyBytes_FromStringAndSize; raw output contents are numpy views
into it, never copied.
"""

from __future__ import annotations

import contextlib
import ctypes
import mmap
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from .spec import TRITON_DTYPES

RAW_INPUT_FIELD = 7
RAW_OUTPUT_FIELD = 6
OUTPUTS_FIELD = 5

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = [ctypes.c_void_p, ctypes.c_ssize_t]
_BYTES_DATA_OFFSET = sys.getsizeof(b"") - 1  # where a bytes object's data starts


def writable_bytes(size: int) -> tuple[bytes, np.ndarray]:
    """A new, uninitialised bytes object and a writable uint8 view of its data. Only valid
    until the bytes object is handed on; nothing else holds it before then."""
    data = _new_bytes(None, size)
    if size == 0:
        return data, np.empty(0, dtype=np.uint8)
    raw = (ctypes.c_char * size).from_address(id(data) + _BYTES_DATA_OFFSET)
    return data, np.frombuffer(raw, dtype=np.uint8)


HUGE_PAGE_MIN = 1 << 20  # replies at least this large are read into huge-page memory


def receive_buffer(size: int) -> tuple[bytes | mmap.mmap, np.ndarray]:
    """Where a reply of `size` bytes is read to, and a writable uint8 view of it. Large
    replies get their own anonymous mapping backed by huge pages where the kernel allows:
    a fresh 16 MB buffer then costs 8 page faults instead of 4096."""
    if size < HUGE_PAGE_MIN:
        return writable_bytes(size)
    memory = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(AttributeError, OSError):  # no THP: ordinary pages
        memory.madvise(mmap.MADV_HUGEPAGE)
    return memory, np.frombuffer(memory, dtype=np.uint8)


def varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def read_varint(data, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _set_parameter(params, key: str, value) -> None:
    if isinstance(value, bool):
        params[key].bool_param = value
    elif isinstance(value, int):
        params[key].int64_param = value
    else:
        params[key].string_param = str(value)


@dataclass
class TensorHeader:
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict[str, object] | None = None  # e.g. shared-memory placement


def request_header(
    model: str,
    inputs: list[TensorHeader],
    outputs: list[TensorHeader],
    request_id: str = "",
    parameters: dict | None = None,
) -> bytes:
    """Every field of ModelInferRequest except the raw input contents."""
    request = pb.ModelInferRequest(model_name=model, id=request_id)
    for key, value in (parameters or {}).items():
        _set_parameter(request.parameters, key, value)
    for t in inputs:
        tensor = request.inputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        for key, value in (t.parameters or {}).items():
            _set_parameter(tensor.parameters, key, value)
    for t in outputs:
        out = request.outputs.add(name=t.name)
        for key, value in (t.parameters or {}).items():
            _set_parameter(out.parameters, key, value)
    return request.SerializeToString()


class MalformedReply(ValueError):
    """A reply whose outputs do not hold what their headers say (the transport makes it an
    INTERNAL error of the server that sent it)."""


def expect_filled(
    name: str, shape: Sequence[int], held: int, unit: str, per_value: int = 1
) -> None:
    """MalformedReply unless `held` (in `unit`, `per_value` of them a value) fills `shape`:
    both transports' check of an output's data against its header."""
    needs = int(np.prod(shape, dtype=np.int64)) * per_value
    if held != needs:
        raise MalformedReply(
            f"output {name!r} holds {held} {unit} where its shape {list(shape)} needs {needs}"
        )


@dataclass
class OutputTensor:
    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: dict


def expect_outputs(wanted: Iterable[str], outputs: Mapping[str, object]) -> None:
    """MalformedReply unless every output asked for is in the reply: a missing one would
    leave its columns with stale data while the chunk counts as delivered."""
    missing = [name for name in wanted if name not in outputs]
    if missing:
        raise MalformedReply(f"outputs {missing} were asked for and are not in it")


def output_dtype(name: str, datatype: str) -> np.dtype:
    """The numpy dtype of an output's datatype; MalformedReply for one the client does not
    read (BYTES: the spec check refuses such outputs, so the server broke its metadata)."""
    try:
        return np.dtype(TRITON_DTYPES[datatype])
    except KeyError:
        raise MalformedReply(
            f"output {name!r} has datatype {datatype!r}, expected one of {list(TRITON_DTYPES)}"
        ) from None


def _fields(data: bytes | mmap.mmap) -> Iterator[tuple[int, int, int]]:
    """(field, start, length) of each length-delimited field; MalformedReply where the
    message is cut short or holds a wire type protobuf does not have."""
    pos, end = 0, len(data)
    try:
        while pos < end:
            key, pos = read_varint(data, pos)
            field, wire = key >> 3, key & 7
            if wire == 2:
                length, pos = read_varint(data, pos)
                if pos + length > end:
                    raise MalformedReply(
                        f"field {field} claims {length} bytes where {end - pos} are left"
                    )
                yield field, pos, length
                pos += length
            elif wire == 0:
                _, pos = read_varint(data, pos)
            elif wire in (1, 5):
                pos += 8 if wire == 1 else 4
            else:
                raise MalformedReply(f"unexpected protobuf wire type {wire} at byte {pos}")
    except IndexError:
        raise MalformedReply(f"the message ends inside a field ({end} bytes)") from None
    if pos > end:
        raise MalformedReply(f"the message ends inside a fixed-size field ({end} bytes)")


def parse_response(
    data: bytes | mmap.mmap, placed: frozenset[str] = frozenset()
) -> dict[str, np.ndarray | OutputTensor]:
    """Outputs of a ModelInferResponse: arrays viewing `data` for outputs sent inline, the
    header alone (OutputTensor) for the `placed` outputs the server wrote to shared memory.
    MalformedReply names what a reply that does not parse, or lacks an output's data, got
    wrong."""
    headers: list[OutputTensor] = []
    raws: list[tuple[int, int]] = []
    for field, start, length in _fields(data):
        if field == OUTPUTS_FIELD:
            try:
                t = pb.ModelInferResponse.InferOutputTensor.FromString(data[start : start + length])
            except DecodeError as exc:
                raise MalformedReply(f"an output's header does not parse: {exc}") from None
            params = {k: v.WhichOneof("parameter_choice") for k, v in t.parameters.items()}
            headers.append(OutputTensor(t.name, t.datatype, tuple(t.shape), params))
        elif field == RAW_OUTPUT_FIELD:
            raws.append((start, length))
    results: dict[str, np.ndarray | OutputTensor] = {h.name: h for h in headers}
    # Triton sends one raw entry per output, empty for those in shared memory.
    inline = headers if len(raws) == len(headers) else [h for h in headers if h.name not in placed]
    for k, header in enumerate(inline):
        if header.name in placed:
            continue
        dtype = output_dtype(header.name, header.datatype)
        start, length = raws[k] if k < len(raws) else (0, 0)
        if k >= len(raws) and int(np.prod(header.shape, dtype=np.int64)):
            raise MalformedReply(f"output {header.name!r} has a header and no contents")
        expect_filled(header.name, header.shape, length, "bytes", dtype.itemsize)
        array = np.frombuffer(data, dtype=dtype, count=length // dtype.itemsize, offset=start)
        array.flags.writeable = False  # a view of the reply, shared by every output
        results[header.name] = array.reshape(header.shape)
    return results

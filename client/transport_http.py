"""KServe v2 REST with Triton's binary tensor extension, over keep-alive connections.

The body is the JSON header followed by each input's bytes; zero-copy inputs are sent
straight from the SoA columns (no gather at all), others are gathered once into the buffer
that is sent. Outputs are numpy views into the response body.
"""

from __future__ import annotations

import http.client
import io
import json
import queue
import socket
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from sonicsite.contract.wire import (
    ADMITTED_HEADER,
    HELD_HEADER,
    INFERENCE_HEADER_LENGTH,
    MODEL_HEADER,
    RETRY_AFTER_HEADER,
    SERVER_HEADER,
    WAIT_HEADER,
)

from .admitted import Admitted
from .armed_reads import ArmedReads, give_left
from .errors import (
    INTERNAL,
    INVALID,
    OVERLOADED,
    TIMEOUT,
    UNAVAILABLE,
    InferError,
    RetryAfter,
    held_kind,
    server_error,
    token_hint,
)
from .plan import CopyPlan
from .spec import ModelInfo
from .stats import parse_statistics
from .tracing import ClientTracing, RequestTrace
from .transport_grpc import CONTROL_TIMEOUT_S, Reply
from .wire import MalformedReply, expect_filled, expect_outputs, output_dtype

HTTP_KINDS = {  # HTTP status -> what it means for the request (errors.py), as gRPC's
    400: INVALID,
    401: INVALID,  # a missing or bad token: retrying will not help
    403: INVALID,
    404: INVALID,
    413: INVALID,  # the request is larger than the site takes: so is every retry
    502: UNAVAILABLE,
    503: UNAVAILABLE,
    504: TIMEOUT,  # a proxy's deadline passed: retried elsewhere, as a timeout
}


def _header_length(response: http.client.HTTPResponse, data: bytes) -> int:
    """Where the reply's JSON header ends (Triton's Inference-Header-Content-Length)."""
    value = response.getheader(INFERENCE_HEADER_LENGTH)
    try:
        length = int(value) if value else len(data)
    except ValueError:
        raise MalformedReply(f"its {INFERENCE_HEADER_LENGTH} is {value!r}") from None
    if not 0 <= length <= len(data):
        raise MalformedReply(
            f"its {INFERENCE_HEADER_LENGTH} is {length}, the body holds {len(data)} bytes"
        )
    return length


def _still_open(sock: socket.socket) -> bool:
    """Whether an idle keep-alive connection can take a request: nothing to read on it (a
    server that closed it, as uvicorn does after a few idle seconds, left an end or a reset
    there). Reusing a closed one would fail a request the server never saw."""
    try:
        sock.setblocking(False)
        try:
            sock.recv(1, socket.MSG_PEEK)
        finally:
            sock.setblocking(True)
    except BlockingIOError:
        return True
    except OSError:
        return False
    return False  # the end of the connection, or bytes no request asked for


class _ArmedSocket:
    """A connection's socket whose reply is read through `ArmedReads` (each read given what
    is left of the call's deadline by `arm`); the rest is the socket's own."""

    def __init__(self, sock: socket.socket, arm: Callable[[], None]) -> None:
        self._sock, self._arm = sock, arm

    def makefile(self, mode: str = "rb", *args: Any, **kwargs: Any) -> io.BufferedReader:
        return io.BufferedReader(ArmedReads(self._sock, self._arm), 1 << 16)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class DeadlineConnection(http.client.HTTPConnection):
    """A keep-alive connection on which a call's deadline (`begin`) holds for the whole
    call: every send and every read of the socket waits at most what is left of it. A plain
    HTTPConnection's timeout is per socket operation, so a reply sent a byte at a time kept
    a call going for as long as it trickled."""

    deadline: float | None = None  # the current call's, on the monotonic clock

    def begin(self, timeout: float) -> None:
        self.deadline = time.monotonic() + timeout
        self.timeout = timeout

    def connect(self) -> None:
        super().connect()
        self.sock = _ArmedSocket(self.sock, self._arm)  # type: ignore[assignment]

    def send(self, data: Any) -> None:
        self._arm()
        super().send(data)

    def _arm(self) -> None:
        give_left(self.sock, self.deadline)  # type: ignore[arg-type]


class HttpTransport:
    kind = "http"

    def __init__(
        self,
        address: str,
        server: str = "",
        pool: int = 8,
        token: str = "",
        tracing: ClientTracing | None = None,
        admitted: Admitted | None = None,
    ):
        """`tracing`: each infer call's spans (tracing.py), its context sent on;
        `admitted`: the models that have answered the client (admitted.py)."""
        self.address = address
        self.server = server or address
        self.tracing = tracing
        self.admitted = admitted or Admitted()
        # a bearer token for a site that requires one (the gateway's tokens)
        self._auth = {"Authorization": f"Bearer {token}"} if token else {}
        self._host, port = address.rsplit(":", 1)
        self._port = int(port)
        self._idle: queue.LifoQueue[DeadlineConnection] = queue.LifoQueue(pool)

    def _connection(self, timeout: float) -> DeadlineConnection:
        """The most recent idle connection the server has not closed, else a new one; its
        call's deadline `timeout` from now."""
        while True:
            try:
                conn = self._idle.get_nowait()
            except queue.Empty:
                conn = DeadlineConnection(self._host, self._port, timeout=timeout)
                conn.begin(timeout)
                return conn
            if conn.sock is None or not _still_open(conn.sock):  # type: ignore[arg-type]
                conn.close()
                continue
            conn.begin(timeout)
            return conn

    def _give_back(self, conn: DeadlineConnection) -> None:
        try:
            self._idle.put_nowait(conn)
        except queue.Full:
            conn.close()

    def _get_json(self, path: str, timeout: float = CONTROL_TIMEOUT_S) -> dict:
        conn = self._connection(timeout)
        try:
            conn.request("GET", path, headers={**self._auth, WAIT_HEADER: f"{timeout:g}"})
            response = conn.getresponse()
            data = response.read()
        except TimeoutError as exc:  # out of time: a timeout, not an unreachable endpoint
            conn.close()
            message = f"no answer within {timeout:g} s: {exc or 'timed out'}"
            raise InferError(TIMEOUT, message, self.server, status="timeout") from None
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise InferError(UNAVAILABLE, repr(exc), self.server, status="connection") from None
        self._give_back(conn)
        if response.status != 200:
            raise self._error(response, data)
        return json.loads(data)

    def model_info(self, model: str, timeout: float = CONTROL_TIMEOUT_S) -> ModelInfo:
        metadata = self._get_json(f"/v2/models/{model}", timeout)
        config = self._get_json(f"/v2/models/{model}/config", timeout)
        return ModelInfo.from_triton(metadata, config)

    def statistics(
        self, model: str, timeout: float = CONTROL_TIMEOUT_S
    ) -> dict[str, tuple[int, int]]:
        stats = self._get_json(f"/v2/models/{model}/stats", timeout)
        return parse_statistics(stats["model_stats"][0])

    def infer(
        self,
        plan: CopyPlan,
        timeout: float,
        placements=None,
        request_id: str = "",
        parameters: dict | None = None,
    ) -> Reply:
        if placements:
            raise ValueError("shared-memory placements go through the gRPC transport")
        if self.tracing is None:
            return self._infer(plan, timeout, request_id, parameters, None)
        return self.tracing.call(
            plan.model,
            self.server,
            lambda traced: self._infer(plan, timeout, request_id, parameters, traced),
        )

    def _infer(
        self,
        plan: CopyPlan,
        timeout: float,
        request_id: str,
        parameters: dict | None,
        traced: RequestTrace | None,
    ) -> Reply:
        t0 = time.perf_counter()
        body: list = []
        header = {
            "inputs": [],
            "outputs": [
                {"name": o.name, "parameters": {"binary_data": True}} for o in plan.outputs
            ],
        }
        if request_id:
            header["id"] = request_id
        if parameters:
            header["parameters"] = dict(parameters)
        for i in plan.inputs:
            header["inputs"].append(
                {
                    "name": i.name,
                    "datatype": i.datatype,
                    "shape": list(i.shape),
                    "parameters": {"binary_data_size": i.nbytes},
                }
            )
            if i.gather:
                buffer = np.empty(i.nbytes, dtype=np.uint8)
                i.gather(buffer)
                body.append(buffer)
            else:
                body.extend(i.pieces)
        head = json.dumps(header).encode()
        body.insert(0, head)
        total = sum(len(b) if isinstance(b, bytes) else b.nbytes for b in body)
        headers = {
            "Content-Type": "application/octet-stream",
            INFERENCE_HEADER_LENGTH: str(len(head)),
            "Content-Length": str(total),
            MODEL_HEADER: plan.model,
            WAIT_HEADER: f"{timeout:g}",  # a holder answers "still loading" before it
            **self.admitted.headers(plan.model),
            **self._auth,
        }
        if traced is not None:  # the send span's context, to the gateway or the server
            headers.update(traced.sending())
        t1 = time.perf_counter()
        conn = self._connection(timeout)
        try:
            conn.request(
                "POST",
                f"/v2/models/{plan.model}/infer",
                body=(memoryview(b).cast("B") if not isinstance(b, bytes) else b for b in body),
                headers=headers,
            )
            response = conn.getresponse()
            data = response.read()
        except TimeoutError as exc:
            conn.close()
            raise InferError(TIMEOUT, str(exc), self.server, status="timeout") from None
        except (OSError, http.client.HTTPException) as exc:
            conn.close()
            raise InferError(UNAVAILABLE, repr(exc), self.server, status="connection") from None
        t2 = time.perf_counter()
        if response.status != 200:
            self._give_back(conn)
            raise self._error(response, data)
        self._give_back(conn)
        try:
            outputs = self._parse(data, _header_length(response, data))
            expect_outputs((o.name for o in plan.outputs), outputs)
        except MalformedReply as exc:
            raise InferError(INTERNAL, f"a malformed reply: {exc}", self.server) from exc
        self.admitted.answered(plan.model, response.getheader(ADMITTED_HEADER))
        copies = sum(i.copies for i in plan.inputs)
        server = response.getheader(SERVER_HEADER) or self.server  # named by the gateway
        return Reply(outputs, server, t1 - t0, t2 - t1, total, copies)

    def _error(self, response: http.client.HTTPResponse, data: bytes) -> InferError:
        try:
            message = json.loads(data).get("error", data.decode(errors="replace"))
        except ValueError:
            message = data.decode(errors="replace")
        status = response.status
        if status == 429:
            retry = RetryAfter.parse(response.getheader(RETRY_AFTER_HEADER)).seconds
            return InferError(OVERLOADED, message, self.server, retry, status="429")
        held = response.getheader(HELD_HEADER)  # a holder's answer (errors.py LOADING)
        if held is not None:
            kind, left = held_kind(held)
            return InferError(kind, message, self.server, left, status=str(status))
        kind = HTTP_KINDS.get(status, INTERNAL)
        error = server_error(kind, message, self.server, status=str(status))
        return token_hint(error, sent=bool(self._auth))

    @staticmethod
    def _parse(data: bytes, header_length: int) -> dict[str, np.ndarray]:
        """The outputs, binary ones as views of `data`; MalformedReply names what the reply
        lacks (an output without its data, or data that does not fill its shape)."""
        try:
            header = json.loads(data[:header_length])
            described = list(header.get("outputs", []))
        except (ValueError, AttributeError, TypeError) as exc:
            raise MalformedReply(f"its JSON header does not parse: {exc}") from exc
        outputs, pos = {}, header_length
        for k, out in enumerate(described):
            try:
                name, shape = str(out["name"]), [int(d) for d in out["shape"]]
                dtype = output_dtype(name, out["datatype"])
                size = int(out.get("parameters", {}).get("binary_data_size", 0))
            except (KeyError, TypeError, ValueError, AttributeError) as exc:
                raise MalformedReply(f"output {k} of its header lacks {exc!r}") from None
            if size:
                if size < 0 or pos + size > len(data) or size % dtype.itemsize:
                    raise MalformedReply(
                        f"output {name!r} claims {size} bytes of {dtype} where the body "
                        f"holds {len(data) - pos} more"
                    )
                array = np.frombuffer(data, dtype=dtype, count=size // dtype.itemsize, offset=pos)
                pos += size
            elif "data" in out:
                try:
                    array = np.asarray(out["data"], dtype=dtype)
                except (TypeError, ValueError) as exc:
                    raise MalformedReply(
                        f"output {name!r}: its data are not {dtype}: {exc}"
                    ) from None
            elif 0 in shape:  # an empty output has nothing to send
                array = np.empty(0, dtype=dtype)
            else:
                raise MalformedReply(f"output {name!r} has neither binary data nor data")
            expect_filled(name, shape, array.size, "values")
            outputs[name] = array.reshape(shape)
        return outputs

    def close(self) -> None:
        while not self._idle.empty():
            self._idle.get_nowait().close()

"""A stream's answers in the order of its requests, as one Triton server gives them.

The gateway's stream router (streams.py) sends a stream's messages to several servers and
answers some itself (a shed, an unknown model): each server answers its own share in order,
but the shares come back interleaved as they finish, and the gateway's own answers at once.
One Triton server answers a (non-decoupled) stream in request order, so here every request
takes a place in line when it is routed (`expect`, or `answered` by the gateway itself), a
server's answers fill its requests' places in the order it was sent them, and an answer
goes out only once every earlier request's has (`ready`).

A request is answered by its final answer: Triton marks each answer of a stream with
`triton_final_response` (true on every answer of a non-decoupled model, and on a decoupled
model's last); an error answer, or one without the flag, ends its request too. A decoupled
model's earlier answers go out as they come while their request heads the line, and wait
behind it otherwise.

What is held is bounded by the requests in flight: the router takes no further message from
the client while MAX_IN_FLIGHT of the stream's requests are unanswered (the client's writes
then wait on gRPC's flow control). A request whose server's stream broke or closed without
answering it gets that failure in its turn (`failed`): the answers before it go out, then
the stream ends with the server's status, as the server's own timeouts and failures would
end it; nothing waits for an answer that cannot come.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import grpc

MAX_IN_FLIGHT = 1024  # a stream's requests routed and not yet answered to its client
FINAL = b"triton_final_response"


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if at >= len(data) or shift > 63:
            raise ValueError("a varint cut short")
        byte = data[at]
        value |= (byte & 0x7F) << shift
        at, shift = at + 1, shift + 7
        if byte < 0x80:
            return value, at


def _fields(data: memoryview) -> list[tuple[int, int, memoryview | int]]:
    """A protobuf message's fields (number, wire type, bytes or value), read without
    copying its payloads (an answer's tensors are never decoded)."""
    found, at = [], 0
    while at < len(data):
        tag, at = _varint(data, at)
        number, kind = tag >> 3, tag & 7
        if kind == 0:
            value, at = _varint(data, at)
            found.append((number, kind, value))
        elif kind == 2:
            size, at = _varint(data, at)
            found.append((number, kind, data[at : at + size]))
            at += size
        elif kind in (1, 5):
            at += 8 if kind == 1 else 4
        else:
            raise ValueError(f"wire type {kind}")
    return found


def is_final(answer: bytes) -> bool:
    """Whether a ModelStreamInferResponse ends its request: an error (field 1), or an
    infer_response (field 2) whose parameters (field 4) do not say
    `triton_final_response: false`. An answer that cannot be read ends it too."""
    try:
        outer = _fields(memoryview(answer))
        if any(n == 1 and k == 2 and len(v) for n, k, v in outer):  # type: ignore[arg-type]
            return True
        for number, kind, response in outer:
            if number != 2 or kind != 2:
                continue
            for pnumber, pkind, entry in _fields(response):  # type: ignore[arg-type]
                if pnumber != 4 or pkind != 2:
                    continue
                pair = {n: v for n, _, v in _fields(entry)}  # type: ignore[arg-type]
                key = pair.get(1)
                if isinstance(key, memoryview) and key == FINAL:
                    value = pair.get(2)
                    inner = _fields(value) if isinstance(value, memoryview) else []
                    return any(n == 1 and v for n, _, v in inner)  # bool_param
    except ValueError:
        return True
    return True


@dataclass
class _Place:
    """One request's place in line: its answers held until its turn."""

    answers: list[bytes] = field(default_factory=list)
    done: bool = False
    failure: tuple[grpc.StatusCode, str] | None = None


@dataclass
class AnswerOrder:
    """The stream's requests in the order they were routed, and each server's requests
    still waiting for its answer, in the order it was sent them."""

    line: deque[_Place] = field(default_factory=deque)
    waiting: dict[str, deque[_Place]] = field(default_factory=dict)
    closed: dict[str, tuple[grpc.StatusCode, str]] = field(default_factory=dict)  # ended

    def expect(self, server: str) -> None:
        """A request sent to `server`: its place, at the end of the line (failed at once
        where the server's stream has ended already)."""
        place = _Place(failure=self.closed.get(server))
        self.line.append(place)
        if place.failure is None:
            self.waiting.setdefault(server, deque()).append(place)

    def fail_here(self, failure: tuple[grpc.StatusCode, str]) -> None:
        """The stream fails after the requests routed so far are answered."""
        self.line.append(_Place(failure=failure))

    def answered(self, answer: bytes) -> None:
        """A request the gateway answers itself, at the end of the line."""
        self.line.append(_Place([answer], done=True))

    def arrived(self, server: str, answer: bytes) -> None:
        """An answer from `server`: its oldest request waiting's (one it was never sent is
        answered in its turn, at the end of the line)."""
        queue = self.waiting.get(server)
        if not queue:
            self.answered(answer)
            return
        place = queue[0]
        place.answers.append(answer)
        if is_final(answer):
            place.done = True
            queue.popleft()

    def failed(self, server: str, failure: tuple[grpc.StatusCode, str]) -> None:
        """`server`'s stream ended (broke, or closed): each of its requests still waiting
        fails in its turn, as does any sent to it later."""
        self.closed[server] = failure
        for place in self.waiting.pop(server, deque()):
            place.failure = failure

    def unanswered(self, server: str) -> int:
        """`server`'s requests still waiting for its answer."""
        return len(self.waiting.get(server, ()))

    def ready(self) -> tuple[list[bytes], int, tuple[grpc.StatusCode, str] | None]:
        """The answers whose turn has come, how many requests they end, and the failure
        that ends the stream once they are out (None: none yet)."""
        out, ended = [], 0
        while self.line:
            head = self.line[0]
            out += head.answers
            head.answers = []
            if head.failure is not None:
                return out, ended, head.failure
            if not head.done:
                break
            self.line.popleft()
            ended += 1
        return out, ended, None

    def pending(self) -> bool:
        """Whether some request has not been answered to the client."""
        return bool(self.line)

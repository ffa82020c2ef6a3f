"""Which failures are one kind: the same message but for its measured figures and its detail.

A site that goes down fails every running job's events with "site unreachable: no endpoint
has answered for 10.5 s ... (last error: ...)", each with its own seconds and its own last
error; a thousand jobs would make a thousand groups in the report and a thousand lines on
the console for one cause. A kind is the message with every number made `N`, every address
`<address>`, and a last parenthesis that follows a space (detail: "(last error: ...)",
"(its log ... ends: ...)") left out; the report keeps the most common full message of each
kind as its example, and how many distinct messages it had.
"""

from __future__ import annotations

import re

_ADDRESS = re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}(?::\d+)?\b|\[[0-9a-fA-F:.]+\](?::\d+)?")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_GRPC_STATUS = re.compile(r"\bStatusCode\.(?=[A-Z_]+\b)")  # grpc.StatusCode's str()


def plain_status(message: str) -> str:
    """`message` with each gRPC status named as gRPC names it ("NOT_FOUND"), not as Python's
    enum prints it ("StatusCode.NOT_FOUND")."""
    return _GRPC_STATUS.sub("", message)


def error_kind(message: str) -> str:
    """`message` without what differs between occurrences of one failure."""
    text = _drop_detail(plain_status(message.strip()))
    text = _ADDRESS.sub("<address>", text)
    return _NUMBER.sub("N", text)


def _drop_detail(text: str) -> str:
    """`text` without a closing " (...)" (matched, not nested in another); as is otherwise."""
    if not text.endswith(")"):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        depth += {")": 1, "(": -1}.get(text[i], 0)
        if depth == 0:
            return text[: i - 1].rstrip() if i > 0 and text[i - 1] == " " else text
    return text

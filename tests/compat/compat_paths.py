"""The paths a stock tool can take through the compatibility suite's site, raw HTTP as a plain
client sends it, and the models' inputs with what they must give."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from dataclasses import dataclass

import numpy as np

from sonicsite.local.state import SiteState

MODELS = ["simple", "identity", "particlenet_ak4"]
HELD = "particlenet_ak4"
HOLDER = "triton-1"  # the only server that holds HELD


@dataclass(frozen=True)
class Paths:
    """Where a stock tool can send a call for `model`: a server that holds it, Envoy (gRPC
    and REST share its one listener) and the gateway (REST)."""

    direct_grpc: str
    direct_http: str
    envoy: str
    gateway: str

    def grpc(self, path: str) -> str:
        return {"direct": self.direct_grpc, "envoy": self.envoy}[path]

    def http(self, path: str) -> str:
        return {"direct": self.direct_http, "envoy": self.envoy, "gateway": self.gateway}[path]


def holder(state: SiteState, model: str):
    """A server that holds `model` (the one that does, for the held model)."""
    wanted = HOLDER if model == HELD else state.servers[0].id
    return next(s for s in state.servers if s.id == wanted)


def paths_for(state: SiteState, model: str) -> Paths:
    server = holder(state, model)
    return Paths(server.grpc, server.http, state.grpc, state.http)


GRPC_PATHS = ["direct", "envoy"]
HTTP_PATHS = ["direct", "envoy", "gateway"]


# -- raw HTTP, as curl or a hand-written client does it -------------------------------------


@dataclass(frozen=True)
class Raw:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


def raw(address: str, method: str, path: str, body: bytes | None = None, headers=None) -> Raw:
    request = urllib.request.Request(
        f"http://{address}{path}", data=body, method=method, headers=headers or {}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return Raw(reply.status, {k.lower(): v for k, v in reply.headers.items()}, reply.read())
    except urllib.error.HTTPError as refusal:
        headers = {k.lower(): v for k, v in refusal.headers.items()}
        return Raw(refusal.code, headers, refusal.read())


# -- the models' inputs and what they must give -------------------------------------------


def inputs_of(model: str) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(7)
    if model == "simple":
        return {
            "INPUT0": np.arange(32, dtype=np.int32).reshape(2, 16),
            "INPUT1": np.full((2, 16), 3, np.int32),
        }
    if model == "identity":
        return {"INPUT0": rng.standard_normal((2, 1000)).astype(np.float32)}
    shapes = {
        "pf_points": (2, 50),
        "pf_features": (20, 50),
        "pf_mask": (1, 50),
        "sv_points": (2, 5),
        "sv_features": (11, 5),
        "sv_mask": (1, 5),
    }
    arrays = {n: rng.standard_normal((2, *s)).astype(np.float32) for n, s in shapes.items()}
    arrays["pf_mask"] = np.ones((2, 1, 50), np.float32)
    arrays["sv_mask"] = np.ones((2, 1, 5), np.float32)
    return arrays


OUTPUTS = {"simple": ["OUTPUT0", "OUTPUT1"], "identity": ["OUTPUT0"], HELD: ["softmax"]}


def expected_of(model: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    """What the model computes, where it is plain arithmetic; None: ask the direct server."""
    if model == "simple":
        return {
            "OUTPUT0": arrays["INPUT0"] + arrays["INPUT1"],
            "OUTPUT1": arrays["INPUT0"] - arrays["INPUT1"],
        }
    if model == "identity":
        return {"OUTPUT0": arrays["INPUT0"]}
    return None

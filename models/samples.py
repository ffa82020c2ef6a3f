"""Synthetic event samples for every model, as a worker job holds them, and the checks on
their answers: `generate(model, n, seed)`.

A worker job holds its events as a Structure of Arrays, one row per event and one column per
physics quantity (CMS's variable names where they exist), or as ragged node and edge layouts
for graphs (sample_types.py); the events themselves come from physics.py.
"""

from __future__ import annotations

import numpy as np
from sonicsite.client.layout import SoA

from .physics import deepmet, gnn_linking, identity, particle_transformer, particlenet_ak4, simple
from .sample_types import Allocate, AnswerError, GraphSample, Sample

__all__ = ["DEFAULT_BATCH", "GENERATORS", "AnswerError", "GraphSample", "Sample", "generate"]

# Events per request that a worker sends by default: a few ms to tens of ms of server work.
DEFAULT_BATCH = {
    "simple": 8,
    "identity": 4,
    "particlenet_ak4": 16,
    "deepmet": 4,
    "particle_transformer": 8,
    "gnn_linking": 4,
}


GENERATORS = {
    "simple": simple,
    "identity": identity,
    "particlenet_ak4": particlenet_ak4,
    "deepmet": deepmet,
    "particle_transformer": particle_transformer,
    "gnn_linking": gnn_linking,
}


def generate(
    model: str, n: int, seed: int, allocate: Allocate = SoA.allocate
) -> Sample | GraphSample:
    """`n` events for `model`; `allocate` lays out the columns (in shared memory, say)."""
    if model not in GENERATORS:
        raise ValueError(f"model: no sample generator for {model!r}; known: {sorted(GENERATORS)}")
    if n < 1:
        raise ValueError(f"events: expected at least 1, got {n}")
    return GENERATORS[model](n, np.random.default_rng(seed), allocate)

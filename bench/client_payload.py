"""The client bench's payload: the identity model fed COLUMNS float32 columns of an SoA,
adjacent in one buffer, as one INPUT0. Its own module (no tritonclient.http, unlike the
bench's stock paths) so that devices/cuda/check.py sends the same payload."""

from __future__ import annotations

import numpy as np
from sonicsite.client import Column, SoA, TensorSpec

MODEL = "identity"
COLUMNS = 16


def _names() -> list[str]:
    return [f"c{k:02d}" for k in range(COLUMNS)]


def _columns() -> list[Column]:
    return [Column(name, np.float32) for name in _names()]


def _spec(rows: int, output_column: str | None) -> TensorSpec:
    spec = TensorSpec(MODEL).append_block(
        "INPUT0", *[c.name for c in _columns()], axis=0, shape=(1, COLUMNS * rows)
    )
    return spec.append_output("OUTPUT0", *([output_column] if output_column else []))


def _fill(soa: SoA, rng: np.random.Generator) -> None:
    for name in soa.names:
        if name.startswith("c"):
            soa[name][...] = rng.standard_normal(soa.rows, dtype=np.float32)


def _expected(soa: SoA) -> np.ndarray:
    return np.concatenate([soa[c.name] for c in _columns()])

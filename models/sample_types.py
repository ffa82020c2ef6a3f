"""What a sample of events is: its columns as one SoA (or ragged node and edge layouts for
graphs), the TensorSpec that maps them to the model's tensors, and the check of every answer.

`request(lo, hi)` gives the columns of events [lo, hi); `check(lo, hi, outputs)` raises
AnswerError when an answer is not plausible for those events (missing, not finite, not a
probability, not the exact arithmetic).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from sonicsite.client.layout import Column, Columns, Ragged, SoA
from sonicsite.client.spec import TensorSpec


class AnswerError(ValueError):
    """A server answer that cannot be right for the events sent."""


Allocate = Callable[[list[Column], int], SoA]


@dataclass
class Sample:
    """Events as one SoA (one row per event): input columns, output columns (NaN until the
    answers arrive) and the spec that maps them to the model's tensors."""

    model: str
    soa: SoA
    spec: TensorSpec
    expected: dict[str, np.ndarray] = field(default_factory=dict)  # output column -> exact
    probabilities: tuple[str, ...] = ()  # output columns whose rows are a softmax

    def __len__(self) -> int:
        return self.soa.rows

    def request(self, lo: int, hi: int) -> Columns:
        return self.soa.rows_slice(lo, hi)

    def reference_inputs(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        """The model inputs for events [lo, hi), stacked with plain numpy (for comparisons
        with the stock client)."""
        return stack_inputs(self.spec, self.request(lo, hi))

    def check(self, lo: int, hi: int, outputs: dict[str, np.ndarray]) -> None:
        for block in self.spec.outputs:
            for name in block.columns:
                got = self.soa[name][lo:hi]
                if got.dtype.kind == "f" and not np.all(np.isfinite(got)):
                    raise AnswerError(
                        f"{self.model}: column {name!r} has missing or non-finite "
                        f"answers for events [{lo}, {hi})"
                    )
                if name in self.probabilities:
                    sums = got.sum(axis=-1)
                    if np.any(got < 0) or not np.allclose(sums, 1.0, atol=1e-4):
                        raise AnswerError(f"{self.model}: column {name!r} rows are not softmax")
                if name in self.expected and not np.array_equal(got, self.expected[name][lo:hi]):
                    raise AnswerError(
                        f"{self.model}: column {name!r} differs from the exact answer"
                    )


@dataclass
class GraphSample:
    """Events as graphs of varying size: node and edge layouts with offsets per event (ragged).
    A request of one event sends its node and edge rows as they are; a request of several is
    one disjoint graph, with edge indices shifted per event."""

    model: str
    nodes: Ragged
    edges: Ragged  # src and dst are local to each event
    spec: TensorSpec
    scores: np.ndarray  # answers, one per edge (NaN until they arrive)

    def __len__(self) -> int:
        return len(self.nodes)

    def request(self, lo: int, hi: int) -> Columns:
        nodes, edges = self.nodes.collections(lo, hi), self.edges.collections(lo, hi)
        if hi - lo > 1:
            shift = np.repeat(self.nodes.offsets[lo:hi] - self.nodes.offsets[lo], edges.counts())
            columns = {n: edges.content[n] for n in edges.content.names}
            columns["src"] = columns["src"] + shift
            columns["dst"] = columns["dst"] + shift
            return Columns.merge(nodes.content, Columns(columns))
        return Columns.merge(nodes.content, edges.content)

    def reference_inputs(self, lo: int, hi: int) -> dict[str, np.ndarray]:
        return stack_inputs(self.spec, self.request(lo, hi))

    def check(self, lo: int, hi: int, outputs: dict[str, np.ndarray]) -> None:
        score = outputs.get("edge_score")
        edges = int(self.edges.offsets[hi] - self.edges.offsets[lo])
        if score is None or score.shape != (edges,):
            shape = None if score is None else score.shape
            raise AnswerError(f"{self.model}: edge_score shape {shape}, expected ({edges},)")
        if not np.all((score >= 0) & (score <= 1)):
            raise AnswerError(f"{self.model}: edge_score outside [0, 1]")
        self.scores[self.edges.offsets[lo] : self.edges.offsets[hi]] = score


def stack_inputs(spec: TensorSpec, columns: Columns) -> dict[str, np.ndarray]:
    out = {}
    for block in spec.inputs:
        arrays = [columns[c] for c in block.columns]
        stacked = arrays[0] if len(arrays) == 1 else np.stack(arrays, axis=block.axis)
        out[block.name] = np.ascontiguousarray(
            stacked.reshape(block.tensor_shape(arrays[0].shape[0], arrays[0].shape[1:]))
        )
    return out

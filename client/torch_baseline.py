"""What the in-process backend is measured against, and the small models that measure it.

`hand_view` is the fastest way a writer who knows the layout can make a tensor of a block of
adjacent SoA columns (one numpy view of the buffer's bytes, then `torch.from_numpy`: no copy,
no check); `stock_tensor` the usual way (stack them with numpy, then `torch.from_numpy`: one
copy of every value); `DirectModel` calls a TorchScript model
on arrays with nothing between (direct inference, as in the GPU studies); `sum_of_squares`
is a model that writes its answer into the tensor it is given, so that a call through
torch_views.py costs no output copy. Used by `sonicsite bench inprocess`; torch is imported
here only because the bench room does not take torch itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from .torch_views import TorchCall


def hand_view(
    buffer: np.ndarray, start: int, end: int, dtype: np.dtype, shape: tuple
) -> torch.Tensor:
    """A hand-written view of bytes `start:end` of an SoA's buffer, the writer knowing its
    columns are adjacent and of one dtype: what a careful user writes, nothing checked."""
    return torch.from_numpy(buffer[start:end].view(dtype)).view(shape)


def stock_tensor(arrays: list[np.ndarray], axis: int = 0) -> torch.Tensor:
    """The usual way: `np.stack` of the columns, then `torch.from_numpy`."""
    return torch.from_numpy(np.stack(arrays, axis=axis))


def sum_of_squares(call: TorchCall, block: str, output: str) -> None:
    """A model writing sum over features of x² straight into the output's columns (`out=`),
    then delivered: no output copy."""
    x = call.inputs[block]
    out = call.outputs[output].tensor
    call.deliver({output: torch.sum(x * x, dim=0, out=out)})


def in_memory_of(tensor: torch.Tensor, arrays: list[np.ndarray]) -> bool:
    """Whether the tensor's storage starts inside the buffer of one of `arrays`."""
    ptr = tensor.data_ptr()
    for array in arrays:
        base = array
        while isinstance(base.base, np.ndarray):
            base = base.base
        start = base.__array_interface__["data"][0]
        if start <= ptr < start + base.nbytes:
            return True
    return False


def torch_version() -> str:
    return torch.__version__


@dataclass
class DirectModel:
    """A TorchScript model called on tensors made once from arrays (no client between)."""

    path: Path
    device: str = "cpu"
    threads: int = 1
    module: torch.jit.ScriptModule | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        torch.set_num_threads(self.threads)
        self.module = torch.jit.load(str(self.path), map_location=self.device).eval()

    def bind(self, arrays: list[np.ndarray]):
        """A call of the model on these arrays (moved to the device once, here)."""
        tensors = [torch.from_numpy(a).to(self.device) for a in arrays]
        module, gpu = self.module, self.device != "cpu"

        def call() -> None:
            with torch.inference_mode():
                module(*tensors)
            if gpu:
                torch.cuda.synchronize()

        return call

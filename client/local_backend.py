"""A model run in the worker's own process: its TorchScript artifact (compile "jit") or its
AOTInductor package (compile "aot", client/aot.py: compiled from the exported program on
first use, then cached) on SoA views.

The first call loads the model (not the construction: a job that never infers pays
nothing) and sets torch's threads, intra-op from `threads` and inter-op from
`interop_threads` (default 1 each: no parallelism the framework does not manage), and
places the model on its `device` ("cpu", or "cuda[:N]" where one is present and asked).
Every call runs in `torch.inference_mode()` on the tensors of torch_views.py (the remote
path's copy plan, views where the layout allows) and puts the results into their SoA
columns; on a GPU the inputs go to the device and the results come back, one transfer
each, counted apart from the payload copies (`TorchCall.transfers`).
torch's thread counts are process-wide by torch's design: the last model loaded sets them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .layout import Columns
from .spec import ModelInfo, TensorSpec
from .torch_views import TorchCall, torch_call


@dataclass
class LocalModel:
    """One model's TorchScript file and the metadata its spec is checked against (the
    same ModelInfo the server gives for the model)."""

    path: Path
    info: ModelInfo
    threads: int = 1
    interop_threads: int = 1
    device: str = "cpu"
    compile: str = "jit"
    module: object | None = field(default=None, repr=False)  # a ScriptModule, or AOT's
    interop_note: str = ""  # why inter-op threads stayed as they were, if they did
    compile_s: float = 0.0  # an AOT compile at load (0: cached, or jit)

    def load(self):
        """Load once, onto its device, with the configured thread counts."""
        if self.module is None:
            if self.threads < 1 or self.interop_threads < 1:
                raise ValueError(
                    f"threads: expected at least 1, got {self.threads} intra-op and "
                    f"{self.interop_threads} inter-op"
                )
            if self.device != "cpu" and not torch.cuda.is_available():
                raise ValueError(f"device: {self.device!r} asked, but torch sees no GPU")
            torch.set_num_threads(self.threads)
            if torch.get_num_interop_threads() != self.interop_threads:
                try:
                    torch.set_num_interop_threads(self.interop_threads)
                except RuntimeError as exc:  # only before any inter-op work in the process
                    self.interop_note = str(exc)
            if self.compile == "aot":
                from .aot import aot_package

                package = aot_package(self.path.parent)
                self.compile_s = package.seconds
                # the package's C++ loader, as torch._inductor.aoti_load_package uses it:
                # importing torch._inductor (the compiler) would add a second to a job's
                # first event for a package that is compiled already
                loader = torch._C._aoti.AOTIModelPackageLoader(
                    str(package.path), "model", False, 1, -1
                )
                self.module = lambda *inputs: loader.run(list(inputs))
            else:
                self.module = torch.jit.load(str(self.path), map_location=self.device).eval()
        return self.module

    def infer(self, spec: TensorSpec, soa: Columns, strict: bool = False) -> TorchCall:
        """Run one batch: inputs viewed (or gathered once) from `soa`, outputs into their
        columns; the returned call counts the copies and reports them."""
        call = torch_call(spec, self.info, soa, strict)
        module = self.load()
        inputs = [call.inputs[name] for name in self.info.inputs]
        if self.compile == "aot":  # AOTInductor's code assumes the strides it was compiled
            # for (contiguous): a strided view of the SoA is copied once, and counted
            if strict and not all(t.is_contiguous() for t in inputs):
                raise ValueError(
                    f"{self.info.name}: strict: compile='aot' needs contiguous inputs, and a "
                    "strided view of the SoA would be copied"
                )
            call.input_copies += sum(not t.is_contiguous() for t in inputs)
            inputs = [t.contiguous() for t in inputs]
        if self.device != "cpu":
            inputs = [t.to(self.device) for t in inputs]
            call.transfers += len(inputs)
        with torch.inference_mode():
            results = module(*inputs)
        if not isinstance(results, tuple | list):
            results = (results,)
        if self.device != "cpu":
            results = [r.to("cpu") for r in results]
            call.transfers += len(results)
        if len(results) != len(self.info.outputs):
            raise ValueError(
                f"{self.info.name}: the model gave {len(results)} outputs, its metadata "
                f"names {len(self.info.outputs)}: {list(self.info.outputs)}"
            )
        call.deliver(dict(zip(self.info.outputs, results, strict=True)))
        return call

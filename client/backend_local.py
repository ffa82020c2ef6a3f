"""Backend `local`: a stream's events run by the model in the worker's own process.

`client.stream(model, spec, backend="local", compile="jit")` runs each chunk of `batch`
events through the model's TorchScript file, or with compile="aot" its AOTInductor package
(compiled from the exported program at the first event unless cached: client/aot.py)
(local_backend.py `LocalModel`), on tensors that
view the SoA columns (torch_views.py): the same TensorSpec, checked against the same model
metadata, and the same copy plan and report as the remote path. The model is loaded and
placed on its device at the first event; one batch runs at a time (a lock), so the
configured torch threads are the only parallelism the model brings. Chunks are delivered
to `on_result` exactly as the remote path delivers them, and recorded with path "local".

torch is imported at the first event only (local_backend.py): a worker without torch still
streams through the site.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from .layout import Columns
from .spec import ModelInfo, TensorSpec
from .stats import RequestRecord
from .stream_guard import check_on_result, check_source
from .stream_io import OnResult, Source, StreamResult

if TYPE_CHECKING:
    from .stream_options import StreamOptions
    from .torch_views import TorchCall  # imports torch: for the checker only

BACKENDS = ("site", "local", "auto")
COMPILES = ("jit", "aot")
LOCAL = "local"  # the path and server of an in-process record
TORCHSCRIPT_FILE = "model.pt"  # as models/torch_artifacts.py writes it beside model.onnx
ONNX_FILE = "model.onnx"  # every model's build has it (models/repository.py)
EXPORTED_FILE = "model.pt2"  # the exported program AOTInductor compiles (client/aot.py)


@dataclass(frozen=True)
class LocalModels:
    """Where in-process models come from and how they run: `folder` is a model repository
    as `sonicsite models build` writes it (`<folder>/<model>/1/model.pt`); `infos` gives a
    model's metadata (None: ask the site, as the remote path does); torch's intra- and
    inter-op threads (default 1: no parallelism the worker does not manage); `device`."""

    folder: Path
    infos: Callable[[str], ModelInfo] | None = None
    threads: int = 1
    interop_threads: int = 1
    device: str = "cpu"

    def __post_init__(self) -> None:
        for name in ("threads", "interop_threads"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected an integer ≥ 1, got {getattr(self, name)}")
        if self.device != "cpu" and not self.device.startswith("cuda"):
            raise ValueError(f"device: expected 'cpu' or 'cuda[:N]', got {self.device!r}")

    def artifact(self, model: str, compile: str) -> Path:
        """The file the model runs from, or why there is none."""
        if compile not in COMPILES:
            raise ValueError(f"compile: expected one of {COMPILES}, got {compile!r}")
        if compile == "aot" and self.device != "cpu":
            raise ValueError(
                f"compile: 'aot' packages are compiled for the CPU here; device {self.device!r} "
                "runs compile='jit'"
            )
        # aot: the exported program, compiled (or found compiled) at the first event
        name = EXPORTED_FILE if compile == "aot" else TORCHSCRIPT_FILE
        path = Path(self.folder) / model / "1" / name
        if path.is_file():
            return path
        folder, version = Path(self.folder), Path(self.folder) / model / "1"
        if (version / ONNX_FILE).is_file() and not (version / TORCHSCRIPT_FILE).is_file():
            built = sorted(p.parent.parent.name for p in folder.glob(f"*/1/{TORCHSCRIPT_FILE}"))
            raise ValueError(
                f"model {model!r}: no PyTorch build in {folder} (only {ONNX_FILE}): it runs on "
                f"the site, not in process; the models that can here: {built or 'none'}"
            )
        raise ValueError(
            f"model {model!r}: {path} is missing; `sonicsite models build --out {folder}` "
            "writes it for the models built from PyTorch"
        )


@dataclass
class LocalRunner:
    """One model in process: loaded at the first batch, one batch at a time."""

    model: str
    settings: LocalModels
    compile: str
    info: Callable[[], ModelInfo]  # the model's metadata, asked for at the first batch
    _loaded: object | None = field(default=None, repr=False)  # local_backend.LocalModel
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def __post_init__(self) -> None:
        self.path = self.settings.artifact(self.model, self.compile)  # fails before any event

    @property
    def loaded(self) -> bool:
        return self._loaded is not None and self._loaded.module is not None

    def run(
        self,
        spec: TensorSpec,
        columns: Columns,
        strict: bool = False,
        known: ModelInfo | None = None,
    ) -> TorchCall:
        """Run one batch; returns its torch_views.TorchCall (copies, report, raw outputs).
        `known`: the metadata the site gave the stream already, used when LocalModels has no
        `infos`: a site that went down mid-stream cannot be asked again (backend "auto")."""
        with self._lock:
            if self._loaded is None:
                from .local_backend import LocalModel  # torch, at the first event only

                s = self.settings
                info = known if known is not None and s.infos is None else self.info()
                self._loaded = LocalModel(
                    self.path, info, s.threads, s.interop_threads, s.device, self.compile
                )
            return self._loaded.infer(spec, columns, strict)

    def deliver(
        self,
        spec: TensorSpec,
        strict: bool,
        lo: int,
        hi: int,
        columns: Columns,
        on_result: OnResult,
        result: StreamResult,
        known: ModelInfo | None = None,
    ) -> None:
        """Run events [lo, hi) of a source, its `columns` for them, and deliver them once:
        recorded (path "local") in `result` (a StreamResult, stream_io.py), then given to
        `on_result` with the outputs returned as arrays (the others are in their columns).
        `known`: as `run`'s."""
        start, t0 = time.time(), time.perf_counter()
        call = self.run(spec, columns, strict, known)
        record = RequestRecord(start, time.perf_counter() - t0, LOCAL, hi - lo, True)
        record.path, record.copies = LOCAL, call.copies
        with self._lock:
            result.stats.records.append(record)
            result.delivered.append((lo, hi))
            result.local.append((lo, hi))
        on_result(lo, hi, call.raw)


class LocalStream:
    """A stream whose chunks all run in process, in the caller's thread, one after another
    (the same `run` as the engine's Stream, so a worker uses either)."""

    def __init__(self, runner: LocalRunner, spec: TensorSpec, options: StreamOptions) -> None:
        self.runner, self.spec, self.options = runner, spec, options

    def run(
        self,
        source: Source,
        on_result: OnResult,
        arrivals: Sequence[float] | None = None,
        on_send: Callable[[int, int], None] | None = None,
        resent: Collection[tuple[int, int]] = (),
    ) -> StreamResult:
        """Every event of `source`, in chunks of `batch`; `arrivals` as the engine's (the
        time each chunk starts at the earliest). `on_send` and `resent` need nothing here:
        a chunk run in process is never sent anywhere."""
        check_source(source)
        check_on_result(on_result)
        result = StreamResult()
        batch = self.options.batch
        chunks = [(lo, min(lo + batch, len(source))) for lo in range(0, len(source), batch)]
        if arrivals is not None and len(arrivals) != len(chunks):
            raise ValueError(f"arrivals: expected {len(chunks)} times, got {len(arrivals)}")
        for i, (lo, hi) in enumerate(chunks):
            columns = source.request(lo, hi)  # the job's own work first, as the engine's
            if arrivals is not None:
                time.sleep(max(0.0, arrivals[i] - time.time()))
            self.runner.deliver(self.spec, self.options.strict, lo, hi, columns, on_result, result)
        return result

"""Generic Triton Python-backend model that serves an ONNX file with onnxruntime, or a
TorchScript file (`model.pt`) with PyTorch: the local stand-in for Triton's onnxruntime and
PyTorch (LibTorch) backends, which the wheel's Triton does not have.

Copied as `model.py` into every model of the local repository. It reads the inputs and
outputs from the model's own config, so one runner serves every model: requests that
Triton's dynamic batcher hands over together are concatenated along the batch dimension,
run once, and split back. The config's parameter `runner_framework` (FRAMEWORK_PARAMETER)
picks the file: `onnx` (the default) or `torchscript`; a TorchScript model takes its inputs in
the config's order and returns its outputs in the config's order, as the LibTorch backend
reads a config whose names do not follow its `<name>__<index>` convention.

Executed at most once per request id (for clients that ask for it): a request that carries
the parameter `sonicsite-idempotent` promises that its id names its inputs (sonicsite workers
name their job and events). Its answer is kept by id for a while (300 s, at most 64 MB per
model instance: kept_settings.py); the same id again (a resend after the answer was lost
with Envoy, the gateway or the worker) is answered from it, not executed. A request with
`sonicsite-lookup` as well is only answered from what is kept (a client asking each server
"did you run this?", see client/engine.py), never executed. A request whose caller went away
before it ran (Triton's request cancellation: the connection that carried it closed) is not
executed at all. Stock clients send neither parameter and are served as by any Triton.

Every request is recorded where it ran: one line per request (time, server, model, rows,
outcome, request id) appended to `<site dir>/executions/<server id>.log` (EXECUTIONS_DIR)
when the server's environment names its site and server (the local launcher sets both; a
runner without them records nothing). Outcomes: `executed`, `replayed` (a resend answered
from the kept answer), `found` / `missed` (a lookup), `cancelled` (not executed: its caller
was gone). The lines of one execution go out in one write(2) on an O_APPEND descriptor after
the model ran and before the answers are returned, so a server killed at any moment has
recorded every request it answered; what the kernel had accepted survives the process (no
fsync: only a crash of the machine itself could lose the last lines).
sonicsite/jobs/executions.py reads the logs back.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import sys
import time
from collections import OrderedDict
from pathlib import Path

# Named, not __name__ (the stub loads this file as `model`); with no handler set in the stub,
# a warning goes to its stderr, which is the server's log.
LOG = logging.getLogger("sonicsite.models.runner")
# A test knob: every execution on this server sleeps this long (the launcher sets it per
# server; the stub inherits the server's environment).
DELAY_ENV = "SONICSITE_MODEL_DELAY_MS"
# The knob of `sonicsite bench balancing`: CPU work per executed request, read from the JSON
# file this names ({"work_ms": W, "factors": {server id: F}}: W × F ms of this thread's CPU
# time, F 1 for a server not named; no file, no work). Re-read whenever the file is replaced,
# so a bench slows a server, or lets it recover, while the site runs.
WORK_ENV = "SONICSITE_MODEL_WORK_FILE"
# Where executions are recorded (set by the local launcher, sonicsite/local/servers.py).
SERVER_ID_ENV, SITE_DIR_ENV = "SONICSITE_SERVER_ID", "SONICSITE_SITE_DIR"
EXECUTIONS_DIR = "executions"
# Request parameters (as sonicsite/contract/wire.py names them; a test checks they agree)
IDEMPOTENT_PARAMETER, LOOKUP_PARAMETER = "sonicsite-idempotent", "sonicsite-lookup"
# How long, and how much of, the answers are kept (per model instance): kept_settings.py,
# copied beside this file (the stub has no project imports), reads SONICSITE_KEPT_TTL_S and
# SONICSITE_KEPT_MAX_MB, as `sonicsite up` does before any server starts.
KEPT_SETTINGS_FILE = "kept_settings.py"
EXECUTED, REPLAYED, FOUND, MISSED, CANCELLED = (
    "executed",
    "replayed",
    "found",
    "missed",
    "cancelled",
)

# The Python-backend stub runs an isolated interpreter that ignores PYTHONPATH; the launcher
# writes the serving environment's package folders beside this file.
_PATHS = Path(__file__).with_name("python_path.txt")
if _PATHS.is_file():
    for _p in reversed(_PATHS.read_text().split()):
        if _p not in sys.path:
            sys.path.insert(0, _p)

import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


def _kept_settings():
    """kept_settings.py, from beside this file (the repository writer copies it there)."""
    path = Path(__file__).with_name(KEPT_SETTINGS_FILE)
    spec = importlib.util.spec_from_file_location("sonicsite_kept_settings", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The config parameter naming the file a model is served from (models/repository.py sets it).
FRAMEWORK_PARAMETER, ONNX, TORCHSCRIPT = "runner_framework", "onnx", "torchscript"


class KeptAnswers:
    """Answers of idempotent requests by id, oldest first: dropped after `ttl_s`, or sooner
    when they would hold more than `max_bytes`. One per model instance (Triton calls an
    instance's `execute` one batch at a time, so no lock)."""

    def __init__(self, ttl_s: float, max_bytes: int):
        self.ttl_s, self.max_bytes = ttl_s, max_bytes
        self._answers: OrderedDict[str, tuple[float, list[np.ndarray], int]] = OrderedDict()
        self._bytes = 0

    def get(self, request_id: str) -> list[np.ndarray] | None:
        self._expire(time.monotonic())
        kept = self._answers.get(request_id)
        return None if kept is None else kept[1]

    def put(self, request_id: str, outputs: list[np.ndarray]) -> None:
        size = sum(o.nbytes for o in outputs)
        if size > self.max_bytes:
            return  # larger than the whole store: a resend of it executes again
        if request_id in self._answers:
            self._bytes -= self._answers.pop(request_id)[2]
        self._answers[request_id] = (time.monotonic() + self.ttl_s, outputs, size)
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._bytes -= self._answers.popitem(last=False)[1][2]

    def _expire(self, now: float) -> None:
        while self._answers:
            key, (expires, _, size) = next(iter(self._answers.items()))
            if expires > now:
                return
            del self._answers[key]
            self._bytes -= size


class ModelWork:
    """The CPU-work knob (WORK_ENV): seconds of CPU work per request on `server`, re-read
    when the file changes (a stat per execution; the bench replaces the file atomically)."""

    def __init__(self, path: str | None, server: str):
        self.path, self.server = path, server
        self._seen: tuple[int, int] | None = None
        self._seconds = 0.0

    def seconds(self) -> float:
        if not self.path:
            return 0.0
        try:
            stat = os.stat(self.path)
        except OSError:
            self._seen, self._seconds = None, 0.0
            return 0.0
        seen = (stat.st_ino, stat.st_mtime_ns)
        if seen != self._seen:
            self._seen, self._seconds = seen, _work_seconds(self.path, self.server)
        return self._seconds


def _work_seconds(path: str, server: str) -> float:
    """W × F ms of the knob's file, in seconds; 0 for a file that cannot be read, said in
    the server's log with why (once per version of the file: it is read once per change),
    never a failed request: a bench that slows a server by a damaged file would otherwise
    measure a fast one without a word."""
    try:
        knob = json.loads(Path(path).read_text())
        factor = float(knob.get("factors", {}).get(server, 1.0))
        return max(float(knob.get("work_ms", 0.0)) * factor, 0.0) / 1e3
    except (OSError, ValueError, TypeError, AttributeError) as exc:
        LOG.warning("CPU-work knob %s unread, no work on %s: %r", path, server or "?", exc)
        return 0.0


def cpu_work(seconds: float) -> None:
    """Keep this thread busy for `seconds` of its own CPU time (not wall time): a stand-in
    for a model's compute, which takes longer in wall time when the cores are shared."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        sum(range(100))


class OnnxSession:
    """An ONNX file run by onnxruntime on the CPU, `threads` intra-op threads."""

    def __init__(self, path: Path, inputs: list[str], threads: int):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        self.session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        known = {i.name for i in self.session.get_inputs()}
        missing = [n for n in inputs if n not in known]
        if missing:
            raise pb_utils.TritonModelException(
                f"{path}: config inputs {missing} are not inputs of the ONNX graph"
            )

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(outputs, feeds)


class TorchScriptSession:
    """A TorchScript file run by PyTorch on the CPU in inference mode: inputs passed in the
    config's order, outputs (a tensor or a tuple) taken in the config's order. `threads`
    intra-op threads and one inter-op thread, as the ONNX session."""

    def __init__(self, path: Path, inputs: list[str], threads: int):
        import torch

        torch.set_num_threads(threads)
        with contextlib.suppress(RuntimeError):  # set once per interpreter, before any use
            torch.set_num_interop_threads(1)
        self.torch = torch
        self.module = torch.jit.load(str(path), map_location="cpu").eval()
        self.inputs = inputs

    def run(self, outputs: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self.torch
        with torch.inference_mode():
            result = self.module(*(torch.from_numpy(feeds[n]) for n in self.inputs))
        results = [result] if isinstance(result, torch.Tensor) else list(result)
        if len(results) != len(outputs):
            raise pb_utils.TritonModelException(
                f"the TorchScript model returned {len(results)} tensors, its config names "
                f"{len(outputs)} outputs ({', '.join(outputs)})"
            )
        return [r.numpy() for r in results]


SESSIONS = {ONNX: (OnnxSession, "model.onnx"), TORCHSCRIPT: (TorchScriptSession, "model.pt")}


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        if int(np.__version__.split(".")[0]) >= 2:  # the stub would answer empty outputs
            raise pb_utils.TritonModelException(
                f"NumPy {np.__version__} ({np.__file__}) in the Python-backend stub: "
                "nvidia-pytriton 0.7.0's stub is built for NumPy 1.x and answers NumPy 2 "
                "arrays as empty tensors; put a NumPy 1.x first on the stub's path "
                f"({_PATHS.name} beside the model, from the launcher's python_path)"
            )
        config = json.loads(args["model_config"])
        self.batching = int(config.get("max_batch_size", 0)) > 0
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [
            (o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in config["output"]
        ]
        self.delay_s = float(os.environ.get(DELAY_ENV) or 0.0) / 1e3
        params = config.get("parameters", {})
        threads = int(params.get("ort_intra_op_threads", {}).get("string_value", "1"))
        framework = params.get(FRAMEWORK_PARAMETER, {}).get("string_value", ONNX)
        if framework not in SESSIONS:
            raise pb_utils.TritonModelException(
                f"parameter {FRAMEWORK_PARAMETER} is {framework!r}; the runner serves "
                f"{', '.join(SESSIONS)}"
            )
        session, filename = SESSIONS[framework]
        path = Path(args["model_repository"]) / args["model_version"] / filename
        self.session = session(path, self.inputs, threads)
        self.name = str(args.get("model_name", config.get("name", "")))
        self.log_fd = _open_log(os.environ.get(SITE_DIR_ENV), os.environ.get(SERVER_ID_ENV))
        self.server = os.environ.get(SERVER_ID_ENV, "")
        self.work = ModelWork(os.environ.get(WORK_ENV), self.server)
        try:
            self.kept = KeptAnswers(*_kept_settings().kept_settings(os.environ))
        except ValueError as exc:  # names the variable and what it expects
            raise pb_utils.TritonModelException(f"model {self.name!r}: {exc}") from None

    def finalize(self) -> None:
        if self.log_fd is not None:
            os.close(self.log_fd)
            self.log_fd = None

    def _record(self, requests, rows: list[int], outcomes: list[str]) -> None:
        """One line per request, all of this execution's lines in one write."""
        if self.log_fd is None:
            return
        now = f"{time.time():.6f}"
        lines = "".join(
            f"{now}\t{self.server}\t{self.name}\t{n}\t{how}\t{_clean(r.request_id())}\n"
            for r, n, how in zip(requests, rows, outcomes, strict=True)
        )
        os.write(self.log_fd, lines.encode())

    def _arrays(self, request) -> dict[str, np.ndarray]:
        return {n: pb_utils.get_input_tensor_by_name(request, n).as_numpy() for n in self.inputs}

    def _run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        names = [n for n, _ in self.outputs]
        results = self.session.run(names, feeds)
        return [
            np.ascontiguousarray(r, dtype=dt)
            for r, (_, dt) in zip(results, self.outputs, strict=True)
        ]

    def _response(self, results: list[np.ndarray]):
        tensors = [pb_utils.Tensor(n, r) for (n, _), r in zip(self.outputs, results, strict=True)]
        return pb_utils.InferenceResponse(output_tensors=tensors)

    def _rows(self, request) -> int:
        """The batch (leading) dimension of a batching model's request; 1 for a model that
        does not batch (its request is one tensor set, a graph say)."""
        if not self.batching:
            return 1
        return int(pb_utils.get_input_tensor_by_name(request, self.inputs[0]).as_numpy().shape[0])

    def _compute(self, arrays: list[dict[str, np.ndarray]]) -> list[list[np.ndarray]]:
        """Each request's outputs: batched together where the shapes allow."""
        sizes = [a[self.inputs[0]].shape[0] for a in arrays] if self.batching else []
        inner = {tuple(a[n].shape[1:] for n in self.inputs) for a in arrays}
        if not self.batching or len(arrays) == 1 or len(inner) > 1:
            return [self._run(a) for a in arrays]
        feeds = {n: np.concatenate([a[n] for a in arrays]) for n in self.inputs}
        results = self._run(feeds)
        bounds = np.cumsum(sizes)[:-1]
        return [list(parts) for parts in zip(*(np.split(r, bounds) for r in results), strict=True)]

    def execute(self, requests):
        """Execute what must be, answer the rest from what is kept (see the module's doc)."""
        n = len(requests)
        ids = [r.request_id() for r in requests]
        flags = [_flags(r) for r in requests]
        outcomes, answers = [""] * n, [None] * n
        arrays = {}
        for i, r in enumerate(requests):
            idempotent, lookup = flags[i]
            if lookup:
                continue  # answered below, after this batch's executions
            kept = self.kept.get(ids[i]) if idempotent and ids[i] else None
            if kept is not None:
                outcomes[i], answers[i] = REPLAYED, kept
            elif r.is_cancelled():
                outcomes[i] = CANCELLED
            elif not (idempotent and ids[i] in {ids[k] for k in arrays if flags[k][0]}):
                arrays[i] = self._arrays(r)  # (a second copy in one batch waits for the first)
        if arrays:
            if self.delay_s:
                time.sleep(self.delay_s)
            work = self.work.seconds()
            if work:
                cpu_work(work * len(arrays))
            for i, outputs in zip(arrays, self._compute(list(arrays.values())), strict=True):
                outcomes[i], answers[i] = EXECUTED, outputs
                if flags[i][0] and ids[i]:
                    self.kept.put(ids[i], outputs)
        for i in range(n):
            if not outcomes[i]:  # a lookup, or the same id again within this batch
                kept = self.kept.get(ids[i]) if ids[i] else None
                if kept is not None:
                    outcomes[i], answers[i] = (FOUND if flags[i][1] else REPLAYED), kept
                else:
                    outcomes[i] = MISSED
        self._record(requests, [self._rows(r) for r in requests], outcomes)
        replies = zip(outcomes, answers, ids, strict=True)
        return [self._reply(how, answer, rid) for how, answer, rid in replies]

    def _reply(self, outcome: str, answer, request_id: str):
        if answer is not None:
            return self._response(answer)
        if outcome == CANCELLED:
            message = f"request {request_id!r}: not executed, its caller had gone (cancelled)"
            return pb_utils.InferenceResponse(
                error=pb_utils.TritonError(message, pb_utils.TritonError.CANCELLED)
            )
        message = f"request {request_id!r}: no answer kept on {self.server or 'this server'}"
        return pb_utils.InferenceResponse(
            error=pb_utils.TritonError(message, pb_utils.TritonError.NOT_FOUND)
        )


def _flags(request) -> tuple[bool, bool]:
    """(idempotent, lookup) from the request's parameters; a lookup is idempotent."""
    try:
        params = json.loads(request.parameters() or "{}")
    except (ValueError, AttributeError):
        return False, False
    lookup = _true(params.get(LOOKUP_PARAMETER))
    return lookup or _true(params.get(IDEMPOTENT_PARAMETER)), lookup


def _true(value) -> bool:
    return value is True or (isinstance(value, str) and value.lower() == "true")


def _open_log(site_dir: str | None, server: str | None) -> int | None:
    """The server's append-only execution log, or None when the environment names no site
    and server (a runner outside the local site records nothing)."""
    if not site_dir or not server:
        return None
    folder = Path(site_dir) / EXECUTIONS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    return os.open(folder / f"{_clean(server)}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)


def _clean(text: str) -> str:
    """A field of a tab-separated line: no tabs or line breaks from a client's request id."""
    return text.replace("\t", " ").replace("\n", " ").replace("\r", " ")

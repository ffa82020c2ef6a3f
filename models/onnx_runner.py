"""Generic Triton Python-backend model that serves an ONNX file with onnxruntime.

Copied as `model.py` into every model of the local repository. It reads the inputs and
outputs from the model's own config, so one runner serves every model: requests that
Triton's dynamic batcher hands over together are concatenated along the batch dimension,
run once, and split back.

Every executed request is recorded where it ran: one line per request (time, server, model,
rows, request id) appended to `<site dir>/executions/<server id>.log` (EXECUTIONS_DIR) when
the server's environment names its site and server (the local launcher sets both; a runner
without them records nothing). The lines of one execution go out in one write(2) on an
O_APPEND descriptor after the model ran and before the answers are returned, so a server
killed at any moment has recorded every request it answered; what the kernel had accepted
survives the process (no fsync: only a crash of the machine itself could lose the last
lines). Request ids are whatever the client sent (sonicsite workers name their job, attempt
and events; sonicsite/jobs/executions.py reads the logs back).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# A test knob for `sonicsite bench balancing`: every execution on this server sleeps this long
# (the launcher sets it per server; the stub inherits the server's environment).
DELAY_ENV = "SONICSITE_MODEL_DELAY_MS"
# Where executions are recorded (set by the local launcher, sonicsite/local/servers.py).
SERVER_ID_ENV, SITE_DIR_ENV = "SONICSITE_SERVER_ID", "SONICSITE_SITE_DIR"
EXECUTIONS_DIR = "executions"

# The Python-backend stub runs an isolated interpreter that ignores PYTHONPATH; the launcher
# writes the serving environment's package folders beside this file.
_PATHS = Path(__file__).with_name("python_path.txt")
if _PATHS.is_file():
    for _p in reversed(_PATHS.read_text().split()):
        if _p not in sys.path:
            sys.path.insert(0, _p)

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        self.batching = int(config.get("max_batch_size", 0)) > 0
        self.inputs = [i["name"] for i in config["input"]]
        self.outputs = [
            (o["name"], pb_utils.triton_string_to_numpy(o["data_type"])) for o in config["output"]
        ]
        self.delay_s = float(os.environ.get(DELAY_ENV) or 0.0) / 1e3
        params = config.get("parameters", {})
        threads = int(params.get("ort_intra_op_threads", {}).get("string_value", "1"))
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        path = Path(args["model_repository"]) / args["model_version"] / "model.onnx"
        self.session = ort.InferenceSession(
            str(path), sess_options=options, providers=["CPUExecutionProvider"]
        )
        self.name = str(args.get("model_name", config.get("name", "")))
        self.log_fd = _open_log(os.environ.get(SITE_DIR_ENV), os.environ.get(SERVER_ID_ENV))
        self.server = os.environ.get(SERVER_ID_ENV, "")
        session_inputs = {i.name for i in self.session.get_inputs()}
        missing = [n for n in self.inputs if n not in session_inputs]
        if missing:
            raise pb_utils.TritonModelException(
                f"{path}: config inputs {missing} are not inputs of the ONNX graph"
            )

    def finalize(self) -> None:
        if self.log_fd is not None:
            os.close(self.log_fd)
            self.log_fd = None

    def _record(self, requests, rows: list[int]) -> None:
        """One line per request, all of this execution's lines in one write."""
        if self.log_fd is None:
            return
        now = f"{time.time():.6f}"
        lines = "".join(
            f"{now}\t{self.server}\t{self.name}\t{n}\t{_clean(r.request_id())}\n"
            for r, n in zip(requests, rows, strict=True)
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

    def execute(self, requests):
        if self.delay_s:
            time.sleep(self.delay_s)
        arrays = [self._arrays(r) for r in requests]
        # rows: the batch (leading) dimension of a batching model; 1 for a model that does
        # not batch (its request is one tensor set, a graph say)
        sizes = [a[self.inputs[0]].shape[0] if self.batching else 1 for a in arrays]
        inner = {tuple(a[n].shape[1:] for n in self.inputs) for a in arrays}
        if not self.batching or len(requests) == 1 or len(inner) > 1:
            responses = [self._response(self._run(a)) for a in arrays]
            self._record(requests, sizes)
            return responses
        feeds = {n: np.concatenate([a[n] for a in arrays]) for n in self.inputs}
        results = self._run(feeds)
        bounds = np.cumsum(sizes)[:-1]
        per_request = zip(*(np.split(r, bounds) for r in results), strict=True)
        responses = [self._response(list(parts)) for parts in per_request]
        self._record(requests, sizes)
        return responses


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

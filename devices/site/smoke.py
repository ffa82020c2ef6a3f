"""Part A's check on the lent machine (run_a.sh): every part of the local site imports with
the unpacked packages, and one Triton server (no control plane) gets the models that part A
carries ready, so that the Python-backend stub, NumPy 1.x and the machine's onnxruntime work
together before part B spends its minutes on the bench. Argument: the unpacked models."""

from __future__ import annotations

import importlib
import sys
import tempfile
import urllib.request
from pathlib import Path

PARTS = (
    "sonicsite.cli",
    "sonicsite.local.launcher",
    "sonicsite.local.operator_main",
    "sonicsite.local.supervisor",
    "sonicsite.gateway.main",
    "sonicsite.bench.placement",
    "sonicsite.bench.from_zero",
    "tritonclient.grpc",
)


def main(models: Path) -> int:
    for name in PARTS:
        importlib.import_module(name)
    for name in ("numpy", "onnxruntime", "grpc", "google.protobuf", "uvicorn", "fastapi"):
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')} from {module.__file__}")
    from sonicsite.bench.placement import LAYOUT

    from sonicsite.local import launcher

    present = {p.name for p in models.iterdir() if p.is_dir()}  # part A's (bundle.py)
    names = sorted({m for held in LAYOUT.values() for m in held} & present)
    with tempfile.TemporaryDirectory() as tmp:
        state = launcher.up(
            Path(tmp) / "site",
            servers=1,
            models=names,
            build_dir=models,
            balancer=False,
            supervise=False,
        )
        try:
            server = state.servers[0]
            for name in names:
                url = f"http://{server.http}/v2/models/{name}/ready"
                with urllib.request.urlopen(url, timeout=10) as reply:
                    print(f"{name}: ready ({reply.status})")
            _identity_answers(server.grpc)
        finally:
            launcher.down(state.site_dir)
    return 0


def _identity_answers(address: str) -> None:
    """The identity model answers its input (a stub that does not run the NumPy it found
    answers empty tensors: models/runner.py refuses to load then, and this would see it)."""
    import numpy as np
    import tritonclient.grpc as grpcclient

    sent = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = grpcclient.InferInput("INPUT0", list(sent.shape), "FP32")
    tensor.set_data_from_numpy(sent)
    reply = grpcclient.InferenceServerClient(address).infer("identity", [tensor])
    got = reply.as_numpy("OUTPUT0")
    if got is None or not np.array_equal(got, sent):
        raise SystemExit(f"identity answered {got!r} for {sent!r}")
    print("identity: answers its input")


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

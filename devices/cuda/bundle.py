"""What the CUDA shared-memory check carries to a lent GPU machine (README.md beside this):
Triton from the nvidia-pytriton wheel (its server, its Python backend, the stub for the
machine's Python 3.12 and the libraries they link, xz-compressed), tritonclient's Python
package (without perf_analyzer's binaries), the client's other wheels for Python 3.12
(NumPy 1.x: the wheel's Python-backend stub does not run NumPy 2), three built models, and
the check itself. The machine reaches no registry, and what travels is held to 64 MiB.

Run as a script: `python devices/cuda/bundle.py OUT_DIR` (`make cuda-check-bundle`)."""

from __future__ import annotations

import fnmatch
import functools
import io
import json
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PYTHON = "3.12"  # the GPU machines' python3 (/opt/torch/.venv)
PLATFORMS = ("manylinux_2_35_x86_64", "manylinux_2_28_x86_64", "manylinux_2_24_x86_64")
PLATFORMS += ("manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux1_x86_64")
CONSTRAINTS = ROOT / "constraints.txt"  # the versions make install takes


def pinned(*names: str) -> tuple[str, ...]:
    """`name==version` for each of `names` at constraints.txt's version, so that the bundle
    carries what the suite runs with here; KeyError naming a package it does not pin."""
    pins = _pins()
    missing = [n for n in names if _normal(n) not in pins]
    if missing:
        raise KeyError(f"{CONSTRAINTS} pins no version of {missing}")
    return tuple(f"{n}=={pins[_normal(n)]}" for n in names)


@functools.cache
def _pins() -> dict[str, str]:
    """constraints.txt's versions by normalised name, read once (both bundles ask)."""
    pins = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==", 1)
            pins[_normal(name)] = version.strip()
    return pins


def _normal(name: str) -> str:
    return name.strip().lower().replace("_", "-").replace(".", "-")


(TRITON, TRITONCLIENT) = pinned("nvidia-pytriton", "tritonclient")
WHEELS = pinned("numpy", "python-rapidjson", "hpack", "opentelemetry-api", "protobuf")
# from the pytriton wheel: the server, the Python backend, one stub, what they link
TRITON_KEEP = (
    "pytriton/__init__.py",
    "pytriton/tritonserver/bin/*",
    "pytriton/tritonserver/backends/*",
    f"pytriton/tritonserver/python_backend_stubs/{PYTHON}/*",
    "nvidia_pytriton.libs/*",
)
TRITON_DROP = ("nvidia_pytriton.libs/libpython3-*",)  # the 3.13 stub's: not linked by 3.12's
MODELS = ("identity", "simple", "particlenet_ak4")


def download(spec: str, into: Path) -> Path:
    platforms = [a for p in PLATFORMS for a in ("--platform", p)]
    pip = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:"]
    target = ["--python-version", PYTHON, "--implementation", "cp", *platforms]
    subprocess.run([*pip, *target, "-d", str(into), spec], check=True)
    name = spec.split("==")[0].replace("-", "_").lower()
    (wheel,) = [w for w in into.glob("*.whl") if w.name.lower().startswith(name + "-")]
    return wheel


def subset_tar(wheel: Path, out: Path, keep, drop=(), strip: str = "") -> None:
    """The wheel's files matching `keep` (not `drop`), `strip` removed from their paths, as
    an xz-compressed tar that keeps their modes (the binaries must stay executable)."""
    with zipfile.ZipFile(wheel) as z, tarfile.open(out, "w:xz") as tar:
        for info in z.infolist():
            name = info.filename
            if info.is_dir() or not any(fnmatch.fnmatch(name, k) for k in keep):
                continue
            if any(fnmatch.fnmatch(name, d) for d in drop):
                continue
            data = z.read(info)
            entry = tarfile.TarInfo(name.removeprefix(strip))
            entry.size, entry.mode = len(data), (info.external_attr >> 16) & 0o777 or 0o644
            tar.addfile(entry, io.BytesIO(data))


def triton_tars(out: Path, scratch: Path) -> None:
    """`triton.tar.xz` (TRITON_KEEP of the pytriton wheel) and `tritonclient.tar.xz` (the
    tritonclient package) in `out`, each with its wheel's METADATA (its version, which a
    result's meta reads); `scratch`: where the wheels are downloaded."""
    subset_tar(
        download(TRITON, scratch),
        out / "triton.tar.xz",
        (*TRITON_KEEP, "nvidia_pytriton-*.dist-info/METADATA"),
        TRITON_DROP,
    )
    purelib = "tritonclient-2.51.0.data/purelib/"
    subset_tar(
        download(TRITONCLIENT, scratch),
        out / "tritonclient.tar.xz",
        (purelib + "tritonclient/*", "tritonclient-*.dist-info/METADATA"),
        strip=purelib,
    )


def size_mib(folder: Path) -> float:
    """What a bundle's folder weighs (a call carries 64 MiB with the working tree)."""
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


def provenance() -> dict:
    """The commit the bundle was built from (the machine gets no .git), and whether the
    working tree differed from it."""
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True)
    return {"commit": commit.stdout.strip(), "uncommitted_changes": bool(dirty.stdout.strip())}


def main(out: Path) -> int:
    if out.exists():
        shutil.rmtree(out)
    (out / "whl").mkdir(parents=True)
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        triton_tars(out, scratch)
        for spec in WHEELS:
            shutil.copy(download(spec, scratch), out / "whl")
    built = ROOT / "build" / "models"
    for model in MODELS:
        shutil.copytree(built / model, out / "models" / model, symlinks=False)
        for name in ("model.pt", "model.pt2"):  # the check serves the ONNX files
            (out / "models" / model / "1" / name).unlink(missing_ok=True)
    shutil.copy(built / "manifest.json", out / "models")
    for name in ("check.py", "run.sh"):
        shutil.copy(HERE / name, out / name)
    (out / "provenance.json").write_text(json.dumps(provenance(), indent=1))
    print(f"{out}: {size_mib(out):.1f} MiB (the working tree travels beside it; 64 MiB in all)")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / ".dev"))

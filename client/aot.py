"""AOTInductor packages compiled from the exported programs (`model.pt2`), cached.

A compiled library is not byte-reproducible (compiler, flags, the machine's CPU), so it is
not part of the repository's manifest; it is compiled on first use or by `sonicsite models
build --aot`, and kept under the model's folder by what it was compiled from:
`<model>/1/aot/<key>/model.pt2`, the key made of the exported program's hash, the torch
version and the CPU (its model name and flags, since the generated code uses the CPU's
vector instructions). Another machine or another torch compiles its own; the same ones find
theirs. A compile writes into a scratch folder and renames it into place, so that two
workers compiling at once never load a half-written package.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from .backend_local import EXPORTED_FILE

AOT_FOLDER = "aot"
PACKAGE_FILE = "model.pt2"


@dataclass(frozen=True)
class AotPackage:
    path: Path
    key: str
    compiled: bool  # compiled by this call (False: found in the cache)
    seconds: float  # the compile's, 0 when found


CPUINFO = Path("/proc/cpuinfo")


def cpu_tag(cpuinfo: Path = CPUINFO) -> str:
    """The CPU as the generated code depends on it: machine, model name and flags (from
    `cpuinfo`). ValueError naming the file and why when it cannot be read: a key of the
    machine alone would hand a package compiled for another CPU's instructions to this one."""
    model, flags = "", ""
    try:
        text = Path(cpuinfo).read_text()
    except OSError as exc:
        raise ValueError(
            f"{cpuinfo} cannot be read ({exc.strerror or exc!r}): the CPU an AOTInductor "
            "package is compiled for is not known here; run the model with --compile jit"
        ) from None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and not model:
            model = value.strip()
        if key.strip() in ("flags", "Features") and not flags:
            flags = " ".join(sorted(value.split()))
    text = f"{platform.machine()}|{model}|{flags}"
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def package_key(exported: Path) -> str:
    """(exported program hash, torch version, CPU) as one folder name."""
    import torch

    digest = hashlib.sha256(exported.read_bytes()).hexdigest()[:16]
    version = torch.__version__.replace("+", "_")
    return f"{digest}-torch{version}-cpu{cpu_tag()}"


# What torch (2.13) warns of, about its own code, when it compiles an exported program
TORCH_OWN_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


def aot_package(model_dir: Path) -> AotPackage:
    """The AOTInductor package of `model_dir` (`<repository>/<model>/1`), compiled from its
    exported program unless the cache has it; ValueError says why there is none."""
    exported = Path(model_dir) / EXPORTED_FILE
    if not exported.is_file():
        raise ValueError(
            f"{exported} is missing; `sonicsite models build` writes it for the models built "
            "from PyTorch"
        )
    key = package_key(exported)
    folder = Path(model_dir) / AOT_FOLDER / key
    package = folder / PACKAGE_FILE
    if package.is_file():
        return AotPackage(package, key, False, 0.0)
    import torch

    started = time.monotonic()
    folder.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{key}-", dir=folder.parent))
    try:
        with warnings.catch_warnings():  # torch copying its own tree specs: nothing to act on
            warnings.filterwarnings("ignore", TORCH_OWN_WARNING, FutureWarning)
            program = torch.export.load(str(exported))
            package_path = str(scratch / PACKAGE_FILE)
            torch._inductor.aoti_compile_and_package(program, package_path=package_path)
        try:
            os.rename(scratch, folder)
        except OSError:  # another process put its package there first: use that one
            if not package.is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return AotPackage(package, key, True, time.monotonic() - started)


def stale_packages(model_dir: Path, keep: str) -> list[Path]:
    """Packages of `model_dir` other than `keep` (another torch, CPU or program)."""
    root = Path(model_dir) / AOT_FOLDER
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name != keep)

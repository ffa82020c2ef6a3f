"""The dependency rule (ARCHITECTURE.md), enforced on the source: which rooms each room may
import, and which third-party packages, so that a worker installs only the client, the
operator's image carries no web framework, and the control plane never reaches into the
launcher or the job streams (the local site hands the operator an actuator instead).
Imports inside functions count as much as those at the top of a module."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# room -> the folder that holds it (as pyproject.toml's package-dir maps it)
ROOMS = {
    "sonicsite.contract": ROOT / "sonicsite" / "contract",
    "sonicsite.client": ROOT / "client",
    "sonicsite.operator": ROOT / "operator",
    "sonicsite.gateway": ROOT / "gateway",
    "sonicsite.models": ROOT / "models",
    "sonicsite.local": ROOT / "sonicsite" / "local",
    "sonicsite.jobs": ROOT / "sonicsite" / "jobs",
    "sonicsite.bench": ROOT / "bench",
    "sonicsite.sim": ROOT / "sim",
    "sonicsite.cli": ROOT
    / "sonicsite",  # cli.py, cli_parser.py, cli_placement.py, cli_usage.py, __init__, __main__
}
# Rooms each room may import besides itself. Read it as the arrows of the architecture.
ALLOWED = {
    "sonicsite.contract": set(),
    "sonicsite.client": {"sonicsite.contract"},
    "sonicsite.operator": {"sonicsite.contract"},
    "sonicsite.gateway": {"sonicsite.contract", "sonicsite.client"},  # its tracing settings
    "sonicsite.models": {"sonicsite.contract", "sonicsite.client"},  # samples are SoA layouts
    "sonicsite.local": {"sonicsite.contract", "sonicsite.operator", "sonicsite.models"},
    "sonicsite.jobs": {
        "sonicsite.contract",
        "sonicsite.client",
        "sonicsite.models",
        "sonicsite.local",
    },
    # the simulator runs the operator's policies and the client's back-off at simulated time
    "sonicsite.sim": {"sonicsite.contract", "sonicsite.operator", "sonicsite.client"},
    "sonicsite.bench": set(ROOMS) - {"sonicsite.cli", "sonicsite.bench"},
    "sonicsite.cli": set(ROOMS) - {"sonicsite.cli"},
}
# Third-party packages each room may import (top-level names), as the extras install them.
THIRD_PARTY = {
    "sonicsite.contract": set(),
    # + interop (pyarrow, awkward); + tracing (opentelemetry: client/tracing.py); + torch,
    # optional, in client/torch_views.py alone (the in-process path; never imported by
    # sonicsite.client itself: test_torch_views.py checks that a worker without it imports)
    "sonicsite.client": {
        "numpy",
        "tritonclient",
        "google",  # protobuf's DecodeError: a reply tritonclient's messages cannot parse
        "hpack",
        "pyarrow",
        "awkward",
        "opentelemetry",
        "torch",
    },
    # + Envoy's ADS stream (xds_ads.py, xds_protos.py): grpcio, protobuf's `google` package
    "sonicsite.operator": {"prometheus_client", "kubernetes", "urllib3", "grpc", "google"},
    # + the one-server view over gRPC (grpc_view.py): Triton's messages, as the client has them
    "sonicsite.gateway": {
        "fastapi",
        "starlette",
        "uvicorn",
        "httptools",  # uvicorn's parser: server.py gives a fresh one after a spliced body
        "httpx2",
        "prometheus_client",
        "jwt",  # bearer JWTs (gateway/jwt_auth.py, gateway/jwks.py)
        "grpc",
        "google",
        "tritonclient",
        "opentelemetry",  # its own tracer (tracing.py)
    },
    "sonicsite.models": {
        "numpy",
        "torch",
        "onnx",
        "onnxruntime",
        "weaver",
        "tritonclient",  # Triton's model-config protobuf
        "google",  # protobuf's text format, with it
    },
    "sonicsite.local": {"envoy"},
    "sonicsite.jobs": {"numpy", "matplotlib"},
    "sonicsite.bench": {"numpy", "tritonclient", "matplotlib"},
    "sonicsite.sim": {"simpy", "yaml", "matplotlib"},
    "sonicsite.cli": set(),
}
# Files not imported by Python but loaded by Triton's Python backend stub.
TRITON_MODELS = {ROOT / "models" / "runner.py": {"triton_python_backend_utils"}}


def room_files(room: str) -> list[Path]:
    folder = ROOMS[room]
    if room == "sonicsite.cli":
        return sorted(folder.glob("*.py"))
    return sorted(folder.rglob("*.py"))


def module_name(room: str, path: Path) -> str:
    if room == "sonicsite.cli":
        return f"sonicsite.{path.stem}"
    parts = path.relative_to(ROOMS[room]).with_suffix("").parts
    return ".".join([room, *parts]).removesuffix(".__init__")


def imports(module: str, path: Path) -> set[str]:
    """Every module that `path`, the source of `module`, imports (relative imports
    resolved; for `from a import b`, both `a` and `a.b`)."""
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
                names = [f"{target}.{a.name}" for a in node.names] if not node.module else []
                found.update(names or [target])
            else:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


CLI_MODULES = (
    "sonicsite.cli",
    "sonicsite.cli_parser",
    "sonicsite.cli_placement",
    "sonicsite.cli_usage",
    "sonicsite.__main__",
    "sonicsite",
)


def room_of(module: str) -> str | None:
    for room in sorted(ROOMS, key=len, reverse=True):
        if room == "sonicsite.cli":
            if module in CLI_MODULES:
                return room
        elif module == room or module.startswith(room + "."):
            return room
    return None


def test_every_module_belongs_to_a_room():
    """The package root holds only the command line: every other module is in a room."""
    assert sorted(p.name for p in (ROOT / "sonicsite").glob("*.py")) == [
        "__init__.py",
        "__main__.py",
        "cli.py",
        "cli_parser.py",
        "cli_placement.py",
        "cli_usage.py",
    ]


@pytest.mark.parametrize("room", sorted(ROOMS))
def test_each_room_imports_only_what_the_rule_allows(room):
    wrong = []
    for path in room_files(room):
        for module in imports(module_name(room, path), path):
            top = module.split(".")[0]
            if top == "sonicsite":
                target = room_of(module)
                if target not in (room, None) and target not in ALLOWED[room]:
                    wrong.append(f"{path.relative_to(ROOT)} imports {module} ({target})")
                elif target is None and module != "sonicsite":
                    wrong.append(f"{path.relative_to(ROOT)} imports {module}: in no room")
            elif top not in sys.stdlib_module_names and top != "__future__":
                allowed = THIRD_PARTY[room] | TRITON_MODELS.get(path, set())
                if top not in allowed:
                    wrong.append(f"{path.relative_to(ROOT)} imports the package {top}")
    assert wrong == []


def test_the_check_sees_imports_inside_functions_and_relative_ones(tmp_path):
    """The check itself can fail: an operator module that reaches into the launcher from
    inside a function, or a client module that climbs out of its package, is found."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from .loadview import ModelLoad\n"
        "from ..local import launcher\n"
        "def actuate():\n    from sonicsite.jobs import driver\n    return driver\n"
    )
    found = imports("sonicsite.operator.probe", probe)
    assert "sonicsite.operator.loadview" in found
    assert {room_of(m) for m in found} == {
        "sonicsite.operator",
        "sonicsite.local",
        "sonicsite.jobs",
    }
    assert not {"sonicsite.local", "sonicsite.jobs"} & ALLOWED["sonicsite.operator"]


def test_the_environment_holds_constraints_versions():
    """make install takes constraints.txt's versions (Makefile): a fresh machine gets the set
    the suite and the device bundles were checked with. An upgrade made in .venv alone shows
    here, until `make constraints` records it."""
    import importlib.metadata

    differ = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line.startswith("#") or "==" not in line:
            continue
        name, version = line.split("==", 1)
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            differ[name] = (version, installed)
    assert not differ, f"constraints.txt vs the environment (pinned, installed): {differ}"

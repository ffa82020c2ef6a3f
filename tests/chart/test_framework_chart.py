"""The demo repository's framework: the init container builds the PyTorch backend's configs
when asked, onnxruntime's by default, and the schema refuses any other framework."""

from __future__ import annotations

import pytest
from chartcheck import objects, render


def _build_command(values: dict) -> list[str]:
    (triton,) = [
        d
        for d in objects(render(values))
        if d["kind"] == "Deployment"
        and d["metadata"]["labels"]["app.kubernetes.io/component"] == "triton"
    ]
    (init,) = triton["spec"]["template"]["spec"]["initContainers"]
    return init["command"]


def test_the_demo_repository_is_built_for_the_framework_asked():
    default = _build_command({})
    assert default[default.index("--framework") + 1] == "onnx"
    repos = [{"source": "demo", "framework": "pytorch"}]
    torch = _build_command({"triton": {"modelRepositories": repos}})
    assert torch[torch.index("--framework") + 1] == "pytorch"
    assert torch[:4] == ["sonicsite", "models", "build", "--configs"]


def test_an_unknown_framework_is_refused():
    repos = [{"source": "demo", "framework": "tensorrt"}]
    with pytest.raises(Exception, match="modelRepositories"):
        render({"triton": {"modelRepositories": repos}})

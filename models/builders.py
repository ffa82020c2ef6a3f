"""Deterministic builders of the repository's ONNX files (`sonicsite models build`).

Each builder writes `<out>/<model>/1/model.onnx`, and for the models built from PyTorch
the TorchScript and exported-program files beside it (torch_artifacts.py); the input and
output names and shapes come from the model's own config.pbtxt, so the config is the single
source of the contract. `manifest.json` records a sha256 per file: two builds give the same
bytes.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from .repository import ONNX_FILE, load_entry, model_names
from .torch_artifacts import write_torch_artifacts

SEED = 20241122
OPSET = 17

_ONNX_TYPES = {mc.TYPE_FP32: "FLOAT", mc.TYPE_INT32: "INT32", mc.TYPE_INT64: "INT64"}


def _io_names(config: mc.ModelConfig) -> tuple[list[str], list[str]]:
    return [i.name for i in config.input], [o.name for o in config.output]


def _onnx_helper_model(config: mc.ModelConfig, nodes: list) -> bytes:
    """A plain ONNX graph whose inputs and outputs are exactly the config's tensors."""
    import onnx
    from onnx import helper

    def value_info(t) -> onnx.ValueInfoProto:
        batch = ["N"] if config.max_batch_size > 0 else []
        dims = batch + [d if d >= 0 else f"{t.name}_d{i}" for i, d in enumerate(t.dims)]
        elem = getattr(onnx.TensorProto, _ONNX_TYPES[t.data_type])
        return helper.make_tensor_value_info(t.name, elem, dims)

    graph = helper.make_graph(
        nodes,
        config.name,
        [value_info(t) for t in config.input],
        [value_info(t) for t in config.output],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.producer_name = "sonicsite"
    onnx.checker.check_model(model)
    return model.SerializeToString()


def build_simple(config: mc.ModelConfig, path: Path) -> None:
    from onnx import helper

    nodes = [
        helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
        helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
    ]
    path.write_bytes(_onnx_helper_model(config, nodes))


def build_identity(config: mc.ModelConfig, path: Path) -> None:
    from onnx import helper

    path.write_bytes(
        _onnx_helper_model(config, [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])])
    )


def _export_torch(
    module,
    example: tuple,
    config: mc.ModelConfig,
    path: Path,
    dynamic: dict[str, dict[int, str]],
    for_torch: Callable[[object], None] | None = None,
) -> None:
    """ONNX, then TorchScript and the exported program; `for_torch` adapts the module for
    the torch artifacts after the ONNX export (where ONNX needed a workaround torch doesn't)."""
    import torch

    inputs, outputs = _io_names(config)
    module.eval()
    with torch.no_grad():
        torch.onnx.export(
            module,
            example,
            str(path),
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=dynamic,
            opset_version=OPSET,
            dynamo=False,
        )
    if for_torch is not None:
        for_torch(module)
    per_input = [dynamic.get(name, {}) for name in inputs]
    write_torch_artifacts(module, example, path.parent, per_input, config.max_batch_size)


def _example(config: mc.ModelConfig, batch: int) -> tuple:
    import torch

    gen = torch.Generator().manual_seed(SEED)
    return tuple(torch.rand((batch, *t.dims), generator=gen) for t in config.input)


def _batch_axes(config: mc.ModelConfig) -> dict[str, dict[int, str]]:
    return {n: {0: "N"} for n in [*_io_names(config)[0], *_io_names(config)[1]]}


def build_particlenet_ak4(config: mc.ModelConfig, path: Path) -> None:
    import torch
    from weaver.nn.model.ParticleNet import ParticleNetTagger

    dims = {t.name: list(t.dims) for t in config.input}
    torch.manual_seed(SEED)
    model = ParticleNetTagger(
        pf_features_dims=dims["pf_features"][0],
        sv_features_dims=dims["sv_features"][0],
        num_classes=config.output[0].dims[0],
        conv_params=[(16, (64, 64, 64)), (16, (128, 128, 128)), (16, (256, 256, 256))],
        fc_params=[(256, 0.1)],
        use_fusion=False,
        for_inference=True,
    )
    _export_torch(model, _example(config, 2), config, path, _batch_axes(config))


def _particle_transformer_module(config: mc.ModelConfig):
    """ParT with its exported signature (points, features, vectors, mask), as in its ONNX recipe."""
    import torch
    from weaver.nn.model.ParticleTransformer import ParticleTransformer

    dims = {t.name: list(t.dims) for t in config.input}

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            # trim=False: the eval-time trimmer would bake the traced length into the graph.
            self.mod = ParticleTransformer(
                input_dim=dims["pf_features"][0],
                num_classes=config.output[0].dims[0],
                pair_input_dim=4,
                embed_dims=[128, 512, 128],
                pair_embed_dims=[64, 64, 64],
                num_heads=8,
                num_layers=8,
                num_cls_layers=2,
                fc_params=[],
                trim=False,
                for_inference=True,
            )

        def forward(self, points, features, vectors, mask):
            # ParT reads no points; a zero-weighted use keeps `pf_points` a graph input so
            # the published signature and Triton's input checks hold.
            mask = mask + 0.0 * points[:, :1, :]
            # ONNX has no atan2: the exporter's decomposition gives NaN for the azimuth of
            # an all-zero (padded) 4-vector where torch gives 0, and the NaN reaches every
            # output through attention. Padded slots are masked out of attention, so any
            # finite vector serves there: a unit massless one.
            unit = torch.tensor([1.0, 0.0, 0.0, 1.0]).view(1, 4, 1)
            vectors = torch.where(mask > 0, vectors, unit)
            return self.mod(features, v=vectors, mask=mask)

    return Wrapper()


def build_particle_transformer(config: mc.ModelConfig, path: Path) -> None:
    import torch

    torch.manual_seed(SEED)
    model = _particle_transformer_module(config)
    example = list(_example(config, 2))
    example[3] = torch.ones_like(example[3])  # a full mask

    def for_torch(module) -> None:
        # weaver's ONNX-friendly tril_indices (ones().tril().nonzero()) has a data-dependent
        # size torch.export refuses; torch's own gives the same indices in the same order.
        module.mod.pair_embed.tril_indices_fn = torch.tril_indices

    _export_torch(model, tuple(example), config, path, _batch_axes(config), for_torch)


def build_deepmet(config: mc.ModelConfig, path: Path) -> None:
    import torch

    from .nets import DeepMET

    torch.manual_seed(SEED)
    x, *_ = _example(config, 2)
    cats = tuple(torch.zeros((2, t.dims[0], 1)) for t in config.input[1:])
    _export_torch(DeepMET(), (x, *cats), config, path, _batch_axes(config))


def build_gnn_linking(config: mc.ModelConfig, path: Path) -> None:
    import torch

    from .nets import EdgeScorer

    torch.manual_seed(SEED)
    nodes, edges = 6, 9
    gen = torch.Generator().manual_seed(SEED)
    example = (
        torch.rand((nodes, 8), generator=gen),
        torch.randint(0, nodes, (2, edges), generator=gen),
        torch.rand((edges, 4), generator=gen),
    )
    dynamic = {
        "node_features": {0: "nodes"},
        "edge_index": {1: "edges"},
        "edge_features": {0: "edges"},
        "edge_score": {0: "edges"},
    }
    _export_torch(EdgeScorer(), example, config, path, dynamic)


BUILDERS: dict[str, Callable[[mc.ModelConfig, Path], None]] = {
    "simple": build_simple,
    "identity": build_identity,
    "particlenet_ak4": build_particlenet_ak4,
    "deepmet": build_deepmet,
    "particle_transformer": build_particle_transformer,
    "gnn_linking": build_gnn_linking,
}


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# Built from PyTorch: each in a fresh interpreter, because TorchScript numbers the classes it
# makes (`___torch_mangle_N`) with a counter that only a new process starts again.
TORCH_BUILT = ("particlenet_ak4", "deepmet", "particle_transformer", "gnn_linking")


PARALLEL_BUILDS = 2  # fresh interpreters at once (each mostly imports torch, then traces)


def _build_in_fresh_processes(jobs: list[tuple[str, Path]]) -> None:
    """Build each (model, version folder) in its own interpreter, a few at a time."""
    pending, running, failed = list(jobs), [], []
    while pending or running:
        while pending and len(running) < PARALLEL_BUILDS:
            name, version_dir = pending.pop(0)
            command = [sys.executable, "-m", "sonicsite.models.builders", name, str(version_dir)]
            # cwd: not the repository root, whose sonicsite/ folder would shadow the package
            process = subprocess.Popen(
                command, cwd=version_dir, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
            )
            running.append((name, process))
        name, process = running.pop(0)
        _, stderr = process.communicate()
        if process.returncode:
            failed.append(f"building {name!r} failed:\n{stderr.decode()[-4000:]}")
    if failed:
        raise RuntimeError("\n".join(failed))


def build(out: Path, names: list[str] | None = None) -> dict[str, dict[str, str]]:
    """Build the named models (all by default) into `out` and update `out/manifest.json`,
    written last: its presence says the build finished."""
    names = names or model_names()
    unknown = [n for n in names if n not in BUILDERS]
    if unknown:
        raise ValueError(f"no builder for {unknown}; models with builders: {sorted(BUILDERS)}")
    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    # gone until the build is whole: make rebuilds from its absence, and a build killed
    # half-way left the old one saying a model was there whose files were already removed
    manifest_path.unlink(missing_ok=True)
    folders = {name: out / name / "1" for name in names}
    for version_dir in folders.values():
        version_dir.mkdir(parents=True, exist_ok=True)
        for stale in version_dir.iterdir():
            if stale.is_file():  # not aot/: compiled packages are keyed by what they came from
                stale.unlink()
    for name in names:
        if name not in TORCH_BUILT:
            BUILDERS[name](load_entry(name).config, folders[name] / ONNX_FILE)
    _build_in_fresh_processes([(n, folders[n].resolve()) for n in names if n in TORCH_BUILT])
    for name, version_dir in folders.items():
        files = sorted(f for f in version_dir.iterdir() if f.is_file())
        manifest[name] = {f.name: _sha256(f) for f in files}
    manifest_path.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return manifest


if __name__ == "__main__":  # one model, by _build_in_fresh_process: NAME VERSION_DIR
    BUILDERS[sys.argv[1]](load_entry(sys.argv[1]).config, Path(sys.argv[2]) / ONNX_FILE)

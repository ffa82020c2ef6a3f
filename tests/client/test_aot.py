"""compile="aot": a model's AOTInductor package, compiled from its exported program at the
first event (or by `sonicsite models build --aot`), cached by (program, torch, CPU), answers
as its TorchScript file does, for any batch size the exported program allows."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from sonicsite.bench.first_event import first_events
from sonicsite.client.aot import AOT_FOLDER, aot_package, package_key
from sonicsite.client.backend_local import LocalModels, LocalRunner
from sonicsite.models.samples import generate

from sonicsite import cli
from sonicsite.jobs.worker import config_info

MODEL = "deepmet"  # the smallest model built from PyTorch: the quickest to compile


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory, built_models: Path) -> Path:
    """A repository holding the model's PyTorch files only (its own AOT cache)."""
    root = tmp_path_factory.mktemp("aot")
    folder = root / MODEL / "1"
    folder.mkdir(parents=True)
    for name in ("model.pt", "model.pt2"):
        shutil.copy(built_models / MODEL / "1" / name, folder / name)
    return root


def _outputs(repository: Path, compile: str, events: int) -> tuple[dict, LocalRunner]:
    sample = generate(MODEL, events, seed=3)
    settings = LocalModels(repository, config_info)
    runner = LocalRunner(MODEL, settings, compile, lambda: config_info(MODEL))
    runner.run(sample.spec, sample.request(0, events))
    columns = [c for block in sample.spec.outputs for c in block.columns]
    return {c: np.array(sample.soa[c]) for c in columns}, runner


def test_the_aot_package_answers_as_the_torchscript_model_and_is_compiled_once(repository):
    jit, _ = _outputs(repository, "jit", 8)
    aot, first = _outputs(repository, "aot", 8)
    assert first._loaded.compile_s > 0  # compiled at the first event
    key = package_key(repository / MODEL / "1" / "model.pt2")
    assert (repository / MODEL / "1" / AOT_FOLDER / key / "model.pt2").is_file()
    for name, want in jit.items():
        assert np.all(np.isfinite(aot[name])), name
        np.testing.assert_allclose(aot[name], want, rtol=1e-4, atol=1e-4, err_msg=name)
    again, second = _outputs(repository, "aot", 3)  # another batch size: the same package
    assert second._loaded.compile_s == 0.0  # found in the cache
    for name, want in _outputs(repository, "jit", 3)[0].items():
        np.testing.assert_allclose(again[name], want, rtol=1e-4, atol=1e-4, err_msg=name)
    package = aot_package(repository / MODEL / "1")
    assert (package.compiled, package.key) == (False, key)


def test_models_build_aot_reports_the_cached_package(repository, capsys):
    """`models build --aot` on a repository whose package is compiled says so (the build
    itself is tested in tests/models; here --only keeps it to one quick model)."""
    aot_package(repository / MODEL / "1")
    key = package_key(repository / MODEL / "1" / "model.pt2")
    assert cli.main(["models", "build", "--out", str(repository), "--only", MODEL, "--aot"]) == 0
    # the rebuilt exported program has the same bytes, so the same key: found, not compiled
    assert f"{MODEL}/1/aot/{key}/model.pt2  cached" in capsys.readouterr().out


def test_aot_is_refused_for_a_gpu_with_the_reason(repository):
    with pytest.raises(ValueError, match="compiled for the CPU here"):
        LocalModels(repository, config_info, device="cuda:0").artifact(MODEL, "aot")


def test_the_first_event_bench_times_both_in_fresh_interpreters(repository):
    """bench inprocess's `aot_first_event_speedup_vs_jit`: the same figures for JIT and AOT
    (the package compiled beforehand, found in the cache here), the speedup their ratio."""
    found = first_events(repository, (MODEL,), repeats=1)[MODEL]
    for compile in ("jit", "aot"):
        assert found[compile]["first_event_s"]["median"] > 0
        assert (
            0
            < found[compile]["steady_per_event_s"]["median"]
            < found[compile]["first_event_s"]["median"]
        )
    jit, aot = (found[c]["first_event_s"]["median"] for c in ("jit", "aot"))
    assert found["aot_first_event_speedup_vs_jit"] == round(jit / aot, 3)
    assert found["aot_compile_s"] == "cached"
    print(f"\n{MODEL} first event: jit {jit * 1e3:.0f} ms, aot {aot * 1e3:.0f} ms")

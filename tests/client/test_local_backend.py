"""The in-process runner answers as the site does: a PyTorch-built model's TorchScript
artifact on SoA views against the same model served by a local Triton server."""

from __future__ import annotations

import numpy as np
import torch
from sonicsite.client import Client
from sonicsite.client.discovery import from_site_file
from sonicsite.client.local_backend import LocalModel
from sonicsite.models.samples import generate
from sonicsite.models.torch_artifacts import TORCHSCRIPT_FILE


def test_deepmet_in_process_equals_the_servers(site, built_models):
    events = 6
    with Client(from_site_file(site.site_dir), "grpc", "direct") as client:
        info = client.balancer("deepmet").endpoints[0].transport.model_info("deepmet")
        served = generate("deepmet", events, seed=3)
        result = client.stream("deepmet", served.spec, batch=3).run(served, lambda *_: None)
    assert result.failed == {} and result.events_ok == events
    local = generate("deepmet", events, seed=3)
    model = LocalModel(built_models / "deepmet" / "1" / TORCHSCRIPT_FILE, info)
    assert model.module is None  # nothing loaded before the first call
    calls = [model.infer(local.spec, local.request(lo, lo + 3)) for lo in (0, 3)]
    assert torch.get_num_threads() == 1
    assert [(c.input_copies, c.output_copies) for c in calls] == [(0, 1), (0, 1)]
    assert np.all(np.isfinite(local.soa["met_xy"]))
    np.testing.assert_allclose(local.soa["met_xy"], served.soa["met_xy"], rtol=1e-4, atol=1e-3)
    local.check(0, events, {})

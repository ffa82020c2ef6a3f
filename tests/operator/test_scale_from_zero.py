"""Scale from zero on a real local site (bench/from_zero.py): the pool scales down to zero
servers with no request, the supervisor leaves it there, and a job stream that arrives then
is held, wakes the autoscaler (activation on held requests), gets a server with no model,
then its model loaded by placement, and every event is answered."""

from __future__ import annotations

import pytest
from sonicsite.bench import from_zero
from sonicsite.operator import main as operator_main
from sonicsite.operator.autoscaler import ScalingPolicy

from sonicsite.local import launcher
from sonicsite.local.errors import SiteError


def test_a_stream_arriving_at_a_pool_at_zero_gets_every_event_answered(
    tmp_path, built_models, capsys
):
    result = from_zero.measure(tmp_path, from_zero.FromZero(events=128, build_dir=built_models))
    assert result["events_lost"] == 0 and result["events_ok"] == 128, result["errors"]
    assert result["server_records_at_zero"] == []
    events = result["scale_events"]
    down = [e for e in events if (e["from"], e["to"]) == (1, 0)]
    up = [e for e in events if (e["from"], e["to"]) == (0, 1)]
    assert down and down[0]["outcome"] == "done", events
    assert up and up[-1]["outcome"] == "done" and up[-1]["reason"].endswith("request(s) held")
    loads = [d for d in result["decisions"] if d["kind"] == "load"]
    assert [(d["model"], d["rule"]) for d in loads] == [("particlenet_ak4", "first_replica")]
    assert loads[0]["outcome"].startswith("loaded"), loads
    cold, start, load = (
        result[k] for k in ("cold_start_from_zero_s", "server_start_s", "model_load_s")
    )
    assert cold >= start + load > 0, result  # the server starts, then the model loads
    with capsys.disabled():
        print(f"\ncold start from zero {cold:.2f} s: server start {start:.2f} s, load {load:.2f} s")


def test_min_zero_without_placement_is_refused_with_the_reason(tmp_path, capsys):
    with pytest.raises(SiteError, match="scaling: MIN 0 needs placing"):
        launcher.up(tmp_path / "site", servers=1, scaling=ScalingPolicy(0, 2))
    options = operator_main.parser()
    args = ["--port=1", "--envoy-listen=127.0.0.1:2", "--site=s", "--autoscale=0:2"]
    with pytest.raises(SystemExit):
        operator_main.build(options.parse_args(args), options)
    assert "--autoscale 0:2: MIN 0 needs --placement" in capsys.readouterr().err

"""Options that mean something only with another one are refused without it, naming both
(argparse's error: exit status 2), instead of being ignored; so are options that cannot go
together; values out of range are named at parse time."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sonicsite import cli_placement
from sonicsite.cli_parser import parse_args

SONICSITE = [sys.executable, "-P", "-m", "sonicsite.cli"]


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["up", "--keep-warm"], "argument --keep-warm: needs --placement"),
        (["up", "--idle-unload-s", "300"], "argument --idle-unload-s: needs --placement"),
        (["up", "--budget-models", "2"], "argument --budget-models: needs --placement"),
        (["up", "--hold-deadline-s", "30"], "argument --hold-deadline-s: needs --placement"),
        (["up", "--pool", "big=1"], "argument --pool: needs --placement"),
        (["up", "--tracing-export", "http://x:1"], "argument --tracing-export: needs --tracing"),
        (["up", "--tracing-envoy-sampling", "100"], "--tracing-envoy-sampling: needs --tracing"),
        (["up", "--tracing-triton-rate", "2"], "argument --tracing-triton-rate: needs --tracing"),
        (
            ["submit", "--model", "simple", "--compile", "jit"],
            "argument --compile: needs --backend local or auto",
        ),
        (
            ["submit", "--model", "simple", "--models-dir", "build/models"],
            "argument --models-dir: needs --backend local or auto",
        ),
        (
            ["submit", "--model", "simple", "--resume", "--fresh"],
            "argument --fresh: not allowed with argument --resume",
        ),
        (
            ["submit", "--model", "simple", "--seed", "-1"],
            "argument --seed: expected an integer ≥ 0",
        ),
        (["demo", "--seed", "-3"], "argument --seed: expected an integer ≥ 0, got -3"),
        (  # each worker failed "use mode='direct'" and every event was counted failed
            ["submit", "--model", "simple", "--transport", "shm", "--mode", "site"],
            "argument --transport shm: needs --mode direct",
        ),
        (
            ["demo", "--transport", "cuda", "--mode", "site"],
            "--transport cuda: needs --mode direct",
        ),
        (  # Path("") is the current folder: the stream's journals went there
            ["submit", "--model", "simple", "--out", ""],
            "argument --out: an empty name would put the stream's journals",
        ),
        (
            ["up", "--tokens", "/nonexistent/tokens"],
            "argument --tokens: /nonexistent/tokens: cannot",
        ),
    ],
)
def test_an_option_without_its_parent_or_out_of_range_is_named(capsys, args, said):
    with pytest.raises(SystemExit) as exited:
        parse_args(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err, err
    assert f"usage: sonicsite {args[0]}" in err  # the command's own usage


def test_an_empty_tokens_file_is_refused(tmp_path, capsys):
    empty = tmp_path / "tokens"
    empty.write_text("\n  \n")
    with pytest.raises(SystemExit):
        parse_args(["up", "--tokens", str(empty)])
    assert "no token in it (one per line); it would refuse every request" in capsys.readouterr().err


def test_the_options_with_their_parent_are_taken():
    up = parse_args(["up", "--placement", "--keep-warm", "--pool", "big=1", "--pool", "rest=1"])
    assert cli_placement.placement_settings(up).keep_warm
    assert cli_placement.placement_settings(up).idle_unload_s == cli_placement.IDLE_UNLOAD_S
    traced = parse_args(["up", "--tracing", "--tracing-triton-rate", "5"])
    config = cli_placement.tracing_config(traced)
    assert (config.triton_rate, config.envoy_sampling, config.export) == (5, 100.0, "")
    local = parse_args(["submit", "--model", "simple", "--backend", "local", "--compile", "aot"])
    assert local.compile == "aot"
    assert parse_args(["submit", "--model", "simple", "--seed", "0"]).seed == 0


def test_up_names_a_hold_on_a_server_it_does_not_have_by_its_option(tmp_path):
    site_dir = tmp_path / "site"
    up = ["up", "--dir", str(site_dir), "--servers", "1", "--models", "simple"]
    out = subprocess.run(
        [*SONICSITE, *up, "--hold", "simple=triton-5"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 1, out.stdout + out.stderr
    said = "sonicsite up: --hold simple=triton-5: 'simple' on ['triton-5']: the site's servers"
    assert said in out.stderr and "(--servers)" in out.stderr, out.stderr
    assert not (site_dir / "state.json").exists()  # nothing was started

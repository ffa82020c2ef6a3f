"""Options that mean something only with another one are refused without it, naming both
(argparse's error: exit status 2), instead of being ignored; so are options that cannot go
together; values out of range are named at parse time."""

from __future__ import annotations

import subprocess
import sys

import pytest

from sonicsite import cli_placement
from sonicsite.cli import main
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
        (  # each was TracingConfig's own error after the parse: exit 1, no option named
            ["up", "--tracing", "--tracing-envoy-sampling", "500"],
            "argument --tracing-envoy-sampling: tracing envoy_sampling: expected 0 to 100",
        ),
        (
            ["up", "--tracing", "--tracing-gateway-sampling", "2"],
            "argument --tracing-gateway-sampling: tracing gateway_sampling: expected 0 to 1",
        ),
        (
            ["up", "--tracing", "--tracing-export", "localhost:4318"],
            "argument --tracing-export: tracing export: expected http(s)://host[:port]",
        ),
        (  # an empty host and a port past 65535 were taken
            ["up", "--tracing", "--tracing-export", "http://:99999"],
            "argument --tracing-export: tracing export: expected http(s)://host[:port]",
        ),
        (  # the last --hold of a model won, silently
            ["up", "--hold", "deepmet=triton-0", "--hold", "deepmet=triton-1"],
            "argument --hold: deepmet is given 2 times (triton-0; triton-1); name all its "
            "servers in one: --hold deepmet=triton-0,triton-1",
        ),
        (["up", "--hold", "deepmet=triton-0,triton-0"], "triton-0 named twice"),
        (  # it started, and `models status` showed deepmet on "triton-0,triton-0"
            ["up", "--models", "deepmet,deepmet"],
            "argument --models: 'deepmet,deepmet': deepmet named twice",
        ),
        (["up", "--placement", "--pool", "big=1:deepmet,deepmet"], "deepmet named twice"),
        (  # the current folder became the site's: state.json, keys and logs strewn in it
            ["up", "--dir", ""],
            "argument --dir: an empty name would make the current folder the site's",
        ),
        (  # it wrote the models and manifest.json into the current folder
            ["models", "build", "--only", "simple", "--out", ""],
            "argument --out: an empty name would write the models",
        ),
        (  # a traceback ending in NotADirectoryError
            ["models", "build", "--only", "simple", "--out", "/dev/null/models"],
            "argument --out: /dev/null/models: /dev/null is a file, not a folder",
        ),
        (  # "[Errno 20] Not a directory"
            ["up", "--dir", "/dev/null/site"],
            "argument --dir: /dev/null/site: /dev/null is a file, not a folder",
        ),
        (["check", "--grpc", "http://127.0.0.1:8001", "--models", "simple"], "no scheme or path"),
        (["simulate", "small", "--seed", "-1"], "argument --seed: expected an integer ≥ 0"),
        (["up", "--autoscale", "3:1"], "argument --autoscale: '3:1': min_servers: expected"),
        (["up", "--autoscale", "1:0"], "argument --autoscale: '1:0': min_servers: expected"),
        (["up", "--autoscale", "3"], "argument --autoscale: expected MIN:MAX servers"),
        (["up", "--autoscale", "0:2"], "argument --autoscale: MIN 0 needs --placement"),
        (  # it exited 0 having written no config: --framework picks the configs' backend
            ["models", "build", "--only", "simple", "--framework", "pytorch"],
            "argument --framework: needs --configs",
        ),
    ],
)
def test_an_option_without_its_parent_or_out_of_range_is_named(capsys, args, said):
    with pytest.raises(SystemExit) as exited:
        parse_args(args)
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert said in err, err
    assert f"usage: sonicsite {' '.join(args[:2] if args[0] == 'models' else args[:1])}" in err


def test_an_empty_tokens_file_is_refused(tmp_path, capsys):
    empty = tmp_path / "tokens"
    empty.write_text("\n  \n")
    with pytest.raises(SystemExit):
        parse_args(["up", "--tokens", str(empty)])
    assert "no token in it (one per line); it would refuse every request" in capsys.readouterr().err


def test_a_tokens_file_others_may_read_is_refused(tmp_path, capsys):
    """As the site's keys: tokens that others can read protect nothing."""
    tokens = tmp_path / "tokens"
    tokens.write_text("a-token-of-the-site\n")
    tokens.chmod(0o644)
    with pytest.raises(SystemExit):
        parse_args(["up", "--tokens", str(tokens)])
    assert f"{tokens}: readable or writable by others (mode 644); expected 600" in (
        capsys.readouterr().err
    )
    tokens.chmod(0o600)
    assert parse_args(["up", "--tokens", str(tokens)]).tokens == tokens


def test_the_options_with_their_parent_are_taken():
    up = parse_args(["up", "--placement", "--keep-warm", "--pool", "big=1", "--pool", "rest=1"])
    assert cli_placement.placement_settings(up).keep_warm
    assert cli_placement.placement_settings(up).idle_unload_s == cli_placement.IDLE_UNLOAD_S
    traced = parse_args(["up", "--tracing", "--tracing-triton-rate", "5"])
    config = cli_placement.tracing_config(traced)
    assert (config.triton_rate, config.envoy_sampling, config.export) == (5, 100.0, "")
    scaled = parse_args(["up", "--autoscale", "1:3"]).autoscale
    assert (scaled.min_servers, scaled.max_servers) == (1, 3)
    assert parse_args(["up", "--placement", "--autoscale", "0:2"]).autoscale.min_servers == 0
    assert parse_args(["up"]).autoscale is None  # off unless asked
    built = parse_args(["models", "build", "--configs", "--framework", "pytorch"])
    assert built.framework == "pytorch"
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


@pytest.mark.parametrize(
    "command",
    [["up"], ["status"], ["down"], ["models", "status"], ["submit", "--model", "simple"]],
)
def test_a_dir_that_is_a_file_is_named_as_one(tmp_path, capsys, command):
    """`up --dir afile` said "[Errno 17] File exists", `status --dir afile` that
    afile/state.json does not exist: a file given for the site's folder is said to be one."""
    afile = tmp_path / "afile"
    afile.write_text("")
    with pytest.raises(SystemExit) as exited:
        parse_args([*command, "--dir", str(afile)])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert f"argument --dir: {afile}: is a file, not a folder" in err, err


def _help(*command: str) -> str:
    out = subprocess.run(
        [*SONICSITE, *command, "--help"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return " ".join(out.stdout.split())  # argparse wraps lines


@pytest.mark.parametrize(
    ("command", "said"),
    [
        (["up"], ["(default .sonicsite)", "(default 2)", "(default build/models)", "(default 1)"]),
        (["submit"], ["(default 4)", "(default 2)", "(default 100)", "default 3)"]),
        (["demo"], ["(default 8)", "(default 4)", "(default 300)"]),
        (["check"], ["events per model (default 4)"]),
        (["models", "build"], ["the folder the models are written to", "(default build/models)"]),
        (["models", "status"], ["with placement off, each model's servers"]),
    ],
)
def test_help_shows_the_defaults(command, said):
    shown = _help(*command)
    assert not [s for s in said if s not in shown], shown


@pytest.mark.parametrize(
    ("command", "codes"),
    [
        (["up"], ["0 the site is up", "3 it is up but something is down", "2 a usage error"]),
        (["submit"], ["0 every event was answered exactly once", "130 or 143"]),
        (["demo"], ["or the site could not be started"]),
        (["check"], ["1 a model failed", "2 a usage error"]),
        (["models", "status"], ["2 the operator answered /v1/placement with an error", "3 "]),
    ],
)
def test_help_says_the_exit_statuses(command, codes):
    shown = _help(*command)
    assert "exit status: 0 " in shown and not [c for c in codes if c not in shown], shown


def test_mode_help_says_http_goes_through_the_gateway():
    shown = _help("submit")
    assert "Envoy for --transport grpc" in shown and "the gateway for http" in shown, shown


def test_simulate_list_with_a_scenario_is_refused_not_ignored(capsys):
    """`simulate nosuch --list` listed the scenarios and exited 0, the name unread."""
    assert main(["simulate", "nosuch", "--list"]) == 2
    said = capsys.readouterr().err
    assert "--list only lists the shipped scenarios; it runs nothing, so SCENARIO" in said, said


def test_supervise_without_a_site_says_there_is_none(tmp_path, capsys):
    """It said "[Errno 2] No such file or directory: '.../up.lock'" (and made that file)."""
    assert main(["supervise", "--dir", str(tmp_path / "nosite")]) == 1
    said = capsys.readouterr().err
    assert said.startswith(f"sonicsite supervise: no site at {tmp_path / 'nosite'}"), said
    assert not (tmp_path / "nosite").exists()


def test_up_in_a_folder_it_cannot_make_says_so(capsys):
    """It said "[Errno 1] Operation not permitted: '/proc/...'"."""
    site = "/proc/sonicsite-no-such-site"  # even root cannot make a folder there
    assert main(["up", "--dir", site]) == 1
    said = capsys.readouterr().err
    assert said.startswith(f"sonicsite up: {site}: cannot make the site's folder there: "), said
    assert "Errno" not in said

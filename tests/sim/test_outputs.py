"""Where `sonicsite simulate` writes, and what its JSON says of where the scenario came from:
a --json or plot path that holds a FIFO (or a device, a socket) is refused before any run,
and left as it was (the result was written beside it and renamed over it, replacing it); a
symlink is written through, at its target, the link kept; --json the scenario file itself
is refused; `meta.scenario` names the file as given and resolved, with the sha256 of its
bytes (and a shipped scenario's name); a file in the working folder named like a shipped
scenario is said not to be the one run, and `./NAME` runs it."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
import yaml
from sonicsite.sim import scenario
from sonicsite.sim.output import OutputError, write_whole

from sonicsite.cli import main


def _light(path: Path, name: str = "light") -> Path:
    """`small` with 12 light jobs (a run of a second): a scenario file of its own."""
    data = yaml.safe_load((scenario.SHIPPED / "small.yaml").read_text())
    data["name"] = name
    data["workload"]["events_per_job"] = 400
    data["workload"]["workflows"] = [{"start_s": 0, "jobs": 12, "wave_size": 12, "wave_every_s": 0}]
    path.write_text(yaml.safe_dump(data))
    return path


def _is_fifo(path: Path) -> bool:
    return stat.S_ISFIFO(os.lstat(path).st_mode)


def test_a_fifo_as_json_is_refused_before_any_run_and_left_a_fifo(tmp_path, capsys):
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    code = main(["simulate", str(_light(tmp_path / "s.yaml")), "--json", str(fifo)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"sonicsite simulate: --json {fifo}: cannot write: it is a FIFO" in err, err
    assert _is_fifo(fifo)
    assert not list(tmp_path.glob(".out.json.*"))  # no partial file beside it


@pytest.mark.timeout(60)  # a plot saved into the FIFO would wait for a reader for ever
def test_a_fifo_where_a_plot_goes_is_refused_before_any_run(tmp_path, capsys):
    plots = tmp_path / "plots"
    plots.mkdir()
    os.mkfifo(plots / "light-fixed_pool.png")
    out = tmp_path / "out.json"
    args = ["simulate", str(_light(tmp_path / "s.yaml")), "--json", str(out)]
    code = main([*args, "--plot", str(plots)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--plot {plots}: cannot write: light-fixed_pool.png: it is a FIFO" in err, err
    assert _is_fifo(plots / "light-fixed_pool.png") and not out.exists()


def test_a_plot_folder_that_is_a_file_is_said_to_be_one(tmp_path, capsys):
    """It said "cannot write: light-fixed_pool.png: File exists", of a file it never named."""
    plots = tmp_path / "s.json"
    plots.write_text("a file")
    out = tmp_path / "out.json"
    args = ["simulate", str(_light(tmp_path / "s.yaml")), "--json", str(out)]
    code = main([*args, "--plot", str(plots)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"sonicsite simulate: --plot {plots}: is a file, not a folder" in err, err
    assert plots.read_text() == "a file" and not out.exists()


def test_a_symlink_is_written_through_and_kept(tmp_path, capsys):
    """The result lands at the link's target (a regular file replaced whole, its mode kept);
    the link stays a link (it was replaced by a plain file). The plots likewise."""
    real, link = tmp_path / "real.json", tmp_path / "link.json"
    real.write_text("old")
    real.chmod(0o640)
    link.symlink_to(real)
    plots, real_png = tmp_path / "plots", tmp_path / "elsewhere.png"
    plots.mkdir()
    (plots / "light-fixed_pool.png").symlink_to(real_png)  # a dangling link: made at its target
    args = ["simulate", str(_light(tmp_path / "s.yaml")), "--json", str(link)]
    assert main([*args, "--workers", "1", "--plot", str(plots)]) == 0, capsys.readouterr().err
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert json.loads(real.read_text())["simulation"] == "light"
    assert stat.S_IMODE(real.stat().st_mode) == 0o640
    assert (plots / "light-fixed_pool.png").is_symlink() and real_png.stat().st_size > 1000


def test_write_whole_refuses_a_fifo_and_writes_at_a_links_target(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(OutputError, match="it is a FIFO"):
        write_whole(fifo, "x")
    link = tmp_path / "to-fifo"
    link.symlink_to(fifo)
    with pytest.raises(OutputError, match=r"it is a FIFO \(named pipe\) \(the symlink's target"):
        write_whole(link, "x")
    assert _is_fifo(fifo) and link.is_symlink()
    target = tmp_path / "sub" / "file.json"
    (tmp_path / "link.json").symlink_to(target)
    assert write_whole(tmp_path / "link.json", b"{}") == target
    assert target.read_bytes() == b"{}"


def test_json_the_scenario_file_itself_is_refused(tmp_path, capsys):
    source = _light(tmp_path / "s.yaml")
    before = source.read_bytes()
    (tmp_path / "alias.json").symlink_to(source)
    for given in (source, tmp_path / "alias.json"):
        assert main(["simulate", str(source), "--json", str(given)]) == 2
        err = capsys.readouterr().err
        assert f"--json {given}: the scenario file itself" in err, err
    assert source.read_bytes() == before


def test_meta_says_where_the_scenario_came_from(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = _light(tmp_path / "s.yaml")
    out = tmp_path / "out.json"
    assert main(["simulate", "s.yaml", "--json", str(out), "--workers", "1"]) == 0
    said = json.loads(out.read_text())["meta"]["scenario"]
    assert said == {
        "given": "s.yaml",
        "resolved": str(source.resolve()),
        "sha256": hashlib.sha256(source.read_bytes()).hexdigest(),
        "shipped": None,
    }
    loaded, shipped = scenario.read("small")
    small = scenario.SHIPPED / "small.yaml"
    assert loaded.name == "small" and shipped["shipped"] == "small"
    assert shipped["resolved"] == str(small.resolve())
    assert shipped["sha256"] == hashlib.sha256(small.read_bytes()).hexdigest()


def test_a_local_file_named_like_a_shipped_scenario_is_said_not_used(tmp_path, capsys, monkeypatch):
    """`small` is the shipped scenario, and the command says that ./small is not the one run;
    `./small` names the file."""
    monkeypatch.chdir(tmp_path)
    _light(tmp_path / "small", name="mine")
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)  # refused after the scenario is read: no run
    assert main(["simulate", "small", "--json", str(fifo)]) == 2
    err = capsys.readouterr().err
    shipped = (scenario.SHIPPED / "small.yaml").resolve()
    assert f"small: the shipped scenario ({shipped}), not the file {tmp_path / 'small'}" in err
    assert "give ./small" in err
    assert scenario.read("small")[1]["not_used"] == str(tmp_path / "small")
    mine, source = scenario.read("./small")
    assert mine.name == "mine" and source["shipped"] is None and "not_used" not in source


def test_a_write_protected_result_is_refused_before_any_run_and_kept(tmp_path, capsys):
    """A result made read-only (chmod a-w) to keep it is not replaced, not even by root,
    whose writes ignore the mode bits: the rename beside it would replace it whatever they say."""
    kept = tmp_path / "kept.json"
    kept.write_text("the earlier result")
    kept.chmod(0o444)
    code = main(["simulate", str(_light(tmp_path / "s.yaml")), "--json", str(kept)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"--json {kept}: cannot write: it is write-protected" in err, err
    assert kept.read_text() == "the earlier result"
    with pytest.raises(OutputError, match="write-protected"):
        write_whole(kept, "x")
    assert kept.read_text() == "the earlier result"

"""The site's folder (sonicsite/local/site_dir.py): the supervisor runs the commands recorded
in it and `up` replaces its `repository/`, so a folder another user owns or may write is
refused before anything starts, a new one is private, and a `repository/` sonicsite did not
write is kept and named, not deleted (`up` deleted whatever was there)."""

from __future__ import annotations

import os
import stat

import pytest

from sonicsite.local import launcher
from sonicsite.local.errors import SiteError
from sonicsite.local.site_dir import MARK, check_private, make_private


def test_a_new_site_folder_is_private(tmp_path):
    make_private(tmp_path / "new" / "site")
    assert stat.S_IMODE((tmp_path / "new" / "site").stat().st_mode) == 0o700


def test_a_folder_others_may_write_is_refused_before_anything_starts(tmp_path, built_models):
    site_dir = tmp_path / "shared"
    site_dir.mkdir()
    site_dir.chmod(0o777)
    with pytest.raises(SiteError, match=r"writable by group or others \(mode 0777\)"):
        launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models)
    assert list(site_dir.iterdir()) == []  # nothing written, nothing started


def test_a_folder_of_another_user_is_refused(tmp_path):
    site_dir = tmp_path / "theirs"
    site_dir.mkdir(mode=0o755)
    other = os.geteuid() + 1
    said = rf"owned by uid {os.geteuid()}, not by you \(uid {other}\)"
    with pytest.raises(SiteError, match=said):
        check_private(site_dir, me=other)
    check_private(site_dir)  # this user's, not writable by others: kept


def test_a_repository_sonicsite_did_not_write_is_kept_and_named(tmp_path, built_models):
    site_dir = tmp_path / "project"
    mine = site_dir / "repository" / "notes.txt"
    mine.parent.mkdir(parents=True)
    mine.write_text("a physicist's own files")
    with pytest.raises(SiteError, match=r"repository: there already, and not a repository"):
        launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models)
    assert mine.read_text() == "a physicist's own files"
    assert not (site_dir / "state.json").exists()


def test_a_repository_up_wrote_is_replaced_by_the_next_up(tmp_path, built_models):
    site_dir = tmp_path / "site"
    launcher.up(site_dir, servers=1, models=["simple"], build_dir=built_models, supervise=False)
    launcher.down(site_dir)
    assert (site_dir / "repository" / MARK).is_file()
    (site_dir / "state.json").unlink(missing_ok=True)  # the mark alone says it is ours
    launcher.up(site_dir, servers=1, models=["identity"], build_dir=built_models, supervise=False)
    try:
        models = sorted(p.name for p in (site_dir / "repository").iterdir() if p.is_dir())
        assert models == ["identity"]
    finally:
        launcher.down(site_dir)

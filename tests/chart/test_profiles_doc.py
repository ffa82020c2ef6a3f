"""The chart README shows one example per site profile, generated from ci/*.yaml (`make
chart-docs`), so that no profile `make chart-check` proves goes unshown or shown stale."""

from __future__ import annotations

import pytest
from chartcheck import CHART, profiles
from profiles_doc import BEGIN, END, purpose, section, with_profiles

README = (CHART / "README.md").read_text()


def test_the_readmes_profiles_are_generated_from_the_profiles():
    begin, end = README.index(BEGIN), README.index(END) + len(END)
    assert README[begin:end] == section(CHART)


@pytest.mark.parametrize("name", sorted(set(profiles()) - {"default"}))
def test_every_profile_has_its_example_and_its_purpose(name):
    path = CHART / "ci" / f"{name}.yaml"
    install = f"-f charts/sonicsite/ci/{path.name}"
    assert README.count(install) == 1, name
    assert purpose(path.read_text()) in README and purpose(path.read_text())
    assert path.read_text().rstrip("\n") in README  # the file itself, unabridged


def test_a_readme_without_the_markers_is_refused(tmp_path):
    with pytest.raises(ValueError, match="expected the markers"):
        with_profiles("# a chart\n", CHART)

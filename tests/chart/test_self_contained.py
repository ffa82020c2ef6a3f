"""The chart folder is the whole chart: copied anywhere as it is (links kept as links, as `cp
-r`, `helm package` or a chart repository's checkout keep them), it renders the same rules
and dashboards; and each rule file and dashboard has one copy in the repository, which
monitoring/ (promtool's tests, the dashboards' builder, the local site's Prometheus) reads."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path

from chartcheck import CHART, objects, render

ROOT = CHART.parents[1]
EVERY_FILE = {
    "monitoring": {"prometheus": {"enabled": True}, "prometheusOperator": {"enabled": True}}
}
EVERY_FILE |= {"networkPolicy": {"metricsFrom": [{"namespaceSelector": {}}]}}


def _kept(docs: list[dict]) -> list[dict]:
    return [d for d in docs if d["kind"] != "Secret"]


def test_a_copy_of_the_chart_folder_renders_as_the_chart(tmp_path):
    copy = tmp_path / "elsewhere" / CHART.name
    shutil.copytree(CHART, copy, symlinks=True)  # dereferencing nothing
    outside = [
        p
        for p in copy.rglob("*")
        if p.is_symlink() and not p.resolve().is_relative_to(copy.resolve())
    ]
    assert outside == [], "the chart links to files outside its folder"
    docs = objects(render(EVERY_FILE, chart=copy))
    # the same objects as the chart in place (but the keys the chart makes at random)
    assert _kept(docs) == _kept(objects(render(EVERY_FILE)))
    (rules,) = [d for d in docs if d["kind"] == "PrometheusRule"]
    assert rules["spec"]["groups"]
    dashboards = [
        d for d in docs if d["kind"] == "ConfigMap" and "dashboard" in d["metadata"]["name"]
    ]
    assert len(dashboards) == len(list((copy / "files" / "dashboards").glob("*.json"))) > 0


def _digests(folder: Path) -> dict[str, list[Path]]:
    found: dict[str, list[Path]] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = [d for d in dirnames if d not in {".venv", ".git", "build", "node_modules"}]
        for name in filenames:
            path = Path(dirpath) / name
            if path.is_symlink() or not name.endswith((".json", ".yaml")):
                continue
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            found.setdefault(digest, []).append(path)
    return found


def test_each_rule_file_and_dashboard_has_one_copy_that_monitoring_reads():
    shipped = [
        *sorted((CHART / "files" / "rules").glob("*.yaml")),
        *sorted((CHART / "files" / "dashboards").glob("*.json")),
    ]
    assert len(shipped) >= 6
    digests = _digests(ROOT)
    for path in shipped:
        assert not path.is_symlink(), path
        copies = digests[hashlib.sha256(path.read_bytes()).hexdigest()]
        assert copies == [path], f"{path.name} has copies: {copies}"
        # monitoring/ reads that one file under its own name
        under = ROOT / "monitoring" / path.parent.name / path.name
        assert under.resolve() == path.resolve(), under
    for folder in ("rules", "dashboards"):
        names = sorted(p.name for p in (ROOT / "monitoring" / folder).iterdir())
        assert names == sorted(p.name for p in (CHART / "files" / folder).iterdir())

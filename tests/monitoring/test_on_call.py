"""What the operator on call reads: the overview board's "Site health" row (processes up
and restarting, targets down, Envoy's retries, timeouts and ejections, a control plane not
followed), every series of it one that the site exports; and an alert text that says where
to look. (That each panel answers on a live site: test_dashboards.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import yaml
from monitoring_dashboards import dashboards, to_json

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "monitoring" / "rules" / "alerts.rules.yaml"
# where the site's own metrics are defined: the operator's, the gateway's, the supervisor's
DEFINED_IN = (
    ROOT / "operator" / "metrics.py",
    ROOT / "gateway" / "metrics.py",
    ROOT / "sonicsite" / "local" / "supervisor_http.py",
)
HEALTH = {
    "Processes up (local site)": {"sonicsite_process_up"},
    "Restarts by process (last 15 min)": {"sonicsite_process_restarts_total"},
    "Scrape targets down": {"up"},
    "Envoy and gateway: retries, per-try timeouts, health-check failures": {
        "envoy_cluster_upstream_rq_retry",
        "envoy_cluster_upstream_rq_per_try_timeout",
        "envoy_cluster_health_check_failure",
        "sonicsite_gateway_retries_total",
    },
    "Servers ejected by Envoy": {
        "envoy_cluster_outlier_detection_ejections_active",
        "envoy_cluster_outlier_detection_ejections_enforced_total",
    },
    "Control plane: stale state, fail-open, xDS refused": {
        "sonicsite_gateway_operator_state_stale",
        "sonicsite_admission_fail_open",
        "sonicsite_operator_xds_refusing",
    },
}
SERIES = re.compile(r"\b([a-z_:]+)\{")


def _rows(board: dict) -> dict[str, list[dict]]:
    """Each row's panels, in order (a row panel starts a row)."""
    rows: dict[str, list[dict]] = {}
    current = ""
    for panel in board["panels"]:
        if panel.get("type") == "row":
            current = panel["title"]
            rows[current] = []
        else:
            rows[current].append(panel)
    return rows


def _overview() -> dict:
    return json.loads(to_json(dashboards()["sonicsite-overview.json"]))


def test_the_overview_starts_with_a_site_health_row_of_the_series_on_call_needs():
    rows = _rows(_overview())
    assert next(iter(rows)) == "Site health"
    panels = {p["title"]: p for p in rows["Site health"]}
    assert set(panels) == set(HEALTH)
    for title, wanted in HEALTH.items():
        read = {m for t in panels[title]["targets"] for m in SERIES.findall(t["expr"])}
        assert read == wanted, title
        assert panels[title].get("description"), f"{title}: says what it shows"


def test_every_sonicsite_series_of_the_row_is_one_the_site_exports():
    """A name made up (or renamed since) would give an empty panel in the very incident it
    is for; a counter is defined without its `_total`, as prometheus_client takes it."""
    code = "".join(path.read_text() for path in DEFINED_IN)
    for wanted in HEALTH.values():
        for series in (s for s in wanted if s.startswith("sonicsite_")):
            bare = series.removesuffix("_total")
            assert f'"{bare}"' in code or f'"{series}"' in code, f"{series} is defined nowhere"


def test_servers_taking_work_names_each_server():
    """One number could not say which server was gone (and read 4 on a 2-server site when
    an old site's series were reopened): the count, then each server."""
    (panel,) = [p for p in _overview()["panels"] if p.get("title") == "Servers taking work"]
    exprs = [t["expr"] for t in panel["targets"]]
    assert any(e.startswith("sum(sonicsite_server_up{") for e in exprs), exprs
    per_server = [t for t in panel["targets"] if "by (server)" in t["expr"]]
    assert per_server and per_server[0]["legendFormat"] == "{{server}}"


def _alert(name: str) -> dict:
    groups = yaml.safe_load(ALERTS.read_text())["groups"]
    (rule,) = [r for g in groups for r in g["rules"] if r.get("alert") == name]
    return rule


def test_server_down_says_a_hung_server_and_its_log_as_crash_looping_does():
    """It said "its pod or process and its log": not that a hung or stopped server fires it
    too, nor where the log is, as SonicsiteProcessCrashLooping's text does."""
    looping = _alert("SonicsiteProcessCrashLooping")["annotations"]["description"]
    assert "logs/{{ $labels.process }}.log" in looping
    down = " ".join(_alert("SonicsiteServerDown")["annotations"]["description"].split())
    assert "logs/{{ $labels.server }}.log in the site's folder" in down, down
    assert "hangs" in down and "SIGSTOP" in down and "NOT ANSWERING" in down, down
    assert "`sonicsite status`" in down, down

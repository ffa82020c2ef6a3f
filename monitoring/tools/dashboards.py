"""Grafana dashboards, built in code with grafana-foundation-sdk (Grafana 11.6).

`make dashboards` (or `python monitoring/tools/dashboards.py [OUT]`, run as a script from
the repository root) writes them to monitoring/dashboards/*.json: a link to the chart's
charts/sonicsite/files/dashboards, where the one copy lives (the chart folder is the whole
chart), shipped as ConfigMaps for Grafana's sidecar; tests/monitoring checks that the
committed JSON is a fresh build. Servers are counted from the operator's view
(`sonicsite_server_up`), never from GPUs, so CPU-only sites are right. A board shows one
release (one site): every query, recorded series included, selects the `namespace` and
`release` variables (single values: the labels the chart puts on its scrape targets, so that
releases sharing a Prometheus are never summed together) and the model variable (any number,
or all). On the local site, whose series carry no namespace or release, the regex `.*` (or
an empty value) matches them.

The panels and their queries are in dashboard_panels.py (the placement board's in
placement_panels.py); this file lays them out on the
boards, with the boards' variables, and writes the JSON.
"""

from __future__ import annotations

import sys
from pathlib import Path

from dashboard_panels import (  # its siblings: on the path when run as a script
    SITE,
    PanelSpec,
    model_panels,
    overview_panels,
)
from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from placement_panels import placement_panels

OUT = Path(__file__).resolve().parents[1] / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def _variable(name: str, query: str, many: bool) -> dashboard.QueryVariable:
    """A variable from a label's values: one value (namespace, release), or any number and
    all (model)."""
    variable = (
        dashboard.QueryVariable(name)
        .label(name)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(2)  # on time range change
    )
    if many:
        variable = variable.include_all(True).all_value(".*").multi(True)
    return variable


def build(uid: str, title: str, rows: list[tuple[str, list[PanelSpec]]]):
    board = (
        dashboard.Dashboard(title)
        .uid(uid)
        .tags(["sonicsite", "triton"])
        .refresh("10s")
        .time("now-1h", "now")
        .timezone("browser")
        .with_variable(
            dashboard.DatasourceVariable("datasource").label("Prometheus").type("prometheus")
        )
        .with_variable(
            _variable("namespace", "label_values(sonicsite_server_up, namespace)", many=False)
        )
        .with_variable(
            _variable(
                "release",
                'label_values(sonicsite_server_up{namespace=~"$namespace"}, release)',
                many=False,
            )
        )
        .with_variable(
            _variable(
                "model",
                # a model any server has served, or one only held for now (placement: no
                # server has loaded it yet)
                'label_values({__name__=~"nv_inference_request_success|'
                f'sonicsite_gateway_held_requests", {SITE}}}, model)',
                many=True,
            )
        )
    )
    for row, panels in rows:
        board = board.with_row(dashboard.Row(row))
        for spec in panels:
            builder = stat.Panel() if spec.kind == "stat" else timeseries.Panel()
            builder = builder.title(spec.title).unit(spec.unit).datasource(DATASOURCE).height(8)
            builder = builder.span(8 if spec.kind == "timeseries" else 6)
            if spec.description:
                builder = builder.description(spec.description)
            for k, q in enumerate(spec.queries):
                target = (
                    prometheus.Dataquery()
                    .expr(q.expr)
                    .legend_format(q.legend or "__auto")
                    .ref_id(chr(ord("A") + k))
                    .datasource(DATASOURCE)
                )
                builder = builder.with_target(target)
            board = board.with_panel(builder)
    return board.build()


def dashboards() -> dict[str, object]:
    """File name -> built dashboard model."""
    return {
        "sonicsite-overview.json": build(
            "sonicsite-overview", "sonicsite: site", overview_panels()
        ),
        "sonicsite-model.json": build("sonicsite-model", "sonicsite: model", model_panels()),
        "sonicsite-placement.json": build(
            "sonicsite-placement", "sonicsite: placement", placement_panels()
        ),
    }


def to_json(model: object) -> str:
    return JSONEncoder(sort_keys=True, indent=2).encode(model)


def panel_queries(board: dict) -> list[tuple[str, str]]:
    """(panel title, PromQL) for every query of a dashboard's JSON."""
    return [
        (panel["title"], target["expr"])
        for panel in board["panels"]
        if panel.get("type") != "row"
        for target in panel.get("targets", [])
    ]


def main(argv: list[str] | None = None) -> int:
    out = Path(argv[0]) if argv else OUT
    out.mkdir(parents=True, exist_ok=True)
    for name, model in dashboards().items():
        (out / name).write_text(to_json(model) + "\n")
        print(out / name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

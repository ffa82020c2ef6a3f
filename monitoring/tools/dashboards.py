"""Grafana dashboards, built in code with grafana-foundation-sdk (Grafana 11.6).

`make dashboards` (or `python monitoring/tools/dashboards.py [OUT]`, run as a script from the
repository root) writes them to monitoring/dashboards/*.json, which the chart ships as
ConfigMaps for Grafana's sidecar; tests/monitoring checks that the committed JSON is a fresh
build. Servers are counted from the operator's view (`sonicsite_server_up`), never from GPUs,
so CPU-only sites are right. A board shows one release (one site): every query, recorded
series included, selects the `namespace` and `release` variables (single values: the labels
the chart puts on its scrape targets, so that releases sharing a Prometheus are never summed
together) and the model variable (any number, or all). On the local site, whose series carry
no namespace or release, the regex `.*` (or an empty value) matches them.

Queue time per request is not computed here. The site's value per model is the recording
rule `sonicsite:model_queue_seconds_per_request:30s` (monitoring/rules/autoscaling.rules.yaml,
the scaling metric: its one definition in PromQL), per namespace, release and model; per
server it is the operator's gauge
`sonicsite_model_queue_seconds_per_request{model, server}` (operator/loadview.py
`per_request`, its one definition in Python). The other stages (compute input, infer,
output) are per request over the rate interval here.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard, prometheus, stat, timeseries
from grafana_foundation_sdk.cog.encoder import JSONEncoder

OUT = Path(__file__).resolve().parents[1] / "dashboards"
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
SITE = 'namespace=~"$namespace", release=~"$release"'
MODEL = f'{SITE}, model=~"$model"'
WINDOW = "$__rate_interval"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""


@dataclass(frozen=True)
class PanelSpec:
    title: str
    unit: str
    queries: tuple[Query, ...]
    kind: str = "timeseries"  # or "stat"
    description: str = ""


def _rate(metric: str, by: str, selector: str = MODEL) -> str:
    return f"sum by ({by}) (rate({metric}{{{selector}}}[{WINDOW}]))"


def _stage_per_request(counter: str, by: str) -> str:
    """Seconds per request of one of Triton's compute-stage duration counters (µs). Not for
    the queue: queue time per request is the recording rule (QUEUE_SITE) or the operator's
    gauge (QUEUE_BY_SERVER)."""
    if counter == "nv_inference_queue_duration_us":
        raise ValueError("queue time per request: use QUEUE_SITE or QUEUE_BY_SERVER")
    return (
        f"{_rate(counter, by)} / 1e6 / clamp_min({_rate('nv_inference_request_success', by)}, 1e-9)"
    )


# Queue time per request, from its two definitions (never recomputed from Triton's counters):
# per model over the site, the scaling metric's recording rule (labels: namespace, release,
# model); per model and server, the operator's gauge.
QUEUE_SITE = f"sonicsite:model_queue_seconds_per_request:30s{{{MODEL}}}"
QUEUE_BY_SERVER = f"max by (model, server) (sonicsite_model_queue_seconds_per_request{{{MODEL}}})"


def overview_panels() -> list[tuple[str, list[PanelSpec]]]:
    """Rows of the site overview: (row title, panels)."""
    stages = (
        ("input", "nv_inference_compute_input_duration_us"),
        ("compute", "nv_inference_compute_infer_duration_us"),
        ("output", "nv_inference_compute_output_duration_us"),
    )
    return [
        (
            "Servers",
            [
                PanelSpec(
                    "Servers taking work",
                    "none",
                    (Query(f"sum(sonicsite_server_up{{{SITE}}})", "ready"),),
                    "stat",
                    "Servers whose metrics the operator reads (CPU and GPU alike).",
                ),
                PanelSpec(
                    "Servers: current vs desired",
                    "none",
                    (
                        Query(f"max(sonicsite_autoscaler_current_servers{{{SITE}}})", "current"),
                        Query(f"max(sonicsite_autoscaler_desired_servers{{{SITE}}})", "desired"),
                    ),
                ),
                PanelSpec(
                    "Endpoint weights",
                    "none",
                    (
                        Query(
                            f"max by (server) (sonicsite_endpoint_weight{{{SITE}}})", "{{server}}"
                        ),
                    ),
                ),
            ],
        ),
        (
            "Throughput",
            [
                PanelSpec(
                    "Requests per second by model",
                    "reqps",
                    (Query(_rate("nv_inference_request_success", "model"), "{{model}}"),),
                ),
                PanelSpec(
                    "Requests per second by server",
                    "reqps",
                    (Query(_rate("nv_inference_request_success", "instance"), "{{instance}}"),),
                ),
                PanelSpec(
                    "Pending requests",
                    "none",
                    (
                        Query(
                            f"sum by (model) (nv_inference_pending_request_count{{{MODEL}}})",
                            "{{model}}",
                        ),
                    ),
                ),
            ],
        ),
        (
            "Latency",
            [
                PanelSpec(
                    "Time per request in Triton: queue, input, compute, output",
                    "s",
                    (
                        Query(QUEUE_SITE, "{{model}} queue"),
                        *(
                            Query(_stage_per_request(c, "model"), f"{{{{model}}}} {s}")
                            for s, c in stages
                        ),
                    ),
                    description=(
                        "Queue: the scaling metric's recording rule "
                        "sonicsite:model_queue_seconds_per_request:30s (over the site, the last "
                        "30 s). Input, compute, output: over the rate interval."
                    ),
                ),
                PanelSpec(
                    "Latency at Envoy (p50, p99)",
                    "ms",
                    tuple(
                        Query(
                            f"histogram_quantile({q}, sum by (le) (rate("
                            f"envoy_cluster_upstream_rq_time_bucket{{{SITE}}}[{WINDOW}])))",
                            f"p{int(q * 100)}",
                        )
                        for q in (0.5, 0.99)
                    ),
                ),
                PanelSpec(
                    "Latency at the gateway (p50, p99)",
                    "s",
                    tuple(
                        Query(
                            f"histogram_quantile({q}, sum by (le, model) (rate("
                            f"sonicsite_gateway_request_duration_seconds_bucket{{{MODEL}}}"
                            f"[{WINDOW}])))",
                            f"{{{{model}}}} p{int(q * 100)}",
                        )
                        for q in (0.5, 0.99)
                    ),
                ),
            ],
        ),
        (
            "Admission and failures",
            [
                PanelSpec(
                    "Models shed",
                    "none",
                    (Query(f"max by (model) (sonicsite_admission_shed{{{MODEL}}})", "{{model}}"),),
                    description="1 while the operator sheds new work for the model.",
                ),
                PanelSpec(
                    "Admission decisions",
                    "none",
                    (
                        Query(
                            f"sum by (model, state) (sonicsite_admission_changes_total{{{MODEL}}})",
                            "{{model}} → {{state}}",
                        ),
                    ),
                ),
                PanelSpec(
                    "Rejections per second (Envoy shed, gateway)",
                    "reqps",
                    (
                        Query(
                            f"sum(rate(envoy_http_fault_aborts_injected{{{SITE}}}[{WINDOW}]))",
                            "Envoy (RESOURCE_EXHAUSTED)",
                        ),
                        Query(
                            f"sum by (reason) (rate("
                            f"sonicsite_gateway_rejections_total{{{MODEL}}}[{WINDOW}]))",
                            "gateway {{reason}}",
                        ),
                    ),
                ),
                PanelSpec(
                    "Failures per second",
                    "reqps",
                    (
                        Query(_rate("nv_inference_request_failure", "model"), "{{model}} Triton"),
                        Query(
                            f"sum by (kind) (rate(sonicsite_gateway_upstream_errors_total"
                            f"{{{SITE}}}[{WINDOW}]))",
                            "gateway upstream {{kind}}",
                        ),
                    ),
                ),
            ],
        ),
    ]


def model_panels() -> list[tuple[str, list[PanelSpec]]]:
    return [
        (
            "Model",
            [
                PanelSpec(
                    "Requests per second by server",
                    "reqps",
                    (Query(_rate("nv_inference_request_success", "instance"), "{{instance}}"),),
                ),
                PanelSpec(
                    "Queue time per request over the site (scaling metric)",
                    "s",
                    (Query(QUEUE_SITE, "{{model}}"),),
                    description=(
                        "The recording rule sonicsite:model_queue_seconds_per_request:30s: "
                        "Σ queue time / Σ requests over the model's servers in the last 30 s, "
                        "what the autoscaler (or KEDA) scales on."
                    ),
                ),
                PanelSpec(
                    "Queue time per request by server",
                    "s",
                    (Query(QUEUE_BY_SERVER, "{{model}} on {{server}}"),),
                    description=(
                        "The operator's measure (sonicsite_model_queue_seconds_per_request), "
                        "over its last step, which its admission and balancing read."
                    ),
                ),
                PanelSpec(
                    "Mean batch size",
                    "none",
                    (
                        Query(
                            f"{_rate('nv_inference_count', 'model')} / "
                            f"clamp_min({_rate('nv_inference_exec_count', 'model')}, 1e-9)",
                            "{{model}}",
                        ),
                    ),
                ),
            ],
        )
    ]


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
                f"label_values(nv_inference_request_success{{{SITE}}}, model)",
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


def placement_panels() -> list[tuple[str, list[PanelSpec]]]:
    """Models on demand (operator/placement*.py, gateway/holding.py): where models are,
    what placement did, and the requests held for a model while it loads."""
    return [
        (
            "Placement",
            [
                PanelSpec(
                    "Models loaded per server",
                    "none",
                    (
                        Query(
                            f"max by (server) (sonicsite_placement_models_loaded{{{SITE}}})",
                            "{{server}}",
                        ),
                    ),
                ),
                PanelSpec(
                    "Loads and unloads by rule",
                    "none",
                    tuple(
                        Query(
                            f"sum by (model, rule) (increase(sonicsite_placement_{kind}_total"
                            f"{{{MODEL}}}[{WINDOW}]))",
                            f"{kind[:-1]} {{{{model}}}} ({{{{rule}}}})",
                        )
                        for kind in ("loads", "unloads")
                    ),
                    description="The reason of each decision is in the operator's log and "
                    "`sonicsite models status`.",
                ),
            ],
        ),
        (
            "Held requests",
            [
                PanelSpec(
                    "Requests held now",
                    "none",
                    (
                        Query(
                            f"sum by (model) (sonicsite_gateway_held_requests{{{MODEL}}})",
                            "{{model}}",
                        ),
                    ),
                    description="Requests for a model no server holds ready, waiting in the "
                    "gateway until one does (the operator loads it for them).",
                ),
                PanelSpec(
                    "Cold start: time held until a server had the model (p50, p99)",
                    "s",
                    tuple(
                        Query(
                            f"histogram_quantile({q}, sum by (le, model) (rate("
                            f'sonicsite_gateway_hold_seconds_bucket{{{MODEL}, outcome="forwarded"}}'
                            f"[{WINDOW}])))",
                            f"{{{{model}}}} p{int(q * 100)}",
                        )
                        for q in (0.5, 0.99)
                    ),
                    description="From a held request's arrival until it was sent to a server "
                    "that had loaded the model; its inference comes after.",
                ),
                PanelSpec(
                    "Holds ended, by outcome",
                    "none",
                    (
                        Query(
                            f"sum by (outcome) (increase(sonicsite_gateway_hold_seconds_count"
                            f"{{{MODEL}}}[{WINDOW}]))",
                            "{{outcome}}",
                        ),
                    ),
                    description="forwarded: answered by a server; asked_again: the client's "
                    "own wait ran out first (the sonicsite client asks again); expired: the "
                    "model's hold deadline passed (the caller got the reason).",
                ),
            ],
        ),
    ]


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

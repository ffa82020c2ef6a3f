"""The dashboards' panels: what each board shows, and the PromQL of every panel.

Queue time per request is not computed here. The site's value per model is the recording
rule `sonicsite:model_queue_seconds_per_request:30s` (monitoring/rules/autoscaling.rules.yaml,
the scaling metric: its one definition in PromQL), per namespace, release and model; per
server it is the operator's gauge
`sonicsite_model_queue_seconds_per_request{model, server}` (operator/loadview.py
`per_request`, its one definition in Python). The other stages (compute input, infer,
output) are per request over the rate interval here. Every query selects the boards'
`namespace`, `release` and `model` variables (dashboards.py says why).
"""

from __future__ import annotations

from dataclasses import dataclass

SITE = 'namespace=~"$namespace", release=~"$release"'
MODEL = f'{SITE}, model=~"$model"'
# Envoy's clusters that carry the boards' models' requests, as the operator names them
# (operator/xds_resources.py): each model's own (`model_cluster`, `rest_cluster`) and the
# all-servers pair its routes share where every server holds every model at full weight
# (operator/route_clusters.py; their time is over every model). No other cluster (holding,
# the site-view fan-out, JWKS, the trace collector, the operator's ADS) is a model's traffic.
ENVOY_MODEL_CLUSTERS = f'{SITE}, envoy_cluster_name=~"(model|rest)_$model|triton|triton_rest"'
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


def _site_health() -> list[PanelSpec]:
    """On-call's first look: processes that run and restart (the local supervisor's),
    targets not scraped, Envoy's retries, timeouts, failed health checks and ejections, and
    a control plane not followed (stale state, fail-open, refused configuration)."""
    envoy = ENVOY_MODEL_CLUSTERS
    return [
        PanelSpec(
            "Processes up (local site)",
            "none",
            (Query(f"min by (process) (sonicsite_process_up{{{SITE}}})", "{{process}}"),),
            description="1 while the supervisor sees the process run, 0 while it is dead or "
            "restarting (its restart's back-off). Why: `sonicsite status`, logs/<process>.log.",
        ),
        PanelSpec(
            "Restarts by process (last 15 min)",
            "none",
            (
                Query(
                    f"sum by (process) (increase(sonicsite_process_restarts_total{{{SITE}}}[15m]))",
                    "{{process}}",
                ),
            ),
            description="As SonicsiteProcessCrashLooping counts them: 3 or more fires it.",
        ),
        PanelSpec(
            "Scrape targets down",
            "none",
            (Query(f"sum by (job) (up{{{SITE}}} == bool 0)", "{{job}}"),),
            description="Targets not scraped now, per job (SonicsiteTargetDown after 2 min).",
        ),
        PanelSpec(
            "Envoy and gateway: retries, per-try timeouts, health-check failures",
            "reqps",
            (
                *(
                    Query(f"sum(rate({counter}{{{envoy}}}[{WINDOW}]))", legend)
                    for counter, legend in (
                        ("envoy_cluster_upstream_rq_retry", "retries"),
                        ("envoy_cluster_upstream_rq_per_try_timeout", "per-try timeouts"),
                        ("envoy_cluster_health_check_failure", "health-check failures"),
                    )
                ),
                Query(_rate("sonicsite_gateway_retries_total", "model"), "gateway {{model}}"),
            ),
            description="Envoy's over the models' clusters; the gateway's: requests sent to "
            "another server after a connection failure. A server killed or hung shows here.",
        ),
        PanelSpec(
            "Servers ejected by Envoy",
            "none",
            (
                Query(
                    f"max(envoy_cluster_outlier_detection_ejections_active{{{envoy}}})",
                    "ejected now (most in one cluster)",
                ),
                Query(
                    "sum(increase(envoy_cluster_outlier_detection_ejections_enforced_total"
                    f"{{{envoy}}}[{WINDOW}]))",
                    "ejections",
                ),
            ),
            description="Outlier detection: a server that failed in a row is sent nothing "
            "for a while (each model's cluster ejects on its own).",
        ),
        PanelSpec(
            "Control plane: stale state, fail-open, xDS refused",
            "none",
            (
                Query(
                    f"max(sonicsite_gateway_operator_state_stale{{{SITE}}})",
                    "gateway: operator state stale",
                ),
                Query(
                    f"max by (model) (sonicsite_admission_fail_open{{{MODEL}}})",
                    "fail open {{model}}",
                ),
                Query(
                    f"max by (kind) (sonicsite_operator_xds_refusing{{{SITE}}})",
                    "Envoys refusing {{kind}}",
                ),
            ),
            description="1 while the gateway's copy of the operator's state is too old to "
            "follow (every model open); while admission fails open (no server of the model "
            "measured); Envoys whose last answer to a kind of configuration was a refusal "
            "(the operator's log has Envoy's reason).",
        ),
    ]


def overview_panels() -> list[tuple[str, list[PanelSpec]]]:
    """Rows of the site overview: (row title, panels); site health first."""
    stages = (
        ("input", "nv_inference_compute_input_duration_us"),
        ("compute", "nv_inference_compute_infer_duration_us"),
        ("output", "nv_inference_compute_output_duration_us"),
    )
    return [
        ("Site health", _site_health()),
        (
            "Servers",
            [
                PanelSpec(
                    "Servers taking work",
                    "none",
                    (
                        Query(f"sum(sonicsite_server_up{{{SITE}}})", "ready"),
                        Query(f"max by (server) (sonicsite_server_up{{{SITE}}})", "{{server}}"),
                    ),
                    "stat",
                    "Servers whose metrics the operator reads (CPU and GPU alike): how many, "
                    "then each server (1 taking work, 0 not).",
                ),
                PanelSpec(
                    "Servers: current vs desired",
                    "none",
                    (
                        Query(
                            f"max by (pool) (sonicsite_autoscaler_current_servers{{{SITE}}})"
                            f" or on () sum(sonicsite_server_up{{{SITE}}})",
                            "current {{pool}}",
                        ),
                        Query(
                            f"max by (pool) (sonicsite_autoscaler_desired_servers{{{SITE}}})",
                            "desired {{pool}}",
                        ),
                    ),
                    description=(
                        "Per pool, the servers taking new work and the servers the autoscaler "
                        "wants. A site without an autoscaler has no desired line, and its "
                        "current line counts the servers whose metrics the operator reads."
                    ),
                ),
                PanelSpec(
                    "Work the clients declare",
                    "none",
                    (
                        Query(
                            f"sum by (model) (sonicsite_declared_requests_left{{{SITE}}})",
                            "{{model}}",
                        ),
                    ),
                    description=(
                        "Requests the sonicsite clients say they have left, per model: a "
                        "scale-up starts no server this work would not keep busy 3 times its "
                        "start (autoscaling.busyOverStart)."
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
                            f"envoy_cluster_upstream_rq_time_bucket{{{ENVOY_MODEL_CLUSTERS}}}"
                            f"[{WINDOW}])))",
                            f"p{int(q * 100)}",
                        )
                        for q in (0.5, 0.99)
                    ),
                    description=(
                        "Time to the servers' replies over the models' clusters (model_<model> "
                        "for gRPC, rest_<model> for REST) and the all-servers clusters (triton, "
                        "triton_rest) that the models' routes share where every server holds "
                        "every model at full weight (their time is over every model): not the "
                        "holding clusters (a held request waits minutes for a model to load), "
                        "the gateway's site-view fan-out, the identity provider's keys or the "
                        "trace collector."
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
                            f"sum by (model, state) (increase("
                            f"sonicsite_admission_changes_total{{{MODEL}}}[{WINDOW}]))",
                            "{{model}} → {{state}}",
                        ),
                    ),
                    description="Decisions that changed the model's admission (to open or "
                    "shed) per rate interval; a model that flaps shows here.",
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

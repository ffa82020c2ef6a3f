"""The placement board's panels (models on demand): where models are loaded, what placement
decided and what failed, and the requests the gateway held for a model no server had (cold
starts). The shared pieces (selectors, `PanelSpec`, `Query`) are in dashboard_panels.py."""

from __future__ import annotations

from dashboard_panels import MODEL, SITE, WINDOW, PanelSpec, Query  # its sibling


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
                PanelSpec(
                    "Placement failures",
                    "none",
                    (
                        Query(
                            "sum by (action, model, server) (increase("
                            f"sonicsite_placement_failures_total{{{MODEL}}}[{WINDOW}]))",
                            "{{action}} {{model}} on {{server}}",
                        ),
                        Query(
                            "sum(increase("
                            f"sonicsite_placement_failures_total{{{MODEL}}}[{WINDOW}])) or "
                            f"sum(sonicsite_placement_models_loaded{{{SITE}}}) * 0",
                            "all",
                        ),
                    ),
                    description="Loads and unloads that failed, each tried again after a "
                    "back-off (the reason is in the operator's log and `sonicsite models "
                    "status`); `all` reads 0 while placement runs and nothing fails. "
                    "SonicsitePlacementFailing alerts when failures go on for 10 minutes.",
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
                    "model's hold deadline passed (the caller got the reason); client_gone: the "
                    "caller closed its connection while held.",
                ),
            ],
        ),
    ]

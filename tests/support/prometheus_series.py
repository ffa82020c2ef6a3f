"""Triton's counters as a live Prometheus holds them, fed to the load view's own functions, so
that a test compares a PromQL figure with the Python definition on exactly the same samples
(tests/monitoring: the recording rule, the chart's KEDA query per release)."""

from __future__ import annotations

from sonicsite.operator.loadview import ModelLoad, _Scrape, compute_loads

from sonicsite.local import prometheus

# Triton's counter -> the load view's key, for queue time per request.
COUNTERS = {
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_request_success": "success",
}


def _series(metric: str, selector: str) -> str:
    return f"{metric}{{{selector}}}" if selector else metric


def scrapes(address: str, at: float, selector: str = "") -> dict[str, _Scrape]:
    """Triton's counters at `at`, per scraped server (`instance`), of the series `selector`
    (PromQL matchers, e.g. `instance="127.0.0.1:8002"`) picks."""
    found: dict[str, _Scrape] = {}
    for metric, key in COUNTERS.items():
        for sample in prometheus.query(address, _series(metric, selector), at):
            instance, model = sample["metric"]["instance"], sample["metric"]["model"]
            scrape = found.setdefault(instance, _Scrape(at, {}))
            scrape.models.setdefault(model, {})[key] = float(sample["value"][1])
    return found


def newest_scrapes(address: str, selector: str) -> dict[str, float]:
    """Per target `selector` picks (matchers on `up`), the timestamp of the newest scrape
    Prometheus has stored. A target's scrapes are stored in order, so every sample of it up to
    that instant has landed."""
    return {
        s["metric"]["instance"]: float(s["value"][1])
        for s in prometheus.query(address, f"timestamp({_series('up', selector)})")
    }


def loads(address: str, at: float, window: float, selector: str = "") -> list[ModelLoad]:
    """The load view's figures on exactly the samples a PromQL `x - x offset window` reads at
    `at`: the counters at `at` and `window` seconds before, per server."""
    now, then = scrapes(address, at, selector), scrapes(address, at - window, selector)
    return [
        load
        for instance in now
        if instance in then
        for load in compute_loads(instance, then[instance], now[instance])
    ]

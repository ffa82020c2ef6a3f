"""What a Triton server's /metrics says, per model: its counters and gauges read from
Prometheus' text format, per version (`parse_versions`) or summed over the versions
(`summed`), and what a read of them may fail with (`UNREADABLE`, raised as
`MetricsUnreadable` naming the URL). The load view (loadview.py) turns them into rates.
"""

from __future__ import annotations

import http.client
import math
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

COUNTERS = {
    "nv_inference_request_success": "success",
    "nv_inference_request_failure": "failure",
    "nv_inference_count": "inferences",
    "nv_inference_exec_count": "executions",
    "nv_inference_queue_duration_us": "queue_us",
    "nv_inference_compute_input_duration_us": "compute_input_us",
    "nv_inference_compute_infer_duration_us": "compute_infer_us",
    "nv_inference_compute_output_duration_us": "compute_output_us",
}
COUNTER_KEYS = tuple(COUNTERS.values())
GAUGES = {"nv_inference_pending_request_count": "pending"}
# what a read of a server's /metrics can raise: refused, reset, timed out (OSError and its
# URLError), a reply cut short or not HTTP (HTTPException: IncompleteRead, BadStatusLine,
# LineTooLong), a body that is not UTF-8 or not Prometheus' text format (ValueError)
UNREADABLE = (OSError, http.client.HTTPException, ValueError)


class MetricsUnreadable(OSError):
    """A server's /metrics could not be read or parsed; the message names the URL and why.
    An OSError, so that callers that catch a failed read as one (sonicsite.local's drain)
    catch a reply cut short or a body that is not Prometheus' text too."""

    def __init__(self, metrics_url: str, exc: BaseException) -> None:
        super().__init__(f"{metrics_url}: {type(exc).__name__}: {exc}")
        self.url = metrics_url


Versions = dict[str, dict[str, dict[str, float]]]  # model: {version: {counter or gauge: value}}


def parse_versions(text: str) -> Versions:
    """Triton's /metrics text as {model: {version: {counter or gauge: value}}}; ValueError
    for a figure that is not a finite number ≥ 0 (a NaN or an infinity, which the text
    format allows, went on into every rate and made each policy step fail)."""
    models: Versions = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = COUNTERS.get(sample.name.removesuffix("_total")) or GAUGES.get(sample.name)
            model = sample.labels.get("model")
            if name is None or model is None:
                continue
            if not math.isfinite(sample.value) or sample.value < 0:  # Triton's never are
                raise ValueError(f"{sample.name}{{model={model!r}}} is {sample.value}")
            values = models.setdefault(model, {}).setdefault(sample.labels.get("version", ""), {})
            values[name] = values.get(name, 0.0) + sample.value
    return models


def summed(versions: Versions) -> dict[str, dict[str, float]]:
    """Each model's counters and gauges summed over its versions."""
    models: dict[str, dict[str, float]] = {}
    for model, by_version in versions.items():
        values = models.setdefault(model, {})
        for counts in by_version.values():
            for name, value in counts.items():
                values[name] = values.get(name, 0.0) + value
    return models


def read_metrics(metrics_url: str, timeout_s: float) -> dict[str, dict[str, float]]:
    """A server's /metrics now, per model (versions `summed`); a failed read or parse raises
    MetricsUnreadable naming the URL (whatever went wrong is that one server's failure)."""
    return summed(read_versions(metrics_url, timeout_s))


def read_versions(metrics_url: str, timeout_s: float) -> Versions:
    """`read_metrics`, per model and version (`parse_versions`)."""
    try:
        with urllib.request.urlopen(metrics_url, timeout=timeout_s) as reply:
            return parse_versions(reply.read().decode())
    except UNREADABLE as exc:
        raise MetricsUnreadable(metrics_url, exc) from exc

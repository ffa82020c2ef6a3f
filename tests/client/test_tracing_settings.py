"""The client's tracing from a worker's environment: the standard OpenTelemetry variables
(tests/site/test_tracing.py follows the spans themselves through a traced site)."""

from __future__ import annotations

import pytest
from sonicsite.client.tracing import ClientTracing, TracingSettings


def test_the_standard_variables_turn_tracing_on_and_nothing_else_does():
    assert TracingSettings.from_environment({}) is None
    assert ClientTracing.from_environment({"SONICSITE_URL": "http://site:8000"}) is None
    base = TracingSettings.from_environment(
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/", "OTEL_TRACES_SAMPLER_ARG": "0.1"}
    )
    assert base == TracingSettings("http://collector:4318/v1/traces", 0.1, "sonicsite-worker")
    own = TracingSettings.from_environment(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored:4318",
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://traces.example.org/v1/traces",
            "OTEL_SERVICE_NAME": "cms-reco",
        }
    )
    assert own == TracingSettings("https://traces.example.org/v1/traces", 1.0, "cms-reco")
    off = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318", "OTEL_TRACES_EXPORTER": "none"}
    assert TracingSettings.from_environment(off) is None


def test_bad_settings_are_named():
    with pytest.raises(ValueError, match="OTEL_TRACES_SAMPLER_ARG"):
        TracingSettings.from_environment(
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_SAMPLER_ARG": "half"}
        )
    with pytest.raises(ValueError, match="sampling: expected 0 to 1"):
        TracingSettings("http://c:4318/v1/traces", sampling=2.0)
    with pytest.raises(ValueError, match="endpoint: expected an http"):
        TracingSettings("collector:4318")

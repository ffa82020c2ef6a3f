"""A sample of a Prometheus exposition (a /metrics page), read with prometheus_client's own
parser: the tests that check what a process counts read its figures through this one."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def sample_value(text: str, name: str, **labels: str) -> float:
    """The first sample named `name` whose labels include `labels`; 0 when there is none (a
    counter or gauge not yet set)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0

"""The chart's own Prometheus keeps its TSDB in an emptyDir: with no size limit it grew
until the node's disk pressure evicted the pod (and every series with it). The volume has a
size limit (monitoring.prometheus.storage.sizeLimit), and Prometheus a size-based retention
below it, so that it deletes its oldest blocks before the kubelet evicts it."""

from __future__ import annotations

import pytest
from chartcheck import objects, one_object, render

ON = {"enabled": True}


def _prometheus(storage: dict | None = None) -> tuple[list[str], dict]:
    values: dict = {"monitoring": {"prometheus": dict(ON)}}
    if storage is not None:
        values["monitoring"]["prometheus"]["storage"] = storage
    deployment = one_object(objects(render(values)), "Deployment", "prometheus")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (data,) = [v for v in pod["volumes"] if v["name"] == "data"]
    return container["args"], data


def _retention_bytes(args: list[str]) -> int:
    """--storage.tsdb.retention.size in bytes (Prometheus's units are powers of 1024)."""
    (arg,) = [a for a in args if a.startswith("--storage.tsdb.retention.size=")]
    size = arg.split("=", 1)[1]
    assert size.endswith("MB") and size[:-2].isdigit(), size
    return int(size[:-2]) * 1024**2


@pytest.mark.parametrize(
    ("size_limit", "limit_bytes"),
    [(None, 2 * 1024**3), ("10Gi", 10 * 1024**3), ("5G", 5 * 10**9), ("512Mi", 512 * 1024**2)],
)
def test_the_tsdb_has_a_size_limit_and_a_retention_below_it(size_limit, limit_bytes):
    args, data = _prometheus(None if size_limit is None else {"sizeLimit": size_limit})
    assert data["emptyDir"] == {"sizeLimit": size_limit or "2Gi"}
    retention = _retention_bytes(args)
    # below the volume's limit, with room for the WAL and compaction past it
    assert 0.75 * limit_bytes <= retention <= 0.85 * limit_bytes, (retention, limit_bytes)
    assert "--storage.tsdb.retention.time=2d" in args  # the time-based one stays


def test_a_size_limit_with_no_room_for_the_tsdb_or_no_quantity_is_refused():
    with pytest.raises(Exception, match=r"monitoring\.prometheus\.storage\.sizeLimit: expected at"):
        _prometheus({"sizeLimit": "100Mi"})
    with pytest.raises(Exception, match="at '/monitoring/prometheus/storage/sizeLimit'"):
        _prometheus({"sizeLimit": "2 Gi"})
    with pytest.raises(Exception, match="additional properties 'size' not allowed"):
        _prometheus({"size": "2Gi"})

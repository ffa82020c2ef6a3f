"""Ports that one pod binds twice or one Service lists twice are refused at render, naming
both values: the API server refuses a Service with a port twice, and a process cannot bind a
port its pod already binds (Envoy's listeners on 0.0.0.0 cannot share the port of its admin
interface on the loopback either: Envoy stops with "cannot bind ... Address already in
use"). Nor may a port that one NetworkPolicy rule opens on two components' pods be another
port of either (the rule would open that one too). Ports of different pods otherwise, or a
Service's port and its own target, never collide."""

from __future__ import annotations

import pytest
from chartcheck import objects, render

METRICS_FROM = {"networkPolicy": {"metricsFrom": [{"namespaceSelector": {}}]}}
COLLISIONS = [
    # (values, the value named first, the one it collides with, the port)
    ({"triton": {"ports": {"grpc": 8000}}}, "triton.ports.http", "triton.ports.grpc", 8000),
    ({"triton": {"ports": {"metrics": 8001}}}, "triton.ports.grpc", "triton.ports.metrics", 8001),
    ({"triton": {"ports": {"http": 8002}}}, "triton.ports.http", "triton.ports.metrics", 8002),
    ({"operator": {"port": 18000}}, "operator.port", "operator.xdsPort", 18000),
    ({"operator": {"xdsPort": 8080}}, "operator.port", "operator.xdsPort", 8080),
    ({"gateway": {"service": {"port": 8081}}}, "gateway.service.port", "gateway.viewPort", 8081),
    ({"gateway": {"viewPort": 8080}}, "gateway.port", "gateway.viewPort", 8080),
    ({"envoy": {"adminPort": 8001}}, "envoy.adminPort", "envoy.port", 8001),
    ({"envoy": {"metricsPort": 8001}}, "envoy.metricsPort", "envoy.port", 8001),
    ({"envoy": {"adminPort": 9102}}, "envoy.metricsPort", "envoy.adminPort", 9102),
    # one NetworkPolicy rule opens a port on two components' pods: another port of one
    # equal to it would be opened too (clients at the gateway's view port, metricsFrom's
    # peers at Triton's inference ports)
    ({"gateway": {"viewPort": 8001}}, "envoy.port", "gateway.viewPort", 8001),
    ({"envoy": {"metricsPort": 8080}}, "gateway.port", "envoy.metricsPort", 8080),
    ({"operator": {"port": 8000}, **METRICS_FROM}, "operator.port", "triton.ports.http", 8000),
    ({"operator": {"port": 8001}, **METRICS_FROM}, "operator.port", "triton.ports.grpc", 8001),
    (
        {"operator": {"xdsPort": 8002}, **METRICS_FROM},
        "triton.ports.metrics",
        "operator.xdsPort",
        8002,
    ),
]


@pytest.mark.parametrize(("values", "first", "second", "port"), COLLISIONS)
def test_ports_one_pod_or_service_would_hold_twice_are_refused(values, first, second, port):
    with pytest.raises(Exception) as caught:
        render(values)
    refused = str(caught.value)
    assert f"{first}: expected a port of its own, not {port}, which {second} is too" in refused
    assert f"set {first} or {second} to another port" in refused


@pytest.mark.parametrize(
    "values",
    [
        {},  # Envoy's listener and Triton's gRPC port are both 8001: two pods
        {"operator": {"port": 8000}},  # Triton's HTTP port, on Triton's pods (no metricsFrom)
        {"gateway": {"viewPort": 8001}, "networkPolicy": {"enabled": False}},
        {"gateway": {"service": {"port": 8080}}},  # the Service's port is its target's
        {"envoy": {"service": {"port": 9901}}},  # a Service port, not the pod's admin port
        {"gateway": {"enabled": False, "viewPort": 8080}, "tests": {"enabled": False}},
    ],
)
def test_ports_of_different_pods_or_a_service_and_its_target_may_be_equal(values):
    assert objects(render(values))

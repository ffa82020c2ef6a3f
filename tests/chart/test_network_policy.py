"""Who reaches what through the chart's NetworkPolicies, read as Kubernetes reads them.

The rendered policies are evaluated for a source (a pod with its labels in a namespace with
its labels, or an address outside the cluster) and a target pod (a Deployment's pod template)
on one port: a policy applies to the pods its podSelector selects; a rule admits a port it
lists (or every port when it lists none) from any of its peers (or from anywhere when it has
no `from`); a pod no policy selects admits everything. So each test asserts what a source can
reach, not the policies' shape.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

import pytest
from chartcheck import objects, profiles, render, selects

NAMESPACE = "hep"  # where the chart's tests render the release


@dataclass(frozen=True)
class Source:
    """A pod (labels, in a namespace with labels), or an address outside the cluster."""

    ip: str
    namespace: str | None = None
    namespace_labels: dict = field(default_factory=dict)
    labels: dict | None = None  # None: not a pod


def _namespace(name: str, **labels: str) -> dict:
    return {"kubernetes.io/metadata.name": name, **labels}


STRANGER = Source("10.4.0.7", "batch", _namespace("batch"), {"app": "worker"})
CLIENT = Source("10.4.1.2", "cms-jobs", _namespace("cms-jobs", **{"sonicsite/client": "true"}), {})
INGRESS = Source(
    "10.4.2.3",
    "ingress-nginx",
    _namespace("ingress-nginx"),
    {"app.kubernetes.io/name": "ingress-nginx"},
)
SITE_PROMETHEUS = Source(
    "10.4.3.4", "monitoring", _namespace("monitoring"), {"app.kubernetes.io/name": "prometheus"}
)
PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
}


def _peer_admits(peer: dict, source: Source) -> bool:
    if "ipBlock" in peer:
        block = peer["ipBlock"]
        address = ipaddress.ip_address(source.ip)
        return address in ipaddress.ip_network(block["cidr"]) and not any(
            address in ipaddress.ip_network(e) for e in block.get("except", [])
        )
    if source.labels is None:  # selectors pick pods, never an outside address
        return False
    if "namespaceSelector" in peer:
        in_namespace = selects(peer["namespaceSelector"], source.namespace_labels)
    else:
        in_namespace = source.namespace == NAMESPACE
    return in_namespace and selects(peer.get("podSelector", {}), source.labels)


def _rule_admits(rule: dict, source: Source, port: int) -> bool:
    ports = rule.get("ports")
    if ports and port not in [p["port"] for p in ports]:
        return False
    peers = rule.get("from")
    return not peers or any(_peer_admits(p, source) for p in peers)


def reaches(docs: list[dict], source: Source, target: dict, port: int) -> bool:
    """Whether `source` reaches the pods of `target` (a pod template) on `port`."""
    labels = target["metadata"]["labels"]
    policies = [
        d["spec"]
        for d in docs
        if d["kind"] == "NetworkPolicy"
        and "Ingress" in d["spec"].get("policyTypes", ["Ingress"])
        and selects(d["spec"]["podSelector"], labels)
    ]
    if not policies:
        return True
    return any(_rule_admits(r, source, port) for p in policies for r in p.get("ingress", []))


def pods(docs: list[dict]) -> dict[str, dict]:
    """Each component's pod template (the `helm test` Pod as itself), by component."""
    found = {}
    for d in docs:
        if d["kind"] == "Deployment":
            found[d["metadata"]["labels"]["app.kubernetes.io/component"]] = d["spec"]["template"]
        elif d["kind"] == "Pod":
            found[d["metadata"]["labels"]["app.kubernetes.io/component"]] = d
    return found


def own(pod: dict, ip: str = "10.8.0.9") -> Source:
    """One of the release's pods as a source."""
    return Source(ip, NAMESPACE, _namespace(NAMESPACE), pod["metadata"]["labels"])


def _docs(values: dict) -> list[dict]:
    return objects(render(values))


def test_no_pod_outside_the_release_reaches_the_operators_api_or_triton_by_default():
    """networkPolicy.metricsFrom empty (the default): the operator's HTTP port is its whole
    API (PUT /v1/balancing, /v1/held, /v1/work), open to the chart's own components alone."""
    values = {"monitoring": {"prometheus": {"enabled": True}}}
    docs = _docs(values)
    p = pods(docs)
    operator, triton = p["operator"], p["triton"]
    api, xds = 8080, 18000
    http, grpc, metrics = 8000, 8001, 8002
    for port in (api, xds):
        assert not reaches(docs, STRANGER, operator, port), port
        assert not reaches(docs, SITE_PROMETHEUS, operator, port), port
        assert not reaches(docs, own(p["test"]), operator, port), port
    for port in (http, grpc, metrics):
        assert not reaches(docs, STRANGER, triton, port), port
        assert not reaches(docs, own(p["test"]), triton, port), port
    # the callers the chart wires keep their way in
    assert reaches(docs, own(p["gateway"]), operator, api)  # its state, held requests
    assert reaches(docs, own(p["envoy"]), operator, xds)  # Envoy's configuration
    assert reaches(docs, own(p["envoy"]), triton, grpc)
    assert reaches(docs, own(p["operator"]), triton, metrics)  # its scrapes
    assert reaches(docs, own(p["prometheus"]), triton, metrics)  # the chart's own Prometheus
    assert reaches(docs, own(p["prometheus"]), operator, api)


def test_metrics_from_admits_the_sites_prometheus_to_the_metrics_ports_alone():
    docs = _docs({"networkPolicy": {"metricsFrom": [PEER]}})
    p = pods(docs)
    assert reaches(docs, SITE_PROMETHEUS, p["triton"], 8002)
    assert reaches(docs, SITE_PROMETHEUS, p["operator"], 8080)
    assert reaches(docs, SITE_PROMETHEUS, p["gateway"], 8080)
    assert not reaches(docs, SITE_PROMETHEUS, p["triton"], 8000)
    assert not reaches(docs, SITE_PROMETHEUS, p["operator"], 18000)
    assert not reaches(docs, STRANGER, p["operator"], 8080)
    assert not reaches(docs, STRANGER, p["triton"], 8002)


def test_without_clients_envoy_and_the_gateway_take_any_source():
    docs = _docs({})
    p = pods(docs)
    assert reaches(docs, STRANGER, p["envoy"], 8001)
    assert reaches(docs, STRANGER, p["gateway"], 8080)
    assert not reaches(docs, STRANGER, p["gateway"], 8081)  # the one-server view: Envoy's
    assert reaches(docs, own(p["envoy"]), p["gateway"], 8081)


@pytest.mark.parametrize("metrics_from", [[], [PEER]])
def test_with_clients_only_they_the_release_and_the_load_balancers_ranges_get_in(metrics_from):
    """The auth-ingress profile (clients, the Ingress controller among them, a LoadBalancer
    with source ranges for Envoy): whatever metricsFrom is, the gateway is not open to all."""
    values = profiles()["auth-ingress-values"]
    values = {**values, "networkPolicy": {**values["networkPolicy"], "metricsFrom": metrics_from}}
    docs = _docs(values)
    p = pods(docs)
    envoy, gateway = p["envoy"], p["gateway"]
    for target, port in ((envoy, 8001), (gateway, 8080)):
        assert not reaches(docs, STRANGER, target, port), port
        assert reaches(docs, CLIENT, target, port), port
        assert reaches(docs, INGRESS, target, port), port
        assert reaches(docs, own(p["test"]), target, port), port
    inside = Source("192.0.2.10")  # in envoy.service.loadBalancerSourceRanges
    outside = Source("198.51.100.1")
    assert reaches(docs, inside, envoy, 8001)
    assert not reaches(docs, outside, envoy, 8001)
    assert not reaches(docs, inside, gateway, 8080)  # the gateway's Service is no LoadBalancer
    assert reaches(docs, SITE_PROMETHEUS, gateway, 8080) == bool(metrics_from)


def test_the_gateways_load_balancer_ranges_reach_the_gateway_alone():
    ranges = ["203.0.113.0/24"]
    service = {"type": "LoadBalancer", "loadBalancerSourceRanges": ranges}
    values = {
        "gateway": {"service": {**service, "externalTrafficPolicy": "Local"}},
        "networkPolicy": {"clients": [{"namespaceSelector": {"matchLabels": {"a": "b"}}}]},
    }
    docs = _docs(values)
    p = pods(docs)
    assert reaches(docs, Source("203.0.113.5"), p["gateway"], 8080)
    assert not reaches(docs, Source("203.0.113.5"), p["envoy"], 8001)
    assert not reaches(docs, Source("203.0.114.5"), p["gateway"], 8080)
    # a ClusterIP Service's ranges mean nothing: no address gets in by them
    cluster_ip = {**values, "gateway": {"service": {"loadBalancerSourceRanges": ranges}}}
    docs = _docs(cluster_ip)
    assert not reaches(docs, Source("203.0.113.5"), pods(docs)["gateway"], 8080)


def test_the_evaluator_reads_selectors_and_rules_as_kubernetes_does():
    """The reading the tests above rely on, on hand-written policies."""
    assert selects({}, {"a": "b"})
    assert not selects({"matchLabels": {"a": "c"}}, {"a": "b"})
    assert selects(
        {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}, {"a": "b"}
    )
    assert selects({"matchExpressions": [{"key": "x", "operator": "DoesNotExist"}]}, {"a": "b"})
    assert not selects(
        {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["b"]}]}, {"a": "b"}
    )
    pod = {"metadata": {"labels": {"app": "t"}}}
    policy = {
        "kind": "NetworkPolicy",
        "spec": {
            "podSelector": {"matchLabels": {"app": "t"}},
            "policyTypes": ["Ingress"],
            "ingress": [{"ports": [{"port": 1}]}, {"from": [{"podSelector": {}}]}],
        },
    }
    assert reaches([policy], STRANGER, pod, 1)  # no `from`: anyone, on its port
    assert not reaches([policy], STRANGER, pod, 2)  # a podSelector alone: the same namespace
    assert reaches([policy], own(pod), pod, 2)
    assert not reaches([policy], Source("10.0.0.1"), pod, 2)
    assert reaches([], STRANGER, pod, 2)  # no policy selects it: open


def _refusal(values: dict) -> str:
    with pytest.raises(Exception) as caught:
        render(values)
    return str(caught.value)


def test_prometheus_operators_scraper_reaches_every_metrics_port_in_its_profile():
    """The prometheus-operator profile's monitors are scraped by the site's Prometheus, outside
    the release: the profile lists it in metricsFrom, so it reaches each port a monitor names."""
    docs = _docs(profiles()["prometheus-operator-values"])
    p = pods(docs)
    monitors = [d for d in docs if d["kind"] in ("PodMonitor", "ServiceMonitor")]
    assert len(monitors) == 4
    for component, port in (("triton", 8002), ("operator", 8080), ("gateway", 8080)):
        assert reaches(docs, SITE_PROMETHEUS, p[component], port), component
    assert reaches(docs, SITE_PROMETHEUS, p["envoy"], 9102)
    assert not reaches(docs, STRANGER, p["triton"], 8002)


def test_monitors_whose_scraper_the_policy_blocks_are_refused():
    """prometheus-operator's monitors with the NetworkPolicy on and metricsFrom empty would be
    scraped by nobody: refused, naming the values; the chart's own Prometheus (a release pod)
    needs no metricsFrom, nor does a release without the policy."""
    values = {**profiles()["prometheus-operator-values"], "networkPolicy": {"metricsFrom": []}}
    refused = _refusal(values)
    assert "networkPolicy.metricsFrom: expected the site's Prometheus" in refused
    assert "monitoring.prometheusOperator.enabled" in refused and "podSelector" in refused
    off = {**values, "networkPolicy": {"enabled": False, "metricsFrom": []}}
    assert not [d for d in _docs(off) if d["kind"] == "NetworkPolicy"]
    own_prometheus = _docs({"monitoring": {"prometheus": {"enabled": True}}})
    p = pods(own_prometheus)
    assert reaches(own_prometheus, own(p["prometheus"]), p["triton"], 8002)


LOAD_BALANCER = {"type": "LoadBalancer", "loadBalancerSourceRanges": ["203.0.113.0/24"]}
CLIENTS = {"clients": [{"namespaceSelector": {"matchLabels": {"a": "b"}}}]}


@pytest.mark.parametrize("component", ["envoy", "gateway"])
def test_source_ranges_admitted_by_address_need_the_clients_addresses(component):
    """The NetworkPolicy admits a LoadBalancer's source ranges by address, which the Service
    keeps only with externalTrafficPolicy Local (with Cluster a node forwards each connection
    from its own address): with clients set, Cluster is refused, naming the value."""
    where = f"{component}.service"
    values = {component: {"service": LOAD_BALANCER}, "networkPolicy": CLIENTS}
    refused = _refusal(values)
    assert f"{where}.externalTrafficPolicy: expected Local" in refused
    assert f"{where}.loadBalancerSourceRanges" in refused and "its own address" in refused
    local = {component: {"service": {**LOAD_BALANCER, "externalTrafficPolicy": "Local"}}}
    docs = _docs({**values, **local})
    (service,) = [
        d
        for d in docs
        if d["kind"] == "Service" and d["metadata"]["name"] == f"site-sonicsite-{component}"
    ]
    assert service["spec"]["externalTrafficPolicy"] == "Local"
    port = 8001 if component == "envoy" else 8080
    assert reaches(docs, Source("203.0.113.5"), pods(docs)[component], port)
    # without clients the policy admits any source: Cluster's rewritten addresses too
    (service,) = [
        d
        for d in _docs({component: {"service": LOAD_BALANCER}})
        if d["kind"] == "Service" and d["metadata"]["name"] == f"site-sonicsite-{component}"
    ]
    assert service["spec"]["externalTrafficPolicy"] == "Cluster"


def test_only_services_reachable_from_outside_take_a_traffic_policy():
    """The API server refuses externalTrafficPolicy on a ClusterIP Service."""
    for kind, expected in (("ClusterIP", None), ("NodePort", "Local"), ("LoadBalancer", "Local")):
        service = {"type": kind, "externalTrafficPolicy": "Local"}
        docs = _docs({"envoy": {"service": service}, "gateway": {"service": service}})
        for name in ("site-sonicsite-envoy", "site-sonicsite-gateway"):
            (found,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == name]
            assert found["spec"].get("externalTrafficPolicy") == expected, (kind, name)
    assert "at '/envoy/service/externalTrafficPolicy'" in _refusal(
        {"envoy": {"service": {"externalTrafficPolicy": "local"}}}
    )


OUTSIDE_CLIENT = Source("198.51.100.7")  # a client outside the cluster, its address kept


@pytest.mark.parametrize("kind", ["LoadBalancer", "NodePort"])
@pytest.mark.parametrize("component", ["envoy", "gateway"])
def test_an_outside_service_that_the_clients_rule_would_close_to_everyone_is_refused(
    kind, component
):
    """A LoadBalancer or NodePort Service is for clients outside the cluster; with
    networkPolicy.clients the policy admits only those peers and the release's pods, so with
    no address of theirs admitted (a LoadBalancer's loadBalancerSourceRanges, an ipBlock
    among the clients) every outside client would be refused: refused at render, naming what
    to set."""
    where = f"{component}.service"
    service = {"type": kind, "externalTrafficPolicy": "Local"}
    refused = _refusal({component: {"service": service}, "networkPolicy": CLIENTS})
    assert f"{where}.type: {kind} with networkPolicy.clients" in refused
    assert "every client from outside the cluster would be refused" in refused
    if kind == "LoadBalancer":
        assert f"set {where}.loadBalancerSourceRanges" in refused
    assert "ipBlock" in refused and "or leave networkPolicy.clients empty" in refused
    # the admin's way: the outside clients' addresses among the clients, kept by Local
    outside = {"ipBlock": {"cidr": "198.51.100.0/24"}}
    values = {component: {"service": service}, "networkPolicy": {"clients": [outside]}}
    docs = _docs(values)
    port = 8001 if component == "envoy" else 8080
    assert reaches(docs, OUTSIDE_CLIENT, pods(docs)[component], port)
    # with Cluster every outside connection arrives from a node's address: refused, naming it
    cluster = {component: {"service": {"type": kind}}, "networkPolicy": {"clients": [outside]}}
    assert f"{where}.externalTrafficPolicy: expected Local" in _refusal(cluster)
    # a ClusterIP Service (behind an Ingress whose controller is a client) needs no address
    assert _docs({"networkPolicy": CLIENTS})

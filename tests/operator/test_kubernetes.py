"""Kubernetes discovery through the kubernetes client, against a small in-process API server
that serves real EndpointSlice bodies (list with a label selector, get, merge-patch)."""

from __future__ import annotations

import copy
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest
from polling import wait_until
from sonicsite.models.samples import generate
from sonicsite.operator import xds_ads
from sonicsite.operator.controller import Operator
from sonicsite.operator.discovery import KubernetesDiscovery, kubernetes_api
from stock import stock_infer

from sonicsite.local import envoy
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import stop_group

NAMESPACE, SERVICE = "hep", "sonicsite-triton"


def endpoint_slice(name: str, pod: str, server, service: str = SERVICE) -> dict:
    """A discovery.k8s.io/v1 EndpointSlice as the EndpointSlice controller writes it."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "resourceVersion": "1",
            "labels": {
                "kubernetes.io/service-name": service,
                "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
            },
        },
        "addressType": "IPv4",
        "endpoints": [
            {
                "addresses": [server.host],
                "conditions": {"ready": True, "serving": True, "terminating": False},
                "targetRef": {"kind": "Pod", "name": pod, "namespace": NAMESPACE},
                "nodeName": "node-1",
            }
        ],
        "ports": [
            {"name": "grpc", "port": server.grpc_port, "protocol": "TCP"},
            {"name": "http", "port": server.http_port, "protocol": "TCP"},
            {"name": "metrics", "port": server.metrics_port, "protocol": "TCP"},
        ],
    }


class ApiServer:
    """The part of the Kubernetes API the operator reads, over real HTTP."""

    def __init__(self, objects: list[dict]):
        self.objects = {o["metadata"]["name"]: o for o in objects}
        self.version = 1
        store = self
        base = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"

        class Handler(BaseHTTPRequestHandler):
            def _send(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                url = urllib.parse.urlparse(self.path)
                if url.path == base:
                    selector = urllib.parse.parse_qs(url.query).get("labelSelector", [""])[0]
                    key, _, value = selector.partition("=")
                    items = [
                        o
                        for o in store.objects.values()
                        if not key or o["metadata"]["labels"].get(key) == value
                    ]
                    self._send(
                        200,
                        {
                            "apiVersion": "discovery.k8s.io/v1",
                            "kind": "EndpointSliceList",
                            "metadata": {"resourceVersion": str(store.version)},
                            "items": items,
                        },
                    )
                elif url.path.startswith(base + "/") and url.path[len(base) + 1 :] in store.objects:
                    self._send(200, store.objects[url.path[len(base) + 1 :]])
                else:
                    self._send(
                        404,
                        {
                            "kind": "Status",
                            "status": "Failure",
                            "code": 404,
                            "reason": "NotFound",
                            "message": f"{url.path} not found",
                        },
                    )

            def do_PATCH(self) -> None:
                name = urllib.parse.urlparse(self.path).path[len(base) + 1 :]
                patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                store.version += 1
                merged = {**store.objects[name], **patch}
                merged["metadata"]["resourceVersion"] = str(store.version)
                store.objects[name] = merged
                self._send(200, merged)

            def log_message(self, *args) -> None:
                return

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def patch_endpoint(self, name: str, **conditions) -> None:
        import urllib.request

        endpoints = copy.deepcopy(self.objects[name]["endpoints"])
        endpoints[0]["conditions"].update(conditions)
        request = urllib.request.Request(
            f"{self.url}/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices/{name}",
            data=json.dumps({"endpoints": endpoints}).encode(),
            method="PATCH",
            headers={"Content-Type": "application/merge-patch+json"},
        )
        urllib.request.urlopen(request, timeout=5).read()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def api(site):
    server = ApiServer(
        [endpoint_slice(f"{SERVICE}-{k}", f"triton-pod-{k}", s) for k, s in enumerate(site.servers)]
    )
    yield server
    server.close()


def _discovery(api: ApiServer, models) -> KubernetesDiscovery:
    return KubernetesDiscovery(kubernetes_api(api.url), NAMESPACE, SERVICE, tuple(models))


def test_endpoint_slices_become_servers_draining_on_termination(site, api):
    discovery = _discovery(api, site.models)
    servers = discovery.servers()
    assert [(s.id, s.grpc_port, s.draining) for s in servers] == [
        ("triton-pod-0", site.servers[0].grpc_port, False),
        ("triton-pod-1", site.servers[1].grpc_port, False),
    ]
    # The pod is being deleted: not ready, still serving its in-flight requests.
    api.patch_endpoint(f"{SERVICE}-1", ready=False, serving=True, terminating=True)
    assert [(s.id, s.draining) for s in discovery.servers()] == [
        ("triton-pod-0", False),
        ("triton-pod-1", True),
    ]
    # Gone from service: no longer a server.
    api.patch_endpoint(f"{SERVICE}-1", ready=False, serving=False, terminating=True)
    assert [s.id for s in discovery.servers()] == ["triton-pod-0"]
    # Losing the API server must not empty Envoy: the last answer stands, and is counted.
    api.close()
    assert [s.id for s in discovery.servers()] == ["triton-pod-0"] and discovery.errors == 1


def test_each_pools_service_gives_its_servers_their_pool(site):
    """The chart's pools: one headless Service per pool; a server is in its Service's pool."""
    gpu, cpu = f"{SERVICE}-gpu", f"{SERVICE}-cpu"
    first, second = site.servers
    api = ApiServer(
        [
            endpoint_slice(f"{gpu}-a", "gpu-pod", first, service=gpu),
            endpoint_slice(f"{cpu}-a", "cpu-pod", second, service=cpu),
        ]
    )
    try:
        pools = ((gpu, "gpu"), (cpu, "cpu"))
        discovery = KubernetesDiscovery(
            kubernetes_api(api.url), NAMESPACE, SERVICE, tuple(site.models), pools=pools
        )
        found = [(s.id, s.pool, s.grpc_port) for s in discovery.servers()]
        assert found == [("cpu-pod", "cpu", second.grpc_port), ("gpu-pod", "gpu", first.grpc_port)]
        alone = KubernetesDiscovery(kubernetes_api(api.url), NAMESPACE, gpu, tuple(site.models))
        assert [(s.id, s.pool) for s in alone.servers()] == [("gpu-pod", "")]
    finally:
        api.close()


def test_envoy_routes_to_the_servers_kubernetes_names(site, api, tmp_path):
    """An operator with Kubernetes discovery configures a real Envoy; a stock client works."""
    listen, admin = free_ports(2)
    operator = Operator(_discovery(api, site.models), "127.0.0.1", listen)
    operator.step()
    server, xds = xds_ads.serve(xds_ads.AdsServer.of(operator), "127.0.0.1", 0)
    stop = threading.Event()
    loop = threading.Thread(target=operator.run, args=(stop,), daemon=True)
    loop.start()
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(envoy.bootstrap(admin, "127.0.0.1", xds)))
    proc = envoy.start(config, tmp_path / "envoy.log")
    try:
        envoy.wait_ready(proc, f"127.0.0.1:{admin}", tmp_path / "envoy.log")
        wanted = sorted(f"127.0.0.1:{s.grpc_port}" for s in site.servers)
        wait_until(
            lambda: envoy.healthy_hosts(f"127.0.0.1:{admin}", "triton") == wanted,
            "Envoy to see both servers healthy",
        )
        sample = generate("simple", 2, seed=1)
        got = stock_infer(
            f"127.0.0.1:{listen}", "simple", sample.reference_inputs(0, 2), ["OUTPUT0"]
        )
        np.testing.assert_array_equal(got["OUTPUT0"], sample.expected["sum"])
        assert [s["id"] for s in operator.view()[1]["servers"]] == ["triton-pod-0", "triton-pod-1"]
    finally:
        stop.set()
        stop_group(proc.pid)
        proc.wait(timeout=30)
        server.stop(grace=None)

"""Which Triton servers the site has. Locally: the launcher's state file (the process
registry). On Kubernetes: the EndpointSlices of Triton's headless Service, with each
endpoint's readiness and termination. Both answer the same `servers()` call."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from sonicsite.contract.wire import ServerRecord, read_state_file


class Discovery(Protocol):
    def servers(self) -> list[ServerRecord]: ...


@dataclass(frozen=True)
class LocalDiscovery:
    """Servers of a local site, read from its state file on every call (it is small)."""

    site_dir: Path

    def servers(self) -> list[ServerRecord]:
        try:
            return list(read_state_file(self.site_dir).servers)
        except FileNotFoundError:
            return []  # before the launcher's first write: no change to act on


SERVICE_LABEL = "kubernetes.io/service-name"
# (connect, read) seconds for one call to the API server: the client's default is none, and a
# dropped connection would then hold the operator's step (and its first, before the API
# serves) for ever
API_TIMEOUT_S = (3.0, 5.0)
API_RETRIES = 1  # urllib3's default is 3: one hung API server costs 4 read timeouts a call


@dataclass
class KubernetesDiscovery:
    """Servers behind a headless Service, from its EndpointSlices (kubernetes client).

    An endpoint that is serving is a server; one that is terminating while still serving is
    a draining server (Envoy sends it nothing new while its in-flight requests finish); one
    that is neither is left out. Every replica holds the same model repository, `models`.
    With `pools` ((service, pool) pairs) the servers are those of each pool's Service, each
    with its pool; without, those of `service`, in the default pool.
    If the API server cannot be read (or does not answer within `timeout_s`), the last
    answer stands, with a warning naming the Service: losing the API server must not empty
    Envoy.
    """

    api: object  # kubernetes.client.DiscoveryV1Api
    namespace: str
    service: str
    models: tuple[str, ...]
    ports: dict[str, str] = field(
        default_factory=lambda: {"grpc": "grpc", "http": "http", "metrics": "metrics"}
    )
    pools: tuple[tuple[str, str], ...] = ()
    timeout_s: tuple[float, float] = API_TIMEOUT_S  # (connect, read), per call
    errors: int = 0
    _last: list[ServerRecord] = field(default_factory=list)

    def servers(self) -> list[ServerRecord]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        servers: list[ServerRecord] = []
        for service, pool in self.pools or ((self.service, ""),):
            try:
                slices = self.api.list_namespaced_endpoint_slice(
                    self.namespace,
                    label_selector=f"{SERVICE_LABEL}={service}",
                    _request_timeout=self.timeout_s,
                )
            except (ApiException, HTTPError, OSError, ValueError) as exc:
                self.errors += 1
                logging.getLogger(__name__).warning(
                    "discovery: EndpointSlices of Service %s/%s unreadable (%d errors so far; "
                    "keeping the last %d server(s)): %s: %s",
                    self.namespace,
                    service,
                    self.errors,
                    len(self._last),
                    type(exc).__name__,
                    exc,
                )
                return self._last
            servers += self._endpoints(slices, pool)
        self._last = sorted(servers, key=lambda s: s.id)
        return self._last

    def _endpoints(self, slices, pool: str) -> list[ServerRecord]:
        """The servers of one Service's EndpointSlices, in `pool`."""
        servers = []
        for item in slices.items:
            ports = {p.name: p.port for p in item.ports or []}
            missing = [n for n in self.ports.values() if n not in ports]
            if missing:
                logging.getLogger(__name__).warning(
                    "EndpointSlice %s has no ports named %s", item.metadata.name, missing
                )
                continue
            for endpoint in item.endpoints or []:
                conditions = endpoint.conditions
                ready = bool(conditions and conditions.ready)
                serving = bool(
                    conditions and (conditions.serving if conditions.serving is not None else ready)
                )
                terminating = bool(conditions and conditions.terminating)
                if not serving:
                    continue
                ref = endpoint.target_ref
                servers.append(
                    ServerRecord(
                        ref.name if ref is not None and ref.name else endpoint.addresses[0],
                        endpoint.addresses[0],
                        ports[self.ports["grpc"]],
                        ports[self.ports["http"]],
                        ports[self.ports["metrics"]],
                        self.models,
                        draining=terminating or not ready,
                        pool=pool,
                    )
                )
        return servers


def kubernetes_api(host: str | None = None):
    """The DiscoveryV1 API: in the cluster from the pod's service account, else at `host`;
    retrying a failed call `API_RETRIES` times, not urllib3's 3 (each bounded by
    `API_TIMEOUT_S`, KubernetesDiscovery's), so that a hung API server costs a step seconds."""
    from kubernetes import client, config

    if host is None:
        config.load_incluster_config()
        configuration = client.Configuration.get_default_copy()
    else:
        configuration = client.Configuration()
        configuration.host = host
    configuration.retries = API_RETRIES
    return client.DiscoveryV1Api(client.ApiClient(configuration))

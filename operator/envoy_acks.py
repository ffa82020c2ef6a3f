"""What every Envoy has applied of the operator's xDS snapshots, so that a route changes
only once every Envoy can follow it (placement's hand-over to and from the holder).

Kept per ADS stream (xds_ads.py `AdsStream.key`: the Envoy's node id and the stream's
serial), not per node id: Envoys that share a node id (the chart's replicas before each had
its own, or a copied bootstrap) are still each waited for, and one that reconnects keeps its
old stream's versions counted until that stream is gone (ENVOY_GONE_S)."""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from .xds_resources import model_cluster, rest_cluster

ENVOY_GONE_S = 10.0  # an Envoy not heard from for this long no longer holds a route back
FORGET_S = 10 * ENVOY_GONE_S  # a stream not heard from for this long is dropped from memory


@dataclass
class EnvoyAcks:
    """Which models every Envoy can send to their own cluster: the clusters and endpoints it
    last applied (the versions it acknowledged on its ADS stream, xds_ads.py) name them. A
    newly loaded model's route leaves the holder only then: Envoy applies each resource
    type on its own, and a route to a cluster it has not yet got (or got without endpoints)
    answers UNAVAILABLE with no text; held requests meanwhile go straight to the new server
    from the gateway."""

    published: dict[tuple[str, str], frozenset[str]] = field(default_factory=dict)
    # (kind, version) -> what it sends where: routes, the models routed to their own
    # clusters; endpoints, the (model, server) pairs of the models' clusters
    sending: dict[tuple[str, str], frozenset] = field(default_factory=dict)
    # by ADS stream: (kind, resource names) -> the version it applied, and when it was
    # last heard from (an answer, or a stream with nothing unanswered: `alive`)
    applied_by: dict[str, tuple[dict[tuple, str], float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(
        self,
        versions: dict[str, str],
        models: list[str],
        routed: Iterable[str] = (),
        replicas: Iterable[tuple[str, str]] = (),
    ) -> None:
        """A snapshot's versions, its models, the models its routes send to their own
        clusters and its (model, server) endpoints."""
        with self._lock:
            for kind in ("clusters", "endpoints"):
                self.published.pop((kind, versions[kind]), None)  # to the end: the newest
                self.published[(kind, versions[kind])] = frozenset(models)
            for old in list(self.published)[:-40]:  # the last snapshots' are enough
                del self.published[old]
            for kind, sends in (("routes", routed), ("endpoints", replicas)):
                if kind in versions:
                    self.sending.pop((kind, versions[kind]), None)
                    self.sending[(kind, versions[kind])] = frozenset(sends)
            for old in list(self.sending)[:-40]:
                del self.sending[old]

    def applied(self, stream: str, kind: str, names: list[str], version: str, now: float) -> None:
        """The Envoy on ADS stream `stream` applied `version` of `kind`'s resources `names`
        (none: all of the kind). Endpoints are kept per cluster: Envoy subscribes to all its
        clusters' at once, and a cluster it no longer subscribes to no longer counts. Streams
        not heard from for long (closed ones) are forgotten."""
        with self._lock:
            for old in [k for k, (_, at) in self.applied_by.items() if now - at >= FORGET_S]:
                del self.applied_by[old]
            versions = self.applied_by.get(stream, ({}, now))[0]
            if kind == "endpoints":
                for key in [k for k in versions if k[0] == kind and k[1][0] not in names]:
                    del versions[key]
                for name in names:
                    versions[(kind, (name,))] = version
            else:
                versions[(kind, tuple(sorted(names)))] = version
            self.applied_by[stream] = (versions, now)

    def alive(self, stream: str, now: float) -> None:
        """The Envoy on `stream` is still there: the stream is open and it answered what it
        got."""
        with self._lock:
            if stream in self.applied_by:
                self.applied_by[stream] = (self.applied_by[stream][0], now)

    def routable(self, now: float) -> set[str]:
        """The models whose clusters (gRPC and REST) and their endpoints every Envoy
        heard from now has applied."""

        def has(versions: dict[tuple, str], kind: str, names: tuple, model: str) -> bool:
            return model in self.published.get((kind, versions.get((kind, names), "")), ())

        found = []
        with self._lock:
            for versions, at in self.applied_by.values():
                if now - at >= ENVOY_GONE_S:
                    continue
                models = self.published.get(("clusters", versions.get(("clusters", ()), "")), ())
                found.append(
                    {
                        m
                        for m in models
                        if has(versions, "endpoints", (model_cluster(m),), m)
                        and has(versions, "endpoints", (rest_cluster(m),), m)
                    }
                )
        return set.intersection(*found) if found else set()

    def routes_gone(self, model: str, server: str, now: float) -> bool:
        """Whether no Envoy heard from now can send `model`'s requests to `server`: the routes
        it applied send the model elsewhere (the holder), or the endpoints it applied for
        the model's clusters leave the server out. A version this operator no longer
        knows counts as sending."""
        clusters = (model_cluster(model), rest_cluster(model))
        with self._lock:
            for versions, at in self.applied_by.values():
                if now - at >= ENVOY_GONE_S:
                    continue
                routes = [v for (kind, _), v in versions.items() if kind == "routes"]
                routed = [self.sending.get(("routes", v)) for v in routes]
                if routes and all(r is not None and model not in r for r in routed):
                    continue
                for cluster in clusters:
                    version = versions.get(("endpoints", (cluster,)))
                    if version is None:
                        continue  # never subscribed: it has no such cluster
                    pairs = self.sending.get(("endpoints", version))
                    if pairs is None or (model, server) in pairs:
                        return False
        return True

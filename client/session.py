"""The worker's entry point: connect to a site, lay out events, stream them.

client = Client.connect()                      # SONICSITE_URL, or the local site file
soa = client.allocate(schema, rows)            # in shared memory when transport="shm"
                                               # ("cuda": GPU regions, staged from the host)
spec = TensorSpec("particlenet_ak4").append_block("pf_points", "etarel", "phirel")...
result = client.stream("particlenet_ak4", spec, batch=16).run(source, on_result)
# in the worker's process, or the site with the process as fallback (local= LocalModels):
result = client.stream("particlenet_ak4", spec, batch=16, backend="auto").run(...)
# in process only, no site (the metadata from the model's config, ModelInfo.from_config):
client = Client(local=LocalModels(folder, infos=lambda m: ModelInfo.from_config(path_of(m))))

A stream checks its spec against the model, and that the site has the model at all, before
any chunk goes (stream_checks.py); Ctrl-C stops it (stream_guard.py `run_all`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from sonicsite.contract.wire import SiteRecord

from .admitted import Admitted
from .backend_auto import AutoPolicy, AutoSwitch
from .backend_local import LocalModels, LocalRunner, LocalStream
from .balancer import Balancer, Endpoint
from .cuda import CudaRegionPool, CudaUnavailable
from .declared_work import WorkReporter, work_url
from .discovery import DiscoveryError, discover
from .engine import Stream
from .errors import InferError, not_found
from .failover import PATHS, Failover
from .layout import Column, Columns, SoA, plan_offsets
from .plan import CopyPlan, make_plan
from .shm import RegionPool, ShmTransport, staging
from .spec import ModelInfo, SpecError, TensorSpec
from .stream_checks import ModelNotServed
from .stream_options import StreamOptions
from .timeouts import PathLatencies
from .tracing import ClientTracing
from .transport_grpc import CONTROL_TIMEOUT_S, GrpcTransport
from .transport_http import HttpTransport

TRANSPORTS = ("grpc", "http", "shm", "cuda")
SHARED_MEMORY = ("shm", "cuda")
MODES = ("site", "direct")


class Client:
    def __init__(
        self,
        site: SiteRecord | None = None,
        transport: str = "grpc",
        mode: str | None = None,
        slot_bytes: int = 1 << 22,
        cuda_device: int = 0,
        token: str | None = None,
        tracing: ClientTracing | None = None,
        local: LocalModels | None = None,
        auto: AutoPolicy | None = None,
        declare_work: bool = True,
    ):
        """`local`: where the in-process backend finds its models and how it runs them
        (streams with backend "local" or "auto" need it); `auto`: backend "auto"'s
        deadlines (backend_auto.py). `token`: a bearer token for a site that requires one
        (Envoy's JWT, the gateway's tokens); default SONICSITE_TOKEN. `tracing`: spans of
        every call (tracing.py); default: from the OpenTelemetry variables, off when they
        name no endpoint (a tracing made here is closed with the client). `declare_work`:
        in site mode, tell the site the requests its streams have left (declared_work.py),
        so that its autoscaler starts no server the work would not keep busy. `site`: where
        the site is (discovery.py; `connect` finds it); none: models run in process only
        (`local=`, streams with backend "local")."""
        site = site if site is not None else SiteRecord(source="none (in process only)")
        if transport not in TRANSPORTS:
            raise ValueError(f"transport: expected one of {TRANSPORTS}, got {transport!r}")
        balanced = site.grpc if transport != "http" else site.http
        mode = mode or ("site" if balanced and transport not in SHARED_MEMORY else "direct")
        if mode not in MODES:
            raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
        if mode == "site" and transport in SHARED_MEMORY:
            raise ValueError("mode: shared memory needs a co-located server; use mode='direct'")
        if mode == "site" and not balanced:
            raise ValueError(f"mode: the site ({site.source}) has no balanced {transport} endpoint")
        self.site, self.transport, self.mode = site, transport, mode
        self.local, self.auto = local, auto or AutoPolicy()
        token = os.environ.get("SONICSITE_TOKEN", "") if token is None else token
        self._own_tracing = ClientTracing.from_environment() if tracing is None else None
        self.tracing = tracing or self._own_tracing
        self._endpoints: list[Endpoint] = []
        self.pool: RegionPool | CudaRegionPool | None = None
        self.admitted = Admitted()  # the models that have answered: a shed spares them
        if mode == "site":
            self._endpoints = _site_endpoints(site, transport, token, self.tracing, self.admitted)
        else:
            grpcs = [
                GrpcTransport(s.grpc, s.id, tracing=self.tracing, admitted=self.admitted)
                for s in site.servers
            ]
            if transport in SHARED_MEMORY:
                try:
                    self.pool = (
                        RegionPool(grpcs, slot_bytes)
                        if transport == "shm"
                        else CudaRegionPool(grpcs, slot_bytes, cuda_device)
                    )
                except CudaUnavailable:
                    for g in grpcs:
                        g.close()
                    raise
                self._endpoints = [Endpoint(g.server, ShmTransport(g, self.pool)) for g in grpcs]
            elif transport == "grpc":
                self._endpoints = [Endpoint(g.server, g) for g in grpcs]
            else:
                for g in grpcs:
                    g.close()
                self._endpoints = [
                    Endpoint(
                        s.id,
                        HttpTransport(s.http, s.id, tracing=self.tracing, admitted=self.admitted),
                    )
                    for s in site.servers
                ]
        self._models = {s.id: s.models for s in site.servers}
        self._failovers: dict[str, Failover] = {}  # per model: its shed holds every path
        self._latencies: dict[tuple[str, int], PathLatencies] = {}  # per model and batch
        self._autos: dict[str, AutoSwitch] = {}  # backend "auto": per model, where it runs
        self.work: WorkReporter | None = None  # the streams' work left, reported to the site
        if declare_work and mode == "site" and site.http:
            self.work = WorkReporter(work_url(site.http), token=token)

    @classmethod
    def connect(
        cls,
        transport: str = "grpc",
        mode: str | None = None,
        endpoints: list[str] | None = None,
        url: str | None = None,
        site: Path | None = None,
        **kwargs,
    ) -> Client:
        """The site from `endpoints`, `url`, SONICSITE_URL or a site file (discovery.py),
        asked with the client's token (`token=`, default SONICSITE_TOKEN)."""
        site_record = discover(endpoints, url, site, kwargs.get("token"))
        return cls(site_record, transport, mode, **kwargs)

    def allocate(self, schema: Iterable[Column], rows: int) -> SoA:
        """A SoA for `rows` rows; with shared memory, inside a registered region so that the
        server reads (and writes) its columns where they are."""
        if self.pool is None or self.pool.device_memory:
            return SoA.allocate(schema, rows)
        schema = list(schema)
        _, size = plan_offsets(schema, rows)
        slot = self.pool.acquire(size)
        return SoA.allocate(schema, rows, buffer=slot.buffer)

    def plan(
        self, model: str, spec: TensorSpec, columns: Columns, strict: bool = False
    ) -> CopyPlan:
        """The copy plan this client's streams send `columns` with (`make_plan` against the
        site's metadata), with the copies its transport adds: shared memory stages what lies
        outside its registered regions, which `make_plan` alone cannot know."""
        sendable = staging(self.pool) if self.pool is not None else None
        return make_plan(spec, self.model_info(model), columns, strict, sendable=sendable)

    def balancer(self, model: str) -> Balancer | Failover:
        """Where the requests of `model` go: in direct mode the servers serving it; in site
        mode Envoy, the gateway, then those servers (failover.py), one Failover per model."""
        serving = [
            e
            for e in self._endpoints
            if e.path != "direct" or not self._models.get(e.id) or model in self._models[e.id]
        ]
        if not serving:
            raise ModelNotServed(f"model {model!r}: {self._no_server()}")
        if self.mode == "direct":
            return Balancer(serving)
        if model not in self._failovers:
            paths = {
                name: Balancer([e for e in serving if e.path == name])
                for name in PATHS
                if any(e.path == name for e in serving)
            }
            self._failovers[model] = Failover(paths)
        return self._failovers[model]

    def stream(self, model: str, spec: TensorSpec, **options) -> Stream | LocalStream:
        """A stream of `model`'s events; `options` are StreamOptions. Its per-attempt
        deadlines are learnt from the latencies this client saw for the model and batch.
        `backend="local"` runs every chunk in this process, `"auto"` the site while it
        answers and this process when it does not (backend_local.py, backend_auto.py).
        The spec must be `model`'s: its requests name the spec's model, the checks before
        sending read the stream's. A model no server serves is refused here in direct mode,
        and at `run`, before any chunk goes, when the site says it has none of that name
        (ModelNotServed, naming the models the site serves: a site that places models on
        demand serves more than its servers list now)."""
        if spec.model != model:
            raise SpecError(
                [
                    f"the stream is of model {model!r}, its spec of {spec.model!r}: requests "
                    "would go to the spec's model, checked against the stream's metadata "
                    f"(build the spec as TensorSpec({model!r}))"
                ]
            )
        if not spec.output_names:  # every answer would be dropped: a job with no results
            raise SpecError(
                [
                    f"outputs: the spec of {model!r} has none, so every answer would be "
                    "dropped; expected append_output(name, column) (written into the column) "
                    "or append_output(name) (given to on_result as an array)"
                ]
            )
        stream_options = StreamOptions(**options)
        runner = None
        if stream_options.backend != "site":
            if self.local is None:
                raise ValueError(
                    f"backend: {stream_options.backend!r} runs the model in this process; "
                    "give the client local=LocalModels(folder) to say where models are"
                )
            runner = LocalRunner(model, self.local, stream_options.compile, self._info_of(model))
            if stream_options.backend == "local":
                return LocalStream(runner, spec, stream_options)
        balancer = self.balancer(model)
        statistics = None
        if isinstance(balancer, Failover):  # behind Envoy: read each server's statistics directly
            direct = balancer.paths.get("direct")
            statistics = {e.id: e.transport for e in direct.endpoints} if direct else {}
        latencies = self._latencies.setdefault((model, stream_options.batch), PathLatencies())
        auto = None
        if runner is not None:  # one per model: a job's streams share what they learnt
            auto = self._autos.setdefault(model, AutoSwitch(self.auto))
        served = self.site.models  # what the servers list: named if the site lacks the model
        return Stream(
            balancer,
            model,
            spec,
            stream_options,
            statistics,
            latencies,
            runner,
            auto,
            self.work,
            served,
        )

    def model_info(self, model: str) -> ModelInfo:
        """`model`'s tensors and batching as the site's servers say (what `make_plan` checks a
        spec against): from the first of its endpoints that answers; ModelNotServed when
        every endpoint says it has no such model, else DiscoveryError (a ValueError) naming
        each one's failure
        (each endpoint once: an InferError's text begins with its endpoint)."""
        errors, missing = [], []
        for endpoint in self.balancer(model).endpoints:
            try:
                return endpoint.transport.model_info(model, CONTROL_TIMEOUT_S)
            except InferError as exc:
                errors.append(str(exc))
                missing.append(not_found(exc))
            except OSError as exc:
                errors.append(f"{endpoint.id}: {exc}")
                missing.append(False)
        said = "; ".join(errors)
        if missing and all(missing):
            raise ModelNotServed(
                f"model {model!r}: not found on the site ({said}); {self._serves()}"
            )
        raise DiscoveryError(
            f"model {model!r}: no metadata: no endpoint of the site gave it ({said})"
        )

    def _serves(self) -> str:
        """The models the site's servers list, as a message says them."""
        models = self.site.models
        return f"the site serves {models}" if models else "the site lists no models"

    def _no_server(self) -> str:
        """Why no endpoint of this client takes a model: no site, or no server lists it."""
        if not self.site.servers and not self._endpoints:
            return (
                "this client has no site (Client(local=LocalModels(...)) runs models in "
                "process only: stream with backend='local')"
            )
        return f"no server of the site ({self.site.source}) serves it; {self._serves()}"

    def _info_of(self, model: str):
        """How the in-process backend gets `model`'s metadata: from LocalModels.infos, else
        from the first of the site's endpoints that answers (as a remote stream does)."""
        if self.local is not None and self.local.infos is not None:
            return lambda: self.local.infos(model)

        def ask() -> ModelInfo:
            try:
                return self.model_info(model)
            except ValueError as exc:
                raise ValueError(
                    f"{exc}; the in-process backend needs it: give LocalModels(infos=...)"
                ) from None

        return ask

    def close(self) -> None:
        """The shared-memory regions first: they are unregistered from every server over the
        transports' control channels, which must still be open (else every server kept
        them: its mappings, a GPU's memory), then the transports. The work report is
        withdrawn first: the client sends nothing more."""
        if self.work is not None:
            self.work.close()
        if self.pool is not None:
            self.pool.close()
        for endpoint in self._endpoints:
            endpoint.transport.close()
        if self._own_tracing is not None:
            self._own_tracing.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _site_endpoints(
    site: SiteRecord,
    transport: str,
    token: str,
    tracing: ClientTracing | None = None,
    admitted: Admitted | None = None,
) -> list[Endpoint]:
    """Site mode's endpoints in order of preference: Envoy (gRPC), the gateway (HTTP), then
    every server directly over the same transport (no token: servers take none). They
    share `admitted` (admitted.py): the site's admission is the site's, whatever the path."""
    endpoints = []
    admitted = admitted or Admitted()
    if transport == "grpc" and site.grpc:
        envoy = GrpcTransport(site.grpc, "envoy", token, tracing, admitted)
        endpoints.append(Endpoint("envoy", envoy, path="envoy"))
    if site.http:
        gateway = HttpTransport(
            site.http, "gateway", token=token, tracing=tracing, admitted=admitted
        )
        endpoints.append(Endpoint("gateway", gateway, path="gateway"))
    for s in site.servers:
        if transport == "grpc" and s.grpc_port:
            direct = GrpcTransport(s.grpc, s.id, tracing=tracing, admitted=admitted)
            endpoints.append(Endpoint(s.id, direct, path="direct"))
        elif transport == "http" and s.http_port:
            direct = HttpTransport(s.http, s.id, tracing=tracing, admitted=admitted)
            endpoints.append(Endpoint(s.id, direct, path="direct"))
    return endpoints

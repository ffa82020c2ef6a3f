"""Tracing end to end on a local site: one W3C trace from the caller through Envoy or the
gateway to Triton's queue and compute, each part's spans from its own tracer.

No request crosses both Envoy and the gateway, so two traces are followed: a worker (the
sonicsite client) → Envoy → Triton over gRPC, and a stock HTTP client with an
OpenTelemetry-propagated `traceparent` → the gateway → Triton. Every part exports to the
site's real collector (rotel), which sends the spans on to a receiver in this process; the
test waits for them (exporters batch), never for a time.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from opentelemetry.exporter.otlp.json.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from otlp_receiver import OtlpReceiver, ReceivedSpan
from polling import wait_until
from sonicsite.client import Client, Column, SoA, TensorSpec
from sonicsite.client.discovery import from_site_file
from sonicsite.client.tracing import ClientTracing, TracingSettings
from sonicsite.operator.main import build
from sonicsite.operator.main import parser as operator_parser
from sonicsite.operator.xds_resources import listener
from sonicsite.operator.xds_tracing import TRACING_CLUSTER, EnvoyTracing

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import envoy, launcher
from sonicsite.local.state import SiteState
from sonicsite.local.tracing import TracingConfig, traces_url

MODEL = "identity"
CALLS = 5  # traced calls per path: one complete chain proves it (see _wait_chain)
SERVER, CLIENT = 2, 3  # OTLP's span kinds


@pytest.fixture(scope="module")
def traced(
    tmp_path_factory: pytest.TempPathFactory, built_models: Path
) -> Iterator[tuple[SiteState, OtlpReceiver]]:
    """One traced site (one server), its collector exporting to a receiver in this process."""
    receiver = OtlpReceiver().start()
    site_dir = tmp_path_factory.mktemp("traced")
    config = TracingConfig(export=receiver.url, export_delay_ms=200)
    state = launcher.up(
        site_dir, servers=1, models=[MODEL], build_dir=built_models, supervise=False, tracing=config
    )
    yield state, receiver
    launcher.down(site_dir)
    receiver.close()
    assert not [p.pid for p in state.processes if pid_alive(p.pid)]


def _events(rows: int = 1) -> tuple[SoA, TensorSpec]:
    soa = SoA.allocate([Column("x", np.dtype(np.float32), (8,))], rows)
    soa["x"][:] = 1.0
    return soa, TensorSpec(MODEL).append_block("INPUT0", "x").append_output("OUTPUT0")


# One hop of a chain, leaf to root: (service, span name or None for any, kind or 0 for any).
Hop = tuple[str, str | None, int]
TRITON = "sonicsite-triton"
TRITON_CHAIN: list[Hop] = [
    (TRITON, "compute", 0),
    (TRITON, MODEL, 0),  # the model's span: queued, then scheduled
    (TRITON, "InferRequest", SERVER),
]


def _chain(spans: list[ReceivedSpan], leaf: ReceivedSpan) -> list[ReceivedSpan]:
    """`leaf` and its ancestors, up to the first whose parent has not (yet) arrived."""
    by_id = {s.span_id: s for s in spans}
    chain = [leaf]
    while chain[-1].parent_id in by_id and len(chain) <= len(spans):
        chain.append(by_id[chain[-1].parent_id])
    return chain


def _is(span: ReceivedSpan, hop: Hop) -> bool:
    service, name, kind = hop
    return span.service == service and name in (None, span.name) and kind in (0, span.kind)


def _matches(chain: list[ReceivedSpan], hops: list[Hop]) -> bool:
    return len(chain) == len(hops) and all(
        _is(span, hop) for span, hop in zip(chain, hops, strict=True)
    )


def _complete_chain(
    receiver: OtlpReceiver, trace_id: str, hops: list[Hop]
) -> list[ReceivedSpan] | None:
    """A chain from one of Triton's compute spans up to the caller's root span, every hop
    as `hops` says (a retry would add chains of its own: one complete chain is enough)."""
    spans = receiver.trace(trace_id)
    for leaf in spans:
        if _is(leaf, TRITON_CHAIN[0]):
            chain = _chain(spans, leaf)
            if _matches(chain, hops) and not chain[-1].parent_id:
                return chain
    return None


def _triton_traces(receiver: OtlpReceiver) -> set[str]:
    """The traces Triton's compute spans have come in so far."""
    return {s.trace_id for s in receiver.received() if _is(s, TRITON_CHAIN[0])}


def _wait_chain(
    receiver: OtlpReceiver,
    trace_ids: list[str],
    hops: list[Hop],
    what: str,
    site_dir: str,
    tritons_before: set[str],
) -> tuple[str, list[ReceivedSpan]]:
    """The first complete chain among the calls' traces, and its trace id, once every trace
    is complete, or every span has come (Triton's compute of each call, in whatever trace,
    since `tritons_before`, and the callers' spans of each trace), or the deadline has
    passed. Exporters are best effort by design (an OTel SDK drops a batch whose export
    fails), and Triton's gRPC frontend drops the context of some calls (up to one in eight
    here; it reads the `traceparent` value as if NUL-terminated, see the README's
    tracing), so of `CALLS` traced calls one complete chain proves the propagation; a
    trace that stays incomplete is a warning that names what came, and none complete
    fails. Either way the spans that came, the traces Triton's spans did arrive in and the
    collector's and Triton's logs' ends are shown."""
    chains: dict[str, list[ReceivedSpan]] = {}
    callers = [hop for hop in hops if hop[0] != TRITON]

    def every_chain_complete_or_every_span_come() -> bool:
        for trace_id in trace_ids:
            if trace_id not in chains and (chain := _complete_chain(receiver, trace_id, hops)):
                chains[trace_id] = chain
        if len(chains) == len(trace_ids):
            return True
        computed = len(_triton_traces(receiver) - tritons_before) >= len(trace_ids)
        came = [receiver.trace(t) for t in trace_ids]
        return computed and all(any(_is(s, h) for s in spans) for spans in came for h in callers)

    with contextlib.suppress(AssertionError):  # what did not come is said below
        wait_until(every_chain_complete_or_every_span_come, what, 120)
    if len(chains) == len(trace_ids):
        return trace_ids[0], chains[trace_ids[0]]
    lost = [t for t in trace_ids if t not in chains]
    report = f"{what}: {len(lost)} of {len(trace_ids)} traces incomplete\n" + (
        "\n".join(_what_came(receiver, t) for t in lost) + "\n" + _logs_tail(site_dir)
    )
    assert chains, report
    warnings.warn(report, stacklevel=2)
    trace_id = next(iter(chains))
    return trace_id, chains[trace_id]


def _what_came(receiver: OtlpReceiver, trace_id: str) -> str:
    spans = receiver.trace(trace_id)
    got = "; ".join(f"{s.service}:{s.name} (kind {s.kind})" for s in spans) or "none"
    tritons = sorted({s.trace_id for s in receiver.received() if s.service.endswith("triton")})
    return f"trace {trace_id}: spans received: {got}; traces with Triton's spans: {tritons}"


def _logs_tail(site_dir: str) -> str:
    return "\n".join(
        f"--- {name}:\n{_tail(Path(site_dir) / 'logs' / name)}"
        for name in ("collector.log", "triton-0.log")
    )


def _tail(path: Path, size: int = 3000) -> str:
    return path.read_text(errors="replace")[-size:] if path.exists() else "(no log)"


def _assert_triton_spans(chain: list[ReceivedSpan]) -> None:
    """Triton's own tracer: its queue (the model span) and its compute."""
    compute, model, request = chain[:3]
    assert "QUEUE_START" in model.events and "COMPUTE_START" in compute.events
    assert request.scope == "triton-server"


def _assert_one_tree(spans: list[ReceivedSpan], root: str) -> None:
    """One trace, one root (the caller's span), every other span's parent in the trace."""
    ids = {s.span_id for s in spans}
    assert len({s.trace_id for s in spans}) == 1
    assert [s.name for s in spans if not s.parent_id] == [root]
    assert all(s.parent_id in ids for s in spans if s.parent_id), spans


def _shown(chain: list[ReceivedSpan]) -> str:
    return " ← ".join(f"{s.service}:{s.name}" for s in chain)


def test_a_worker_call_through_envoy_is_one_trace_to_tritons_compute(traced):
    state, receiver = traced
    tritons_before = _triton_traces(receiver)
    tracing = ClientTracing.start(TracingSettings(traces_url(state.collector), export_delay_ms=200))
    soa, spec = _events()
    trace_ids = []
    with Client(from_site_file(state.site_dir), "grpc", tracing=tracing) as client:
        answers: list[np.ndarray] = []
        for call in range(CALLS):
            with tracing.tracer.start_as_current_span("worker event") as event:
                result = client.stream(MODEL, spec, batch=1).run(
                    soa, lambda lo, hi, out: answers.append(np.array(out["OUTPUT0"]))
                )
            assert result.events_ok == 1 and answers[call].tolist() == [[1.0] * 8]
            trace_ids.append(format(event.get_span_context().trace_id, "032x"))
    tracing.close()  # what is batched goes out
    hops = [
        *TRITON_CHAIN,
        ("sonicsite-envoy", None, CLIENT),  # Envoy's try upstream
        ("sonicsite-envoy", None, SERVER),  # Envoy's ingress
        ("sonicsite-worker", "send", CLIENT),
        ("sonicsite-worker", f"sonicsite infer {MODEL}", 0),
        ("sonicsite-worker", "worker event", 0),
    ]
    what = "Triton's compute ← Envoy ← the worker's call"
    trace_id, chain = _wait_chain(receiver, trace_ids, hops, what, state.site_dir, tritons_before)
    _assert_triton_spans(chain)
    send, call = chain[5], chain[6]
    assert send.attributes["sonicsite.server"] == "envoy"  # the call went through Envoy
    spans = receiver.trace(trace_id)
    assert any(s.name == "pack" and s.parent_id == call.span_id for s in spans)  # before send
    _assert_one_tree(spans, "worker event")
    print(f"worker → Envoy → Triton, trace {trace_id}: {_shown(chain)}")


def test_an_http_call_through_the_gateway_is_one_trace_to_tritons_compute(traced):
    state, receiver = traced
    tritons_before = _triton_traces(receiver)
    provider = TracerProvider(resource=Resource.create({"service.name": "http-caller"}))
    exporter = OTLPSpanExporter(endpoint=traces_url(state.collector))
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=200))
    data = np.ones((1, 8), np.float32)
    tensor = httpclient.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    client = httpclient.InferenceServerClient(state.http)
    trace_ids = []
    for _ in range(CALLS):
        tracer = provider.get_tracer("test")
        with tracer.start_as_current_span("http call", kind=SpanKind.CLIENT) as call:
            headers: dict[str, str] = {}
            TraceContextTextMapPropagator().inject(headers)
            reply = client.infer(MODEL, [tensor], headers=headers)
        assert reply.as_numpy("OUTPUT0").tolist() == data.tolist()
        trace_ids.append(format(call.get_span_context().trace_id, "032x"))
    client.close()
    provider.shutdown()
    hops = [
        *TRITON_CHAIN,
        ("sonicsite-gateway", f"gateway forward {state.servers[0].id}", CLIENT),
        ("sonicsite-gateway", f"gateway infer {MODEL}", SERVER),
        ("http-caller", "http call", CLIENT),
    ]
    what = "Triton's compute ← the gateway ← the HTTP call"
    trace_id, chain = _wait_chain(receiver, trace_ids, hops, what, state.site_dir, tritons_before)
    _assert_triton_spans(chain)
    assert chain[4].attributes["http.response.status_code"] == 200
    _assert_one_tree(receiver.trace(trace_id), "http call")
    print(f"HTTP → gateway → Triton, trace {trace_id}: {_shown(chain)}")


def test_every_server_of_a_traced_site_exports_and_its_parts_are_told_where(traced):
    """Triton's trace settings are on its command line (the trace protocol is restricted);
    the operator gives Envoy its tracer, the gateway its own; the collector is a process of
    the site that `down` stops."""
    state, _ = traced
    url = traces_url(state.collector)
    by_name = {p.name: p for p in state.processes}
    assert f"--trace-config=opentelemetry,url={url}" in _command_line(state.servers[0].pid)
    assert f"--tracing-endpoint={url}" in by_name["operator"].command
    assert f"--tracing-endpoint={url}" in by_name["gateway"].command
    assert by_name["collector"].kind == "collector" and pid_alive(by_name["collector"].pid)


def _command_line(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0")


def test_envoy_accepts_its_tracer_with_a_tls_collector(tmp_path: Path):
    """Envoy validates the listener's tracing and the collector's cluster (https: TLS)."""
    tracing = EnvoyTracing("https://otel.example.org:4318/v1/traces", sampling=5.0)
    hcm_listener = listener("127.0.0.1", 9000, tracing=tracing)
    hcm = hcm_listener["filter_chains"][0]["filters"][0]["typed_config"]
    hcm.pop("rds")
    hcm["route_config"] = {"name": "r", "virtual_hosts": []}
    hcm["http_filters"] = [hcm["http_filters"][-1]]  # the router: the rest is proved elsewhere
    config = envoy.bootstrap(9901, "127.0.0.1", 8080)
    config["static_resources"]["listeners"] = [
        {k: v for k, v in hcm_listener.items() if k != "@type"}
    ]
    config["static_resources"]["clusters"].append(
        {k: v for k, v in tracing.cluster().items() if k != "@type"}
    )
    path = tmp_path / "envoy.json"
    path.write_text(json.dumps(config))
    envoy.validate(path)
    assert hcm["tracing"]["random_sampling"] == {"value": 5.0}
    assert hcm["tracing"]["provider"]["typed_config"]["http_service"]["http_uri"]["cluster"] == (
        TRACING_CLUSTER
    )


def test_the_operator_refuses_a_tracing_endpoint_that_is_no_url(capsys):
    args = ["--port=1", "--envoy-listen=127.0.0.1:2", "--site=s", "--tracing-endpoint=collector"]
    options = operator_parser()
    with pytest.raises(SystemExit):
        build(options.parse_args(args), options)
    assert "tracing endpoint: expected an http(s)://host:port/path URL" in capsys.readouterr().err

"""Two releases of the chart on one Prometheus: each release's KEDA query, verbatim from the
rendered chart, reads its own release's load and never the other's.

Two local sites of one Triton server each stand for the releases: `alpha` (namespace cms) and
`beta` (namespace atlas). Each server sleeps the same time per execution of `identity` (no
batching, one instance), and the loads keep 8 and 2 requests in flight: queue time per
request, the scaling metric, differs several times over. One real Prometheus scrapes both as
a cluster's would: alpha with the chart's own Prometheus job (its relabelling verbatim, the
DNS discovery swapped for the server's address), beta by annotation with the site job of
monitoring/scrape/kubernetes-pods.yaml (verbatim, Kubernetes discovery swapped for a file
holding the meta labels Kubernetes gives the pod the chart renders). It evaluates both
releases' rules as the chart ships them (alpha's own Prometheus's, beta's PrometheusRule)."""

from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import yaml
from chartcheck import objects, render
from polling import wait_until
from prometheus_series import loads, newest_scrapes
from sonicsite.operator.autoscaler import ScalingPolicy, queue_ms_per_request

from sonicsite.contract.processes_seen import pid_alive
from sonicsite.local import launcher, prometheus
from sonicsite.local.ports import free_ports
from sonicsite.local.processes import stop_group

ROOT = Path(__file__).resolve().parents[2]
ANNOTATION_JOB = ROOT / "monitoring" / "scrape" / "kubernetes-pods.yaml"
MODEL = "identity"  # no dynamic batching: with one instance, requests queue one behind another
DELAY_MS = 20.0  # each execution sleeps this long: queue time comes from the load, not the CPU
WINDOW = ScalingPolicy().window_s  # the rule's `offset 30s`
SITE_QUEUE = "sonicsite:queue_seconds_per_request:30s"  # the scaling metric


@dataclass(frozen=True)
class Release:
    name: str
    namespace: str
    in_flight: int  # requests its load keeps in flight


ALPHA = Release("alpha", "cms", 8)  # scraped by the chart's own Prometheus job
BETA = Release("beta", "atlas", 2)  # scraped by annotation, the site's job


@dataclass(frozen=True)
class Rendered:
    """What one release's chart gives the shared Prometheus: its scrape job, its rule
    files, and its ScaledObject's query."""

    query: str
    job: dict
    rules: dict[str, str]  # file name -> rule file text


def _kinds(docs: list[dict], kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def _query(docs: list[dict]) -> str:
    (scaled,) = _kinds(docs, "ScaledObject")
    (trigger,) = scaled["spec"]["triggers"]
    return trigger["metadata"]["query"]


def _own_prometheus(release: Release, metrics: str) -> Rendered:
    """Alpha with the chart's own Prometheus: its triton job, DNS discovery swapped for the
    server's address on the port the chart renders (its metrics port), and its rule files."""
    host, port = metrics.rsplit(":", 1)
    values = {
        "autoscaling": {"enabled": True},
        "monitoring": {"prometheus": {"enabled": True}},
        "triton": {"ports": {"metrics": int(port)}},
        "networkPolicy": {"metricsFrom": [{"namespaceSelector": {}}]},  # its scraper's pods
    }
    docs = objects(render(values, name=release.name, namespace=release.namespace))
    (config,) = [d for d in _kinds(docs, "ConfigMap") if "prometheus.yml" in d.get("data", {})]
    scrape = yaml.safe_load(config["data"]["prometheus.yml"])["scrape_configs"]
    (job,) = [j for j in scrape if j["job_name"] == "triton"]
    (dns,) = job.pop("dns_sd_configs")
    job["static_configs"] = [{"targets": [f"{host}:{dns['port']}"]}]
    rules = {k: v for k, v in config["data"].items() if k.endswith(".rules.yaml")}
    return Rendered(_query(docs), job, rules)


def _sanitised(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _pod_targets(pod: dict, release: Release, host: str) -> list[dict]:
    """A file_sd target group with the meta labels Kubernetes' pod discovery gives the pod
    the chart renders: its namespace, name, labels and annotations, and its first container
    port as the address (discovery gives one target per port; the job keeps the annotated
    one)."""
    meta = pod["metadata"]
    labels = {
        "__meta_kubernetes_namespace": release.namespace,
        "__meta_kubernetes_pod_name": f"{release.name}-sonicsite-triton-0",
    }
    for key, value in meta["labels"].items():
        labels[f"__meta_kubernetes_pod_label_{_sanitised(key)}"] = value
    for key, value in meta.get("annotations", {}).items():
        labels[f"__meta_kubernetes_pod_annotation_{_sanitised(key)}"] = value
    first = pod["spec"]["containers"][0]["ports"][0]["containerPort"]
    return [{"targets": [f"{host}:{first}"], "labels": labels}]


def _annotated(release: Release, metrics: str, targets_file: Path) -> Rendered:
    """Beta scraped by annotation: the site's job over the pod the chart renders, and the
    rules of its PrometheusRule."""
    host, port = metrics.rsplit(":", 1)
    values = {
        "autoscaling": {"enabled": True},
        "monitoring": {
            "prometheusAddress": "https://prometheus.monitoring.svc:9090",
            "scrapeAnnotations": True,
            "prometheusOperator": {"enabled": True},
        },
        "triton": {"ports": {"metrics": int(port)}},
        "networkPolicy": {"metricsFrom": [{"namespaceSelector": {}}]},  # its scraper's pods
    }
    docs = objects(render(values, name=release.name, namespace=release.namespace))
    (deployment,) = [
        d
        for d in _kinds(docs, "Deployment")
        if d["metadata"]["labels"]["app.kubernetes.io/component"] == "triton"
    ]
    pod = deployment["spec"]["template"]
    targets_file.write_text(json.dumps(_pod_targets(pod, release, host)))
    (job,) = yaml.safe_load(ANNOTATION_JOB.read_text())["scrape_configs"]
    job.pop("kubernetes_sd_configs")
    job["file_sd_configs"] = [{"files": [str(targets_file)]}]
    (rule,) = _kinds(docs, "PrometheusRule")
    return Rendered(_query(docs), job, {"beta.rules.yaml": yaml.safe_dump(rule["spec"])})


@dataclass
class Load:
    """Threads that keep `in_flight` requests in flight at one server until stopped."""

    stop: threading.Event
    errors: list
    threads: list[threading.Thread]

    def end(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=60)
        assert not any(t.is_alive() for t in self.threads)


def _keep_busy(grpc: str, in_flight: int) -> Load:
    stop, errors = threading.Event(), []

    def one() -> None:
        try:
            client = grpcclient.InferenceServerClient(grpc)
            x = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
            x.set_data_from_numpy(np.ones((1, 16), dtype=np.float32))
            while not stop.is_set():
                client.infer(MODEL, [x], client_timeout=120)
            client.close()
        except Exception as exc:  # reported by the test, not lost in the thread
            errors.append(exc)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(in_flight)]
    for t in threads:
        t.start()
    return Load(stop, errors, threads)


@dataclass(frozen=True)
class Shared:
    """The two releases' servers, their charts, and the one Prometheus over both."""

    address: str
    metrics: dict[str, str]  # release name -> its server's metrics address (`instance`)
    rendered: dict[str, Rendered]
    loads: dict[str, Load]
    load_started: float  # a timestamp on Prometheus' clock (the same host)


@pytest.fixture(scope="module")
def shared(tmp_path_factory, built_models):
    root = tmp_path_factory.mktemp("scoped")
    releases, states, procs, running = (ALPHA, BETA), {}, [], {}
    try:
        for release in releases:
            states[release.name] = launcher.up(
                root / release.name,
                servers=1,
                models=[MODEL],
                build_dir=built_models,
                balancer=False,
                supervise=False,
                delay_ms={"triton-0": DELAY_MS},
            )
        metrics = {n: f"{s.servers[0].host}:{s.servers[0].metrics_port}" for n, s in states.items()}
        rendered = {
            ALPHA.name: _own_prometheus(ALPHA, metrics[ALPHA.name]),
            BETA.name: _annotated(BETA, metrics[BETA.name], root / "pods.json"),
        }
        rule_files = []
        for r in rendered.values():
            for name, text in r.rules.items():
                path = root / "rules" / f"{len(rule_files)}-{name}"
                path.parent.mkdir(exist_ok=True)
                path.write_text(text)
                rule_files.append(str(path))
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": rule_files,
            "scrape_configs": [r.job for r in rendered.values()],
        }
        (root / "prometheus.yml").write_text(yaml.safe_dump(config))
        address = f"127.0.0.1:{free_ports(1)[0]}"
        log = root / "prometheus.log"
        proc = prometheus.start(root / "prometheus.yml", root / "data", address, log)
        procs.append(proc)
        prometheus.wait_ready(proc, address, log, timeout=120)
        started = time.time()
        for release in releases:
            server = states[release.name].servers[0]
            running[release.name] = _keep_busy(server.grpc, release.in_flight)
        yield Shared(address, metrics, rendered, running, started)
    finally:
        for load in running.values():
            load.stop.set()
        for load in running.values():
            load.end()
        for proc in procs:
            stop_group(proc.pid)
            proc.wait(timeout=60)
        # both sites at once: each server takes seconds to unload and exit
        downs = [threading.Thread(target=launcher.down, args=(root / n,)) for n in states]
        for thread in downs:
            thread.start()
        for thread in downs:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in downs)
        assert not [s.pid for state in states.values() for s in state.servers if pid_alive(s.pid)]


def test_each_releases_keda_query_reads_its_own_load_and_not_the_others(shared, capsys):
    address = shared.address
    instances = {shared.metrics[r.name]: r.name for r in (ALPHA, BETA)}

    def both_measured() -> dict[str, tuple[float, float, float]] | None:
        """Per release (query, ours, requests per second) at an instant whose scrapes have
        all landed, a whole window after the loads started, with both releases' recording
        rules evaluated, once each release's query and ours both read its load."""
        for load in shared.loads.values():
            assert load.errors == [], load.errors
        newest = newest_scrapes(address, "")
        if set(newest) != set(instances):
            return None
        at = min(newest.values())
        if at - WINDOW <= shared.load_started:
            return None
        recorded = {
            (s["metric"].get("namespace"), s["metric"].get("release"))
            for s in prometheus.query(address, SITE_QUEUE)
        }
        if recorded != {(r.namespace, r.name) for r in (ALPHA, BETA)}:
            return None
        figures = {}
        for instance, name in instances.items():
            measured = loads(address, at, WINDOW, f'instance="{instance}"')
            ours = queue_ms_per_request(measured)
            answer = prometheus.query(address, shared.rendered[name].query, at)
            if ours is None or ours <= 0 or len(answer) != 1:
                return None
            rps = sum(load.requests for load in measured) / WINDOW
            figures[name] = (float(answer[0]["value"][1]), ours / 1e3, rps)
        return figures

    figures = wait_until(
        both_measured,
        "both releases' queries to read a window of their loads",
        timeout=240,
        interval=0.5,
    )
    releases = {r.name: r for r in (ALPHA, BETA)}
    (alpha, alpha_ours, _), (beta, beta_ours, _) = figures[ALPHA.name], figures[BETA.name]
    with capsys.disabled():  # the two releases' figures, in the suite's own output
        print()
        for name, (query, ours, rps) in figures.items():
            r = releases[name]
            print(
                f"scoped queries: {name} ({r.namespace}, {r.in_flight} in flight): its KEDA "
                f"query reads {query * 1e3:.2f} ms of queue per request; its server's load by "
                f"the Python definition: {ours * 1e3:.2f} ms, at {rps:.1f} requests/s"
            )
        print(f"scoped queries: alpha / beta: {alpha / beta:.1f}")
    mine = f"alpha {alpha * 1e3:.3f} ms (own {alpha_ours * 1e3:.3f}), beta {beta * 1e3:.3f} ms"
    mine += f" (own {beta_ours * 1e3:.3f}) of queue per request"
    assert alpha == pytest.approx(alpha_ours, rel=1e-9), f"alpha's query is not its load: {mine}"
    assert beta == pytest.approx(beta_ours, rel=1e-9), f"beta's query is not its load: {mine}"
    assert alpha >= 3 * beta, f"the loads should differ at least threefold: {mine}"
    assert beta != pytest.approx(alpha_ours) and alpha != pytest.approx(beta_ours), mine

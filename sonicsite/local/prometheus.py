"""Run the real Prometheus (Debian's package) against a site, and query it.

The local site starts it when the binary is installed (with every rule in monitoring/rules,
scraping every server, Envoy, the operator and the gateway); the tests query it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

from .errors import PrometheusError
from .processes import start_process, wait_for_http


def binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        raise PrometheusError("prometheus not found: `apt-get install prometheus` (Debian 12)")
    return path


RULES_DIR = Path(__file__).resolve().parents[2] / "monitoring" / "rules"


def site_config(
    triton_targets: Path,
    jobs: dict[str, tuple[str, str]],
    rule_files: list[Path],
    interval: str = "2s",
) -> dict:
    """The local site's Prometheus: Triton servers from a file the launcher rewrites when
    servers come and go (file_sd), and one static target per other `job: (address, path)`."""
    scrape = [{"job_name": "triton", "file_sd_configs": [{"files": [str(triton_targets)]}]}]
    for job, (address, path) in jobs.items():
        scrape.append(
            {"job_name": job, "metrics_path": path, "static_configs": [{"targets": [address]}]}
        )
    return {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": scrape,
    }


def write_targets(path: Path, servers: dict[str, str]) -> None:
    """file_sd targets: one per server (`id: host:metrics_port`), labelled with its id."""
    groups = [{"targets": [address], "labels": {"server": sid}} for sid, address in servers.items()]
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    tmp.replace(path)  # Prometheus never reads a half-written file


def fresh_storage(folder: Path) -> Path:
    """`folder/data`, empty, for a new site's Prometheus. The TSDB of the site that ran in
    this folder before is moved to `data.previous` (for a post-mortem; the one before it
    removed): reopened, it gave the new site the old one's series, so that alerts fired
    for restarts the new site never had and servers were counted twice. PrometheusError
    naming the folder and why when it cannot be moved."""
    data, previous = folder / "data", folder / "data.previous"
    try:
        if data.exists():
            if previous.exists():
                shutil.rmtree(previous)
            data.rename(previous)
    except OSError as exc:
        raise PrometheusError(
            f"prometheus: cannot move the previous site's TSDB {data} aside to {previous} "
            f"({exc.strerror or exc}); the new site must not read its series: remove it"
        ) from exc
    return data


def start(
    config_path: Path, data_dir: Path, address: str, log: Path, site_dir: Path | None = None
) -> subprocess.Popen:
    """Start Prometheus (a site's, marked as its own, with `site_dir`)."""
    return start_process(
        [
            binary(),
            f"--config.file={config_path}",
            f"--storage.tsdb.path={data_dir}",
            f"--web.listen-address={address}",
        ],
        log,
        site_dir=site_dir,
    )


def wait_ready(proc: subprocess.Popen, address: str, log: Path, timeout: float = 30.0) -> None:
    wait_for_http(f"http://{address}/-/ready", proc, log, timeout, PrometheusError, "prometheus")


def query(address: str, expr: str, at: float | None = None) -> list[dict]:
    """An instant query; each result is {"metric": labels, "value": [time, "value"]}."""
    params = {"query": expr}
    if at is not None:
        params["time"] = f"{at:.3f}"
    url = f"http://{address}/api/v1/query?{urllib.parse.urlencode(params)}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        body = json.loads(reply.read())
    if body.get("status") != "success":
        raise PrometheusError(f"query {expr!r} failed: {body}")
    return body["data"]["result"]

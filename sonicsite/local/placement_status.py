"""`sonicsite models status`: per model, the servers holding it, its footprint, its idle
time and the requests held for it, and the placement's last decisions with their reasons,
as the operator's read-only `/v1/placement` says (the operator is the one that knows: it
reads every server's index). On a site without placement, where each model is: the servers
the state file records with it."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from .state import SiteState

EXIT_OK, EXIT_NO_SITE, EXIT_NO_PLACEMENT = 0, 1, 2
SHOWN_DECISIONS = 10


def fetch_placement(operator: str, timeout: float = 10.0) -> dict:
    """The operator's `/v1/placement`; urllib.error.HTTPError 404 when placement is off."""
    with urllib.request.urlopen(f"http://{operator}/v1/placement", timeout=timeout) as reply:
        return json.loads(reply.read())


def _mib(n: int | None) -> str:
    return "not measured" if n is None else f"{n / 2**20:.1f} MiB"


def render(view: dict) -> list[str]:
    """The table of models, then the last decisions, as lines."""
    held = view.get("held", {})  # requests waiting in the gateways for the model
    head = f"{'MODEL':<24} {'POOL':<10} {'LOADED ON':<28} {'FOOTPRINT':>14} {'IDLE':>8} {'HELD':>5}"
    lines = [head]
    for model, m in sorted(view["models"].items()):
        where = ",".join(m["servers"]) or "-"
        idle = "-" if m["idle_s"] is None else f"{m['idle_s']:.0f} s"
        footprint = _mib(m["footprint_bytes"])
        pool = m.get("pool", "-")
        lines.append(
            f"{model:<24} {pool:<10} {where:<28} {footprint:>14} {idle:>8} {held.get(model, 0):>5}"
        )
    decisions = view["decisions"][-SHOWN_DECISIONS:]
    if decisions:
        lines.append("last decisions:")
    for d in decisions:
        lines.append(
            f"  {d['kind']} {d['model']} on {d['server']} ({d['rule']}): {d['reason']} "
            f"-> {d['outcome']}"
        )
    return lines


def static_view(state: SiteState) -> dict:
    """A site without placement (`up` without --placement): each model on the servers that
    started with it, as the state file records them; nothing is loaded or unloaded."""
    models: dict[str, list[str]] = {m: [] for m in state.models}
    for server in state.servers:
        for model in server.models:
            models.setdefault(model, []).append(server.id)
    return {"placement": "off", "models": {m: {"servers": s} for m, s in sorted(models.items())}}


def render_static(view: dict) -> list[str]:
    lines = [
        "placement is off on this site (`sonicsite up` without --placement): every server "
        "keeps the models it started with",
        f"{'MODEL':<24} LOADED ON",
    ]
    for model, m in view["models"].items():
        lines.append(f"{model:<24} {','.join(m['servers']) or '-'}")
    return lines


def print_placement(site_dir: Path, as_json: bool = False) -> int:
    try:
        state = SiteState.load(site_dir)
    except (FileNotFoundError, ValueError) as exc:  # no site, or not a site's state file
        print(exc, file=sys.stderr)
        return EXIT_NO_SITE
    if not state.operator:
        print(f"no operator in the site at {site_dir}", file=sys.stderr)
        return EXIT_NO_SITE
    try:
        view = fetch_placement(state.operator)
    except urllib.error.HTTPError as exc:
        said = exc.read().decode(errors="replace")
        if exc.code == 404 and "placement is off" in said:
            view = static_view(state)
            print(json.dumps(view, indent=1) if as_json else "\n".join(render_static(view)))
            return EXIT_OK
        print(f"operator {state.operator}: HTTP {exc.code}: {said}", file=sys.stderr)
        return EXIT_NO_PLACEMENT
    except (urllib.error.URLError, OSError) as exc:
        print(f"operator {state.operator} unreachable: {exc}", file=sys.stderr)
        return EXIT_NO_SITE
    print(json.dumps(view, indent=1) if as_json else "\n".join(render(view)))
    return EXIT_OK

"""`sonicsite models status`: per model, the servers holding it, its footprint, its idle
time and the requests held for it, and the placement's last decisions with their reasons,
as the operator's read-only `/v1/placement` says (the operator is the one that knows: it
reads every server's index). On a site without placement (its operator's command line, on
record in the state file, says so: no operator asked, it may be stopped or hung), where each
model is: the servers the state file records with it, each probed for readiness as
`sonicsite status` probes it (a server that is not ready serves none of its models now:
said, and the exit status says it)."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from pathlib import Path

from sonicsite.contract.wire import RUNNING, read_processes

from .state import SiteState
from .status import EXIT_DOWN
from .triton import is_ready

EXIT_OK, EXIT_NO_SITE, EXIT_NO_PLACEMENT = 0, 1, 2
MODELS_STATUS_EXIT = (
    f"exit status: {EXIT_OK} shown; {EXIT_NO_SITE} no site in DIR (or not a site's state "
    f"file), or placement is on and there is no operator in it or the operator does not "
    f"answer (`sonicsite status` says why); {EXIT_NO_PLACEMENT} the "
    f"operator answered /v1/placement with an error (said); {EXIT_DOWN} placement is off and "
    "a server is not ready (dead, restarting or not answering /v2/health/ready): its models "
    "are not served there now"
)
PREFIX = "sonicsite models status: "
SHOWN_DECISIONS = 10
PLACEMENT_FLAG = "--placement"  # on the operator's command line: `up --placement`


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


def servers_ready(state: SiteState) -> dict[str, bool]:
    """Each server's readiness now, as `sonicsite status` reads it: its process running (its
    PID alive for the site) and its /v2/health/ready saying 200."""
    states = {r.name: r.state for r in read_processes(Path(state.site_dir))}
    return {s.id: states.get(s.id, RUNNING) == RUNNING and is_ready(s.http) for s in state.servers}


def static_view(state: SiteState, ready: dict[str, bool]) -> dict:
    """A site without placement (`up` without --placement): each model on the servers that
    started with it, as the state file records them (nothing is loaded or unloaded), and
    which of them are ready now (`ready`, servers_ready)."""
    models: dict[str, list[str]] = {m: [] for m in state.models}
    for server in state.servers:
        for model in server.models:
            models.setdefault(model, []).append(server.id)
    return {
        "placement": "off",
        "models": {
            m: {"servers": s, "ready_on": [x for x in s if ready.get(x)]}
            for m, s in sorted(models.items())
        },
        "not_ready": sorted(s for s, ok in ready.items() if not ok),
    }


def render_static(view: dict) -> list[str]:
    lines = [
        "placement is off on this site (`sonicsite up` without --placement): every server "
        "keeps the models it started with",
        f"{'MODEL':<24} LOADED ON",
    ]
    down = set(view["not_ready"])
    for model, m in view["models"].items():  # each server with its own readiness
        where = ", ".join(f"{s} {'NOT READY' if s in down else 'ready'}" for s in m["servers"])
        lines.append(f"{model:<24} {where or '-'}")
    for server in view["not_ready"]:
        lines.append(
            f"NOT READY: {server}: it serves none of its models now (dead, restarting or not "
            "answering /v2/health/ready); see `sonicsite status`"
        )
    return lines


def placement_on(state: SiteState) -> bool | None:
    """Whether the site's operator runs placement, as its command line on record says
    (the supervisor restarts it with the same); None when none is recorded: ask it."""
    operator = state.process("operator")
    if operator is None or not operator.command:
        return None
    return PLACEMENT_FLAG in operator.command


def _print_static(state: SiteState, as_json: bool) -> int:
    view = static_view(state, servers_ready(state))
    print(json.dumps(view, indent=1) if as_json else "\n".join(render_static(view)))
    return EXIT_DOWN if view["not_ready"] else EXIT_OK


def _unreachable(state: SiteState, site_dir: Path, exc: Exception, on: bool | None) -> str:
    why = "placement is on" if on else "placement may be on (no operator command on record)"
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    return (
        f"{PREFIX}operator {state.operator} unreachable: {reason}; {why} and only the operator "
        "knows which server holds which model now: `sonicsite status --dir "
        f"{site_dir}` says whether it runs, is stopped or hung"
    )


def print_placement(site_dir: Path, as_json: bool = False) -> int:
    """Print the models' placement (or, with placement off, where each is and whether its
    servers are ready: no operator asked); the exit status is one of MODELS_STATUS_EXIT's."""
    try:
        state = SiteState.load(site_dir)
    except (FileNotFoundError, ValueError) as exc:  # no site, or not a site's state file
        print(f"{PREFIX}{exc}", file=sys.stderr)
        return EXIT_NO_SITE
    on = placement_on(state)
    if on is False:
        return _print_static(state, as_json)
    if not state.operator:
        print(f"{PREFIX}no operator in the site at {site_dir}", file=sys.stderr)
        return EXIT_NO_SITE
    try:
        view = fetch_placement(state.operator)
    except urllib.error.HTTPError as exc:
        said = exc.read().decode(errors="replace")
        if exc.code == 404 and "placement is off" in said:
            return _print_static(state, as_json)
        print(f"{PREFIX}operator {state.operator}: HTTP {exc.code}: {said}", file=sys.stderr)
        return EXIT_NO_PLACEMENT
    except (urllib.error.URLError, OSError) as exc:
        print(_unreachable(state, site_dir, exc, on), file=sys.stderr)
        return EXIT_NO_SITE
    print(json.dumps(view, indent=1) if as_json else "\n".join(render(view)))
    return EXIT_OK

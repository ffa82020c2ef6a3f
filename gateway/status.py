"""The status page: one HTML document that reads `/v1/status` every two seconds.

Servers (ready, draining, weight, pool, models), per-model load (queue and compute time per
request, throughput, pending) and admission, placement over time (the operator's last
decisions: which model it loaded or unloaded where, why, and how it ended; requests held),
the recent scale events (per pool, with their reason), and the site's
processes with their state and restarts (a local site's state file, read through the
contract's `read_processes`; one whose health URL gives no answer is "not answering", as
`sonicsite status` says it, and a supervisor so named restarts nothing meanwhile; on
Kubernetes the cluster restarts pods and the page says so);
readable at a glance, no assets to serve.
"""

from __future__ import annotations

from pathlib import Path

from sonicsite.contract.processes_seen import unanswered
from sonicsite.contract.wire import RUNNING, SUPERVISOR, read_processes

PROBE_S = 1.5  # how long the page waits for each process's health URL (all at once)
NOT_ANSWERING = "not answering"  # a state of the page's own: alive, its health URL silent

CLUSTER_NOTE = (
    "processes are the cluster's job: Kubernetes restarts a container that exits or fails "
    "its liveness probe (kubectl get pods shows restarts)"
)


def site_processes(state_file: Path | None) -> dict:
    """`/v1/status`'s `processes`: every process of a local site with its state now, or,
    without a state file (Kubernetes), a note that says who restarts them."""
    if state_file is None:
        return {"local": False, "records": [], "supervised": False, "note": CLUSTER_NOTE}
    try:
        records = read_processes(state_file)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return {
            "local": True,
            "records": [],
            "supervised": False,
            "note": f"the site's state file {state_file} is unreadable: {exc}",
        }
    supervisor = next((r for r in records if r.kind == SUPERVISOR), None)
    supervised = supervisor is not None and supervisor.state == RUNNING
    health = {r.name: r.health for r in records if r.state == RUNNING and r.health}
    silent_now = unanswered(health, PROBE_S)  # alive, but silent: stopped or hung
    silent = supervisor is not None and supervisor.name in silent_now
    supervised = supervised and not silent
    note = (
        f"supervised by pid {supervisor.pid}: a process that dies is restarted"
        if supervised
        else f"NOT supervised: the supervisor (pid {supervisor.pid}) does not answer (stopped "
        "or hung): nothing restarts the site's processes meanwhile"
        if silent
        else "NOT supervised: a process that dies stays dead"
    )
    rows = [r.to_dict() for r in records]
    for row in rows:  # alive, but silent: what `sonicsite status` says, not "running"
        if why := silent_now.get(row["name"]):
            row["state"], row["why"] = NOT_ANSWERING, f"{row['health']}: {why}"
    return {"local": True, "records": rows, "supervised": supervised, "note": note}


STATUS_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>sonicsite</title>
<style>
 body { font: 14px system-ui, sans-serif; margin: 1.5em; color: #222; }
 h1 { font-size: 1.3em; margin: 0 0 .2em; } h2 { font-size: 1.05em; margin: 1.2em 0 .4em; }
 table { border-collapse: collapse; min-width: 40em; }
 th, td { padding: .25em .8em; border-bottom: 1px solid #ddd; text-align: left; }
 th { background: #f4f4f4; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
 .ok { color: #14773a; font-weight: 600; } .bad { color: #b3261e; font-weight: 600; }
 .warn { color: #a15c00; font-weight: 600; } #meta { color: #666; }
</style></head>
<body>
<h1>sonicsite</h1>
<div id="meta">loading…</div>
<h2>Servers</h2>
<table id="servers"><thead><tr><th>server</th><th>state</th><th>weight</th><th>pool</th>
<th>gRPC</th><th>HTTP</th><th>models</th></tr></thead><tbody></tbody></table>
<h2>Models</h2>
<table id="models"><thead><tr><th>model</th><th>admission</th><th>server</th>
<th>queue ms/req</th><th>compute ms/req</th><th>req/s</th><th>pending</th></tr></thead>
<tbody></tbody></table>
<h2>Placement</h2>
<div id="placement-note"></div>
<table id="placement"><thead><tr><th>when</th><th>decision</th><th>model</th><th>server</th>
<th>rule</th><th>outcome</th><th>why</th></tr></thead><tbody></tbody></table>
<h2>Processes</h2>
<div id="processes-note"></div>
<table id="processes"><thead><tr><th>process</th><th>kind</th><th>pid</th><th>state</th>
<th>restarts</th><th>last exit</th><th>in state for</th></tr></thead><tbody></tbody></table>
<h2>Scale events</h2>
<table id="scale"><thead><tr><th>when</th><th>pool</th><th>from</th><th>to</th>
<th>metric ms</th><th>why</th><th>outcome</th></tr></thead><tbody></tbody></table>
<script>
const ms = us => us == null ? "–" : (us / 1000).toFixed(2);
function cell(text, cls) {
  const td = document.createElement("td"); td.textContent = text;
  if (cls) td.className = cls; return td;
}
function fill(id, rows, data) {
  const body = document.querySelector("#" + id + " tbody"); body.replaceChildren();
  rows.forEach((r, k) => {
    const tr = document.createElement("tr"); tr.append(...r);
    Object.assign(tr.dataset, data ? data[k] : {}); body.append(tr);
  });
}
const STATE_CLASS = {running: "ok", restarting: "warn", dead: "bad", stopped: "",
                     "not answering": "bad"};
function processes(p) {
  const note = document.getElementById("processes-note");
  note.textContent = p ? p.note : "processes unknown to this gateway";
  note.className = p && p.local && !p.supervised ? "warn" : "";
  const records = p ? p.records : [];
  const now = Date.now() / 1000;
  fill("processes", records.map(r => [
    cell(r.name), cell(r.kind), cell(r.pid, "num"),
    cell(r.state === "stopped" ? "stopped (on purpose)"
         : r.why ? r.state + " (" + r.why + ")" : r.state, STATE_CLASS[r.state]),
    cell(r.restarts, "num"), cell(r.last_exit || "–"),
    cell(r.since ? (now - r.since).toFixed(0) + " s" : "–", "num")]),
    records.map(r => ({process: r.name, state: r.state, restarts: r.restarts})));
}
const when = at => new Date(at * 1000).toLocaleTimeString();
const OUTCOME_CLASS = o => !o ? "warn" : o.startsWith("failed") ? "bad" : "";
function placement(p) {
  const note = document.getElementById("placement-note");
  if (!p) { note.textContent = "placement is off: every server keeps the models it starts with"; }
  else {
    const held = Object.entries(p.held || {}).map(([m, n]) => `${m}: ${n}`);
    note.textContent = held.length ? "requests held: " + held.join(", ") : "no request held";
  }
  const decisions = p ? p.decisions.slice().reverse() : [];
  fill("placement", decisions.map(d => [
    cell(when(d.at)), cell(d.kind), cell(d.model), cell(d.server), cell(d.rule),
    cell(d.outcome || "in progress", OUTCOME_CLASS(d.outcome)), cell(d.reason)]),
    decisions.map(d => ({model: d.model, kind: d.kind})));
}
async function refresh() {
  try {
    const reply = await fetch("v1/status", {cache: "no-store"});
    const data = await reply.json(); const st = data.state || {};
    const servers = st.servers || [];
    const ready = servers.filter(s => s.ready && !s.draining).length;
    document.getElementById("meta").textContent =
      `${ready}/${servers.length} servers taking work · gRPC endpoint ${st.grpc || "–"} · ` +
      `balancing ${st.balancing || "–"} · state ${data.updated_at ?
        ((Date.now() / 1000 - data.updated_at).toFixed(1) + " s old") : "never read"}` +
      (data.error ? " · " + data.error : "");
    fill("servers", servers.map(s => [
      cell(s.id),
      s.draining ? cell("draining", "warn")
        : cell(s.ready ? "ready" : "down", s.ready ? "ok" : "bad"),
      cell(s.weight, "num"), cell(s.pool || "default"), cell(s.grpc), cell(s.http),
      cell((s.models || []).join(", "))]));
    const rows = [];
    for (const [name, m] of Object.entries(st.models || {})) {
      const a = (st.admission || {})[name] || {};
      const adm = a.state === "shed" ? cell("shed: " + a.reason, "bad")
        : cell(a.fail_open ? "open (no metrics)" : "open", a.fail_open ? "warn" : "ok");
      const loads = m.load && m.load.length ? m.load : [{}];
      loads.forEach((l, k) => rows.push([cell(k ? "" : name), k ? cell("") : adm,
        cell(l.server || "–"), cell(ms(l.queue_us_per_request), "num"),
        cell(ms(l.compute_us_per_request), "num"),
        cell(l.throughput_rps == null ? "–" : l.throughput_rps.toFixed(1), "num"),
        cell(l.pending == null ? "–" : l.pending, "num")]));
    }
    fill("models", rows);
    placement(st.placement);
    processes(data.processes);
    fill("scale", (st.scale_events || []).slice().reverse().map(e => [
      cell(when(e.at)), cell(e.pool || "default"), cell(e.from, "num"), cell(e.to, "num"),
      cell(e.metric_ms == null ? "–" : e.metric_ms.toFixed(1), "num"), cell(e.reason || "–"),
      cell(e.outcome || "in progress", OUTCOME_CLASS(e.outcome))]));
  } catch (err) {
    document.getElementById("meta").textContent = "gateway unreachable: " + err;
  }
}
refresh(); setInterval(refresh, 2000);
</script>
</body></html>
"""

"""A server that stopped answering for a while during a stream (SIGSTOP, then SIGCONT: hung,
then woke) caused retries and events executed twice, and nothing in the report named it:
the supervisor keeps each silence on the process's record, and the stream's end names it
(`site_incidents`, the console's `site:` line). `submit`'s pre-flight notes a process that
does not answer, in `status`'s words, and goes on; the report keeps the note. A stream with
nothing to say about the site has `site_incidents` [] (it was null).

Real processes (Python HTTP servers of kinds probed for hangs) under a real supervisor."""

from __future__ import annotations

import os
import signal
from types import SimpleNamespace

from answering_site import answering_site, record
from polling import wait_until

from sonicsite.jobs.driver import StreamSpec, _site_at_end
from sonicsite.jobs.preflight import check_site
from sonicsite.jobs.site_end import processes_now, site_incidents
from sonicsite.jobs.summary import _incident_lines
from sonicsite.local import launcher
from sonicsite.local.state import SiteState
from sonicsite.local.supervision import SupervisionPolicy

# the silence is not ended by a kill: the process comes back by itself
PATIENT = SupervisionPolicy(interval_s=0.2, probe_timeout_s=0.5, hang_after_s=600.0)


def test_a_silence_during_the_stream_is_named_at_its_end_and_noted_before_it(tmp_path):
    site_dir = answering_site(tmp_path / "site", ("gateway", "operator"), PATIENT)
    try:
        before = processes_now(site_dir)
        victim = record(site_dir, "gateway")
        os.killpg(victim.pid, signal.SIGSTOP)
        try:
            wait_until(
                lambda: record(site_dir, "gateway").silent_since > 0,
                "the supervisor to record the gateway's silence",
            )
            notes: list[str] = []
            check_site(SimpleNamespace(backend="site", site_dir=site_dir, models=[]), notes.append)
            at_end = site_incidents(before, processes_now(site_dir))
        finally:
            os.killpg(victim.pid, signal.SIGCONT)
        (note,) = notes
        head = f"submit: site at {site_dir}: NOT ANSWERING: gateway (pid {victim.pid}): "
        assert note.startswith(head + "stopped (SIGSTOP): `kill -CONT "), note
        assert note.endswith("; going on"), note
        (still,) = at_end
        assert still.startswith("gateway: not answering at the end of the stream (for "), still

        after = wait_until(
            lambda: (r := record(site_dir, "gateway")).silences and not r.silent_since and r,
            "the silence to end in an answer",
        )
        ((start, end),) = after.silences
        assert after.restarts == 0 and after.pid == victim.pid
        befell = site_incidents(before, processes_now(site_dir))
        said = f"gateway: not answering for {end - start:.0f} s during the stream (not restarted)"
        assert befell == [said]

        # the report: the incident, and the pre-flight's note, on the console's summary too
        report: dict = {"events_failed": 0, "site_at_start": notes}
        spec = StreamSpec(site_dir, [], 1, 1, 1, tmp_path / "out")
        _site_at_end(report, spec, SiteState.load(site_dir), "", before)
        assert report["site_incidents"] == [said]
        shown = _incident_lines(report)
        assert shown[0] == "site at the start: " + note.removeprefix("submit: ").removesuffix(
            "; going on"
        )
        assert shown[1] == f"site: {said}"
        # a stream that began after it: nothing befell the site, an empty list (not null)
        quiet: dict = {"events_failed": 0}
        _site_at_end(quiet, spec, SiteState.load(site_dir), "", processes_now(site_dir))
        assert quiet["site_incidents"] == []
    finally:
        launcher.down(site_dir)

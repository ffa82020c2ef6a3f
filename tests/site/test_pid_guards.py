"""The guard against PID reuse before a recorded PID is signalled or believed, and the
supervisor's health probe, against real processes of the test's own: a folder named as a
whole path (a site in `.../s1` is not one in `.../s10`), a kernel thread is no site's, a
group is killed only while it is the site's, and a port that answers in something other
than HTTP is a probe that failed, not an error that stops every sweep."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from loopback_http import answering
from polling import wait_until

from sonicsite.contract.processes_seen import kernel_thread, runs_for_site
from sonicsite.local.processes import site_group, stop_group
from sonicsite.local.supervisor import answers

SLEEP = [sys.executable, "-c", "import time; time.sleep(600)"]


def _start(args: list[str], cwd: Path) -> subprocess.Popen:
    """`args` started in `cwd`, once its command line is there: while a process is in exec
    it has none for an instant, and the guard then takes a recorded PID for the site's
    (a site's process just started is in exec too)."""
    proc = subprocess.Popen(args, cwd=cwd, start_new_session=True)
    try:
        wait_until(lambda: Path(f"/proc/{proc.pid}/cmdline").read_bytes(), "its command line")
    except BaseException:  # not left running when the wait fails
        stop_group(proc.pid)
        proc.wait(timeout=60)
        raise
    return proc


def test_a_site_folder_is_named_as_a_whole_path(tmp_path):
    """A process whose command names `.../s10/...` was taken for site `.../s1`'s (the name
    matched as a substring), so that `down` on s1 stopped s10's processes."""
    s1, s10, elsewhere = tmp_path / "s1", tmp_path / "s10", tmp_path / "else"
    for folder in (s1, s10, elsewhere):
        folder.mkdir()
    proc = _start([*SLEEP, f"--site={s10}", str(s10 / "config.json")], elsewhere)
    try:
        assert runs_for_site(proc.pid, str(s10))
        assert not runs_for_site(proc.pid, str(s1))
        assert not site_group(proc.pid, str(s1)) and site_group(proc.pid, str(s10))
    finally:
        stop_group(proc.pid)
        proc.wait(timeout=60)


def test_a_process_in_the_site_folder_is_the_sites_and_a_stranger_is_not(tmp_path):
    site, elsewhere = tmp_path / "site", tmp_path / "else"
    site.mkdir()
    elsewhere.mkdir()
    started = [_start(SLEEP, site)]  # each stopped by its PID, whatever fails
    try:
        started.append(_start(SLEEP, elsewhere))
        ours, stranger = started
        assert site_group(ours.pid, str(site))
        assert not site_group(stranger.pid, str(site))  # a recorded PID given to it: spared
    finally:
        for proc in started:
            stop_group(proc.pid)
            proc.wait(timeout=60)


def test_a_kernel_thread_is_no_sites_process():
    """A kernel thread has no command line, ever, as a process in exec has for an instant:
    one that got a recorded PID passed for the site's live process (`up` refused, `status`
    said running, the supervisor restarted nothing)."""
    threads = [
        int(entry)
        for entry in (p.name for p in Path("/proc").iterdir())
        if entry.isdigit() and kernel_thread(int(entry))
    ]
    for pid in threads[:5]:  # where the machine shows its kernel's threads
        assert not runs_for_site(pid, "/")
    assert not kernel_thread(os.getpid())


def test_a_port_that_answers_in_something_else_than_http_is_a_failed_probe():
    """A health port taken by a program that is not HTTP: its BadStatusLine went out of the
    probe and failed every sweep of the supervisor, so that nothing was restarted."""
    listener, port, _ = answering(b"SSH-2.0-OpenSSH_9.2\r\n")
    try:
        assert answers(f"http://127.0.0.1:{port}/healthz", 10.0) is False
    finally:
        listener.close()

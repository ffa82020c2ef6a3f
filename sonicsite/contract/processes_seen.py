"""What /proc says of a process, read here and nowhere else: the PIDs there are (`pids`);
the one parser of /proc/PID/stat (`stat_fields`): whether it lives (`pid_alive`), whether it
is the kernel's, when it started and whether it is still the process that started then
(`start_ticks`, `same_process`: the job driver's `kill_left_behind`, abandoned adds), its
parent; its command line (`cmdline`, `command_line` for a log line), the environment it was
started with (`environ_has`: a site's mark), its resident memory (`rss_bytes`), the flock it
holds (`flock_pid`); whether it is a site's (`runs_for_site`, the guard against PID reuse
that wire.py `lives_for_site` applies to a record), whether an argument names a folder;
and whether its health URL answers (a live PID that does not is stopped or hung: the
supervisor, `status`, the status page), and if not, why (`no_answer`: a refused connection
is not a silence)."""

from __future__ import annotations

import http.client
import os
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def names_folder(arg: bytes, folder: bytes) -> bool:
    """Whether a command-line argument (or an option's value, `--x=VALUE`) is `folder` or a
    path inside it: whole components (a site in `.../s1` is not one in `.../s10`)."""
    value = arg.split(b"=", 1)[1] if arg.startswith(b"-") and b"=" in arg else arg
    folder = folder.rstrip(b"/")
    return value.rstrip(b"/") == folder or value.startswith(folder + b"/")


KERNEL_THREAD = 0x00200000  # PF_KTHREAD, in the flags of /proc/PID/stat


def stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name (the first is the state, field 3 of
    proc(5); the name may hold spaces and parentheses, so it is cut at the last `)`); []
    when it cannot be read (gone, not ours)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def pid_alive(pid: int) -> bool:
    """True while process `pid` exists on this machine and is not a zombie (the one
    definition; whether it is still a site's process: `runs_for_site`)."""
    fields = stat_fields(pid) if pid > 0 else []
    return bool(fields) and fields[0] != "Z"


def parent_pid(pid: int) -> int | None:
    """The parent of process `pid`; None when it cannot be read (gone, not ours)."""
    try:
        return int(stat_fields(pid)[1])
    except (IndexError, ValueError):
        return None


def kernel_thread(pid: int) -> bool:
    """Whether `pid` is one of the kernel's threads (a PID of ours may be given to one)."""
    try:
        return bool(int(stat_fields(pid)[6]) & KERNEL_THREAD)
    except (IndexError, ValueError):
        return False


def start_ticks(pid: int) -> int:
    """When live process `pid` started, in clock ticks since boot: with its PID, a name that
    a later process cannot have (no wall clock in it to be set back or forward); -1 for a
    zombie or when it cannot be read."""
    fields = stat_fields(pid)
    try:
        return -1 if fields[0] == "Z" else int(fields[19])
    except (IndexError, ValueError):
        return -1


def same_process(pid: int, ticks: int) -> bool:
    """Whether `pid` is still the process that started at `ticks` (`start_ticks`, recorded
    when it started): a PID and its start no later process can have; False for a zombie."""
    return pid > 0 and ticks >= 0 and start_ticks(pid) == ticks


def pids() -> list[int]:
    """The PIDs /proc lists now (each may be gone by the time it is read)."""
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def descendants(pid: int) -> set[int]:
    """Process `pid` and every process below it (/proc/PID/task/*/children); what vanished
    while it was read is left out."""
    found = {pid}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            children = (task / "children").read_text().split()
        except OSError:
            continue  # a thread that ended meanwhile
        for child in children:
            found |= descendants(int(child))
    return found


def cmdline(pid: int) -> list[str] | None:
    """The arguments process `pid` runs with (/proc/PID/cmdline, decoded): [] while it has
    none (a zombie, a kernel thread, one in exec); None when it cannot be read (gone, not
    ours)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return None
    args = raw.decode(errors="replace").split("\0")
    return args[:-1] if args[-1] == "" else args  # each argument ends with a NUL


def command_line(pid: int) -> str:
    """Process `pid`'s command line as one line, for a log line or a message; "" when it
    has none or cannot be read."""
    return " ".join(cmdline(pid) or []).strip()


def environ_has(pid: int, entry: str) -> bool:
    """Whether the environment process `pid` was started with holds `entry` (`NAME=VALUE`,
    whole); False when it cannot be read (gone, not ours)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return False
    return b"\0" + entry.encode() + b"\0" in b"\0" + environ


def rss_bytes(pid: int) -> int | None:
    """Process `pid`'s resident memory in bytes (/proc/PID/statm); None when it cannot be
    read (gone, not ours)."""
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return pages * os.sysconf("SC_PAGE_SIZE")


def flock_pid(inode: int) -> int | None:
    """The PID holding a flock on the file of `inode` (/proc/locks): 0 when none does, None
    when /proc/locks cannot be read."""
    try:
        lines = Path("/proc/locks").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        fields = line.split()
        if "->" in fields or len(fields) < 6 or fields[1] != "FLOCK":
            continue  # a waiter, or not a flock
        if fields[5].rsplit(":", 1)[-1] == str(inode):
            return int(fields[4])
    return 0


def runs_for_site(pid: int, site_dir: str, server_id: str = "") -> bool:
    """Guard against PID reuse (a state file left by a crash or a reboot): live process `pid`
    is the site's. With `server_id`: that server's tritonserver, its command naming the site;
    else it runs in the site's directory, or its command line names it."""
    names = {site_dir, os.path.realpath(site_dir)} - {""}
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        cwd = "" if server_id else os.readlink(f"/proc/{pid}/cwd")
    except OSError:  # gone, or not ours to read
        return False
    if not cmdline:  # in exec: the kernel sets the new command line just after (or a zombie)
        return pid_alive(pid) and not kernel_thread(pid)  # a kernel thread has none ever
    argv = cmdline.split(b"\0")
    named = any(names_folder(arg, n.encode()) for arg in argv for n in names)
    if server_id:
        named = named and argv[0].endswith(b"tritonserver")
        named = named and f"--id={server_id}".encode() in argv
    return pid_alive(pid) and (named or cwd in names)


def answers(url: str, timeout: float) -> bool:
    """True when `url` gives any HTTP answer within `timeout`: a process that answers 503
    is alive; one that is stopped or hung gives none (why not: `no_answer`)."""
    return not no_answer(url, timeout)


REFUSED = "connection refused"  # nothing listens there: not open yet, or closed


def unanswered(urls: dict[str, str], timeout: float) -> dict[str, str]:
    """Of `urls` (a process's name -> its health URL), those with no answer in `timeout`,
    with why (`no_answer`), all asked at once: `status` and the status page alike."""
    if not urls:
        return {}
    with ThreadPoolExecutor(len(urls), thread_name_prefix="status-probe") as pool:
        said = pool.map(lambda url: no_answer(url, timeout), urls.values())
        found = dict(zip(urls, said, strict=True))
    return {name: why for name, why in found.items() if why}


def no_answer(url: str, timeout: float) -> str:
    """Why `url` gives no HTTP answer within `timeout`; "" when it gives one (any status).
    REFUSED: nothing listens on its port (a process still starting, or one that closed
    it); "no answer in T s": something listens and says nothing (stopped or hung); else
    what went wrong (not HTTP: another program on its port)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return ""
    except urllib.error.HTTPError:
        return ""
    except urllib.error.URLError as exc:
        return _why(exc.reason, timeout)
    except (OSError, http.client.HTTPException, ValueError) as exc:
        return _why(exc, timeout)


def _why(exc: object, timeout: float) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED
    if isinstance(exc, TimeoutError):
        return f"no answer in {timeout:g} s"
    if isinstance(exc, ConnectionResetError):
        return "connection reset before an answer"
    if isinstance(exc, http.client.HTTPException):
        return f"not an HTTP answer ({type(exc).__name__}: {exc})"
    return str(exc) or type(exc).__name__

"""What a process's entries in /proc say about it, for the guard against PID reuse
(wire.py `runs_for_site`): whether an argument names a folder, whether it is the kernel's."""

from __future__ import annotations


def names_folder(arg: bytes, folder: bytes) -> bool:
    """Whether a command-line argument (or an option's value, `--x=VALUE`) is `folder` or a
    path inside it: whole components (a site in `.../s1` is not one in `.../s10`)."""
    value = arg.split(b"=", 1)[1] if arg.startswith(b"-") and b"=" in arg else arg
    folder = folder.rstrip(b"/")
    return value.rstrip(b"/") == folder or value.startswith(folder + b"/")


KERNEL_THREAD = 0x00200000  # PF_KTHREAD, in the flags of /proc/PID/stat


def kernel_thread(pid: int) -> bool:
    """Whether `pid` is one of the kernel's threads (a PID of ours may be given to one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            flags = int(f.read().rsplit(")", 1)[1].split()[6])
    except (OSError, IndexError, ValueError):
        return False
    return bool(flags & KERNEL_THREAD)

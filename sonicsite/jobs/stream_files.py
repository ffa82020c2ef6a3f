"""A stream's own files in `--out`: `stream.json` (what a resumed submit needs to go on with
the same stream) and `stream.lock` (held by the one driver running it), and the checks of
`--out` itself, made before any worker starts.

`--out` is refused, naming it and why, when it is a file or cannot be written, when
another submit runs the stream there (its PID named), when `--resume` finds no stream there
(nothing is created then), and when a new stream would clear an unfinished one (events
without an answer) without `--fresh`. `--resume` is refused when the stream there was run
with other models, jobs, events, seed, batch or site: the same request ids would name other
events.
"""

from __future__ import annotations

import fcntl
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sonicsite.local.state import lock_holder

LOCK_FILE = "stream.lock"

# stream.json's shape key -> the option that sets it (what a resume must give the same)
SHAPE_OPTIONS = {
    "models": "--model",
    "jobs": "--jobs",
    "events": "--events",
    "seed": "--seed",
    "batch": "--batch",
    "site": "--dir",
}


def stream_shape(spec: Any) -> dict:
    """What a resumed stream must share with the first run: the events (models, jobs, events
    per job, seed: the same request ids name the same inputs), the chunks (batch: the chunks
    a killed worker sent are asked of the servers by their ids) and the site."""
    return {
        "models": list(spec.models),
        "jobs": spec.jobs,
        "events": spec.events,
        "seed": spec.seed,
        "batch": spec.batch,
        "site": str(Path(spec.site_dir).resolve()),
    }


NO_REPORT = (
    "ended without its report: its submit was killed (SIGKILL, a crash, the machine going "
    "down); its workers stopped with it"
)


@dataclass
class StreamRecord:
    """`OUT/stream.json`: what a resumed submit needs to go on with the same stream (its
    request ids, where its execution-log lines start, each job's open-loop start), the
    intervals its runs took (`runs`: a resume's duration leaves out the time between them)
    and whether every event has its answer, or a wrong one (`complete`)."""

    stream: str
    since: dict[str, int]  # execution-log sizes at the stream's start
    started: float
    start_at: dict[str, float] = field(default_factory=dict)  # job -> first start (epoch s)
    run_starts: dict[str, list[int]] = field(default_factory=dict)  # job -> each run's 1st try
    shape: dict = field(default_factory=dict)  # stream_shape: must match to resume
    runs: list[list[float]] = field(default_factory=list)  # [start, last seen] of each run
    complete: bool = False  # no event left that a resume would send
    ended: list[str] = field(default_factory=list)  # how each run ended ("": no report)

    FILE = "stream.json"

    def save(self, out: Path) -> None:
        tmp = out / (self.FILE + ".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(out / self.FILE)

    @classmethod
    def read(cls, out: Path) -> StreamRecord | None:
        """The record in `out`, None without one; ValueError naming the file when it is not
        one of ours."""
        path = out / cls.FILE
        try:
            data = json.loads(path.read_text())
            known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
            return cls(**known)
        except FileNotFoundError:
            return None
        except (ValueError, TypeError, AttributeError) as exc:
            raise ValueError(
                f"--out {out}: {path} is not a stream's record ({exc}); use another --out, "
                "or --fresh to start a new stream there"
            ) from None

    def check_shape(self, shape: dict, out: Path) -> None:
        """ValueError naming each option that differs from the stream's first run."""
        differ = [
            f"{SHAPE_OPTIONS[k]} {_shown(self.shape[k])} (not {_shown(shape[k])})"
            for k in SHAPE_OPTIONS
            if k in self.shape and k in shape and self.shape[k] != shape[k]
        ]
        if differ:
            raise ValueError(
                f"--resume: the stream in {out / self.FILE} was run with {'; '.join(differ)}; "
                "resume it with the same options, or start a new one with --fresh"
            )

    def begin_run(self, now: float, jobs_dir: Path) -> None:
        """A run starts; a record from before runs were kept counts its first run as lasting
        until its journals' last change."""
        if not self.runs:
            self.runs.append([self.started, max(self.started, journals_changed(jobs_dir))])
        self.runs.append([now, now])

    def end_run(self, how: str) -> None:
        """The run under way ends with its report: `how` ("finished", "stopped by SIGINT")."""
        self.ended += [""] * (len(self.runs) - len(self.ended))
        self.ended[-1] = how

    def runs_ended(self) -> list[str]:
        """How each run before this one ended: a run with no ending on record was cut off
        before its report (its submit killed), which its resume's report says."""
        said = self.ended + [""] * (len(self.runs) - len(self.ended))
        return [how or NO_REPORT for how in said[:-1]]

    def seen(self, now: float) -> None:
        """The run is still going at `now` (what is kept of it if it is killed)."""
        self.runs[-1][1] = now


def _shown(value: object) -> str:
    return ",".join(value) if isinstance(value, list) else str(value)


def check_out(out: Path, resume: bool) -> None:
    """`--out` before anything is created: ValueError naming it and why."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {out}: exists and is not a directory")
    if resume and not (out / StreamRecord.FILE).is_file():
        raise ValueError(
            f"--resume: {out / StreamRecord.FILE} does not exist: no stream to resume in "
            f"--out {out}"
        )
    parent = next((p for p in [out, *out.parents] if p.exists()), None)
    if parent is not None and not parent.is_dir():
        raise ValueError(f"--out {out}: {parent} is a file, not a directory")
    if parent is not None and not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: {parent} is not writable")


@dataclass
class OutLock:
    """The exclusive flock on `OUT/stream.lock`, held for the driver's life."""

    path: Path
    fd: int

    def release(self) -> None:
        os.close(self.fd)  # closing it drops the flock


def lock_out(out: Path) -> OutLock:
    """Create `out` and take its stream lock; ValueError naming --out and why when it cannot
    be created or written, or naming the submit that holds the lock."""
    out = Path(out)
    path = out / LOCK_FILE
    try:
        (out / "jobs").mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        raise ValueError(f"--out {out}: cannot write there: {exc.strerror or exc}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = lock_holder(os.fstat(fd).st_ino)
        os.close(fd)
        raise ValueError(
            f"--out {out}: another submit runs the stream there ({holder} holds {path}); "
            "wait for it to end, or use another --out"
        ) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return OutLock(path, fd)


def refuse_unfinished(out: Path, record: StreamRecord | None) -> None:
    """A new stream would clear an unfinished one's journals: ValueError saying how to
    finish it or start anew."""
    if record is None or record.complete:
        return
    raise ValueError(
        f"--out {out} holds stream {record.stream}, unfinished (events without an answer: "
        "its submit was killed or stopped, or events failed); finish it with --resume, or "
        "start a new stream there with --fresh (its journals are cleared)"
    )


def journals_changed(jobs_dir: Path) -> float:
    """The last time any of the stream's journals changed (0 without any)."""
    times = [p.stat().st_mtime for p in jobs_dir.glob("job-*.journal")]
    return max(times, default=0.0)

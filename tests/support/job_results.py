"""A job's result as a worker writes it (sonicsite/jobs/worker.py), every event failed: what
the report and the console summary are built from in tests that need no worker."""

from __future__ import annotations


def failed_job(job: int, failed: dict[str, str], model: str = "simple") -> dict:
    """Job `job` of `model`, whose events (by index) each failed with the message given."""
    return {
        "job": job,
        "model": model,
        "first_event": 0,
        "events": len(failed),
        "transport": "grpc",
        "answered": {},
        "failed": failed,
        "requests": [],
        "retries": 0,
        "overloaded": 0,
        "client": {},
        "attempt": 1,
        "error": None,
        "span": [],
        "from_journal": False,
    }

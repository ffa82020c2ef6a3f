"""The stall limit a worker gets when the user gives none (stall.py): over the longest wait
of a healthy chunk, three times, plus what the job itself may spend between two answers."""

from __future__ import annotations

from dataclasses import replace

from sonicsite.jobs.driver import StreamSpec
from sonicsite.jobs.stall import longest_chunk_s, stall_limit


def test_the_default_limit_is_three_of_the_longest_healthy_chunk_plus_the_jobs_own_time(tmp_path):
    spec = StreamSpec(site_dir=tmp_path, models=["m"], jobs=2, wave=2, events=100, out=tmp_path)
    assert spec.job_stall_s is None
    assert longest_chunk_s() == 8 * 60 + 600 + 120  # tries at their cap, sheds, a model held
    assert stall_limit(spec) == 3600
    # the job's own work for all its events, 1 s each, may fall between two answers...
    assert stall_limit(replace(spec, cpu_ms_per_event=1000)) == 3600 + 100
    # ...and so may its open-loop schedule: 100 events at 2/s (the wave's 4/s, two jobs)
    assert stall_limit(replace(spec, rate=4.0)) == 3600 + 50


def test_a_limit_the_user_gives_is_the_one_applied_and_zero_is_never(tmp_path):
    spec = StreamSpec(site_dir=tmp_path, models=["m"], jobs=1, wave=1, events=10, out=tmp_path)
    assert stall_limit(replace(spec, job_stall_s=30)) == 30
    assert stall_limit(replace(spec, job_stall_s=0)) == 0

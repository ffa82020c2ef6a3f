"""The CPU an AOTInductor package is compiled for (client/aot.py `cpu_tag`, part of its
cache key): read from /proc/cpuinfo, and a cpuinfo that cannot be read is said, naming it,
not taken for "no CPU model, no flags" (a key of the machine alone, which would hand a
package compiled for another CPU's vector instructions to this one)."""

from __future__ import annotations

import pytest
from sonicsite.client.aot import cpu_tag

CPUINFO = "processor\t: 0\nmodel name\t: A CPU\nflags\t\t: sse avx {more}\n\nprocessor\t: 1\n"


def test_the_tag_is_the_cpus_model_and_flags(tmp_path):
    one, other, more = (tmp_path / name for name in ("one", "other", "more"))
    one.write_text(CPUINFO.format(more="avx2"))
    other.write_text(CPUINFO.format(more="avx2").replace("sse avx avx2", "avx2 avx sse"))
    more.write_text(CPUINFO.format(more="avx2 avx512f"))
    assert cpu_tag(one) == cpu_tag(other) != cpu_tag(more)  # the flags, in any order
    assert len(cpu_tag()) == 12  # this machine's


def test_a_cpuinfo_that_cannot_be_read_is_said(tmp_path):
    missing = tmp_path / "cpuinfo"
    with pytest.raises(ValueError, match=f"{missing} cannot be read.*--compile jit"):
        cpu_tag(missing)
    with pytest.raises(ValueError, match=f"{tmp_path} cannot be read"):
        cpu_tag(tmp_path)  # a folder: IsADirectoryError

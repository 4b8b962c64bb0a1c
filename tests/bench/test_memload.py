"""RSS per open stream: reading VmRSS and the per-stream figure."""

from __future__ import annotations

import math
import os

import pytest

from bench.memload import MemoryResult, parse_vmrss_kib, read_rss_kib

STATUS = "Name:\tpython\nVmPeak:\t  300000 kB\nVmRSS:\t   51200 kB\nThreads:\t1\n"


def test_vmrss_is_read_in_kib():
    assert parse_vmrss_kib(STATUS) == 51200
    with pytest.raises(ValueError, match="VmRSS"):
        parse_vmrss_kib("Name:\tkthreadd\n")
    with pytest.raises(ValueError, match="unit"):
        parse_vmrss_kib("VmRSS:\t 5 MB\n")
    assert read_rss_kib(os.getpid()) > 1000


def test_kib_per_stream_is_the_growth_over_the_streams_open():
    m = MemoryResult(1000, {"target": 40_000}, {"target": 60_500}, 1.5)
    assert m.kib_per_stream("target") == pytest.approx(20.5)
    assert math.isnan(m.kib_per_stream("other"))
    assert math.isnan(MemoryResult(0, {"target": 1}, {"target": 2}, 9.0).kib_per_stream("target"))

"""The benchmark's plot: drawn from a report, placed beside the table unless told where."""

from __future__ import annotations

import struct
from pathlib import Path

from bench.plot import plot_path, write_plot
from bench.run import BenchOptions, BenchReport, RoundResult, aggregate
from tests.bench.test_run import TARGETS, _load


def test_plot_is_drawn_for_every_target(tmp_path):
    opts = BenchOptions(targets=TARGETS, rounds=1)
    results = [
        RoundResult("direct", 0, _load(1000, 0.2, 1.0, None)),
        RoundResult("passthrough", 0, _load(1000, 0.5, 2.5, 0.020)),
        RoundResult("tokenstamp", 0, _load(1000, 0.6, 3.0, 0.035)),
    ]
    rows = aggregate(opts, results, {"direct": "aa", "passthrough": "aa", "tokenstamp": "aa"})
    report = BenchReport(options=opts, rows=rows, rounds=tuple(results), elapsed_s=12.0)
    path = write_plot(report, tmp_path / "bench.png", dpi=100)
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", head[16:24]) == (1100, 420)


def test_plot_goes_beside_the_table_unless_told_where():
    assert plot_path(Path("x/plot.png"), Path("t.md"), None) == Path("x/plot.png")
    assert plot_path(None, Path("out/bench.md"), Path("out/bench.json")) == Path("out/bench.png")
    assert plot_path(None, None, Path("r.json")) == Path("r.png")
    assert plot_path(None, None, None) is None

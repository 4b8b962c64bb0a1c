"""The benchmark page's latest run is a bench output spliced between two marker lines."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.docpage import BEGIN, END, PageError, between, main, splice

PAGE = Path(__file__).resolve().parents[2] / "docs" / "benchmark.md"


def test_splice_replaces_only_what_is_between_the_markers():
    page = f"# Benchmark\n\nbefore\n\n{BEGIN}\n\nold table\n\n{END}\n\nafter\n"
    tables = "steady: new\n\n| a | b |\n|---|---:|\n| x | 1 |\n"
    out = splice(page, tables)
    assert out.startswith("# Benchmark\n\nbefore\n\n" + BEGIN + "\n\n")
    assert out.endswith(END + "\n\nafter\n")
    assert between(out) == tables
    assert splice(out, tables) == out  # splicing the same output again changes nothing


@pytest.mark.parametrize("page", ["no markers\n", f"{END}\nx\n{BEGIN}\n",
                                  f"{BEGIN}\n{BEGIN}\n{END}\n"])  # fmt: skip
def test_a_page_without_one_pair_of_markers_in_order_is_refused(page):
    with pytest.raises(PageError):
        splice(page, "t\n")


def test_main_writes_the_page_in_place(tmp_path):
    tables, page = tmp_path / "bench.md", tmp_path / "page.md"
    tables.write_text("max-rate: x\n", encoding="utf-8")
    page.write_text(f"top\n{BEGIN}\n{END}\nend\n", encoding="utf-8")
    assert main([str(tables), str(page)]) == 0
    assert between(page.read_text(encoding="utf-8")) == "max-rate: x\n"
    page.write_text("no markers\n", encoding="utf-8")
    assert main([str(tables), str(page)]) == 1


def test_the_benchmark_page_shows_a_bench_run_at_two_lengths_with_max_rate():
    """What ``make bench-docs`` writes: steady and max-rate at 10 and 200 tokens, each fitted,
    the fitted tables with max-rate's requests/s at 10 tokens."""
    text = between(PAGE.read_text(encoding="utf-8"))
    assert text.startswith("Run ")
    assert "\n\nsteady: 64 streams" in text
    for line in ("steady, fitted from 10, 200 tokens per request",
                 "max-rate, fitted from 10, 200 tokens per request"):  # fmt: skip
        assert line in text
    assert text.count("| max-rate requests/s at 10 tokens |") == 2
    assert "10 tokens per request and the next request at once" in text
    assert "Every ended body byte-identical to the backend's" in text


def _section(page: str, heading: str) -> str:
    start = page.index(f"\n{heading}\n")
    end = page.find("\n#", start + len(heading) + 2)
    return page[start : end if end >= 0 else len(page)]


def test_every_figure_the_reading_cites_is_in_the_run_it_reads():
    """The hand-written reading under the latest run cites its figures from that run, so a
    new ``make bench-docs`` that changes them fails here until the reading is rewritten."""
    page = PAGE.read_text(encoding="utf-8")
    run = between(page)
    reading = _section(page, "## How to read it")
    cited = re.findall(r"\d[\d,]*\.\d+x?|\d{2,}[\d,]*x?", reading.replace("`", " "))
    assert cited, "the reading cites no figure"
    missing = [n for n in cited if n not in run]
    assert not missing, f"figures in the reading that the spliced run does not show: {missing}"

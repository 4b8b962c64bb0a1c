"""Put a bench run's Markdown into the benchmark page, between the page's two marker lines.

``python -m bench.docpage TABLES PAGE`` replaces what lies between ``BEGIN`` and ``END``
in ``PAGE`` (docs/benchmark.md) with the text of ``TABLES`` (what ``tokenstamp bench
--markdown`` wrote), byte for byte, so the page shows the bench's own output and never a
hand-edited table. ``make bench-docs`` runs the bench with the page's flags, then this.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

BEGIN = "<!-- bench output: begin (make bench-docs writes what follows) -->"
"""The line after which the bench's tables start."""
END = "<!-- bench output: end -->"
"""The line before which they end."""


class PageError(ValueError):
    """The page lacks the markers, or has them more than once or out of order."""


def _bounds(page: str) -> tuple[int, int]:
    if page.count(BEGIN) != 1 or page.count(END) != 1:
        raise PageError(f"the page needs the lines {BEGIN!r} and {END!r}, once each")
    begin, end = page.index(BEGIN), page.index(END)
    if end < begin:
        raise PageError(f"{END!r} comes before {BEGIN!r}")
    return begin + len(BEGIN), end


def splice(page: str, tables: str) -> str:
    """``page`` with the text between its marker lines replaced by ``tables`` (a blank line
    on either side, so Markdown reads the first and last lines as their own paragraphs)."""
    after_begin, end = _bounds(page)
    body = tables if tables.endswith("\n") else tables + "\n"
    return f"{page[:after_begin]}\n\n{body}\n{page[end:]}"


def between(page: str) -> str:
    """The bench's text as it stands between the markers (what ``splice`` put there)."""
    after_begin, end = _bounds(page)
    return page[after_begin:end].removeprefix("\n\n").removesuffix("\n")


def main(argv: Sequence[str] | None = None) -> int:
    """Splice ``TABLES`` into ``PAGE`` in place; 0 on success, 1 on a page without markers."""
    p = argparse.ArgumentParser(prog="python -m bench.docpage", description=__doc__)
    p.add_argument("tables", type=Path, help="the Markdown tokenstamp bench wrote")
    p.add_argument("page", type=Path, help="the page to update (docs/benchmark.md)")
    a = p.parse_args(argv)
    try:
        text = splice(a.page.read_text(encoding="utf-8"), a.tables.read_text(encoding="utf-8"))
    except PageError as exc:
        print(f"bench.docpage: {a.page}: {exc}", file=sys.stderr)
        return 1
    a.page.write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""One line per interval, and the next says how many were muted (``proxy.core.ratelog``)."""

from __future__ import annotations

import logging

from proxy.core.ratelog import RateLimitedLog


def test_one_line_per_interval_and_the_next_counts_the_muted(caplog):
    now = [0.0]
    limit = RateLimitedLog(logging.getLogger("t.ratelog"), every_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, "t.ratelog")
    for _ in range(5):
        limit.warning("upstream %s", "misbehaved")
    now[0] = 9.9
    limit.warning("upstream %s", "misbehaved")
    now[0] = 10.0
    limit.warning("upstream %s", "misbehaved")
    assert [r.getMessage() for r in caplog.records] == [
        "upstream misbehaved",
        "upstream misbehaved (5 more like it not logged)",
    ]
    assert limit.count == 7
    assert limit.allow() is None  # muted again: 10 s from the last line

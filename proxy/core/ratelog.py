"""Warnings that can come at any rate, logged at most once per interval.

A client that sends malformed requests, an upstream that misbehaves on every
response, a telemetry backend that is down: none may flood the log (or fill a
disk). Such a warning is one line, then silence for ``every_s`` seconds; the
next line says how many there were meanwhile. Pure: the clock is a parameter.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

EVERY_S = 10.0
"""Default shortest time between two lines of one ``RateLimitedLog``."""


class RateLimitedLog:
    """One kind of warning: written at most once per ``every_s``, the rest counted."""

    __slots__ = ("_clock", "_every_s", "_last_s", "_muted", "count", "logger")

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger
        """Where the lines go."""
        self._every_s = every_s
        self._clock = clock
        self._last_s: float | None = None
        self._muted = 0
        self.count = 0
        """Warnings of this kind so far, written or not."""

    def allow(self) -> int | None:
        """Count one. None: not now (muted); else how many since the last line, this one in."""
        self.count += 1
        self._muted += 1
        now = self._clock()
        if self._last_s is not None and now - self._last_s < self._every_s:
            return None
        self._last_s = now
        n, self._muted = self._muted, 0
        return n

    def warning(self, msg: str, *args: object) -> None:
        """Log ``msg % args`` at WARNING unless a line was written within ``every_s``."""
        n = self.allow()
        if n is not None:
            suffix = f" ({n - 1} more like it not logged)" if n > 1 else ""
            self.logger.warning(msg + suffix, *args)

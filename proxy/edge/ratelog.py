"""Warnings a peer can cause at will, logged at most once per interval.

A client that sends malformed requests, or an upstream that misbehaves on
every response, must not be able to flood the log (or fill a disk): such a
warning is one line, with no request bytes in it, and then silence for
``every_s`` seconds; the next line says how many were not written.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

EVERY_S = 10.0
"""Default shortest time between two lines of one ``RateLimitedLog``."""


class RateLimitedLog:
    """One kind of warning: written at most once per ``every_s``, the rest counted."""

    __slots__ = ("_clock", "_every_s", "_last_s", "_logger", "_muted", "count")

    def __init__(
        self,
        logger: logging.Logger,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._every_s = every_s
        self._clock = clock
        self._last_s: float | None = None
        self._muted = 0
        self.count = 0
        """Warnings of this kind so far, written or not."""

    def allow(self) -> str | None:
        """Count one; the suffix for its line when it may be written now, else None."""
        self.count += 1
        now = self._clock()
        if self._last_s is not None and now - self._last_s < self._every_s:
            self._muted += 1
            return None
        self._last_s = now
        muted, self._muted = self._muted, 0
        return f" ({muted} more like it not logged)" if muted else ""

    def warning(self, msg: str, *args: object) -> None:
        """Log ``msg % args`` at WARNING unless a line was written within ``every_s``."""
        suffix = self.allow()
        if suffix is not None:
            self._logger.warning(msg + suffix, *args)

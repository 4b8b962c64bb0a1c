"""A backstop for the upstream read timeout: a body that stops arriving is cut.

aiohttp's client enforces ``sock_read`` itself, but after some protocol errors
(bad chunked framing mid-body) it drops that timer and the body just never
ends. ``WatchedBody`` wraps the response body: every read pushes a deadline
``2 x --read-timeout`` ahead (rescheduled at most once per read-timeout period,
so a read costs one comparison), and when nothing arrives by then the relay
gets ``TimeoutError``: outcome ``timeout``, the client's stream is cut.
"""

from __future__ import annotations

import asyncio

import aiohttp


class WatchedBody:
    """Reads through to a response body, keeping a silence deadline alive."""

    __slots__ = ("_inner", "_loop", "_next_s", "_period_s", "_timeout")

    def __init__(
        self, inner: aiohttp.StreamReader, timeout: asyncio.Timeout, period_s: float
    ) -> None:
        self._inner = inner
        self._timeout = timeout
        self._period_s = period_s
        self._loop = asyncio.get_running_loop()
        self._next_s = 0.0
        self._fed()

    def _fed(self) -> None:
        now = self._loop.time()
        if now >= self._next_s:
            self._next_s = now + self._period_s
            self._timeout.reschedule(now + 2 * self._period_s)

    async def readany(self) -> bytes:
        """As ``StreamReader.readany``."""
        data = await self._inner.readany()
        self._fed()
        return data

    async def read(self, n: int = -1) -> bytes:
        """As ``StreamReader.read``."""
        data = await self._inner.read(n)
        self._fed()
        return data

    def __getattr__(self, name: str) -> object:
        return getattr(self._inner, name)

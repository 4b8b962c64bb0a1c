"""Keep-alive connections to one upstream, and the request heads written on them.

A connection comes back here only through ``UpstreamConnection.recycle``, which
keeps it only from its one clean state (``proxy.edge.upstream``): every other
connection handed back is closed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

from multidict import CIMultiDict

from proxy.edge.upstream import IDLE, UpstreamConnection
from proxy.edge.upstream_errors import ConnectFailed, NameNotResolved

log = logging.getLogger("tokenstamp.proxy")

IDLE_S = 15.0
"""A pooled connection unused this long is closed instead of reused (aiohttp's default)."""
MAX_IDLE = 256
"""At most this many idle connections are kept."""


def request_head(
    method: str, target: str, host: str, headers: CIMultiDict[str], length: int
) -> bytes:
    """The request line and headers: ``Host`` and ``Content-Length`` are the hop's own."""
    fields = "".join([f"{k}: {v}\r\n" for k, v in headers.items()])
    if length or method in ("POST", "PUT", "PATCH"):
        fields += f"Content-Length: {length}\r\n"
    return f"{method} {target} HTTP/1.1\r\nHost: {host}\r\n{fields}\r\n".encode("latin-1")


class UpstreamPool:
    """Keep-alive connections to one upstream base URL."""

    def __init__(
        self, base_url: str, *, connect_timeout_s: float, clock: Callable[[], int]
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"upstream must be an http(s) URL, got {base_url!r}")
        self._https = parts.scheme == "https"
        self.host = parts.hostname
        self.port = parts.port or (443 if self._https else 80)
        default = 443 if self._https else 80
        name = f"[{self.host}]" if ":" in self.host else self.host
        self.host_header = name if self.port == default else f"{name}:{self.port}"
        self.path_prefix = parts.path.rstrip("/")
        self._connect_timeout_s = connect_timeout_s
        self._clock = clock
        self._ssl: ssl.SSLContext | None = ssl.create_default_context() if self._https else None
        self._idle: deque[UpstreamConnection] = deque()
        self._closed = False

    async def acquire(self) -> UpstreamConnection:
        """A pooled connection that is still open, else a new one."""
        conn = self.idle()
        return conn if conn is not None else await self.connect()

    def idle(self) -> UpstreamConnection | None:
        """A pooled connection that is still open, else None (``connect`` makes one); the
        stale ones met on the way are closed. A plain call: no coroutine when one is idle."""
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.phase == IDLE and conn.open and now - conn.idle_since < IDLE_S:
                return conn
            conn.close()
        return None

    async def connect(self) -> UpstreamConnection:
        """A new connection (``ConnectFailed`` when none can be made in time)."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self._connect_timeout_s):
                _, proto = await loop.create_connection(
                    lambda: UpstreamConnection(self._clock),
                    self.host,
                    self.port,
                    ssl=self._ssl,
                    server_hostname=self.host if self._ssl else None,
                )
        except TimeoutError:
            raise
        except OSError as exc:
            if isinstance(exc, socket.gaierror):
                raise NameNotResolved(f"cannot resolve {self.host}: {exc}") from exc
            raise ConnectFailed(f"cannot connect to {self.host}:{self.port}: {exc}") from exc
        log.debug(
            "new upstream connection to %s:%d (%d idle)", self.host, self.port, len(self._idle)
        )
        return proto

    def release(self, conn: UpstreamConnection) -> None:
        """Keep ``conn`` for the next request when it is in its one clean state (see
        ``UpstreamConnection.recycle``); close it otherwise."""
        if self._closed or len(self._idle) >= MAX_IDLE:
            conn.close()
            return
        if conn.recycle():
            conn.idle_since = time.monotonic()
            self._idle.append(conn)

    def close(self) -> None:
        """Close every idle connection; later releases close theirs."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()

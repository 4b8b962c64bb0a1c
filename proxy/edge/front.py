"""The proxy listener's own HTTP/1.1 connections: observed requests without aiohttp's server.

Why: memory per open stream. aiohttp's server gives every request a parsed
message, a payload stream, two tasks and a keep-alive timer, about 9 KiB that
a stream holds for as long as it runs (README, Benchmark). A
``FrontConnection`` is one object per client connection: it reads each
request head itself and serves the request (``proxy.edge.app.exchange``)
when it is an observed route in the plainest HTTP/1.1 form: a
``Content-Length`` body, no ``Expect``, no ``Upgrade``, a target of plain
characters. Anything else (another route, a chunked body, HTTP/1.0, a head it
cannot read) is handed at that request's first byte to aiohttp's server, which
answers it as it always did: the bytes the connection sent since that request
began go to a fresh aiohttp protocol on the same transport, which keeps the
connection from then on. A request is only ever read by one of the two, from
its first byte, so nothing is parsed twice or differently.

Limits as aiohttp's: a connection that has not sent a whole request head
within ``--header-timeout`` of opening or of its last response is closed
(slowloris, idle keep-alive; trickled bytes do not extend it); the body has
``--body-timeout`` (408) and ``--max-body-bytes`` (413). A client that goes
away cancels its request, which closes its upstream connection. Bytes of a
next request sent while one is served (pipelining) wait, and reading pauses
once they pass ``PIPELINE_LIMIT``.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from email.utils import formatdate
from http import HTTPStatus
from typing import cast

import httptools
from aiohttp import web
from aiohttp.tcp_helpers import tcp_keepalive, tcp_nodelay
from multidict import CIMultiDict

from proxy.core.decoders.registry import route
from proxy.edge.app import exchange
from proxy.edge.headers import Headers
from proxy.edge.inbound import error_text, too_large
from proxy.edge.state import ProxyState

log = logging.getLogger("tokenstamp.proxy")

HEAD_LIMIT = 65536
"""A head not complete within this many bytes goes to aiohttp (whose limits answer it)."""
LINE_LIMIT = 8190
"""A head with a longer line goes to aiohttp (its ``max_line_size``, ``max_field_size``)."""
FIELD_COUNT_LIMIT = 128
"""A head with more fields goes to aiohttp (its ``max_headers``)."""
PIPELINE_LIMIT = 65536
"""Bytes of later requests buffered while one is served, before reading pauses."""

_HEAD, _BODY, _BUSY, _DONE = range(4)
"""A connection waits for a head, reads a body, serves a request, or is no longer ours."""

_REQUEST_START = re.compile(rb"(?:\r?\n)*[A-Z]{0,16}(?: |$)")
"""What a request line can start with: a method (after blank lines), so far. Anything else
(TLS, HTTP/2's preface, a binary protocol) goes to aiohttp at once, which answers 400."""

_NO_HEADERS: CIMultiDict[str] = CIMultiDict()
"""The headers of a request whose own were let go (never written to)."""

_NEVER_OURS = frozenset({b"transfer-encoding", b"expect", b"upgrade"})


class Front:
    """What the connections of one listener share; called, it makes one (a protocol factory)."""

    __slots__ = ("_date", "_date_s", "connections", "handed_off", "served", "server", "state")

    def __init__(self, state: ProxyState, server: web.Server) -> None:
        self.state = state
        self.server = server
        """aiohttp's server, for the connections handed over."""
        self.connections: set[FrontConnection] = set()
        """Open connections that are still this front's."""
        self.served = 0
        """Requests this front read and served itself."""
        self.handed_off = 0
        """Connections given to aiohttp's server."""
        self._date_s = 0
        self._date = ""

    def date(self) -> str:
        """The ``Date`` header's value now (formatted once a second, not per response)."""
        now = int(time.time())
        if now != self._date_s:
            self._date_s = now
            self._date = formatdate(now, usegmt=True)
        return self._date

    def __call__(self) -> FrontConnection:
        return FrontConnection(self)

    def close_all(self) -> None:
        """Close every connection still ours (shutdown: after the drain)."""
        for conn in list(self.connections):
            conn.close()


class _Head:
    """What ``httptools`` reports of one request head."""

    __slots__ = ("complete", "fields", "url")

    def __init__(self) -> None:
        self.url = b""
        self.fields: list[tuple[bytes, bytes]] = []
        self.complete = False

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_headers_complete(self) -> None:
        self.complete = True


def _phrase(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class FrontConnection(asyncio.Protocol):
    """One client connection of the proxy listener; the ``Inbound`` of its current request."""

    __slots__ = (
        "_body",
        "_body_waiter",
        "_buf",
        "_close_after",
        "_drain_waiter",
        "_ended",
        "_front",
        "_got",
        "_lost",
        "_need",
        "_phase",
        "_read_paused",
        "_started",
        "_task",
        "_timer",
        "_transport",
        "_write_paused",
        "chunked",
        "headers",
        "method",
        "path",
        "remote",
        "scheme",
        "target",
    )

    def __init__(self, front: Front) -> None:
        self._front = front
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._phase = _HEAD
        self._timer: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[None] | None = None
        self._lost = False
        self._read_paused = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._body_waiter: asyncio.Future[None] | None = None
        self._body: bytearray | None = None
        self._need = 0
        self._got = 0
        self.remote: str | None = None
        self.scheme = "http"
        self._clear_request()

    def _clear_request(self) -> None:
        self.method = ""
        self.path = ""
        self.target = ""
        self.headers: Headers = _NO_HEADERS
        self.chunked = False
        self._started = False
        self._ended = False
        self._close_after = False

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)
        # As aiohttp's server does: dead peers are found, and a token goes out at once
        # (no Nagle delay behind an unacknowledged one).
        tcp_keepalive(transport)
        tcp_nodelay(transport, True)
        peer = transport.get_extra_info("peername")
        self.remote = peer[0] if isinstance(peer, tuple) and peer else None
        self._front.connections.add(self)
        self._wait_for_head()

    def data_received(self, data: bytes) -> None:
        phase = self._phase
        if phase == _BODY:
            self._feed_body(data)
            return
        if phase == _DONE:
            return
        buf = self._buf
        buf += data
        if phase == _HEAD:
            self._read_head()
        elif len(buf) > PIPELINE_LIMIT and not self._read_paused and self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # the transport closes: a request being served is cancelled

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        self._phase = _DONE
        self._front.connections.discard(self)
        self._cancel_timer()
        self._wake_drain(ConnectionResetError("the client closed the connection"))
        task = self._task
        if task is not None and not task.done():
            task.cancel()  # a client that goes away cancels its upstream request
        self._task = None
        self._buf.clear()
        self._body = None

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain(None)

    # Reading requests

    def _wait_for_head(self) -> None:
        self._phase = _HEAD
        self._cancel_timer()
        loop = asyncio.get_running_loop()
        self._timer = loop.call_later(
            self._front.state.config.header_timeout_s, self._head_timed_out
        )
        if self._read_paused and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()
        if self._buf:
            self._read_head()

    def _head_timed_out(self) -> None:
        self._timer = None
        if self._phase == _HEAD and self._transport is not None:
            self._phase = _DONE
            self._transport.close()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _read_head(self) -> None:
        buf = self._buf
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            if (
                len(buf) > HEAD_LIMIT
                or b"\n\n" in buf
                or b"\n\r\n" in buf
                or _REQUEST_START.match(buf) is None
            ):
                self._hand_off()  # not a head this front reads: aiohttp answers it
            return
        size = end + 4
        head = bytes(buf[:size])
        if not self._take(head):
            self._hand_off()
            return
        del buf[:size]
        self._cancel_timer()
        self._body = bytearray()
        self._got = 0
        if self._need:
            self._phase = _BODY
            if buf:
                rest = bytes(buf)
                buf.clear()
                self._feed_body(rest)
        else:
            self._phase = _BUSY
        self._front.served += 1
        self._task = asyncio.get_running_loop().create_task(self._serve())

    def _take(self, head: bytes) -> bool:
        """Read ``head`` into the request fields when this front serves it."""
        if head.count(b"\n") != head.count(b"\r\n"):
            return False  # a bare LF: aiohttp decides what it means
        if len(head) > LINE_LIMIT and max(map(len, head.split(b"\r\n"))) > LINE_LIMIT:
            return False  # over aiohttp's limits: it answers 400
        got = _Head()
        parser = httptools.HttpRequestParser(got)
        try:
            parser.feed_data(head)
        except httptools.HttpParserError:
            return False
        if not got.complete or parser.get_http_version() != "1.1" or parser.should_upgrade():
            return False
        if len(got.fields) > FIELD_COUNT_LIMIT:
            return False
        try:
            method = parser.get_method().decode("ascii")
            target = got.url.decode("ascii")
        except UnicodeDecodeError:
            return False
        if not target.startswith("/") or "%" in target or "#" in target:
            return False
        path = target.partition("?")[0]
        if route(method, path) is None or self._front.state.pool is None:
            return False
        length = None
        headers: CIMultiDict[str] = CIMultiDict()
        for name, value in got.fields:
            low = name.lower()
            if low in _NEVER_OURS:
                return False
            if low == b"content-length":
                if length is not None or not value.isdigit():
                    return False
                length = int(value)
            headers.add(name.decode("latin-1"), value.decode("latin-1"))
        if length is None:
            return False
        self.method = method
        self.path = path
        self.target = target
        self.headers = headers
        self._need = length
        self._close_after = not parser.should_keep_alive()
        return True

    def _feed_body(self, data: bytes) -> None:
        body = self._body
        if body is None:
            return
        left = self._need - self._got
        if len(data) > left:
            self._buf += data[left:]  # the next request's
            data = data[:left]
        self._got += len(data)
        if self._need <= self._front.state.config.max_body_bytes:
            body += data  # a body over the limit is refused (413), not kept
        if self._got >= self._need:
            self._phase = _BUSY
            w = self._body_waiter
            if w is not None and not w.done():
                w.set_result(None)

    def _hand_off(self) -> None:
        """Give the connection to aiohttp from this request on: it gets the bytes so far."""
        transport = self._transport
        assert transport is not None
        self._cancel_timer()
        self._phase = _DONE
        front = self._front
        front.connections.discard(self)
        front.handed_off += 1
        handler = front.server()
        if self._read_paused:
            self._read_paused = False
            transport.resume_reading()
        transport.set_protocol(handler)
        handler.connection_made(transport)
        data = bytes(self._buf)
        self._buf.clear()
        if data:
            handler.data_received(data)

    async def _serve(self) -> None:
        try:
            await exchange(self, self._front.state)
        except Exception:
            log.exception("serving a request failed")
            if not self._started:
                self._close_after = True
                self.refuse(500, "internal_error", "the proxy failed to serve this request")
            else:
                self.abort()
        self._task = None
        if self._lost:
            return
        if self._ended and not self._close_after:
            self._clear_request()
            self._wait_for_head()
        elif self._transport is not None:
            self._phase = _DONE
            self._transport.close()

    def close(self) -> None:
        """Close the connection (a request being served is cancelled)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
        if self._transport is not None:
            self._transport.close()

    # Inbound

    @property
    def transport(self) -> asyncio.Transport | None:
        """The client's connection (``None`` once it is gone)."""
        return None if self._lost else self._transport

    def gone(self) -> bool:
        """The client's connection is closed or closing."""
        t = self._transport
        return self._lost or t is None or t.is_closing()

    def forget_headers(self) -> None:
        """The request headers are not read again: let them go while the body streams."""
        self.headers = _NO_HEADERS

    async def read_body(self, limit: int) -> bytes:
        """The whole request body; ``Refused`` (413) once it passes ``limit`` bytes."""
        if self._need > limit:
            self._close_after = True  # its bytes are not read: the connection cannot go on
            raise too_large(limit, self._need)
        if self._phase == _BODY:
            waiter = self._body_waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            except BaseException:
                self._close_after = True
                raise
            finally:
                self._body_waiter = None
        body = bytes(self._body or b"")
        self._body = None
        return body

    def refuse(self, status: int, error_type: str, message: str) -> None:
        """Answer with an error of ours instead of a relayed response."""
        t = self.transport
        if t is None or t.is_closing():
            return
        if self._phase == _BODY:
            self._close_after = True  # the body was not read to its end
        body = error_text(status, error_type, message).encode()
        close = self._close_after or self._front.state.draining
        lines = [
            f"HTTP/1.1 {status} {_phrase(status)}",
            "Content-Type: application/json; charset=utf-8",
            f"Content-Length: {len(body)}",
            f"X-Tokenstamp-Error: {error_type}",
            f"Date: {self._front.date()}",
        ]
        if close:
            lines.append("Connection: close")
            self._close_after = True
        self._started = True
        t.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        self._ended = True

    async def start(self, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        """Send the response head (``Content-Length`` in ``headers`` means not chunked)."""
        self._started = True
        t = self.transport
        if t is None or t.is_closing():
            return
        lines = [f"HTTP/1.1 {status} {reason or _phrase(status)}"]
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        bodiless = status < 200 or status in (204, 304)
        self.chunked = not bodiless and "Content-Length" not in headers
        if self.chunked:
            lines.append("Transfer-Encoding: chunked")
        if not bodiless and "Content-Type" not in headers:
            lines.append("Content-Type: application/octet-stream")
        if "Date" not in headers:
            lines.append(f"Date: {self._front.date()}")
        if self._close_after or self._front.state.draining:
            self._close_after = True
            lines.append("Connection: close")
        t.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def write(self, data: bytes) -> None:
        """Send body bytes, waiting while the client's buffer is full (``ConnectionError``)."""
        t = self.transport
        if t is None or t.is_closing():
            raise ConnectionResetError("the client closed the connection")
        t.write(b"%x\r\n%b\r\n" % (len(data), data) if self.chunked else data)
        await self.drain()

    async def drain(self) -> None:
        """Wait until the client's buffer has room (``ConnectionError`` if it went away)."""
        if self._lost:
            raise ConnectionResetError("the client closed the connection")
        if not self._write_paused:
            return
        waiter = self._drain_waiter = asyncio.get_running_loop().create_future()
        try:
            await waiter
        finally:
            self._drain_waiter = None

    def _wake_drain(self, exc: BaseException | None) -> None:
        w = self._drain_waiter
        if w is not None and not w.done():
            if exc is None:
                w.set_result(None)
            else:
                w.set_exception(exc)

    async def end(self) -> None:
        """End the response cleanly (``ConnectionError`` if the client went away)."""
        t = self.transport
        if t is None or t.is_closing():
            raise ConnectionResetError("the client closed the connection")
        if self.chunked:
            t.write(b"0\r\n\r\n")
        self._ended = True

    def abort(self) -> None:
        """Cut the connection without a clean end (bytes sent so far stay sent)."""
        self._close_after = True
        if self._transport is not None:
            self._transport.close()

"""The proxy listener's own HTTP/1.1 connections: observed requests without aiohttp's server.

Why: memory per open stream. aiohttp's server gives every request a parsed
message, a payload stream, two tasks and a keep-alive timer, about 9 KiB that
a stream holds for as long as it runs (docs/benchmark.md). A
``FrontConnection`` is one object per client connection: it reads each
request head itself and serves the request (``proxy.edge.app.exchange``)
when it is an observed route in the plainest HTTP/1.1 form
(``proxy.edge.request_head``). Anything else (another route, a chunked body,
HTTP/1.0, ``Upgrade``, ``CONNECT``, a missing or repeated ``Host``, a head it
cannot read) is handed at that request's first byte to aiohttp's server,
which answers it as it does without the front: the bytes the connection sent
since that request began go to a fresh aiohttp protocol on the same
transport, which keeps the connection from then on. A request is only ever
read by one of the two, from its first byte, so nothing is parsed twice or
differently.

One connection is one state machine (``TRANSITIONS``): it waits for a head
(``HEAD``), reads the body of a head it serves (``BODY``), serves the request
(``BUSY``), and goes back to ``HEAD`` only when the response ended cleanly and
neither side asked to close; a connection handed to aiohttp, timed out, or
closed is ``GONE``. Bytes of a next request sent while one is served
(pipelining) wait in ``BUSY``, and reading pauses once they pass
``PIPELINE_LIMIT``.

Limits as aiohttp's: a connection that has not sent a whole request head
within ``--header-timeout`` of opening or of its last response is closed
(slowloris, idle keep-alive; trickled bytes do not extend it); the body has
``--body-timeout`` (408) and ``--max-body-bytes`` (413), and must fit in the
body budget (``proxy.edge.budget``: 503 with ``Retry-After``) before any of it
is kept. A client that goes away cancels its request, which closes its
upstream connection.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from email.utils import formatdate
from typing import Final, cast

from aiohttp import web
from aiohttp.tcp_helpers import tcp_keepalive, tcp_nodelay
from multidict import CIMultiDict

from proxy.edge.app import exchange
from proxy.edge.budget import BodyHold
from proxy.edge.headers import Headers
from proxy.edge.inbound import Refused, over_budget, too_large
from proxy.edge.reply import Reply
from proxy.edge.request_head import plain_request
from proxy.edge.state import ProxyState

log = logging.getLogger("tokenstamp.proxy")

HEAD_LIMIT = 65536
"""A head not complete within this many bytes goes to aiohttp (whose limits answer it)."""
PIPELINE_LIMIT = 65536
"""Bytes of later requests buffered while one is served, before reading pauses."""

HEAD: Final = 0
"""Waiting for a request head (``--header-timeout`` runs)."""
BODY: Final = 1
"""A head the front serves was read; its ``Content-Length`` body is arriving."""
BUSY: Final = 2
"""The request is being served; a pipelined next request waits in the buffer."""
GONE: Final = 3
"""No longer the front's: handed to aiohttp, timed out, or closed."""

TRANSITIONS: Final[dict[int, tuple[int, ...]]] = {
    HEAD: (BODY, BUSY, GONE),  # a plain head with a body, or none; or aiohttp's, a timeout
    BODY: (BUSY, GONE),  # the body's last byte; or the client left
    BUSY: (HEAD, GONE),  # ended cleanly and kept alive by both sides; else closed
    GONE: (),
}
"""Every legal move of a front connection; anything else is a bug of the proxy's own."""

_PHASES = ("HEAD", "BODY", "BUSY", "GONE")

_REQUEST_START = re.compile(rb"(?:\r?\n)*[A-Z]{0,16}(?: |$)")
"""What a request line can start with: a method (after blank lines), so far. Anything else
(TLS, HTTP/2's preface, a binary protocol) goes to aiohttp at once, which answers 400."""

_NO_HEADERS: CIMultiDict[str] = CIMultiDict()
"""The headers of a request whose own were let go (never written to)."""


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


class FrontConnection(Reply):
    """One client connection of the proxy listener; the ``Inbound`` of its current request."""

    __slots__ = (
        "_body",
        "_body_waiter",
        "_buf",
        "_front",
        "_got",
        "_head_deadline",
        "_hold",
        "_loop",
        "_need",
        "_phase",
        "_read_paused",
        "_refusal",
        "_task",
        "_timer",
        "headers",
        "method",
        "path",
        "remote",
        "scheme",
        "target",
    )

    def __init__(self, front: Front) -> None:
        self._front = front
        self._buf = bytearray()
        self._phase = HEAD
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # known once the connection is made
        self._head_deadline = 0.0  # loop time by which the next request head must be in
        self._task: asyncio.Task[None] | None = None
        self._read_paused = False
        self._body_waiter: asyncio.Future[None] | None = None
        self._body: bytearray | None = None
        self._hold: BodyHold | None = None
        self._need = 0
        self._got = 0
        self.remote: str | None = None
        self.scheme = "http"
        super().__init__()
        self._clear_request()

    def _clear_request(self) -> None:
        self.method = ""
        self.path = ""
        self.target = ""
        self.headers: Headers = _NO_HEADERS
        self._refusal: Refused | None = None
        self._new_reply()

    def _date(self) -> str:
        return self._front.date()

    def _draining(self) -> bool:
        return self._front.state.draining

    def _body_unread(self) -> bool:
        return self._phase == BODY

    def _move(self, to: int) -> None:
        if to not in TRANSITIONS[self._phase]:
            raise RuntimeError(f"front connection: no move from {_PHASES[self._phase]} to "
                               f"{_PHASES[to]}")  # fmt: skip
        self._phase = to

    def _go(self) -> None:
        """To ``GONE`` from wherever the connection is (it is no longer ours)."""
        self._phase = GONE

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport = cast(asyncio.Transport, transport)
        # Looked up once per connection, not per request: on Python 3.11 every
        # get_running_loop() is a getpid() system call.
        self._loop = asyncio.get_running_loop()
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
        if phase == BODY:
            self._feed_body(data)
            return
        if phase == GONE:
            return
        buf = self._buf
        buf += data
        if phase == HEAD:
            self._read_head()
        elif len(buf) > PIPELINE_LIMIT and not self._read_paused and self._transport is not None:
            self._read_paused = True
            self._transport.pause_reading()

    def eof_received(self) -> bool | None:
        return None  # the transport closes: a request being served is cancelled

    def connection_lost(self, exc: BaseException | None) -> None:
        self._lost = True
        self._go()
        self._front.connections.discard(self)
        self._cancel_timer()
        self._wake_drain(ConnectionResetError("the client closed the connection"))
        task = self._task
        if task is not None and not task.done():
            task.cancel()  # a client that goes away cancels its upstream request
        self._task = None
        self._buf.clear()
        self._body = None
        self.release_body()

    # Reading requests

    def _wait_for_head(self) -> None:
        # One timer per connection, not one per request: a timer still armed (from an
        # earlier wait) fires at its old time and moves itself on to this deadline.
        loop = self._loop or asyncio.get_running_loop()
        self._head_deadline = deadline = loop.time() + self._front.state.config.header_timeout_s
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._head_timed_out)
        if self._read_paused and self._transport is not None:
            self._read_paused = False
            self._transport.resume_reading()
        if self._buf:
            self._read_head()

    def _head_timed_out(self) -> None:
        self._timer = None
        if self._phase != HEAD or self._transport is None:
            return  # a request is being read or served: the next wait arms the timer again
        loop = asyncio.get_running_loop()
        if loop.time() < self._head_deadline:
            # A later wait moved the deadline (this timer was armed for an earlier one).
            self._timer = loop.call_at(self._head_deadline, self._head_timed_out)
            return
        self._go()
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
        state = self._front.state
        got = plain_request(bytes(buf[:size])) if state.pool is not None else None
        if got is None:
            self._hand_off()
            return
        del buf[:size]
        # The header timer stays armed: it finds the request being served when it fires.
        self.method, self.path, self.target = got.method, got.path, got.target
        self.headers = got.headers
        self._close_after = not got.keep_alive
        need = self._need = got.length
        self._got = 0
        hold = self._hold = state.body_budget.hold()
        if need > state.config.max_body_bytes:
            self._body = None  # refused (413) by ``read_body``, never kept
        elif need and not hold.grow(need):
            self._body = None  # refused (503) before a byte of it is kept
            self._refusal = over_budget(state.body_budget, need)
        else:
            self._body = bytearray()
        self._front.served += 1
        if need:
            self._move(BODY)
            if buf:
                rest = bytes(buf)
                buf.clear()
                self._feed_body(rest)
        else:
            self._move(BUSY)
        self._task = (self._loop or asyncio.get_running_loop()).create_task(self._serve())

    def _feed_body(self, data: bytes) -> None:
        left = self._need - self._got
        if len(data) > left:
            self._buf += data[left:]  # the next request's
            data = data[:left]
        self._got += len(data)
        body = self._body
        if body is not None:
            body += data  # a refused body (413, 503) is not kept
        if self._got >= self._need:
            self._move(BUSY)
            w = self._body_waiter
            if w is not None and not w.done():
                w.set_result(None)

    def _hand_off(self) -> None:
        """Give the connection to aiohttp from this request on: it gets the bytes so far."""
        transport = self._transport
        assert transport is not None
        self._cancel_timer()
        self._go()
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
        self.release_body()
        if self._lost:
            return
        if self._ended and not self._close_after and self._phase == BUSY:
            self._clear_request()
            self._move(HEAD)
            self._wait_for_head()
        elif self._transport is not None:
            self._go()
            self._transport.close()

    def close(self) -> None:
        """Close the connection (a request being served is cancelled)."""
        task = self._task
        if task is not None and not task.done():
            task.cancel()
        if self._transport is not None:
            self._transport.close()

    # Inbound

    def forget_headers(self) -> None:
        """The request headers are not read again: let them go while the body streams."""
        self.headers = _NO_HEADERS

    def body_now(self, limit: int) -> bytes | None:
        """The whole request body when the head's ``Content-Length`` bytes were all read
        (``Refused`` as ``read_body``), else None: ``read_body`` waits for it."""
        if self._phase == BODY:
            return None
        self._refuse_over(limit)
        return self._take_body()

    async def read_body(self, limit: int) -> bytes:
        """The whole request body; ``Refused``: 413 past ``limit`` bytes, 503 over budget."""
        self._refuse_over(limit)
        if self._phase == BODY:
            waiter = self._body_waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            except BaseException:
                self._close_after = True
                raise
            finally:
                self._body_waiter = None
        return self._take_body()

    def _take_body(self) -> bytes:
        body = bytes(self._body or b"")
        self._body = None
        return body

    def _refuse_over(self, limit: int) -> None:
        """``Refused``: 413 when the declared body passes ``limit``, 503 over the budget."""
        if self._need > limit:
            self._close_after = True  # its bytes are not read: the connection cannot go on
            raise too_large(limit, self._need)
        if self._refusal is not None:
            self._close_after = True
            raise self._refusal

    def release_body(self) -> None:
        """The body went upstream (or never will): give its bytes back to the budget."""
        hold = self._hold
        if hold is not None:
            hold.release()
            self._hold = None

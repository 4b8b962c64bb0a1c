"""Writing one HTTP/1.1 response on a client connection of the front.

The head (status line, the relayed headers, ``Transfer-Encoding: chunked``
unless the upstream gave a length), interim responses before it (RFC 9110
section 15.2: a proxy forwards the 1xx it did not ask for; the front only
serves HTTP/1.1 clients, which can take them), the body as the upstream sends
it (each piece one chunk), the end, our own JSON errors, and flow control
(the transport's pause and resume, a waiter for ``drain``). ``Reply`` is the
response half of ``proxy.edge.front.FrontConnection``, which reads the
requests; this half keeps no state machine of its own beyond started, ended,
and whether the connection closes after it.
"""

from __future__ import annotations

import asyncio
from http import HTTPStatus
from typing import Final

from multidict import CIMultiDict

from proxy.edge.headers import Headers, client_response_headers
from proxy.edge.inbound import error_text

MAX_INTERIM: Final = 8
"""Interim responses relayed to a client per request; more are read past, not relayed."""


def phrase(status: int) -> str:
    """The standard reason phrase of ``status`` (empty for an unknown code)."""
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return ""


class Reply(asyncio.Protocol):
    """The response side of one client connection (subclassed by the front's connection)."""

    __slots__ = (
        "_close_after",
        "_drain_waiter",
        "_ended",
        "_interims",
        "_lost",
        "_started",
        "_tail_held",
        "_transport",
        "_write_paused",
        "chunked",
    )

    def __init__(self) -> None:
        self._transport: asyncio.Transport | None = None
        self._lost = False
        self._write_paused = False
        self._drain_waiter: asyncio.Future[None] | None = None
        self._new_reply()

    def _new_reply(self) -> None:
        """Ready for the next request's response."""
        self.chunked = False
        self._started = False
        self._ended = False
        self._tail_held = False
        self._close_after = False
        self._interims = 0

    def _date(self) -> str:
        """The ``Date`` header's value now."""
        raise NotImplementedError

    def _draining(self) -> bool:
        """The proxy is shutting down: every response closes its connection."""
        raise NotImplementedError

    def _body_unread(self) -> bool:
        """The request's body has not been read to its end (so the connection cannot go on)."""
        raise NotImplementedError

    # flow control (asyncio.Protocol)

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        self._wake_drain(None)

    # Inbound: the response

    @property
    def transport(self) -> asyncio.Transport | None:
        """The client's connection (``None`` once it is gone)."""
        return None if self._lost else self._transport

    def gone(self) -> bool:
        """The client's connection is closed or closing."""
        t = self._transport
        return self._lost or t is None or t.is_closing()

    def refuse(
        self, status: int, error_type: str, message: str, retry_after_s: int | None = None
    ) -> None:
        """Answer with an error of ours instead of a relayed response."""
        t = self.transport
        if t is None or t.is_closing():
            return
        if self._body_unread():
            self._close_after = True  # the body was not read to its end
        body = error_text(status, error_type, message).encode()
        close = self._close_after or self._draining()
        lines = [
            f"HTTP/1.1 {status} {phrase(status)}",
            "Content-Type: application/json; charset=utf-8",
            f"Content-Length: {len(body)}",
            f"X-Tokenstamp-Error: {error_type}",
            f"Date: {self._date()}",
        ]
        if retry_after_s is not None:
            lines.append(f"Retry-After: {retry_after_s}")
        if close:
            lines.append("Connection: close")
            self._close_after = True
        self._started = True
        t.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        self._ended = True

    def interim(self, status: int, reason: str, headers: Headers) -> None:
        """Relay an interim (1xx) response before the final one (RFC 9110 section 15.2)."""
        t = self.transport
        if self._started or t is None or t.is_closing() or self._interims >= MAX_INTERIM:
            return
        self._interims += 1
        lines = [f"HTTP/1.1 {status} {reason or phrase(status)}"]
        lines.extend(f"{k}: {v}" for k, v in client_response_headers(headers, keep_length=False)
                     .items())  # fmt: skip
        t.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))

    async def start(self, status: int, reason: str, headers: CIMultiDict[str]) -> None:
        """Send the response head (``Content-Length`` in ``headers`` means not chunked)."""
        head = self.start_held(status, reason, headers)
        t = self.transport
        if head and t is not None:
            t.write(head)

    def start_held(self, status: int, reason: str, headers: CIMultiDict[str]) -> bytes:
        """The response head, not written: the relay sends it with the body's first bytes
        (one write, not two, when the body's start was read with the head). Empty when
        the client is gone."""
        self._started = True
        t = self.transport
        if t is None or t.is_closing():
            return b""
        lines = [f"HTTP/1.1 {status} {reason or phrase(status)}"]
        lines.extend(f"{k}: {v}" for k, v in headers.items())
        bodiless = status < 200 or status in (204, 304)
        self.chunked = not bodiless and "Content-Length" not in headers
        if self.chunked:
            lines.append("Transfer-Encoding: chunked")
        if not bodiless and "Content-Type" not in headers:
            lines.append("Content-Type: application/octet-stream")
        if "Date" not in headers:
            lines.append(f"Date: {self._date()}")
        if self._close_after or self._draining():
            self._close_after = True
            lines.append("Connection: close")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")

    def end_held(self) -> bytes:
        """The chunked terminator (empty when not chunked), not written: the relay sends it
        with the body's last bytes when the body ended cleanly (one write, not two);
        ``end`` then writes it no more."""
        self._tail_held = True
        return b"0\r\n\r\n" if self.chunked else b""

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
        if self.chunked and not self._tail_held:
            t.write(b"0\r\n\r\n")
        self._ended = True

    def abort(self) -> None:
        """Cut the connection without a clean end (bytes sent so far stay sent)."""
        self._close_after = True
        if self._transport is not None:
            self._transport.close()

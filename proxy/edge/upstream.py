"""The upstream client of observed requests: HTTP/1.1 on an asyncio protocol, bodies by callback.

Why not aiohttp's client here: its body arrives through a ``StreamReader``,
so every read costs a future, a task wake-up, an ``await readany()`` and a
read-timer reschedule before the proxy sees a byte: most of what a streamed
token costs. Here the response is parsed by ``httptools`` (llhttp, the
parser of Node.js) inside ``data_received``, and each body piece goes
synchronously to a ``BodyConsumer`` with the stamp of the socket read it came
from; the relay writes it to the client and observes it in the same call.
Flow control is the transport's: a consumer that cannot write pauses reading
(``pause_reading``) until the client drains.

Only observed requests (POST to a completion route, body already read) come
here; everything else keeps aiohttp's client. Connections are kept alive in a
small pool. Failures raise ``UpstreamError`` subclasses whose ``kind`` is the
``error.type`` label, the same names the aiohttp path reports.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import ssl
import time
from collections import deque
from collections.abc import Callable
from typing import ClassVar, Protocol, cast
from urllib.parse import urlsplit

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

log = logging.getLogger("tokenstamp.proxy")

IDLE_S = 15.0
"""A pooled connection unused this long is closed instead of reused (aiohttp's default)."""
MAX_IDLE = 256
"""At most this many idle connections are kept."""
EARLY_BYTES = 1 << 16
"""Body bytes kept for a relay not attached yet; past this, reading pauses until it is."""


_NO_HEADERS: CIMultiDict[str] = CIMultiDict()
"""What a connection holds once its response's headers were taken (never added to)."""


class UpstreamError(Exception):
    """The upstream failed; ``kind`` is the bounded ``error.type`` value."""

    kind: ClassVar[str] = "UpstreamError"


class ConnectFailed(UpstreamError):
    """No connection could be opened."""

    kind: ClassVar[str] = "ClientConnectorError"


class NameNotResolved(ConnectFailed):
    """The upstream's host name did not resolve."""

    kind: ClassVar[str] = "ClientConnectorDNSError"


class DisconnectedBeforeHead(UpstreamError):
    """The upstream closed the connection without answering."""

    kind: ClassVar[str] = "ServerDisconnectedError"


class ResetBeforeHead(UpstreamError):
    """The upstream reset the connection without answering."""

    kind: ClassVar[str] = "ClientOSError"


class NotHttp(UpstreamError):
    """What the upstream answered is not an HTTP response."""

    kind: ClassVar[str] = "ClientResponseError"


class PayloadError(UpstreamError):
    """The body broke off: reset, closed before its end, or bad framing."""

    kind: ClassVar[str] = "ClientPayloadError"


class BodyConsumer(Protocol):
    """Where a response body goes, piece by piece, as it is read."""

    def body(self, data: bytes, read_ns: int) -> None:
        """A piece of the body (chunked framing removed), stamped when its read completed."""

    def read_done(self) -> None:
        """Every piece of the last read was handed over (one read may carry several)."""

    def end(self, error: UpstreamError | None) -> None:
        """The body ended: complete (``None``) or broken off."""


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to the upstream; one request at a time.

    Slotted: one of these lives per open stream.
    """

    __slots__ = (
        "_busy",
        "_clock",
        "_complete",
        "_consumer",
        "_early",
        "_early_bytes",
        "_ended",
        "_eof_delimited",
        "_error",
        "_head",
        "_headers",
        "_keep_alive",
        "_lost",
        "_parser",
        "_read_ns",
        "_reason",
        "_status",
        "idle_since",
        "paused",
        "received_bytes",
        "transport",
    )

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._read_ns = 0
        self._reason = b""
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._busy = False  # a request is in flight (from ``send`` to ``detach``)
        self._head: asyncio.Future[None] | None = None  # while ``send`` waits for the head
        self._consumer: BodyConsumer | None = None
        self._early: list[tuple[bytes, int]] = []
        self._early_bytes = 0
        self._complete = False
        self._ended = False
        self._eof_delimited = False
        self._lost = False
        self._status = 0
        self._keep_alive = False
        self._error: UpstreamError | None = None
        self.idle_since = 0.0
        self.received_bytes = 0
        """Body bytes received so far (the read watchdog's progress)."""
        self.paused = False
        """Reading is paused because the client is not draining."""

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport, but is one).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        self._read_ns = self._clock()  # the stamp: before anything else is done with the bytes
        if not self._busy:
            # Bytes on an idle connection answer nothing we asked: it cannot be trusted
            # with the next request.
            self.close()
            return
        try:
            self._parser.feed_data(data)
            consumer = self._consumer
            if consumer is not None:
                consumer.read_done()
        except httptools.HttpParserUpgrade:
            self._fail(NotHttp("upstream asked to switch protocols"))
        except httptools.HttpParserError as exc:
            head = self._head
            if head is not None and not head.done():
                self._fail(NotHttp(f"not an HTTP response: {exc}"))
            else:
                self._fail(PayloadError(f"bad body framing: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True
        self.transport = None
        head = self._head
        if head is not None and not head.done():
            if isinstance(exc, ConnectionResetError) or (
                isinstance(exc, OSError) and exc.errno == errno.ECONNRESET
            ):
                error: UpstreamError = ResetBeforeHead(f"connection reset: {exc}")
            else:
                error = DisconnectedBeforeHead("connection closed before a response")
            head.set_exception(error)
            return
        if self._complete or self._ended:
            return
        if self._eof_delimited and exc is None:
            self.on_message_complete()
            return
        why = "connection reset" if exc is not None else "connection closed"
        self._end(PayloadError(f"{why} before the end of the body"))

    # httptools callbacks

    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._headers is not _NO_HEADERS:  # trailers after ``forget_headers``: not kept
            self._headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        self._status = self._parser.get_status_code()
        headers = self._headers
        chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        self._eof_delimited = not chunked and "Content-Length" not in headers
        head = self._head
        if head is not None and not head.done():
            head.set_result(None)

    def on_body(self, body: bytes) -> None:
        self.received_bytes += len(body)
        consumer = self._consumer
        if consumer is None:
            self._early.append((body, self._read_ns))
            self._early_bytes += len(body)
            if self._early_bytes > EARLY_BYTES:
                self.pause_reading()  # the relay resumes it once it has taken these
        else:
            consumer.body(body, self._read_ns)

    def on_message_complete(self) -> None:
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()
        self._end(None)

    # the client's side

    @property
    def status(self) -> int:
        """The response's status code."""
        return self._status

    @property
    def reason(self) -> str:
        """The response's reason phrase."""
        return self._reason.decode("latin-1")

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """The response's headers."""
        return CIMultiDictProxy(self._headers)

    def forget_headers(self) -> None:
        """The response's headers were copied: let them go while the body streams."""
        self._headers = _NO_HEADERS

    @property
    def reusable(self) -> bool:
        """The last response was read to its end and the connection may carry another."""
        return (
            self._complete
            and not self._lost
            and self.transport is not None
            and not self.transport.is_closing()
            and self._keep_alive
        )

    async def send(self, head: bytes, body: bytes) -> None:
        """Write a request and wait for the response head."""
        loop = asyncio.get_running_loop()
        self._busy = True
        self._head = loop.create_future()
        self._parser = httptools.HttpResponseParser(self)
        self._reason = b""
        self._headers = CIMultiDict()
        self._consumer = None
        self._early = []
        self._complete = self._ended = False
        self.received_bytes = 0
        transport = self.transport
        if transport is None or transport.is_closing():
            raise DisconnectedBeforeHead("connection closed before a response")
        transport.write(head + body if body else head)
        try:
            await self._head
        finally:
            self._head = None  # answered (or given up on): not kept while the body streams

    def consume(self, consumer: BodyConsumer) -> None:
        """Hand the body to ``consumer``: what already arrived first, with its own stamps."""
        self._consumer = consumer
        early, self._early = self._early, []
        held = self._early_bytes > EARLY_BYTES
        self._early_bytes = 0
        for data, read_ns in early:
            consumer.body(data, read_ns)
        consumer.read_done()
        if held and not self._ended:
            self.resume_reading()
        if self._ended:
            consumer.end(self._error)

    async def discard_body(self) -> None:
        """Read the body to its end and drop it (an answer that is not relayed)."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        self.consume(_Discard(done))
        await done

    def pause_reading(self) -> None:
        """Stop reading the upstream socket (the client is not draining)."""
        if self.transport is not None and not self.paused:
            self.paused = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        """Read the upstream socket again."""
        if self.transport is not None and self.paused:
            self.paused = False
            self.transport.resume_reading()

    def detach(self) -> None:
        """The request is over: drop the consumer (no reference cycle outlives a request)."""
        self._consumer = None
        self._early = []
        self._early_bytes = 0
        self._busy = False

    def close(self) -> None:
        """Close the connection (which also tells the upstream to stop generating)."""
        self._consumer = None
        if self.transport is not None:
            self.transport.close()
            self.transport = None

    def _end(self, error: UpstreamError | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._error = error
        if self._consumer is not None:
            self._consumer.end(error)

    def _fail(self, error: UpstreamError) -> None:
        head = self._head
        if head is not None and not head.done():
            head.set_exception(error)
        else:
            self._end(error)
        self.close()


class _Discard:
    """A ``BodyConsumer`` that drops the body and says when it ended."""

    __slots__ = ("_done",)

    def __init__(self, done: asyncio.Future[None]) -> None:
        self._done = done

    def body(self, data: bytes, read_ns: int) -> None:
        """Dropped."""

    def read_done(self) -> None:
        """Nothing held."""

    def end(self, error: UpstreamError | None) -> None:
        """Done, either way: the connection is not reused after an error."""
        if not self._done.done():
            self._done.set_result(None)


def request_head(
    method: str, target: str, host: str, headers: CIMultiDict[str], length: int
) -> bytes:
    """The request line and headers: ``Host`` and ``Content-Length`` are the hop's own."""
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host}"]
    lines.extend(f"{k}: {v}" for k, v in headers.items())
    if length or method in ("POST", "PUT", "PATCH"):
        lines.append(f"Content-Length: {length}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


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
        now = time.monotonic()
        while self._idle:
            conn = self._idle.pop()
            if conn.reusable and now - conn.idle_since < IDLE_S:
                return conn
            conn.close()
        return await self.connect()

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
        """Return ``conn`` to the pool when it can carry another request, else close it."""
        if self._closed or not conn.reusable or len(self._idle) >= MAX_IDLE:
            conn.close()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def close(self) -> None:
        """Close every idle connection; later releases close theirs."""
        self._closed = True
        while self._idle:
            self._idle.pop().close()

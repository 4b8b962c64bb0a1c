"""The proxy's upstream client: HTTP/1.1 exchanges on an asyncio protocol, bodies by callback.

Why not aiohttp's client here: its body arrives through a ``StreamReader``,
so every read costs a future, a task wake-up, an ``await readany()`` and a
read-timer reschedule before the proxy sees a byte: most of what a streamed
token costs. Here the response is parsed by ``httptools`` (llhttp, the
parser of Node.js) inside ``data_received``, and each body piece goes
synchronously to a ``BodyConsumer`` with the stamp of the socket read it came
from; the relay writes it to the client and observes it in the same call.
Flow control is the transport's: a consumer that cannot write pauses reading
(``pause_reading``) until the client drains.

One connection carries one exchange at a time, and its states are the table
``TRANSITIONS`` below (h11's idea: a transition table, and reuse allowed from
one state only). llhttp reads the bytes; this module decides what they may
mean for the exchange (RFC 9112, RFC 9110 section 15.2):

- An interim response (1xx other than 101) is read past: never relayed as the
  answer, never the end of the exchange. A 101 is an error: the proxy never
  asks to switch protocols.
- The exchange ends where the response's framing says. Any byte after that
  end, in the same read or a later one, or on an idle pooled connection, makes
  the connection unusable: it is closed and nothing of it is relayed. (CR and
  LF alone right after the end, in the same read, are skipped by llhttp as
  RFC 9112 section 2.2 allows; they cannot carry anything to relay.)
- A connection goes back to the pool only from ``DONE`` and only when
  ``reusable``: nothing unread, the request written whole before the answer
  came, keep-alive on both sides. Every other way out closes it.

Every forwarded request comes here, observed or not (``proxy.edge.forward``),
its body already read. Connections are kept alive in a small pool
(``proxy.edge.pool``). Failures raise ``UpstreamError`` subclasses whose
``kind`` is the ``error.type`` label (``proxy.edge.upstream_errors``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
from collections.abc import Callable
from typing import Final, Protocol, cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from proxy.core.ratelog import RateLimitedLog
from proxy.edge.upstream_errors import (
    DisconnectedBeforeHead,
    NotHttp,
    PayloadError,
    ResetBeforeHead,
    UpstreamError,
)

log = logging.getLogger("tokenstamp.proxy")
_violations = RateLimitedLog(log)
"""Upstream violations of the one-exchange rule (an upstream can do it on every response)."""

EARLY_BYTES = 1 << 16
"""Body bytes kept for a relay not attached yet; past this, reading pauses until it is."""
MAX_INTERIM = 64
"""Interim responses read past before one exchange's final head; more is an error."""

Interim = Callable[[int, str, CIMultiDict[str]], None]
"""Where an interim (1xx) response goes: status, reason, headers (the client relays it)."""


_NO_HEADERS: CIMultiDict[str] = CIMultiDict()
"""What a connection holds once its response's headers were taken (never added to)."""


class BodyConsumer(Protocol):
    """Where a response body goes, piece by piece, as it is read."""

    def body(self, data: bytes, read_ns: int) -> None:
        """A piece of the body (chunked framing removed), stamped when its read completed."""

    def read_done(self) -> None:
        """Every piece of the last read was handed over (one read may carry several)."""

    def end(self, error: UpstreamError | None) -> None:
        """The body ended: complete (``None``) or broken off."""


IDLE: Final = 0
"""Open with no exchange: just connected, or back in the pool. Any byte read here answers
nothing that was asked: the connection closes."""
HEAD: Final = 1
"""A request was written; its final response head is awaited (interim 1xx heads are read
past: never relayed, never the end of the exchange)."""
BODY: Final = 2
"""The final head was read; body pieces go to the consumer as they are read."""
DONE: Final = 3
"""The response ended where its framing said. Any further byte, in this read or a later
one, makes the connection unusable: it closes, and nothing after the end is relayed."""
CLOSED: Final = 4
"""Closed, or unusable: never pooled again."""

PHASES: Final = ("IDLE", "HEAD", "BODY", "DONE", "CLOSED")
"""The phases' names, by number (for messages)."""

TRANSITIONS: Final[dict[int, tuple[int, ...]]] = {
    IDLE: (HEAD, CLOSED),  # ``send``; or bytes nobody asked for, a close, the pool's cleanup
    HEAD: (BODY, CLOSED),  # a final (non-1xx) head; or no answer, not HTTP, a 101 not asked for
    BODY: (DONE, CLOSED),  # the body's end by its framing; or broken off, cut by the proxy
    DONE: (IDLE, CLOSED),  # ``recycle`` when ``reusable`` (the only way back); else closed
    CLOSED: (),
}
"""Every legal move of one connection; anything else is a bug of the proxy's own (raised)."""


class UpstreamConnection(asyncio.Protocol):
    """One HTTP/1.1 connection to the upstream; one exchange at a time, by ``TRANSITIONS``.

    A connection goes back to the pool from one state only (``reusable``): the
    response is complete (``DONE``), nothing after its end was read, the request
    was written whole before the response came, and both sides kept the
    connection alive (the request never says ``close``; the response must not).
    Slotted: one of these lives per open stream.
    """

    __slots__ = (
        "_clock",
        "_consumer",
        "_early",
        "_early_bytes",
        "_ended",
        "_eof_delimited",
        "_error",
        "_head",
        "_head_only",
        "_headers",
        "_interim",
        "_interim_to",
        "_interims",
        "_keep_alive",
        "_parser",
        "_phase",
        "_read_ns",
        "_reason",
        "_status",
        "_violation",
        "_written",
        "idle_since",
        "loop",
        "paused",
        "received_bytes",
        "transport",
    )

    def __init__(self, clock: Callable[[], int]) -> None:
        self._clock = clock
        self.transport: asyncio.Transport | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        """The connection's event loop (known once it is made)."""
        self._phase = IDLE
        self._parser = httptools.HttpResponseParser(self)
        self._read_ns = 0
        self._reason = b""
        self._headers: CIMultiDict[str] = CIMultiDict()
        self._head: asyncio.Future[None] | None = None  # while ``send`` waits for the head
        self._head_only = False  # the request was HEAD: its answer ends with its head
        self._consumer: BodyConsumer | None = None
        self._early: list[tuple[bytes, int]] = []
        self._early_bytes = 0
        self._ended = False
        self._eof_delimited = False
        self._interim = False
        self._interim_to: Interim | None = None
        self._interims = 0
        self._violation = ""
        self._written = False
        self._status = 0
        self._keep_alive = False
        self._error: UpstreamError | None = None
        self.idle_since = 0.0
        self.received_bytes = 0
        """Body bytes received so far (the read watchdog's progress)."""
        self.paused = False
        """Reading is paused because the client is not draining."""

    @property
    def phase(self) -> int:
        """Where the connection is in ``TRANSITIONS``."""
        return self._phase

    @property
    def open(self) -> bool:
        """The transport is open and not closing."""
        transport = self.transport
        return transport is not None and not transport.is_closing()

    def _move(self, to: int) -> None:
        if to not in TRANSITIONS[self._phase]:
            raise RuntimeError(
                f"upstream connection: no move from {PHASES[self._phase]} to {PHASES[to]}"
            )
        self._phase = to

    # asyncio.Protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio.Transport, but is one).
        self.transport = cast(asyncio.Transport, transport)
        # Looked up once per connection: on Python 3.11 every get_running_loop() is a
        # getpid() system call, which a request paid several times.
        self.loop = asyncio.get_running_loop()

    def data_received(self, data: bytes) -> None:
        self._read_ns = self._clock()  # the stamp: before anything else is done with the bytes
        phase = self._phase
        if phase not in (HEAD, BODY):
            # IDLE: an answer to nothing asked. DONE: bytes after the response's end.
            # Neither can be trusted with the next request, and neither is relayed.
            self.close()
            return
        try:
            self._parser.feed_data(data)
            consumer = self._consumer
            if consumer is not None:
                consumer.read_done()
        except httptools.HttpParserCallbackError as exc:
            if self._violation:
                self._stopped()
            elif self._head_only and self._phase == DONE:
                self.close()  # the head of a HEAD answer: parsing stopped on purpose
            else:  # a consumer failed on a body piece: the proxy's own bug
                log.error("relaying an upstream body failed", exc_info=exc.__context__)
                self._fail(PayloadError("the proxy failed relaying the body"))
        except httptools.HttpParserUpgrade:
            self._fail(NotHttp("upstream switched protocols, which was not asked"))
        except httptools.HttpParserError as exc:
            if self._phase == HEAD:
                self._fail(NotHttp(f"not an HTTP response: {exc}"))
            elif self._phase == DONE:
                self.close()  # after the end (e.g. data after ``Connection: close``)
            else:
                self._fail(PayloadError(f"bad body framing: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        phase = self._phase
        self._phase = CLOSED
        self.transport = None
        head = self._head
        if phase == HEAD and head is not None and not head.done():
            if isinstance(exc, ConnectionResetError) or (
                isinstance(exc, OSError) and exc.errno == errno.ECONNRESET
            ):
                error: UpstreamError = ResetBeforeHead(f"connection reset: {exc}")
            else:
                error = DisconnectedBeforeHead("connection closed before a response")
            head.set_exception(error)
            return
        if phase != BODY or self._ended:
            return
        if self._eof_delimited and exc is None:
            self._keep_alive = False  # the close was the body's end (RFC 9112 section 6.3)
            self._end(None)
            return
        why = "connection reset" if exc is not None else "connection closed"
        self._end(PayloadError(f"{why} before the end of the body"))

    # httptools callbacks

    def on_message_begin(self) -> None:
        if self._phase == DONE:  # a second message in the read that ended the first
            self._stop("bytes after the end of the response")

    def on_status(self, status: bytes) -> None:
        self._reason += status

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._phase == HEAD:  # not trailers: they are not relayed (as nginx does)
            self._headers.add(name.decode("latin-1"), value.decode("latin-1"))

    def on_headers_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                self._stop("upstream switched protocols (101), which was not asked")
            # Interim (RFC 9110 section 15.2): handed to the client, which relays it where
            # its client can take it; never the answer, never the end of the exchange.
            self._interims += 1
            if self._interims > MAX_INTERIM:
                self._stop(f"upstream sent more than {MAX_INTERIM} interim responses")
            self._interim = True
            relay = self._interim_to
            if relay is not None:
                relay(status, self._reason.decode("latin-1"), self._headers)
            self._reason = b""
            self._headers = CIMultiDict()
            return
        self._status = status
        transport = self.transport
        # Written whole before the answer came? If not, the upstream answered a request
        # it had not read to its end: what it does with the rest is unknown, so this
        # connection carries nothing more.
        self._written = transport is not None and transport.get_write_buffer_size() == 0
        headers = self._headers
        chunked = "chunked" in headers.get("Transfer-Encoding", "").lower()
        self._eof_delimited = not chunked and "Content-Length" not in headers
        self._move(BODY)
        head = self._head
        if head is not None and not head.done():
            head.set_result(None)
        if self._head_only:
            # The answer to HEAD ends with its head, whatever length it states (RFC 9110
            # section 9.3.2); llhttp does not know the request, so parsing stops here, and
            # the connection is not reused (what the parser would make of the rest is moot).
            self._keep_alive = False
            self._move(DONE)
            self._end(None)
            self._stop("")

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
        if self._interim:
            self._interim = False  # the final response follows
            return
        self._keep_alive = self._parser.should_keep_alive()
        self._move(DONE)
        self._end(None)

    def _stop(self, why: str) -> None:
        """Stop parsing, raised through llhttp: a violation of the one-exchange rule, or
        (``why`` empty) the end of a HEAD answer."""
        self._violation = why
        raise _Violation(why or "end of a HEAD answer")

    def _stopped(self) -> None:
        if self._phase == DONE:
            _violations.warning("upstream %s; connection closed, nothing after the end "
                                "relayed", self._violation)  # fmt: skip
            self.close()
        else:
            self._fail(NotHttp(self._violation))

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
        """The one state a connection is pooled from: the exchange is complete, nothing was
        read after its end, the request was written whole before the answer, both sides
        keep the connection alive, and it is open and reading."""
        return (
            self._phase == DONE
            and self._keep_alive
            and self._written
            and not self.paused
            and self.open
        )

    def recycle(self) -> bool:
        """Back to ``IDLE`` for the next request when ``reusable``; else closed. True if kept."""
        if not self.reusable:
            self.close()
            return False
        self._consumer = None
        self._early = []
        self._early_bytes = 0
        self._move(IDLE)
        return True

    async def send(
        self,
        head: bytes,
        body: bytes,
        interim: Interim | None = None,
        *,
        head_only: bool = False,
        timeout_s: float | None = None,
    ) -> None:
        """Write a request and wait for the final response head (``IDLE`` only); interim
        responses meanwhile go to ``interim``. ``head_only``: the request is HEAD.
        ``timeout_s``: ``TimeoutError`` when no head came in that many seconds (one timer
        handle on the head's future, cheaper than a timeout scope around the call)."""
        if self._phase != IDLE:
            if self._phase == CLOSED:
                raise DisconnectedBeforeHead("connection closed before a response")
            raise RuntimeError(f"upstream connection busy ({PHASES[self._phase]})")
        transport = self.transport
        if transport is None or transport.is_closing():
            self.close()
            raise DisconnectedBeforeHead("connection closed before a response")
        loop = self.loop or asyncio.get_running_loop()
        waiting: asyncio.Future[None] = loop.create_future()
        self._head = waiting
        self._parser = httptools.HttpResponseParser(self)
        self._reason = b""
        self._headers = CIMultiDict()
        self._consumer = None
        self._early = []
        self._early_bytes = 0
        self._ended = self._interim = self._written = self._keep_alive = False
        self._interim_to = interim
        self._head_only = head_only
        self._interims = 0
        self._violation = ""
        self._error = None
        self.received_bytes = 0
        self._move(HEAD)
        transport.write(head + body if body else head)
        late = None if timeout_s is None else loop.call_later(timeout_s, _head_late, waiting)
        try:
            await waiting
        finally:
            if late is not None:
                late.cancel()
            self._head = None  # answered (or given up on): not kept while the body streams
            self._interim_to = None

    def consume(self, consumer: BodyConsumer) -> None:
        """Hand the body to ``consumer``: what already arrived first, with its own stamps."""
        self._consumer = consumer
        early, self._early = self._early, []
        held = self._early_bytes > EARLY_BYTES
        self._early_bytes = 0
        for data, read_ns in early:
            consumer.body(data, read_ns)
        if self._ended:  # before ``read_done``, as in a read that ends the body
            consumer.end(self._error)
        consumer.read_done()
        if held and not self._ended:
            self.resume_reading()

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

    def close(self) -> None:
        """Close the connection (which also tells the upstream to stop generating)."""
        self._phase = CLOSED
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


def _head_late(head: asyncio.Future[None]) -> None:
    """``--read-timeout`` passed with no response head: the waiting request gets
    ``TimeoutError`` (the 504 of ``proxy.edge.forward``)."""
    if not head.done():
        head.set_exception(TimeoutError())


class _Violation(Exception):
    """Raised inside an ``httptools`` callback to stop parsing at a violation."""

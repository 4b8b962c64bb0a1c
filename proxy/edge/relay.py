"""Relaying an upstream response body to the client: plain, timed SSE or NDJSON, timed JSON.

The hot path. An observed body arrives through ``proxy.edge.upstream``'s
callbacks: per read, the connection stamps it, then a ``BodyRelay`` writes it
to the client's transport and only then looks at it (with usage stripping on,
the read is split at event boundaries before writing: see ``proxy.core.usage``),
all inside one ``data_received``. A read that carries several body pieces (the
proxy fell behind, or the upstream wrote several chunks at once) costs two
writes, not one per piece: the first piece goes at once, the others together
when the read is done (``read_done``), each still framed as its own chunk.
When the client's socket buffer is full, upstream reading pauses until it
drains, so a slow client slows its own stream only and memory stays bounded.
Unobserved bodies take the same path with a plain ``BodyRelay`` (written, not looked at).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Protocol

from proxy.core.decoders.ndjson import NdjsonDecoder, NdjsonLine
from proxy.core.decoders.openai import OUTPUT, REASONING
from proxy.core.decoders.registry import Format, interpret_json_body
from proxy.core.decoders.shape import TokenShape
from proxy.core.decoders.sse import SseDecoder, SseEvent
from proxy.core.records import Outcome
from proxy.core.timing import StreamTimer
from proxy.core.usage import EventCutter
from proxy.edge.tracing import CAPTURE_BYTES
from proxy.edge.upstream import UpstreamConnection
from proxy.edge.upstream_errors import PayloadError, UpstreamError

if TYPE_CHECKING:
    from proxy.edge.state import ProxyState


log = logging.getLogger("tokenstamp.proxy")

SHAPE_TRIES = 4
"""Reads a stream may spend learning its token shape (an attempt costs one more parse)."""


@dataclass(frozen=True, slots=True)
class RelayResult:
    """How relaying a response ended."""

    outcome: Outcome
    """Outcome to record."""
    status: int
    """Status sent to the client."""
    error_type: str = ""
    """Failure class, empty on success."""
    complete: bool = True
    """The body was relayed to its end (so the response may end cleanly)."""


class Drainable(Protocol):
    """Where a relay waits for the client to drain (``proxy.edge.inbound.Inbound``)."""

    async def drain(self) -> None:
        """Wait until the client's buffer has room (``ConnectionError`` if it went away)."""
        ...


class BodyRelay:
    """A ``BodyConsumer``: writes each piece of an upstream body to the client as it is read.

    Runs inside the upstream connection's ``data_received``: no await, no task
    wake-up per read. Subclasses look at the bytes after writing them. The
    coroutine ``run`` only waits for the end, or for the client to drain when
    its socket buffer is full (then upstream reading is paused meanwhile, so a
    slow client slows its own stream only and memory stays bounded).
    """

    __slots__ = (
        "_capture",
        "_chunked",
        "_client",
        "_conn",
        "_error",
        "_expired",
        "_finished",
        "_gone",
        "_head",
        "_high",
        "_pending",
        "_tail",
        "_waiter",
        "_wrote",
    )

    def __init__(
        self,
        conn: UpstreamConnection,
        client: asyncio.Transport,
        *,
        chunked: bool,
        capture: bytearray | None = None,
        head: bytes = b"",
        tail: bytes = b"",
    ) -> None:
        self._conn = conn
        self._client = client
        self._chunked = chunked
        self._head = head  # the response head, written with the body's first bytes
        self._tail = tail  # the response's end, written with the body's last bytes
        self._capture = capture
        self._high = client.get_write_buffer_limits()[1]
        self._waiter: asyncio.Future[None] | None = None
        self._finished = False
        self._gone = False
        self._error: UpstreamError | None = None
        self._expired = False
        self._wrote = False  # this read's first piece went out already
        self._pending: list[bytes] | None = None  # this read's later pieces, framed

    def write(self, data: bytes) -> None:
        """Send ``data`` to the client (framed as one chunk when the response is chunked).

        The read's first piece goes now (after the response head, the first time:
        one write for both); later pieces of the same read go together when it is done
        (``read_done``): one write for them, not one each.
        """
        if not data or self._gone:
            return
        framed = b"%x\r\n%b\r\n" % (len(data), data) if self._chunked else data
        capture = self._capture
        if capture is not None and len(capture) < CAPTURE_BYTES:
            capture += data[: CAPTURE_BYTES - len(capture)]
        if not self._wrote:
            self._wrote = True
            head = self._head
            if head:
                self._head = b""
                framed = head + framed
            self._send(framed)
        elif self._pending is None:
            self._pending = [framed]
        else:
            self._pending.append(framed)

    def read_done(self) -> None:
        """The read was handed over whole: send its later pieces, in one write."""
        self._wrote = False
        pending = self._pending
        if pending is not None:
            self._pending = None
            data = pending[0] if len(pending) == 1 else b"".join(pending)
            head = self._head
            if head:  # the pieces read with the head (``run``): one write for all
                self._head = b""
                data = head + data
            self._send(data)
        elif self._head:
            # Nothing of the body came with the head (or nothing was written of it): the
            # head goes now, at the first read handed over (``run`` hands the early ones).
            head, self._head = self._head, b""
            self._send(head)

    def _send(self, framed: bytes) -> None:
        if self._gone:
            return
        client = self._client
        if client.is_closing():
            self._gone = True
            self._conn.pause_reading()
            self._wake()
            return
        client.write(framed)
        if client.get_write_buffer_size() > self._high:
            self._conn.pause_reading()
            self._wake()

    def body(self, data: bytes, read_ns: int) -> None:
        """Relay one piece unchanged (subclasses also look at it)."""
        self.write(data)

    def end(self, error: UpstreamError | None) -> None:
        """The body ended (``error`` when it broke off): what this read relayed goes first.

        Ended cleanly, what is left is written and looked at (``finish``) and the
        response's end goes with the body's last bytes, in the same write.
        """
        try:
            if error is None:
                try:
                    self.finish()
                except Exception:  # the proxy's own bug: the response is not ended cleanly
                    log.exception("finishing a relayed body failed")
                    error = PayloadError("the proxy failed relaying the body")
                else:
                    self._write_tail()
            self.read_done()
        finally:
            self._finished = True
            self._error = error
            self._wake()

    def _write_tail(self) -> None:
        tail = self._tail
        if not tail or self._gone:
            return
        self._tail = b""
        if self._wrote:  # with this read's later pieces (``read_done``)
            if self._pending is None:
                self._pending = [tail]
            else:
                self._pending.append(tail)
            return
        self._wrote = True
        head, self._head = self._head, b""
        self._send(head + tail if head else tail)

    def finish(self) -> None:
        """What is left to write and look at once the body is complete (called from
        ``end``, before the response's end is written)."""

    def _wake(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)

    async def run(self, writer: Drainable) -> bool:
        """Relay until the body ends; ``False`` when the client went away first.

        Raises the upstream's ``UpstreamError`` when the body broke off.
        """
        conn = self._conn
        # The pieces read before the relay existed (with the response head, usually) go
        # together with the head, in one write, once all were handed over.
        self._wrote = True
        conn.consume(self)
        loop = conn.loop or asyncio.get_running_loop()
        while True:
            if self._gone:
                return False
            if self._finished:
                break
            if self._expired:
                raise TimeoutError("the upstream body fell silent (--read-timeout)")
            if conn.paused:
                try:
                    await writer.drain()
                except ConnectionError:
                    return False
                if self._client.is_closing():
                    return False
                conn.resume_reading()
                continue
            self._waiter = loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        if self._error is not None:
            raise self._error
        return not self._gone

    @property
    def received_bytes(self) -> int:
        """Body bytes read from the upstream so far (the watchdog's progress)."""
        return self._conn.received_bytes

    @property
    def waiting_for_data(self) -> bool:
        """The relay waits on the upstream (not on the client, not done): the watchdog's cue."""
        return not self._finished and not self._conn.paused

    @property
    def expired(self) -> bool:
        """The watchdog found the body silent (``expire``)."""
        return self._expired

    def expire(self) -> None:
        """The body fell silent (the watchdog): ``run`` raises ``TimeoutError`` instead of
        waiting on (no timeout scope per request: the relay's own waiter is woken)."""
        self._expired = True
        self._wake()


class TimedRelay(BodyRelay):
    """A relay that also times the body's events for ``timer``; subclasses decode ``fmt``."""

    __slots__ = ("_backend", "_fmt", "_interpret", "_sink", "_state", "_timer")

    def __init__(
        self,
        conn: UpstreamConnection,
        client: asyncio.Transport,
        timer: StreamTimer,
        state: ProxyState,
        fmt: Format,
        *,
        chunked: bool,
        capture: bytearray | None = None,
        head: bytes = b"",
        tail: bytes = b"",
    ) -> None:
        super().__init__(conn, client, chunked=chunked, capture=capture, head=head, tail=tail)
        self._timer = timer
        self._state = state
        self._sink = state.sink
        self._backend = state.backend
        self._fmt = fmt
        self._interpret = fmt.interpret
        self._start()

    def _start(self) -> None:
        """Set up the decoding state (the constructor's last step)."""


class SseRelay(TimedRelay):
    """Relays an event stream while timing every output event of ``fmt``.

    Once a stream's usual token event has been decoded and found a plain
    answer event, its shape is learned (``proxy.core.decoders.shape``, at most
    ``SHAPE_TRIES`` attempts a stream): a later read that is one event of that
    shape is timed as an answer event from its bytes, without being decoded.
    A reasoning model's stream learns a second shape, of its reasoning events,
    the same way; each shape only ever passes events of its own kind.
    """

    __slots__ = (
        "_cutter",
        "_decoder",
        "_learn",
        "_misses",
        "_oversized",
        "_rshape",
        "_rshape_tries",
        "_shape",
        "_shape_tries",
    )

    def __init__(
        self,
        conn: UpstreamConnection,
        client: asyncio.Transport,
        timer: StreamTimer,
        state: ProxyState,
        fmt: Format,
        *,
        chunked: bool,
        strip_usage: bool,
        capture: bytearray | None = None,
        head: bytes = b"",
        tail: bytes = b"",
    ) -> None:
        super().__init__(
            conn, client, timer, state, fmt, chunked=chunked, capture=capture, head=head,
            tail=tail,
        )  # fmt: skip
        self._cutter = EventCutter() if strip_usage else None

    def _start(self) -> None:
        self._decoder = SseDecoder(self._state.config.max_event_bytes)
        self._oversized = 0
        self._learn = self._fmt.token_shape
        self._shape: TokenShape | None = None
        self._shape_tries = SHAPE_TRIES if self._learn is not None else 0
        self._rshape: TokenShape | None = None
        self._rshape_tries = self._shape_tries
        self._misses = 0  # reads tried as a shape that were no output event at all

    def body(self, data: bytes, read_ns: int) -> None:
        """Write first (minus a usage event the proxy asked for), then time the events."""
        decoder = self._decoder
        timer = self._timer
        cutter = self._cutter
        shape = self._shape
        if cutter is None:
            self.write(data)
            if shape is not None and shape.matches(data) and decoder.skip_event(len(data)):
                # The usual token, recognised by its bytes (after the first answer: the
                # shape was learned from one the timer saw).
                timer.token(read_ns)
                return
            rshape = self._rshape
            if rshape is not None and rshape.matches(data) and decoder.skip_event(len(data)):
                timer.reasoning(read_ns)  # the usual thinking token
                return
            known = bool(timer.response_id or timer.response_model)
            learning = (
                known and shape is None and self._shape_tries > 0 and self._misses < SHAPE_TRIES
            )
            if learning and self._learned(data, read_ns):
                return
            events = decoder.feed(data)
            interpret = self._interpret
            infos = [interpret(ev.data, ev.event, known_ids=known) for ev in events]
        else:
            # An event is removed whole, so bytes of one still in progress are held
            # (see ``proxy.core.usage``): decode before writing.
            if shape is not None and shape.matches(data) and decoder.skip_event(len(data)):
                self.write(cutter.push(data, decoder.boundary_offset))
                timer.token(read_ns)
                return
            rshape = self._rshape
            if rshape is not None and rshape.matches(data) and decoder.skip_event(len(data)):
                self.write(cutter.push(data, decoder.boundary_offset))
                timer.reasoning(read_ns)
                return
            known = bool(timer.response_id or timer.response_model)
            learning = (
                known and shape is None and self._shape_tries > 0 and self._misses < SHAPE_TRIES
            )
            if learning and self._learned(data, read_ns):
                self.write(cutter.push(data, decoder.boundary_offset))
                return
            events = decoder.feed(data)
            interpret = self._interpret
            infos = []
            for ev in events:
                info = interpret(ev.data, ev.event, known_ids=known)
                if info is not None and info.usage_only:
                    self._cut(cutter, ev)
                infos.append(info)
            self.write(cutter.push(data, decoder.boundary_offset))
        for info in infos:
            if info is OUTPUT:
                timer.output(read_ns)
            elif info is REASONING:
                timer.reasoning(read_ns)
            elif info is None:
                self._sink.decoder_error(self._backend, "invalid_json")
            else:
                timer.chunk(info, read_ns)
        if decoder.errors != self._oversized:
            for _ in range(decoder.errors - self._oversized):
                self._sink.decoder_error(self._backend, "oversized_event")
            self._oversized = decoder.errors
        if learning:
            # Tried as a shape already (``_learned``), and it was none: that counts as the
            # try of the kind the decoder found, or else as a miss.
            if len(infos) == 1 and infos[0] is OUTPUT:
                self._shape_tries -= 1
            elif len(infos) == 1 and infos[0] is REASONING and self._rshape is None:
                self._rshape_tries = max(0, self._rshape_tries - 1)
            else:
                self._misses += 1
        elif len(infos) == 1 and self._learn is not None:
            # One plain output event in one read (``OUTPUT`` comes only once the ids are
            # known, and they stay known): the stream's usual token, perhaps. A shape is
            # kept only when it is of the kind the decoder found.
            if infos[0] is OUTPUT and shape is None and self._shape_tries:
                self._shape_tries -= 1
                learned = self._learn(data)
                self._shape = learned if learned is not None and not learned.reasoning else None
            elif infos[0] is REASONING and self._rshape is None and self._rshape_tries:
                self._rshape_tries -= 1
                learned = self._learn(data)
                self._rshape = learned if learned is not None and learned.reasoning else None

    def _learned(self, data: bytes, read_ns: int) -> bool:
        """Try ``data`` as the stream's usual token before decoding it (one parse, not two:
        learning a shape parses the event whole anyway). True when it was one whole plain
        output event, now timed, its shape kept; else nothing changed, and the read is
        decoded the general way (``body`` counts the try).

        What ``TokenShape.learn`` accepts is exactly what ``interpret`` with the ids known
        calls a plain answer (``OUTPUT``) or reasoning (``REASONING``) event of choice 0.
        """
        learn = self._learn
        assert learn is not None, "a shape is tried only where the format has one"
        learned = learn(data)
        if learned is None:
            return False
        if learned.reasoning and (self._rshape is not None or not self._rshape_tries):
            return False
        if not self._decoder.skip_event(len(data)):
            return False  # not at an event boundary: the general decode reads it
        timer = self._timer
        if learned.reasoning:
            self._rshape_tries -= 1
            self._rshape = learned
            timer.reasoning(read_ns)
        else:
            self._shape = learned
            timer.output(read_ns)
        return True

    def _cut(self, cutter: EventCutter, ev: SseEvent) -> None:
        state = self._state
        if '"timings"' in ev.data:
            # The backend moved more than usage into the chunk we asked for
            # (llama.cpp): hiding it would hide that too. Let it through, and stop
            # asking this backend.
            if state.inject_usage:
                state.inject_usage = False
                log.warning(
                    "upstream put timings into the usage chunk; usage "
                    "injection is now off for this backend"
                )
            return
        cutter.cut(ev.start_offset, ev.end_offset, ev.open_cr)

    def finish(self) -> None:
        """Release what the cutter still holds (an event cut off by the end of the body)."""
        if self._cutter is not None:
            self.write(self._cutter.flush())


class NdjsonRelay(TimedRelay):
    """Relays a newline-delimited JSON stream while timing every output event."""

    __slots__ = ("_decoder", "_oversized")

    def _start(self) -> None:
        self._decoder = NdjsonDecoder(self._state.config.max_event_bytes)
        self._oversized = 0

    def body(self, data: bytes, read_ns: int) -> None:
        """Write first, then time the complete lines."""
        self.write(data)
        self._observe(self._decoder.feed(data), read_ns)

    def finish(self) -> None:
        """The last line may lack its LF."""
        self._observe(self._decoder.close(), self._state.clock())

    def _observe(self, lines: list[NdjsonLine], read_ns: int) -> None:
        timer = self._timer
        sink = self._state.sink
        backend = self._state.backend
        known = bool(timer.response_id or timer.response_model)
        for line in lines:
            info = self._interpret(line.text, "", known_ids=known)
            if info is OUTPUT:
                timer.output(read_ns)
            elif info is REASONING:
                timer.reasoning(read_ns)
            elif info is None:
                sink.decoder_error(backend, "invalid_json")
            else:
                timer.chunk(info, read_ns)
        decoder = self._decoder
        if decoder.errors != self._oversized:
            for _ in range(decoder.errors - self._oversized):
                sink.decoder_error(backend, "oversized_event")
            self._oversized = decoder.errors


class JsonRelay(TimedRelay):
    """Relays a non-streaming body unchanged; reads usage from it at the end.

    A copy of at most ``max_event_bytes`` is kept for parsing; a larger body
    is relayed all the same and counted as undecodable.
    """

    __slots__ = ("_copy", "_limit", "_too_big")

    def _start(self) -> None:
        self._limit = self._state.config.max_event_bytes
        self._copy = bytearray()
        self._too_big = False

    def body(self, data: bytes, read_ns: int) -> None:
        """Write, and keep a bounded copy."""
        self.write(data)
        if not self._too_big:
            if len(self._copy) + len(data) > self._limit:
                self._too_big = True
                self._copy.clear()
            else:
                self._copy += data

    def finish(self) -> None:
        """Parse the copy: usage, ids, finish reasons."""
        state = self._state
        if self._too_big:
            state.sink.decoder_error(state.backend, "oversized_event")
        elif self._copy:
            info = interpret_json_body(self._fmt, bytes(self._copy))
            if info is None:
                state.sink.decoder_error(state.backend, "invalid_json")
            else:
                # Not a stream: no first token to see, only what the body reports.
                self._timer.chunk(replace(info, output=False), state.clock())


def stream_failed(status: int, timer: StreamTimer, state: ProxyState) -> RelayResult:
    """The upstream reported an error inside its body: its type, bounded in number."""
    kind = state.error_kinds.label(timer.stream_error)
    return RelayResult(Outcome.UPSTREAM_ERROR, status, kind)


def by_status(status: int) -> RelayResult:
    """A relayed response is the upstream's error when its status says so."""
    if status >= 500:
        return RelayResult(Outcome.UPSTREAM_ERROR, status, str(status))
    if status >= 400:
        return RelayResult(Outcome.OK, status, str(status))
    return RelayResult(Outcome.OK, status)

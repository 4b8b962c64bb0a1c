"""Incremental server-sent-events decoder.

Follows the WHATWG HTML standard, section 9.2.6 "Interpreting an event stream":
lines end in CRLF, LF or a lone CR; a line starting with ``:`` is a comment;
``field: value`` with one optional space after the colon; ``data`` lines are
joined with LF; a blank line dispatches the event (nothing is dispatched when
the data buffer is empty). Bytes are split into lines before any decoding, so
a multi-byte UTF-8 character split across reads is decoded whole; invalid
UTF-8 is replaced (U+FFFD) as the standard's UTF-8 decode does.

Pure and bounded: never raises on input, never holds more than ``max_event_bytes``
of one event (an oversized event is skipped to its end and counted in
``errors``). Any split of the byte stream yields the same events.

Offsets are absolute byte positions in the stream. ``boundary_offset`` is the
position just after the last blank line seen (an event boundary): every byte
before it belongs to a finished event or comment block. The proxy uses this to
remove one event byte-exactly (see ``proxy.core.usage``).
"""

from __future__ import annotations

from typing import NamedTuple

_BOM = b"\xef\xbb\xbf"


class SseEvent(NamedTuple):
    """One dispatched server-sent event (a named tuple: one is built per token)."""

    data: str
    """The data buffer, lines joined by LF, without the trailing LF."""
    event: str
    """The event type (``message`` when the stream did not name one)."""
    start_offset: int
    """Stream offset of the first byte after the previous boundary."""
    end_offset: int
    """Stream offset just after the blank line that dispatched this event."""
    open_cr: bool
    """The dispatching blank line ended in a CR at the end of the bytes seen so far:
    an LF arriving next belongs to it."""
    last_event_id: str = ""
    """The last event ID seen so far in the stream."""


_new_tuple = tuple.__new__


def _event(data: str, start: int, end: int, last_id: str) -> SseEvent:
    """A ``message`` event made without the named tuple's Python-level ``__new__``."""
    return _new_tuple(SseEvent, (data, "message", start, end, False, last_id))


class SseDecoder:
    """Feeds bytes, returns complete events. One decoder per response stream."""

    __slots__ = (
        "_after_cr",
        "_data",
        "_data_bytes",
        "_event",
        "_event_start",
        "_line",
        "_mid_line",
        "_offset",
        "_skipping",
        "_started",
        "boundary_offset",
        "errors",
        "last_event_id",
        "max_event_bytes",
    )

    def __init__(self, max_event_bytes: int = 1 << 20) -> None:
        if max_event_bytes < 1:
            raise ValueError("max_event_bytes must be positive")
        self.max_event_bytes = max_event_bytes
        """Largest event kept, counting the raw bytes of its lines."""
        self.errors = 0
        """Events skipped because they were oversized."""
        self.boundary_offset = 0
        """Offset just after the last blank line seen."""
        self.last_event_id = ""
        """WHATWG last event ID buffer."""
        self._line = bytearray()  # incomplete line carried to the next feed
        self._after_cr = False  # previous byte was a CR ending a line
        self._data: list[str] = []
        self._data_bytes = 0
        self._event = ""
        self._event_start = 0
        self._offset = 0  # bytes consumed so far
        self._skipping = False  # inside an oversized event: drop to the next blank line
        self._mid_line = False  # a dropped partial line: its terminator is not a blank line
        self._started = False  # BOM check done

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Consume ``chunk``; return the events it completed, in order."""
        if not chunk:
            return []
        if (
            chunk[-2:] == b"\n\n"
            and not self._line
            and not self._after_cr
            and not self._data
            and not self._event
            and not self._skipping
            and not self._mid_line
            and b"\r" not in chunk
        ):
            # Both fast paths take only reads that start with "data:" or ":", so the
            # stream's first read has no byte order mark to strip: they may take it too.
            n = len(chunk)
            if chunk.find(b"\n") == n - 2 and chunk.startswith(b"data:"):
                # One data line, one event, in one read: a token stream's usual read.
                if n - 2 <= self.max_event_bytes:
                    self._started = True
                    start = self._offset
                    end = start + n
                    value = chunk[6 : n - 2] if chunk[5] == 0x20 else chunk[5 : n - 2]
                    self._offset = self.boundary_offset = self._event_start = end
                    text = value.decode("utf-8", "replace")
                    # Built in place (``_event``'s body): this is every token's event.
                    return [
                        _new_tuple(
                            SseEvent, (text, "message", start, end, False, self.last_event_id)
                        )
                    ]
            else:
                fast = self._feed_simple(chunk)
                if fast is not None:
                    self._started = True
                    return fast
        return self._feed(chunk)

    def skip_event(self, n: int) -> bool:
        """Take the next ``n`` bytes as one whole event the caller has recognised itself.

        For a read the caller knows to be exactly one event and one ``data`` line
        (``proxy.core.decoders.shape``): the offsets move on as ``feed`` would
        have moved them, and no event is built. Returns ``False``, having changed
        nothing, when the decoder is inside a line or an event (then ``feed`` it),
        or when the event would be oversized.
        """
        if (
            self._line
            or self._after_cr
            or self._data
            or self._event
            or self._skipping
            or self._mid_line
            or not self._started
            or n - 2 > self.max_event_bytes
        ):
            return False
        self._offset = self.boundary_offset = self._event_start = self._offset + n
        return True

    def _feed_simple(self, chunk: bytes) -> list[SseEvent] | None:
        """The common shape, fast: whole ``data:`` events, one line each, LF endings.

        Returns ``None`` (having changed nothing) when the read has any other
        shape; the general path then handles it.
        """
        blocks = chunk.split(b"\n\n")
        if blocks.pop():  # not empty: the read ends with more than one blank line
            return None
        limit = self.max_event_bytes
        for b in blocks:
            if not b.startswith((b"data:", b":")) or b"\n" in b or len(b) > limit:
                return None
        out: list[SseEvent] = []
        pos = self._offset
        last_id = self.last_event_id
        for b in blocks:
            end = pos + len(b) + 2
            if b[0] == 0x64:  # "data:"
                v = b[6:] if b[5:6] == b" " else b[5:]
                out.append(_event(v.decode("utf-8", "replace"), pos, end, last_id))
            pos = end
        self._offset = pos
        self.boundary_offset = pos
        self._event_start = pos
        return out

    def _feed(self, chunk: bytes) -> list[SseEvent]:
        out: list[SseEvent] = []
        pos = 0
        n = len(chunk)
        if self._after_cr:
            self._after_cr = False
            if chunk[0] == 0x0A:  # the LF of a CRLF split across reads
                pos = 1
                if self.boundary_offset == self._offset:
                    self.boundary_offset += 1
                if self._event_start == self._offset:
                    self._event_start += 1
        base = self._offset
        while pos < n:
            lf = chunk.find(b"\n", pos)
            cr = chunk.find(b"\r", pos, lf if lf >= 0 else n)
            if cr >= 0:
                end, nxt = cr, cr + 1
                if nxt < n and chunk[nxt] == 0x0A:
                    nxt += 1
                elif nxt == n:
                    self._after_cr = True
            elif lf >= 0:
                end, nxt = lf, lf + 1
            else:
                self._carry(chunk, pos, n)
                break
            if self._line:
                self._line += chunk[pos:end]
                line = bytes(self._line)
                self._line.clear()
            else:
                line = chunk[pos:end]
            if self._mid_line:
                # The rest of a line dropped while skipping: even if empty, it is
                # that line's end, not a blank line.
                self._mid_line = False
                self.boundary_offset = base + nxt
                pos = nxt
                continue
            ev = self._line_done(line, base + nxt, nxt == n and self._after_cr)
            if ev is not None:
                out.append(ev)
            pos = nxt
        self._offset = base + n
        return out

    def _carry(self, chunk: bytes, pos: int, n: int) -> None:
        """Keep an incomplete line, or drop it when the event grows past the limit."""
        if self._skipping:
            self._line.clear()
            self._mid_line = True
            self.boundary_offset = self._offset + n
            return
        if len(self._line) + (n - pos) + self._data_bytes > self.max_event_bytes:
            self._line.clear()
            self._start_skip()
            self._mid_line = True
            self.boundary_offset = self._offset + n
        else:
            self._line += chunk[pos:n]

    def _start_skip(self) -> None:
        # The oversized event will never be dispatched, so nothing before the
        # current position can need removing: release it (see ``boundary_offset``).
        self._skipping = True
        self.errors += 1
        self._data.clear()
        self._data_bytes = 0
        self._event = ""

    def _line_done(self, line: bytes, end_offset: int, open_cr: bool) -> SseEvent | None:
        """Process one complete line ending just before ``end_offset``."""
        if not line:
            return self._blank(end_offset, open_cr)
        if self._skipping:
            self.boundary_offset = end_offset
            return None
        if not self._started:
            self._started = True
            if line.startswith(_BOM):
                line = line[3:]
                if not line:  # the BOM alone on the first line: a blank line
                    return self._blank(end_offset, open_cr)
        if line[0] == 0x3A:  # ':' comment
            if not self._data and not self._event:
                # Between events (a keep-alive): a boundary, so it is never held back.
                self.boundary_offset = end_offset
                self._event_start = end_offset
            return None
        self._data_bytes += len(line)
        if self._data_bytes > self.max_event_bytes:
            self._start_skip()
            self.boundary_offset = end_offset
            return None
        colon = line.find(b":")
        if colon < 0:
            field, value = line, b""
        else:
            field = line[:colon]
            vstart = colon + 2 if line[colon + 1 : colon + 2] == b" " else colon + 1
            value = line[vstart:]
        if field == b"data":
            self._data.append(value.decode("utf-8", "replace"))
        elif field == b"event":
            self._event = value.decode("utf-8", "replace")
        elif field == b"id" and b"\x00" not in value:
            self.last_event_id = value.decode("utf-8", "replace")
        # "retry" and unknown fields are ignored: they carry nothing we time.
        return None

    def _blank(self, end_offset: int, open_cr: bool) -> SseEvent | None:
        """A blank line: dispatch the event, if any, and mark a boundary."""
        start = self._event_start
        self.boundary_offset = end_offset
        self._event_start = end_offset
        self._started = True
        if self._skipping:
            self._skipping = False
            return None
        data, event = self._data, self._event
        self._data_bytes = 0
        self._event = ""
        if not data:
            return None
        self._data = []
        return SseEvent(
            data="\n".join(data),
            event=event or "message",
            start_offset=start,
            end_offset=end_offset,
            open_cr=open_cr,
            last_event_id=self.last_event_id,
        )

    @property
    def offset(self) -> int:
        """Bytes consumed so far."""
        return self._offset

    @property
    def pending_bytes(self) -> int:
        """Bytes held for an incomplete line (bounded by ``max_event_bytes``)."""
        return len(self._line)

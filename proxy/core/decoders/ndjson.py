"""Incremental newline-delimited JSON (NDJSON) line decoder.

Follows the NDJSON framing (ndjson-spec 1.0, also called JSON Lines): one
JSON text per line, lines separated by LF; a CR right before the LF is part
of the separator (CRLF). Ollama streams ``application/x-ndjson`` this way.
Whitespace-only lines carry nothing and are skipped without counting. A UTF-8
byte order mark at the very start is dropped. Bytes are split into lines
before any decoding, so a multi-byte UTF-8 character split across reads is
decoded whole; invalid UTF-8 is replaced (U+FFFD). The JSON itself is not
parsed here: that is the format interpreter's job.

Pure and bounded, with the SSE decoder's contract: never raises on input,
never holds more than ``max_line_bytes`` of one line (an oversized line is
skipped to its end and counted in ``errors``), and any split of the byte
stream yields the same lines. The last line may lack its LF: ``close()``
returns it when the stream ends.

Offsets are absolute byte positions in the stream: a line covers
``[start_offset, end_offset)``, its LF included.
"""

from __future__ import annotations

from dataclasses import dataclass

_BOM = b"\xef\xbb\xbf"
_BLANK = b" \t\r"


@dataclass(frozen=True, slots=True)
class NdjsonLine:
    """One complete, non-blank line of an NDJSON stream."""

    text: str
    """The line without its CRLF or LF, decoded as UTF-8 (invalid bytes replaced)."""
    start_offset: int
    """Stream offset of the line's first byte."""
    end_offset: int
    """Stream offset just after the line's LF (the stream's end for an unterminated last line)."""


class NdjsonDecoder:
    """Feeds bytes, returns complete lines. One decoder per response stream."""

    __slots__ = ("_line", "_line_start", "_offset", "_skipping", "errors", "max_line_bytes")

    def __init__(self, max_line_bytes: int = 1 << 20) -> None:
        if max_line_bytes < 1:
            raise ValueError("max_line_bytes must be positive")
        self.max_line_bytes = max_line_bytes
        """Longest line kept, counting its raw bytes without the LF."""
        self.errors = 0
        """Lines skipped because they were oversized."""
        self._line = bytearray()  # incomplete line carried to the next feed
        self._line_start = 0  # offset of the current line's first byte
        self._offset = 0  # bytes consumed so far
        self._skipping = False  # inside an oversized line: drop to the next LF

    def feed(self, chunk: bytes) -> list[NdjsonLine]:
        """Consume ``chunk``; return the lines it completed, in order."""
        out: list[NdjsonLine] = []
        pos = 0
        n = len(chunk)
        base = self._offset
        while pos < n:
            lf = chunk.find(b"\n", pos)
            if lf < 0:
                self._carry(chunk, pos, n)
                break
            line = self._take(chunk, pos, lf)
            if line is not None:
                self._emit(line, base + lf + 1, out)
            self._line_start = base + lf + 1
            pos = lf + 1
        self._offset = base + n
        return out

    def close(self) -> list[NdjsonLine]:
        """The stream ended: return its last line if it lacked an LF. Call once."""
        out: list[NdjsonLine] = []
        if self._skipping:
            self._skipping = False
        elif self._line:
            line = bytes(self._line)
            self._line.clear()
            self._emit(line, self._offset, out)
        self._line_start = self._offset
        return out

    def _carry(self, chunk: bytes, pos: int, n: int) -> None:
        """Keep the start of an unfinished line, or drop it once it passes the limit."""
        if self._skipping:
            return
        if len(self._line) + (n - pos) > self.max_line_bytes:
            self._line.clear()
            self._skipping = True
            self.errors += 1
        else:
            self._line += chunk[pos:n]

    def _take(self, chunk: bytes, pos: int, lf: int) -> bytes | None:
        """The finished line ending at ``lf`` (exclusive), or ``None`` when it is dropped."""
        if self._skipping:
            self._skipping = False
            return None
        if len(self._line) + (lf - pos) > self.max_line_bytes:
            self._line.clear()
            self.errors += 1
            return None
        if self._line:
            self._line += chunk[pos:lf]
            line = bytes(self._line)
            self._line.clear()
            return line
        return chunk[pos:lf]

    def _emit(self, line: bytes, end_offset: int, out: list[NdjsonLine]) -> None:
        start = self._line_start
        if start == 0 and line.startswith(_BOM):
            line = line[3:]
        if line.endswith(b"\r"):
            line = line[:-1]
        if not line.strip(_BLANK):
            return
        out.append(NdjsonLine(line.decode("utf-8", "replace"), start, end_offset))

    @property
    def offset(self) -> int:
        """Bytes consumed so far."""
        return self._offset

    @property
    def pending_bytes(self) -> int:
        """Bytes held for an incomplete line (bounded by ``max_line_bytes``)."""
        return len(self._line)

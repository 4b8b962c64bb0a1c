"""Usage injection: ask the upstream for token usage, then hide the answer.

When a streaming request does not set ``stream_options.include_usage``, the
proxy adds ``"stream_options":{"include_usage":true}`` right after the body's
opening brace (every other byte of the body unchanged), so the backend reports
exact token counts. The usage-only chunk this produces (``choices: []``) is then
removed from what the client receives, byte-exactly, so the client sees the
stream it would have seen. A client that set ``include_usage`` either way is
left alone.

To remove one event exactly, bytes of an event still in progress are held
until its end is known; complete events (and comments between events) are
released at once. Nothing else is ever held back.
"""

from __future__ import annotations

from bisect import insort
from typing import Any

_INJECTED = b'"stream_options":{"include_usage":true},'


def wants_injection(body: dict[str, Any]) -> bool:
    """Whether a parsed chat/completions body is a stream that did not choose usage."""
    if body.get("stream") is not True:
        return False
    # Only inject into an absent key: rewriting a present object would change its bytes.
    return "stream_options" not in body or body["stream_options"] is None


def inject(raw: bytes) -> bytes | None:
    """The body with ``include_usage`` added after the opening brace; ``None`` if impossible."""
    start = 0
    n = len(raw)
    while start < n and raw[start] in b" \t\r\n":
        start += 1
    if start >= n or raw[start] != 0x7B:  # '{'
        return None
    rest = raw[start + 1 :].lstrip()
    if rest.startswith(b"}"):
        return raw[: start + 1] + _INJECTED[:-1] + raw[start + 1 :]
    return raw[: start + 1] + _INJECTED + raw[start + 1 :]


class EventCutter:
    """Releases stream bytes up to the decoder's boundary, minus cut ranges.

    ``push`` takes one read and returns what may go to the client now. Offsets
    are absolute stream positions, as the SSE decoder reports them.
    """

    __slots__ = ("_cuts", "_held", "_held_start", "_lf_at")

    def __init__(self) -> None:
        self._held = bytearray()
        self._held_start = 0
        self._cuts: list[tuple[int, int]] = []  # sorted: _release walks them in order
        self._lf_at: list[int] = []  # cut events that ended in CR at a read's end: drop an LF

    def cut(self, start: int, end: int, open_cr: bool) -> None:
        """Mark ``[start, end)`` for removal (an event that must not reach the client)."""
        insort(self._cuts, (start, end))
        if open_cr:
            self._lf_at.append(end)

    def push(self, chunk: bytes, boundary: int) -> bytes:
        """Add ``chunk``; return the releasable bytes before ``boundary``."""
        if self._lf_at:
            end = self._held_start + len(self._held) + len(chunk)
            data = self._held + chunk
            waiting = []
            for at in self._lf_at:
                if at >= end:
                    waiting.append(at)
                elif at >= self._held_start and data[at - self._held_start] == 0x0A:
                    insort(self._cuts, (at, at + 1))
                    boundary = max(boundary, at + 1)
            self._lf_at = waiting
        if not self._held and not self._cuts and boundary == self._held_start + len(chunk):
            self._held_start = boundary
            return chunk
        self._held += chunk
        return self._release(boundary)

    def flush(self) -> bytes:
        """Everything still held (the stream ended): released unchanged."""
        return self._release(self._held_start + len(self._held))

    def _release(self, upto: int) -> bytes:
        start = self._held_start
        upto = min(upto, start + len(self._held))
        if upto <= start:
            return b""
        out = bytearray()
        pos = start
        keep: list[tuple[int, int]] = []
        for a, b in self._cuts:
            if a >= upto:
                keep.append((a, b))
                continue
            if a > pos:
                out += self._held[pos - start : a - start]
            pos = max(pos, min(b, upto))
            if b > upto:
                keep.append((upto, b))
        if pos < upto:
            out += self._held[pos - start : upto - start]
        del self._held[: upto - start]
        self._held_start = upto
        self._cuts = keep
        return bytes(out)

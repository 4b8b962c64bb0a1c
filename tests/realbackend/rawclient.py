"""A measuring HTTP client: stamps each read in ``data_received``, parses afterwards.

aiohttp stamps a read only when the task awaiting it resumes; a client with
nine streams whose tokens land together then stamps the ninth after the eight
before it were parsed, and blames the proxy for its own work. Here the
protocol callback takes the stamp (``time.monotonic_ns``) and keeps the bytes;
nothing else happens until the connection closes (the request says
``Connection: close``). Then HTTP framing, SSE events and output events are
recovered, each event stamped with the read that completed it (``parse``,
called once every stream of a run has ended, so no parsing delays a stamp).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tests.realbackend.client import Capture, output_text

ACCEPT_WAIT_S = 0.02


class _Reads(asyncio.Protocol):
    def __init__(
        self, closed: asyncio.Future[None], progress: dict[str, int], request_id: str
    ) -> None:
        self.reads: list[tuple[int, bytes]] = []
        self.closed = closed
        self.progress = progress
        self.request_id = request_id
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.reads.append((time.monotonic_ns(), data))
        self.progress[self.request_id] = len(self.reads)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


@dataclass
class RawExchange:
    """One request's stamped reads, not yet parsed (parse when nothing else runs)."""

    capture: Capture
    """Request id and send stamps so far."""
    reads: list[tuple[int, bytes]]
    """``(stamp_ns, bytes)`` per read."""

    def parse(self) -> Capture:
        """Recover status, body, events and output stamps into the capture."""
        _parse(self.capture, self.reads)
        return self.capture


async def stream_raw(
    url: str,
    body: dict[str, Any],
    request_id: str,
    *,
    path: str = "/v1/chat/completions",
    progress: dict[str, int] | None = None,
) -> RawExchange:
    """POST ``body`` over a fresh connection; keep every read with its stamp.

    ``progress[request_id]`` counts reads as they happen (to watch a stream warm up).
    """
    cap = Capture(request_id)
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    payload = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\nX-Request-Id: {request_id}\r\n"
        "Connection: close\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    closed: asyncio.Future[None] = loop.create_future()
    cap.start_ns = time.monotonic_ns()
    counts = progress if progress is not None else {}
    transport, proto = await loop.create_connection(
        lambda: _Reads(closed, counts, request_id), host, port
    )
    # Like a client on a kept-alive connection: the proxy has accepted it before
    # the request goes out, so the TTFT compared is the request's, not the accept's.
    await asyncio.sleep(ACCEPT_WAIT_S)
    transport.write(head + payload)
    cap.sent_ns = time.monotonic_ns()
    try:
        await closed
    finally:
        transport.close()
    cap.end_ns = time.monotonic_ns()
    return RawExchange(cap, proto.reads)


def _parse(cap: Capture, reads: list[tuple[int, bytes]]) -> None:
    raw = b"".join(d for _, d in reads)
    ends: list[int] = []
    total = 0
    for stamp, data in reads:
        total += len(data)
        ends.append(total)
        cap.reads.append((stamp, len(data)))

    def stamp_at(offset: int) -> int:
        return reads[bisect.bisect_right(ends, offset)][0]

    head_end = raw.find(b"\r\n\r\n")
    if head_end < 0:
        cap.error = "no response head"
        return
    lines = raw[:head_end].decode("latin-1").split("\r\n")
    cap.status = int(lines[0].split()[1])
    cap.headers = dict(ln.split(": ", 1) for ln in lines[1:] if ": " in ln)
    pos = head_end + 4
    # Body bytes with their raw offsets (chunked framing removed).
    segments: list[tuple[int, int]] = []  # (raw start, length)
    if cap.headers.get("Transfer-Encoding", "").lower() == "chunked":
        complete = False
        while True:
            eol = raw.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(raw[pos:eol].split(b";")[0], 16)
            pos = eol + 2
            if size == 0:
                complete = True
                break
            segments.append((pos, min(size, len(raw) - pos)))
            pos += size + 2
        if not complete:
            cap.error = "incomplete chunked body"
    else:
        length = int(cap.headers.get("Content-Length", len(raw) - pos))
        segments.append((pos, min(length, len(raw) - pos)))
        if len(raw) - pos < length:
            cap.error = "incomplete body"
    body_starts = []
    acc = 0
    for start, n in segments:
        body_starts.append(acc)
        cap.body += raw[start : start + n]
        acc += n
    body = bytes(cap.body)

    def raw_offset(body_offset: int) -> int:
        i = bisect.bisect_right(body_starts, body_offset) - 1
        return segments[i][0] + body_offset - body_starts[i]

    start = 0
    while (end := body.find(b"\n\n", start)) >= 0:
        block = body[start:end]
        start = end + 2
        data = b"\n".join(ln[5:].removeprefix(b" ") for ln in block.split(b"\n")
                          if ln.startswith(b"data:"))  # fmt: skip
        if not data:
            continue
        cap.events.append(data)
        try:
            obj = json.loads(data)
        except ValueError:
            continue
        text = output_text(obj) if isinstance(obj, dict) else ""
        if text:
            cap.output_ns.append(stamp_at(raw_offset(end + 1)))
            cap.output_text.append(text)

"""A measuring HTTP client: the kernel stamps each read, parsing waits until the end.

aiohttp stamps a read only when the task awaiting it resumes; a client with
nine streams whose tokens land together then stamps the ninth after the eight
before it were parsed, and blames the proxy for its own work. Even a stamp
taken in the read callback holds the client's own wake-up: on a shared
machine, a millisecond now and then that says nothing about the proxy. So the
socket asks the kernel for its receive time (``SO_TIMESTAMPNS``): each read is
stamped when its bytes arrived at the client's socket, converted to the
monotonic clock the proxy stamps with. The callback keeps the bytes; nothing
else happens until the connection closes (the request says ``Connection:
close``). Then HTTP framing, SSE events and output events are recovered, each
event stamped with the read that completed it (``parse``, called once every
stream of a run has ended, so no parsing delays a stamp).
"""

from __future__ import annotations

import asyncio
import bisect
import json
import socket
import struct
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from tests.realbackend.client import Capture, output_text

ACCEPT_WAIT_S = 0.02


# Linux: the socket option and its control message share the number.
_SO_TIMESTAMPNS = getattr(socket, "SO_TIMESTAMPNS", 35)
_TIMESPEC = struct.Struct("qq")


class _Reads:
    """Reads a socket until the peer closes it, each read with the kernel's receive stamp."""

    def __init__(
        self, sock: socket.socket, closed: asyncio.Future[None], progress: dict[str, int],
        request_id: str,
    ) -> None:  # fmt: skip
        self.sock = sock
        self.reads: list[tuple[int, bytes]] = []
        self.seen: list[int] = []  # per read: when recvmsg returned (the client's own clock)
        self.closed = closed
        self.progress = progress
        self.request_id = request_id

    def readable(self) -> None:
        sock = self.sock
        while True:
            try:
                data, ancillary, _flags, _addr = sock.recvmsg(1 << 18, socket.CMSG_SPACE(16))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, ancillary = b"", []
            mono_ns, real_ns = time.monotonic_ns(), time.time_ns()
            if not data:
                asyncio.get_running_loop().remove_reader(sock.fileno())
                if not self.closed.done():
                    self.closed.set_result(None)
                return
            stamp_ns = mono_ns
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == _SO_TIMESTAMPNS:
                    sec, nsec = _TIMESPEC.unpack(payload[: _TIMESPEC.size])
                    # Arrival on the realtime clock -> the same instant on the monotonic one.
                    stamp_ns = mono_ns - (real_ns - (sec * 1_000_000_000 + nsec))
            self.reads.append((stamp_ns, data))
            self.seen.append(mono_ns)
            self.progress[self.request_id] = len(self.reads)


@dataclass
class RawExchange:
    """One request's stamped reads, not yet parsed (parse when nothing else runs)."""

    capture: Capture
    """Request id and send stamps so far."""
    reads: list[tuple[int, bytes]]
    """``(stamp_ns, bytes)`` per read: the kernel's receive stamp."""
    seen: list[int]
    """Per read: when the client's code got it."""

    def parse(self) -> Capture:
        """Recover status, body, events and output stamps into the capture."""
        _parse(self.capture, self.reads, self.seen)
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
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    sock.setsockopt(socket.SOL_SOCKET, _SO_TIMESTAMPNS, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    reads = _Reads(sock, closed, counts, request_id)
    try:
        await loop.sock_connect(sock, (host, port))
        loop.add_reader(sock.fileno(), reads.readable)
        # Like a client on a kept-alive connection: the proxy has accepted it before
        # the request goes out, so the TTFT compared is the request's, not the accept's.
        await asyncio.sleep(ACCEPT_WAIT_S)
        await loop.sock_sendall(sock, head + payload)
        cap.sent_ns = time.monotonic_ns()
        await closed
    finally:
        loop.remove_reader(sock.fileno())
        sock.close()
    cap.end_ns = time.monotonic_ns()
    return RawExchange(cap, reads.reads, reads.seen)


def _parse(cap: Capture, reads: list[tuple[int, bytes]], seen: list[int]) -> None:
    raw = b"".join(d for _, d in reads)
    ends: list[int] = []
    total = 0
    for stamp, data in reads:
        total += len(data)
        ends.append(total)
        cap.reads.append((stamp, len(data)))

    def read_at(offset: int) -> int:
        return bisect.bisect_right(ends, offset)

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
            i = read_at(raw_offset(end + 1))
            cap.output_ns.append(reads[i][0])
            cap.seen_ns.append(seen[i])
            cap.output_text.append(text)

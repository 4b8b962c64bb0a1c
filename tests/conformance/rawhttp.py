"""A raw HTTP/1.1 client for the conformance suite: exact bytes out, every byte back.

``send_raw`` writes bytes as given (no normalisation of any kind), then reads
until the peer closes or falls silent, and returns everything it received;
``parse_responses`` splits that into responses by RFC 9112 framing (section 6:
``Content-Length``, chunked, or to the close), interim (1xx) ones included,
and says what was left over. It is written here from the RFC, not taken from
any of the implementations under test, so it judges them all the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field


@dataclass
class Response:
    """One response as the client received it."""

    status: int
    reason: bytes
    version: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes
    raw: bytes
    complete: bool = True
    """Its framing said where it ends and it ended there (not cut off)."""

    def header(self, name: str) -> list[bytes]:
        """Every value of the header ``name`` (case-insensitive)."""
        low = name.lower().encode()
        return [v for k, v in self.headers if k.lower() == low]


@dataclass
class Received:
    """Everything one connection received, split into responses."""

    raw: bytes
    responses: list[Response] = field(default_factory=list)
    leftover: bytes = b""
    """Bytes after the last response that are not a response."""
    closed: bool = False
    """The peer closed (or reset) the connection."""
    timed_out: bool = False
    """The peer fell silent without closing."""

    @property
    def final(self) -> list[Response]:
        """The non-interim responses."""
        return [r for r in self.responses if not 100 <= r.status < 200]

    @property
    def statuses(self) -> list[int]:
        """Every status received, interim ones included."""
        return [r.status for r in self.responses]


async def send_raw(
    port: int,
    data: bytes | list[bytes],
    *,
    idle_s: float = 1.0,
    total_s: float = 10.0,
    pause_s: float = 0.05,
) -> Received:
    """Send ``data`` (a list: its pieces as separate writes, ``pause_s`` apart) to
    127.0.0.1:``port``; read until closed, ``idle_s`` of silence, or ``total_s``."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    pieces = data if isinstance(data, list) else [data]
    out = bytearray()
    closed = timed_out = False
    try:
        for i, piece in enumerate(pieces):
            if i:
                await asyncio.sleep(pause_s)
            writer.write(piece)
            await writer.drain()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + total_s
        while True:
            left = min(idle_s, deadline - loop.time())
            if left <= 0:
                timed_out = True
                break
            try:
                chunk = await asyncio.wait_for(reader.read(65536), left)
            except TimeoutError:
                timed_out = True
                break
            if not chunk:
                closed = True
                break
            out += chunk
    except ConnectionError:
        closed = True
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    got = parse_responses(bytes(out))
    got.closed, got.timed_out = closed, timed_out
    return got


def parse_responses(data: bytes, *, head_request: bool = False) -> Received:
    """Split ``data`` into the responses it holds (RFC 9112 sections 4-7)."""
    got = Received(raw=data)
    pos = 0
    while pos < len(data):
        end = data.find(b"\r\n\r\n", pos)
        if end < 0 or not data.startswith(b"HTTP/", pos):
            break
        head = data[pos:end]
        lines = head.split(b"\r\n")
        version, _, rest = lines[0].partition(b" ")
        code, _, reason = rest.partition(b" ")
        if not code.isdigit():
            break
        status = int(code)
        headers = []
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            headers.append((name.strip(), value.strip()))
        start = end + 4
        resp = Response(status, reason, version, headers, b"", b"")
        lengths = resp.header("content-length")
        te = b",".join(resp.header("transfer-encoding")).lower()
        if 100 <= status < 200 or status in (204, 304) or head_request:
            stop = start
        elif b"chunked" in te:
            body, stop, complete = _dechunk(data, start)
            resp.body, resp.complete = body, complete
        elif lengths:
            n = int(lengths[0])
            stop = min(start + n, len(data))
            resp.body = data[start:stop]
            resp.complete = stop - start == n
        else:
            stop = len(data)
            resp.body = data[start:]
        resp.raw = data[pos:stop]
        got.responses.append(resp)
        pos = stop
        if not resp.complete:
            break
    got.leftover = data[pos:]
    return got


def _dechunk(data: bytes, pos: int) -> tuple[bytes, int, bool]:
    body = bytearray()
    while True:
        eol = data.find(b"\r\n", pos)
        if eol < 0:
            return bytes(body), len(data), False
        size_text = data[pos:eol].split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            return bytes(body), len(data), False
        pos = eol + 2
        if size == 0:
            # trailer section, then the final CRLF
            while True:
                eol = data.find(b"\r\n", pos)
                if eol < 0:
                    return bytes(body), len(data), False
                if eol == pos:
                    return bytes(body), eol + 2, True
                pos = eol + 2
        if pos + size + 2 > len(data):
            body += data[pos : pos + size]
            return bytes(body), len(data), False
        body += data[pos : pos + size]
        pos += size + 2


async def exchange(
    port: int,
    data: bytes,
    *,
    settle_s: float = 0.25,
    idle_s: float = 1.0,
    total_s: float = 5.0,
    first_byte: asyncio.Event | None = None,
    answered: asyncio.Event | None = None,
) -> Received:
    """Send ``data`` (written while the answer is read, so an answer that comes before
    the request is fully sent is still seen) and read as a client waiting for its
    answer: until a final response is complete by its framing, then on until
    ``settle_s`` of silence (anything more that comes is kept: a second response,
    stray bytes); or until the peer closes, ``idle_s`` of silence, or ``total_s``.

    ``first_byte`` is set when the first bytes arrive, ``answered`` when the final
    response is complete (both, at the latest, when this returns)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    loop = asyncio.get_running_loop()

    async def send() -> None:
        try:
            writer.write(data)
            await writer.drain()
        except ConnectionError:
            pass

    sending = loop.create_task(send())
    out = bytearray()
    closed = timed_out = done = False
    deadline = loop.time() + total_s
    try:
        while True:
            left = min(settle_s if done else idle_s, deadline - loop.time())
            if left <= 0:
                timed_out = not done
                break
            try:
                chunk = await asyncio.wait_for(reader.read(65536), left)
            except TimeoutError:
                timed_out = not done
                break
            if not chunk:
                closed = True
                break
            out += chunk
            if first_byte is not None:
                first_byte.set()
            if not done:
                done = _answered(bytes(out))
                if done and answered is not None:
                    answered.set()
    except ConnectionError:
        closed = True
    finally:
        for event in (first_byte, answered):
            if event is not None:
                event.set()
        if sending.done():
            writer.close()
        else:
            sending.cancel()
            writer.transport.abort()  # the request could not all be sent: do not wait for it
        await asyncio.gather(sending, writer.wait_closed(), return_exceptions=True)
    got = parse_responses(bytes(out))
    got.closed, got.timed_out = closed, timed_out
    return got


def _answered(data: bytes) -> bool:
    """``data`` holds a final response whose framing says it is complete."""
    for r in parse_responses(data).final:
        te = b",".join(r.header("transfer-encoding")).lower()
        framed = r.status in (204, 304) or b"chunked" in te or bool(r.header("content-length"))
        return framed and r.complete
    return False

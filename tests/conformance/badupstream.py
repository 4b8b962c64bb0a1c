"""A scriptable upstream that misbehaves on purpose, for the upstream-isolation suite.

An asyncio streams server on 127.0.0.1. Each connection loops: read a request
head and its ``Content-Length`` body, then answer by the request's
``X-Marker`` header (a header, not the body: every target forwards it
unchanged, while tokenstamp may rewrite a streaming request body to ask for
usage). A marker is ``<case>.<who>``: when ``<case>`` names one of the
upstream's ``cases`` the request gets that case's ``Script``, pieces of bytes
written in turn (each drained, ``TCP_NODELAY``; a piece after a delay arrives
as its own read), after which the connection serves more requests, is
closed, is reset, or only drains, as the script says. Any other marker gets a
normal, well-framed response whose body carries the marker: a chunked SSE
chat stream on ``POST /v1/chat/completions``, one JSON object with
``Content-Length`` elsewhere.

It records which requests (markers) came on which connection and whether the
proxy closed each connection (EOF or reset seen while the upstream was still
willing to read), so a test can say whether a connection was reused after a
given exchange and whether the proxy gave it up.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from proxy.edge.tasks import TaskSet

CHAT = "/v1/chat/completions"
MARKER_HEADER = "x-marker"
RCVBUF = 64 << 10
"""The upstream's socket receive buffer: small, so a large request body the upstream
does not read stays (partly) unwritten in the proxy (loopback otherwise absorbs
several megabytes in kernel buffers)."""

_MARKER_RE = re.compile(rb"(?im)^x-marker:[ \t]*([^\r\n]+?)[ \t]*\r?$")


def chunk(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk (RFC 9112 section 7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"
SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: text/event-stream\r\n"
    b"Cache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def sse_events(marker: str, n: int = 3) -> list[bytes]:
    """A chat-completion stream of ``n`` events carrying ``marker``, then ``[DONE]``."""
    event = json.dumps(
        {
            "id": marker,
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": marker}}],
        },
        separators=(",", ":"),
    ).encode()
    return [b"data: " + event + b"\n\n"] * n + [b"data: [DONE]\n\n"]


def sse_body(marker: str) -> bytes:
    """The body (chunked framing removed) of ``sse_response(marker)``."""
    return b"".join(sse_events(marker))


def sse_response(marker: str) -> bytes:
    """A complete chunked SSE 200 whose events carry ``marker``."""
    return SSE_HEAD + b"".join(chunk(e) for e in sse_events(marker)) + LAST_CHUNK


def json_body(marker: str) -> bytes:
    """The JSON body of ``json_response(marker)``."""
    return json.dumps(
        {"object": "list", "model": marker, "data": [{"object": "embedding", "index": 0}]},
        separators=(",", ":"),
    ).encode()


def json_response(
    marker: str, *, status: bytes = b"200 OK", version: bytes = b"HTTP/1.1", extra: bytes = b""
) -> bytes:
    """A complete ``Content-Length`` JSON response carrying ``marker`` (``extra``: header
    lines, each ending in CRLF)."""
    body = json_body(marker)
    return (
        version + b" " + status + b"\r\n"
        b"Content-Type: application/json\r\n"
        b"Content-Length: %d\r\n" % len(body) + extra + b"\r\n" + body
    )


def normal_response(path: str, marker: str) -> bytes:
    """What a well-behaved upstream answers: SSE on the chat route, JSON elsewhere."""
    return sse_response(marker) if path == CHAT else json_response(marker)


def normal_body(path: str, marker: str) -> bytes:
    """The body a client must receive for ``normal_response(path, marker)``."""
    return sse_body(marker) if path == CHAT else json_body(marker)


After = Literal["keep", "close", "reset", "drain"]


@dataclass(frozen=True)
class Script:
    """What one request gets: ``pieces(marker)`` as (delay before, bytes) writes, then ``after``.

    ``after``: ``keep`` serves further requests on the connection; ``close`` closes it
    (FIN); ``reset`` aborts it (RST); ``drain`` keeps it open but answers nothing more
    (what arrives is read, dropped, and searched for markers).
    ``read_body``: ``False`` answers right after the request head and reads (and drops)
    the body only ``body_after_s`` after the answer.
    """

    pieces: Callable[[str], list[tuple[float, bytes]]]
    after: After = "keep"
    read_body: bool = True
    body_after_s: float = 0.1


@dataclass
class UpConn:
    """One connection a proxy opened to the upstream."""

    id: int
    markers: list[str] = field(default_factory=list)
    """The ``X-Marker`` of each request that came on it, in order."""
    proxy_closed: bool = False
    """The proxy closed (or reset) it while the upstream still served it."""
    upstream_closed: bool = False
    """The upstream closed or reset it (its script, or ``close_all``)."""
    writer: asyncio.StreamWriter | None = None

    @property
    def open(self) -> bool:
        """Neither side has closed it."""
        return not (self.proxy_closed or self.upstream_closed)


def case_of(marker: str) -> str:
    """The case a marker names: its part before the first dot."""
    return marker.split(".", 1)[0]


@dataclass
class BadUpstream:
    """The listening upstream; ``cases`` maps case names to scripts."""

    cases: dict[str, Script] = field(default_factory=dict)
    url: str = ""
    conns: list[UpConn] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _tasks: TaskSet = field(default_factory=TaskSet)

    async def start(self) -> BadUpstream:
        """Listen on a free port of 127.0.0.1."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)  # inherited on accept
        sock.bind(("127.0.0.1", 0))
        sock.listen(512)
        sock.setblocking(False)
        self._server = await asyncio.start_server(self._accept, sock=sock, limit=1 << 20)
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        return self

    async def close(self) -> None:
        """Stop listening and end every connection."""
        if self._server is not None:
            self._server.close()
        await self.close_all()
        await self._tasks.cancel_all()
        if self._server is not None:
            await self._server.wait_closed()

    async def close_all(self) -> None:
        """Close every connection still open (between cases: each starts from nothing)."""
        for c in self.conns:
            if c.open and c.writer is not None:
                c.upstream_closed = True
                c.writer.close()
        await asyncio.sleep(0)

    def conn_of(self, marker: str) -> UpConn | None:
        """The connection the request with ``marker`` came on (``None``: it never came)."""
        for c in self.conns:
            if marker in c.markers:
                return c
        return None

    def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # An owned task: ``close`` cancels it (a cancelled callback task would be logged).
        _ = self._tasks.spawn(self._serve(reader, writer))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = UpConn(len(self.conns), writer=writer)
        self.conns.append(conn)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                path, headers = _parse_head(head)
                marker = headers.get(MARKER_HEADER, "")
                conn.markers.append(marker)
                length = int(headers.get("content-length", "0") or 0)
                script = self.cases.get(case_of(marker)) if marker else None
                if script is None:
                    await reader.readexactly(length)
                    await _send(writer, normal_response(path, marker or "no-marker"))
                    continue
                if script.read_body:
                    await reader.readexactly(length)
                for delay, data in script.pieces(marker):
                    if delay:
                        await asyncio.sleep(delay)
                    await _send(writer, data)
                if not script.read_body:
                    await asyncio.sleep(script.body_after_s)
                    await reader.readexactly(length)
                if script.after == "close":
                    conn.upstream_closed = True
                    return
                if script.after == "reset":
                    conn.upstream_closed = True
                    _reset(writer)
                    return
                if script.after == "drain":
                    await self._drain(conn, reader)
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            if not conn.upstream_closed:
                conn.proxy_closed = True
        except asyncio.LimitOverrunError:
            pass
        finally:
            if not conn.proxy_closed:
                conn.upstream_closed = True
            writer.close()

    async def _drain(self, conn: UpConn, reader: asyncio.StreamReader) -> None:
        seen = b""
        while data := await reader.read(65536):
            seen = seen[-200:] + data
            for m in _MARKER_RE.findall(seen):
                marker = m.decode("latin-1")
                if marker not in conn.markers:
                    conn.markers.append(marker)
        if not conn.upstream_closed:
            conn.proxy_closed = True


def _parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    path = parts[1] if len(parts) > 1 else ""
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            k, _, v = line.partition(":")
            headers[k.strip().lower()] = v.strip()
    return path, headers


async def _send(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(data)
    await writer.drain()


def _reset(writer: asyncio.StreamWriter) -> None:
    """Abort with a TCP RST (SO_LINGER 0), not a clean FIN."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()

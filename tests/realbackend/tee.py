"""A byte tee between the proxy and a real server: what did the proxy read?

``TcpTee`` is a plain TCP relay on a free loopback port that copies both
directions unchanged and keeps the upstream-to-proxy bytes of every connection.
It adds a hop, so tests that compare timings do not use it; tests that compare
bytes do: the client's bytes against the bytes the proxy read, same request.

``http_responses`` splits a recorded connection into responses and undoes the
HTTP/1.1 framing (``Content-Length`` or chunked), so bodies compare as the
client sees them.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from proxy.edge.tasks import TaskSet


@dataclass
class Connection:
    """One relayed TCP connection."""

    to_client: bytearray = field(default_factory=bytearray)
    """Bytes the server sent toward the proxy."""
    to_server: bytearray = field(default_factory=bytearray)
    """Bytes the proxy sent toward the server."""
    closed: bool = False
    """Both directions ended."""


@dataclass
class HttpResponse:
    """One HTTP/1.1 response as read off the wire."""

    head: bytes
    """Status line and headers."""
    body: bytes
    """The body with the transfer framing removed."""
    complete: bool
    """The framing said the body ended (last chunk / full length)."""


class TcpTee:
    """``async with TcpTee("127.0.0.1", port) as tee: tee.url``."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.connections: list[Connection] = []
        self.url = ""
        self._server: asyncio.Server | None = None
        self._tasks = TaskSet()
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> TcpTee:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for w in self._writers:
            w.close()
        await self._tasks.cancel_all()
        await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection()
        self.connections.append(conn)
        up_reader, up_writer = await asyncio.open_connection(*self.target)
        self._writers += [writer, up_writer]
        a = self._tasks.spawn(self._pump(reader, up_writer, conn.to_server))
        b = self._tasks.spawn(self._pump(up_reader, writer, conn.to_client))
        await asyncio.gather(a, b, return_exceptions=True)
        conn.closed = True

    @staticmethod
    async def _pump(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, log: bytearray
    ) -> None:
        try:
            while data := await reader.read(65536):
                log += data
                writer.write(data)
                await writer.drain()
        except ConnectionError:
            pass
        finally:
            # The other side sees the end as it happened: EOF when clean, else a reset.
            writer.close()

    def responses(self) -> list[HttpResponse]:
        """Every response of every connection, in connection order."""
        out: list[HttpResponse] = []
        for conn in self.connections:
            out += http_responses(bytes(conn.to_client))
        return out


def http_responses(raw: bytes) -> list[HttpResponse]:
    """Split HTTP/1.1 responses on one connection; the last may be cut short."""
    out: list[HttpResponse] = []
    pos = 0
    while pos < len(raw):
        end = raw.find(b"\r\n\r\n", pos)
        if end < 0:
            break
        head = raw[pos : end + 4]
        pos = end + 4
        headers = {}
        for line in head.split(b"\r\n")[1:]:
            name, sep, value = line.partition(b":")
            if sep:
                headers[name.strip().lower()] = value.strip()
        if headers.get(b"transfer-encoding", b"").lower() == b"chunked":
            body, pos, complete = _dechunk(raw, pos)
        else:
            length = int(headers.get(b"content-length", b"0"))
            body = raw[pos : pos + length]
            complete = len(body) == length
            pos += length
        out.append(HttpResponse(head, body, complete))
        if not complete:
            break
    return out


def _dechunk(raw: bytes, pos: int) -> tuple[bytes, int, bool]:
    body = bytearray()
    while True:
        eol = raw.find(b"\r\n", pos)
        if eol < 0:
            return bytes(body), len(raw), False
        size = int(raw[pos:eol].split(b";")[0], 16)
        pos = eol + 2
        if size == 0:
            trailer_end = raw.find(b"\r\n", pos)
            return bytes(body), (len(raw) if trailer_end < 0 else trailer_end + 2), True
        body += raw[pos : pos + size]
        if pos + size + 2 > len(raw):
            return bytes(body), len(raw), False
        pos += size + 2

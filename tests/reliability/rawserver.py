"""A raw asyncio upstream that misbehaves at the TCP and HTTP level on purpose.

aiohttp's own server always frames its answers correctly; the faults the proxy
must survive (a reset before the status line, a chunked body cut short, a
header that never ends) need a server that writes bytes by hand. One request
per connection: the scripted behaviour gets the parsed request and the raw
reader and writer, and the connection is closed when it returns.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from proxy.edge.tasks import TaskSet

SSE_HEAD = (
    b"HTTP/1.1 200 OK\r\n"
    b"Content-Type: text/event-stream\r\n"
    b"Transfer-Encoding: chunked\r\n"
    b"Connection: close\r\n\r\n"
)


def chunked(data: bytes) -> bytes:
    """``data`` as one HTTP/1.1 chunk (RFC 9112 section 7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


LAST_CHUNK = b"0\r\n\r\n"


@dataclass
class RawConn:
    """One accepted upstream connection and the request the proxy sent on it."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    peer_closed_at: float | None = None
    """Loop time at which the proxy closed its side (EOF or reset seen)."""

    async def send(self, data: bytes) -> None:
        """Write and wait for the kernel to take it."""
        self.writer.write(data)
        await self.writer.drain()

    def reset(self) -> None:
        """Abort with a TCP RST (SO_LINGER 0), not a clean FIN."""
        sock = self.writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.writer.transport.abort()

    async def wait_peer_closed(self, timeout_s: float) -> bool:
        """Wait until the proxy closes its side; ``False`` on timeout."""
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(timeout_s):
                while await self.reader.read(65536):
                    pass
        except TimeoutError:
            return False
        except ConnectionError:
            pass
        self.peer_closed_at = loop.time()
        return True


Behaviour = Callable[[RawConn], Awaitable[None]]


@dataclass
class RawUpstream:
    """A listening raw upstream; ``behave`` scripts what each connection gets."""

    behave: Behaviour
    url: str = ""
    conns: list[RawConn] = field(default_factory=list)
    _server: asyncio.Server | None = None
    _tasks: TaskSet = field(default_factory=TaskSet)

    async def start(self) -> RawUpstream:
        """Listen on a free port of 127.0.0.1."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0, limit=1 << 20)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def close(self) -> None:
        """Stop listening and end every connection still open."""
        if self._server is not None:
            self._server.close()
        for c in self.conns:
            c.writer.transport.abort()
        await self._tasks.cancel_all()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        # Run the connection as an owned task: ``close`` cancels it, and a cancelled
        # ``client_connected_cb`` task would make asyncio log an error.
        _ = self._tasks.spawn(self._connection(reader, writer))

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return
        lines = head.decode("latin-1").split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        headers = {}
        for line in lines[1:]:
            if line:
                k, _, v = line.partition(":")
                headers[k.strip().lower()] = v.strip()
        length = int(headers.get("content-length", "0"))
        body = await reader.readexactly(length) if length else b""
        conn = RawConn(reader, writer, method, path, headers, body)
        self.conns.append(conn)
        try:
            await self.behave(conn)
        except ConnectionError:
            pass
        finally:
            writer.close()

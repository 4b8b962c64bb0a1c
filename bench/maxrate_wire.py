"""The two ends of the max-rate load, as bare asyncio protocols on one event loop.

``Upstream`` is the backend side of one connection a target opens to its upstream. It
reads requests one after another (HTTP/1.1 keep-alive; a body framed by Content-Length
or chunked) and answers each as the steady backend does (``bench.backend``): the head
and the role event at once, then a content event each time the client has received the
previous one (so every read of the target carries one token), and after ``max_tokens``
of them the finish event, the usage event when the request asked for it (tokenstamp
asks, then hides it from its client), ``[DONE]`` and the chunked terminator. With
``max_tokens`` 0 the stream never ends.

``Stream`` is one closed-loop client stream: it sends a request, reads the response
(chunked, Content-Length or until close), tells its ``Upstream`` each token it received,
and when the response has ended sends the next request at once, on the same connection
unless the target closed it. Every ended response's body is compared with the backend's
own bytes (without the usage event, which no client asked for). The first request of
stream k of C asks for ``(k + 1) / C`` of ``max_tokens`` (as ``bench.loadgen`` does), so
the streams do not end their requests in step and requests end evenly over the window.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import re
from typing import cast

from bench.backend import DONE, STAMP_FIELD, Answer, ChunkFormat

CYCLE = 32
"""Distinct token events; token ``i`` of a request is event ``i % CYCLE``."""

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_KEY_RE = re.compile(rb"maxrate stream (\d+)")
_LENGTH_RE = re.compile(rb"\r\ncontent-length:[ \t]*(\d+)")
_CHUNKED_RE = re.compile(rb"\r\ntransfer-encoding:[^\r\n]*chunked")
_CLOSE_RE = re.compile(rb"\r\nconnection:[^\r\n]*close")
_USAGE = b'"include_usage":true'
_LENGTH_FIELD_RE = re.compile(rb'"max_tokens": (\d+)')
_MAX_ERROR_SAMPLES = 5

# What a client stream is reading.
_IDLE, _HEAD_STATE, _LENGTH, _UNTIL_CLOSE, _SIZE, _DATA, _DATA_END, _LAST = range(8)


def _chunked(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


class Hub:
    """What both ends share: the answer's bytes, who serves which stream, and the counts."""

    def __init__(self, max_tokens: int, host: str, port: int, streams: int = 1) -> None:
        self.max_tokens = max_tokens
        """Tokens per request; 0: endless streams."""
        self.host, self.port, self.streams_total = host, port, streams
        self._fmt = fmt = ChunkFormat(Answer(True, False, CYCLE, "bench-model", "maxrate"), 0)
        self._events = [fmt.content(i, 0) for i in range(CYCLE)]
        self._finish = fmt.finish("length")
        self.role = _chunked(fmt.role())
        self.tokens = [_chunked(t) for t in self._events]
        self._ends: dict[int, tuple[bytes, bytes, bytes]] = {}
        self.servers: dict[int, Upstream] = {}
        """The upstream connection answering each stream's request now."""
        self.streams: dict[int, Stream] = {}
        """Each stream's client connection (the latest)."""
        self.running = True
        self.counting = False
        self.tokens_counted = 0
        self.requests_counted = 0
        self.differing = 0
        self.errors = 0
        self.error_samples: list[str] = []
        self.differing_digest = ""
        self.connections = 0
        """Client connections opened to the target (more than the streams: it closed some)."""
        self.connecting: set[asyncio.Task[object]] = set()  # held: a task needs a reference

    def error(self, message: str) -> None:
        """Count a failed request and keep the first few messages."""
        self.errors += 1
        if len(self.error_samples) < _MAX_ERROR_SAMPLES:
            self.error_samples.append(message)

    def first_length(self, key: int) -> int:
        """Tokens of stream ``key``'s first request: ``(key + 1) / streams`` of the length."""
        if not self.max_tokens:
            return 0  # endless
        return max(1, self.max_tokens * (key + 1) // self.streams_total)

    def ends(self, n: int) -> tuple[bytes, bytes, bytes]:
        """For an ``n``-token answer: its end on the wire without and with the usage event
        (chunked, with the terminator), and the whole body its client must receive."""
        end = self._ends.get(n)
        if end is None:
            finish, usage = self._finish, self._fmt.usage(n)
            body = [self._fmt.role(), *(self._events[i % CYCLE] for i in range(n)), finish, DONE]
            end = (_chunked(finish + DONE) + b"0\r\n\r\n",
                   _chunked(finish + usage + DONE) + b"0\r\n\r\n", b"".join(body))  # fmt: skip
            self._ends[n] = end
        return end

    def body_digest(self) -> str:
        """sha256 of the backend's ``max_tokens`` body when every ended body equalled the
        backend's, else of one that did not."""
        return self.differing_digest or hashlib.sha256(self.ends(self.max_tokens)[2]).hexdigest()

    def connect(self, key: int, *, first: bool = False) -> None:
        """Open stream ``key``'s connection to the target in the background: ``first``, or
        again after the target closed one (then its requests have the whole length)."""
        length = self.first_length(key) if first else self.max_tokens
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.create_connection(lambda: Stream(self, key, length),
                                                       self.host, self.port))  # fmt: skip
        self.connecting.add(task)
        task.add_done_callback(self._connected)

    def _connected(self, task: asyncio.Task[object]) -> None:
        self.connecting.discard(task)
        if not task.cancelled() and task.exception() is not None and self.running:
            self.error(f"connect: {task.exception()!r}")


class Upstream(asyncio.Protocol):
    """Backend side of one upstream connection: answers its requests one after another."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.key = -1
        """The stream whose request is being answered; -1 between requests."""
        self.sent = 0
        self.total = 0
        """Tokens the request asked for; 0: endless."""
        self.usage = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        self.buf += data
        while self.key < 0:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buf[: end + 2].lower()
            m = _LENGTH_RE.search(head)
            if m is not None:
                stop = end + 4 + int(m.group(1))
            elif _CHUNKED_RE.search(head):
                last = self.buf.find(b"\r\n0\r\n\r\n", end + 2)
                if last < 0:
                    return
                stop = last + 7
            else:
                stop = end + 4
            if len(self.buf) < stop:
                return
            body, self.buf = self.buf[end + 4 : stop], self.buf[stop:]
            self._answer(body)

    def _answer(self, body: bytes) -> None:
        m = _KEY_RE.search(body)
        if m is None or self.transport is None:
            if self.transport is not None:
                self.transport.close()  # not the load's request: nothing to answer
            return
        self.key, self.sent, self.usage = int(m.group(1)), 0, _USAGE in body
        n = _LENGTH_FIELD_RE.search(body)
        self.total = int(n.group(1)) if n is not None and self.hub.max_tokens else 0
        self.hub.servers[self.key] = self
        self.transport.write(_HEAD + self.hub.role)
        self.send()

    def send(self) -> None:
        """The next token, or after the last one the end of the answer."""
        transport, hub = self.transport, self.hub
        if transport is None or transport.is_closing() or self.key < 0:
            return
        if not self.total or self.sent < self.total:
            transport.write(hub.tokens[self.sent % CYCLE])
            self.sent += 1
            return
        tail, tail_usage, _ = hub.ends(self.total)
        transport.write(tail_usage if self.usage else tail)
        if hub.servers.get(self.key) is self:
            del hub.servers[self.key]
        self.key = -1
        if self.buf:
            self.data_received(b"")  # a request that came early

    def connection_lost(self, exc: Exception | None) -> None:
        if self.key >= 0 and self.hub.servers.get(self.key) is self:
            del self.hub.servers[self.key]
        self.transport = None


def request(host: str, key: int, max_tokens: int) -> bytes:
    """Stream ``key``'s request: a streamed chat completion naming the stream in its prompt."""
    body = json.dumps({
        "model": "bench-model", "stream": True, "max_tokens": max_tokens or 100_000,
        "messages": [{"role": "user", "content": f"maxrate stream {key}"}],
    }).encode()  # fmt: skip
    return (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class Stream(asyncio.Protocol):
    """Client side of one closed-loop stream: one request after another, one token at a time."""

    def __init__(self, hub: Hub, key: int, length: int) -> None:
        self.hub, self.key = hub, key
        self.length = length
        """Tokens this stream's current request asks for."""
        self.request = request(hub.host, key, self.length)
        self.transport: asyncio.Transport | None = None
        self.state = _IDLE
        self.buf = b""
        self.need = 0
        self.keep_alive = True
        self.got = 0
        self.tail = b""
        self.pieces: list[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.hub.streams[self.key] = self
        self.hub.connections += 1
        self._send_request()

    def _send_request(self) -> None:
        assert self.transport is not None
        self.state, self.buf, self.got, self.tail = _HEAD_STATE, b"", 0, b""
        self.pieces = [] if self.hub.max_tokens else None  # an endless body is never compared
        self.transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        state = self.state
        if state == _HEAD_STATE:
            data = self._head(data)
            state = self.state
            if not data:
                return
        if state == _LENGTH:
            piece = data[: self.need]
            self.need -= len(piece)
            self._payload(piece)
            if not self.need:
                self._end()
            return
        if state == _UNTIL_CLOSE:
            self._payload(data)
            return
        if state >= _SIZE:
            self._chunks(self.buf + data if self.buf else data)

    def _head(self, data: bytes) -> bytes:
        """Read the response head; the bytes after it, once it is whole."""
        buf = self.buf + data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            self.buf = buf
            return b""
        head, rest = buf[: end + 2].lower(), buf[end + 4 :]
        self.buf = b""
        if not head.startswith((b"http/1.1 200 ", b"http/1.0 200 ")):
            status = head[: head.find(b"\r\n")].decode(errors="replace")
            self._fail(f"status: {status}")
            return b""
        self.keep_alive = head.startswith(b"http/1.1") and _CLOSE_RE.search(head) is None
        m = _LENGTH_RE.search(head)
        if _CHUNKED_RE.search(head):
            self.state = _SIZE
        elif m is not None:
            self.state, self.need = _LENGTH, int(m.group(1))
        else:
            self.state, self.keep_alive = _UNTIL_CLOSE, False
        return rest

    def _chunks(self, buf: bytes) -> None:
        """Decode chunked framing (RFC 9112, 7.1) incrementally; no trailers expected."""
        i, n = 0, len(buf)
        while i < n:
            state = self.state
            if state == _DATA:
                take = min(self.need, n - i)
                self._payload(buf[i : i + take])
                i += take
                self.need -= take
                if self.need:
                    break
                self.state = _DATA_END
            elif state == _SIZE:
                eol = buf.find(b"\r\n", i)
                if eol < 0:
                    break
                try:
                    size = int(buf[i:eol].split(b";", 1)[0], 16)
                except ValueError:
                    self._fail("bad chunk size line")
                    return
                i = eol + 2
                self.state, self.need = (_DATA, size) if size else (_LAST, 0)
            else:  # _DATA_END or _LAST: a CRLF
                if n - i < 2:
                    break
                if buf[i : i + 2] != b"\r\n":
                    self._fail("bad chunk framing")
                    return
                i += 2
                if state == _LAST:
                    self.buf = b""
                    self._end()
                    return
                self.state = _SIZE
        self.buf = buf[i:]

    def _payload(self, piece: bytes) -> None:
        """Body bytes: keep them, count the tokens, ask the backend for as many more."""
        if self.pieces is not None:
            self.pieces.append(piece)
        seen = self.tail + piece
        n = seen.count(STAMP_FIELD)
        self.tail = seen[-len(STAMP_FIELD) + 1 :]
        if not n:
            return
        hub = self.hub
        if hub.counting:
            hub.tokens_counted += n
        if hub.max_tokens:
            n = min(n, self.length - self.got)
            self.got += n
        server = hub.servers.get(self.key)
        if server is not None:
            for _ in range(n):
                server.send()

    def _end(self) -> None:
        """The response ended: check its body, then the next request at once."""
        hub = self.hub
        body = b"".join(self.pieces or ())
        if body == hub.ends(self.length)[2]:
            if hub.counting:
                hub.requests_counted += 1
        else:
            hub.differing += 1
            hub.differing_digest = hub.differing_digest or hashlib.sha256(body).hexdigest()
            hub.error(f"body of {len(body)} bytes differs from the backend's")
        self.state = _IDLE
        if self.length != hub.max_tokens:  # the first request was shorter
            self.length = hub.max_tokens
            self.request = request(hub.host, self.key, self.length)
        if not hub.running or self.transport is None:
            return
        if self.keep_alive:
            self._send_request()
        else:
            self.transport.close()  # connection_lost opens the next

    def _fail(self, message: str) -> None:
        self.hub.error(message)
        self.state = _IDLE
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.state == _UNTIL_CLOSE:
            self._end()
        elif self.state != _IDLE and self.hub.running:
            self.hub.error(f"connection lost mid-response: {exc!r}")
        if self.hub.running:
            self.hub.connect(self.key)

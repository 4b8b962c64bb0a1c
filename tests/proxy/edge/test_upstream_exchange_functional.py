"""The upstream exchange's state machine (``proxy.edge.upstream.TRANSITIONS``), way by way.

Each test drives one ``UpstreamConnection`` from a real ``UpstreamPool`` against
a raw upstream over a real socket, and checks where the connection ends up:
which phase, whether the pool keeps it, and what a consumer received. The one
rule: a connection is pooled again only from ``DONE`` when ``reusable``, and
nothing read after a response's end ever reaches a consumer.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from multidict import CIMultiDict

from proxy.edge.pool import UpstreamPool, request_head
from proxy.edge.upstream import (
    BODY,
    CLOSED,
    DONE,
    HEAD,
    IDLE,
    MAX_INTERIM,
    TRANSITIONS,
    UpstreamConnection,
)
from proxy.edge.upstream_errors import (
    DisconnectedBeforeHead,
    NotHttp,
    PayloadError,
    ResetBeforeHead,
    UpstreamError,
)

Script = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@dataclass
class Upstream:
    """A raw upstream: every connection runs ``script`` once per request it reads."""

    script: Script
    url: str = ""
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.requests.append(head + await reader.readexactly(length))
                await self.script(reader, writer)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def upstream():
    servers: list[asyncio.Server] = []
    pools: list[UpstreamPool] = []

    async def make(script: Script) -> tuple[Upstream, UpstreamPool]:
        up = Upstream(script)
        server = await asyncio.start_server(up.serve, "127.0.0.1", 0)
        servers.append(server)
        up.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        pools.append(UpstreamPool(up.url, connect_timeout_s=2, clock=time.monotonic_ns))
        return up, pools[-1]

    yield make
    for p in pools:
        p.close()
    for s in servers:
        s.close()
    await asyncio.sleep(0.05)  # the upstream sides see the close and end


class Collect:
    """A ``BodyConsumer`` that keeps what it is given."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.ended = asyncio.get_running_loop().create_future()

    def body(self, data: bytes, read_ns: int) -> None:
        self.data += data

    def read_done(self) -> None:
        pass

    def end(self, error: UpstreamError | None) -> None:
        if not self.ended.done():
            self.ended.set_result(error)


async def exchange(pool: UpstreamPool, body: bytes = b"{}") -> tuple[UpstreamConnection, Collect]:
    conn = await pool.acquire()
    head = request_head("POST", "/v1/chat/completions", pool.host_header, CIMultiDict(), len(body))
    async with asyncio.timeout(5):
        await conn.send(head, body)
    got = Collect()
    conn.consume(got)
    async with asyncio.timeout(5):
        error = await got.ended
    if error is not None:
        raise error
    conn.detach()
    return conn, got


def answer(*pieces: bytes, pause_s: float = 0.0) -> Script:
    async def script(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        for i, piece in enumerate(pieces):
            if i and pause_s:
                await asyncio.sleep(pause_s)
            writer.write(piece)
            await writer.drain()

    return script


OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n"


def test_the_table_has_one_way_back_to_the_pool():
    # Every phase but CLOSED can close; only DONE leads back to IDLE; CLOSED is final.
    assert TRANSITIONS[CLOSED] == ()
    assert [p for p, moves in TRANSITIONS.items() if IDLE in moves] == [DONE]
    assert all(CLOSED in moves for p, moves in TRANSITIONS.items() if p != CLOSED)
    assert TRANSITIONS[IDLE] == (HEAD, CLOSED)
    assert TRANSITIONS[HEAD] == (BODY, CLOSED)
    assert TRANSITIONS[BODY] == (DONE, CLOSED)


# IDLE -> HEAD -> BODY -> DONE -> IDLE: the clean way round, twice on one connection.


@pytest.mark.parametrize("wire", [OK, CHUNKED], ids=["content-length", "chunked"])
async def test_a_clean_exchange_goes_back_to_the_pool_and_carries_the_next(upstream, wire):
    up, pool = await upstream(answer(wire))
    conn, got = await exchange(pool)
    assert (conn.phase, conn.reusable, bytes(got.data)) == (DONE, True, b"hi")
    pool.release(conn)
    assert conn.phase == IDLE
    again, got = await exchange(pool)
    assert again is conn
    assert bytes(got.data) == b"hi"
    assert up.connections == 1
    pool.release(again)


# HEAD: interim responses are read past; HEAD -> CLOSED on what is not an answer.


async def test_interim_responses_are_read_past_and_handed_to_the_relay(upstream):
    hints = b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
    _up, pool = await upstream(answer(b"HTTP/1.1 100 Continue\r\n\r\n", hints, OK, pause_s=0.03))
    conn = await pool.acquire()
    seen: list[tuple[int, str, dict[str, str]]] = []
    head = request_head("POST", "/", pool.host_header, CIMultiDict(), 0)
    await conn.send(head, b"", lambda s, r, h: seen.append((s, r, dict(h))))
    assert conn.status == 200
    assert "Link" not in conn.headers
    assert seen == [(100, "Continue", {}), (103, "Early Hints", {"Link": "</a.css>; rel=preload"})]
    got = Collect()
    conn.consume(got)
    assert await got.ended is None
    assert bytes(got.data) == b"hi"
    conn.detach()
    assert conn.reusable
    pool.release(conn)


async def test_more_interim_responses_than_the_bound_are_not_an_answer(upstream):
    _up, pool = await upstream(answer(b"HTTP/1.1 102 Processing\r\n\r\n" * (MAX_INTERIM + 1) + OK))
    with pytest.raises(NotHttp, match="interim"):
        await exchange(pool)


@pytest.mark.parametrize(
    ("wire", "error"),
    [
        (
            b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\nConnection: Upgrade\r\n\r\n",
            NotHttp,
        ),
        (b"HTTP/1.1 101 Switching Protocols\r\n\r\n", NotHttp),
        (b"SSH-2.0-OpenSSH_9.2\r\n", NotHttp),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi", NotHttp),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n", NotHttp),
        (b"", DisconnectedBeforeHead),
    ],
    ids=["101-upgrade", "101-bare", "not-http", "two-lengths", "cl-and-te", "closed"],
)
async def test_head_to_closed_on_what_is_not_an_answer(upstream, wire, error):
    async def script(reader, writer):
        writer.write(wire)
        await writer.drain()
        writer.close()

    _up, pool = await upstream(script)
    conn = await pool.acquire()
    head = request_head("POST", "/", pool.host_header, CIMultiDict(), 0)
    with pytest.raises(error):
        async with asyncio.timeout(5):
            await conn.send(head, b"")
    conn.close()
    assert conn.phase == CLOSED
    assert not conn.reusable


async def test_head_to_closed_on_a_reset(upstream):
    import socket
    import struct

    async def reset(reader, writer):
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()

    _up, pool = await upstream(reset)
    with pytest.raises((ResetBeforeHead, DisconnectedBeforeHead)):
        await exchange(pool)


# BODY -> CLOSED: the body broke off.


@pytest.mark.parametrize(
    "wire",
    [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhel",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\nhello\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nhel",
    ],
    ids=["closed-mid-chunk", "bad-chunk-size", "short-content-length"],
)
async def test_body_to_closed_when_the_body_breaks_off(upstream, wire):
    async def script(reader, writer):
        writer.write(wire)
        await writer.drain()
        writer.close()

    _up, pool = await upstream(script)
    with pytest.raises(PayloadError):
        await exchange(pool)


async def test_a_body_delimited_by_the_close_ends_done_but_never_reusable(upstream):
    async def script(reader, writer):
        writer.write(b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nhi")
        await writer.drain()
        writer.close()

    _up, pool = await upstream(script)
    conn, got = await exchange(pool)
    assert bytes(got.data) == b"hi"
    assert conn.phase == CLOSED
    assert not conn.reusable


# DONE -> CLOSED: every way the one clean state is missed.


@pytest.mark.parametrize(
    ("wire", "body"),
    [
        (OK + b"HTTP/1.1 200 OK\r\nSet-Cookie: x=1\r\nContent-Length: 4\r\n\r\nEVIL", b"hi"),
        (CHUNKED + b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL", b"hi"),
        (OK + b"garbage", b"hi"),
        (b"HTTP/1.1 204 No Content\r\n\r\nbody after 204", b""),
        (b"HTTP/1.1 304 Not Modified\r\nContent-Length: 4\r\n\r\nbody", b""),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi", b"hi"),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", b"hi"),
    ],
    ids=[
        "second-response-same-read",
        "after-chunked-end",
        "garbage-same-read",
        "body-after-204",
        "body-after-304",
        "connection-close",
        "http-1.0",
    ],
)
async def test_done_to_closed_when_anything_but_the_clean_state(upstream, wire, body):
    up, pool = await upstream(answer(wire))
    conn, got = await exchange(pool)
    assert bytes(got.data) == body  # its own body only: nothing after the end
    assert not conn.reusable
    pool.release(conn)
    assert conn.phase == CLOSED
    again, _ = await exchange(pool)
    assert again is not conn
    assert up.connections == 2
    pool.release(again)


async def test_done_to_closed_on_bytes_after_the_end_in_a_later_read(upstream):
    _up, pool = await upstream(answer(OK, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL",
                                     pause_s=0.1))  # fmt: skip
    conn, got = await exchange(pool)
    await asyncio.sleep(0.3)  # the stray bytes arrive while the exchange is DONE
    assert bytes(got.data) == b"hi"
    assert conn.phase == CLOSED
    pool.release(conn)
    again, got = await exchange(pool)
    assert again is not conn
    assert bytes(got.data) == b"hi"
    pool.release(again)


async def test_idle_to_closed_on_bytes_nobody_asked_for(upstream):
    _up, pool = await upstream(answer(OK, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nEVIL",
                                     pause_s=0.1))  # fmt: skip
    conn, _ = await exchange(pool)
    pool.release(conn)
    assert conn.phase == IDLE  # pooled...
    await asyncio.sleep(0.3)
    assert conn.phase == CLOSED  # ...until the stray bytes came
    again, got = await exchange(pool)
    assert again is not conn
    assert bytes(got.data) == b"hi"
    pool.release(again)


async def test_done_to_closed_when_the_answer_came_before_the_request_was_written(upstream):
    """The upstream answers after the head, never reading the 8 MiB body: what it does
    with the rest is unknown, so the connection carries nothing more."""

    async def early(reader, writer):
        writer.write(OK)
        await writer.drain()
        with contextlib.suppress(ConnectionError):
            while await reader.read(1 << 16):  # the body, read only after answering
                pass

    async def serve_head_only(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up.connections += 1
        await reader.readuntil(b"\r\n\r\n")
        await early(reader, writer)
        writer.close()

    up = Upstream(early)
    server = await asyncio.start_server(serve_head_only, "127.0.0.1", 0)
    pool = UpstreamPool(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}",
                        connect_timeout_s=2, clock=time.monotonic_ns)  # fmt: skip
    try:
        conn, got = await exchange(pool, b"x" * (8 << 20))
        assert bytes(got.data) == b"hi"
        assert conn.phase == DONE
        assert not conn.reusable
        pool.release(conn)
        assert conn.phase == CLOSED
    finally:
        pool.close()
        server.close()
        await asyncio.sleep(0.05)


async def test_done_to_closed_when_the_client_paused_reading(upstream):
    _up, pool = await upstream(answer(OK))
    conn, _ = await exchange(pool)
    conn.pause_reading()
    assert not conn.reusable
    pool.release(conn)
    assert conn.phase == CLOSED


# Misuse of the machine is the proxy's own bug: it fails loudly.


async def test_a_busy_connection_refuses_a_second_request(upstream):
    _up, pool = await upstream(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nhi", pause_s=0))
    conn = await pool.acquire()
    head = request_head("POST", "/", pool.host_header, CIMultiDict(), 0)
    await conn.send(head, b"")
    assert conn.phase == BODY
    with pytest.raises(RuntimeError, match="busy"):
        await conn.send(head, b"")
    with pytest.raises(RuntimeError, match="no move"):
        conn._move(IDLE)  # BODY -> IDLE is not in the table
    conn.close()
    assert conn.phase == CLOSED
    with pytest.raises(DisconnectedBeforeHead):
        await conn.send(head, b"")


async def test_the_answer_to_head_ends_with_its_head_and_is_not_reused(upstream):
    """RFC 9110 section 9.3.2: the stated length is the GET's; nothing after the head is
    the HEAD answer's body, so nothing after it is relayed, and the connection closes."""
    _up, pool = await upstream(answer(b"HTTP/1.1 200 OK\r\nContent-Length: 40\r\n\r\nstray"))
    conn = await pool.acquire()
    head = request_head("HEAD", "/v1/models", pool.host_header, CIMultiDict(), 0)
    async with asyncio.timeout(5):
        await conn.send(head, b"", head_only=True)
    got = Collect()
    conn.consume(got)
    assert await got.ended is None
    assert bytes(got.data) == b""
    assert conn.headers["Content-Length"] == "40"
    assert conn.phase in (DONE, CLOSED)
    assert not conn.reusable
    pool.release(conn)
    assert conn.phase == CLOSED


async def test_trailers_in_the_heads_read_do_not_become_headers(upstream):
    """Trailers are not relayed (as nginx does not): read with the head in one packet,
    they once landed among the headers the client was about to get."""
    wire = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Late\r\n\r\n"
            b"2\r\nhi\r\n0\r\nX-Late: 1\r\nSet-Cookie: t=1\r\n\r\n")  # fmt: skip
    _up, pool = await upstream(answer(wire))
    conn, got = await exchange(pool)
    assert bytes(got.data) == b"hi"
    assert "X-Late" not in conn.headers
    assert "Set-Cookie" not in conn.headers
    assert conn.reusable
    pool.release(conn)

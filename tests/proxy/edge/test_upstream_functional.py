"""The observed requests' upstream client (``proxy.edge.upstream``) over real sockets.

A raw asyncio upstream writes its answers byte by byte where the test says so,
so framing, keep-alive and the early bytes that arrive with the response head
are exercised exactly; the proxy runs in front of it, the client is aiohttp's.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import aiohttp
import pytest

from proxy.edge.pool import UpstreamPool, request_head

ROLE = b'data: {"id":"c1","model":"m","choices":[{"delta":{"role":"assistant"}}]}\n\n'
TOKEN = b'data: {"id":"c1","model":"m","choices":[{"delta":{"content":"hi"}}]}\n\n'
DONE = b"data: [DONE]\n\n"
BODY = ROLE + TOKEN + TOKEN + DONE
REQUEST = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "x"}]}


def chunk(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (RFC 9112 section 7.1)."""
    return b"%x\r\n%s\r\n" % (len(data), data)


Answer = Callable[["Conn"], Awaitable[bool]]
"""Writes one response; returns whether the connection stays open for another."""


@dataclass
class Conn:
    """One connection the proxy opened to the upstream."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    heads: list[bytes] = field(default_factory=list)

    async def send(self, data: bytes, *, pause_s: float = 0.0) -> None:
        """Write ``data`` and let the kernel take it (``pause_s``: then wait, so it is
        its own read on the other side)."""
        self.writer.write(data)
        await self.writer.drain()
        if pause_s:
            await asyncio.sleep(pause_s)


@dataclass
class RawUpstream:
    """Counts connections and requests; answers each request with ``answer``."""

    answer: Answer
    connections: list[Conn] = field(default_factory=list)
    url: str = ""

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Conn(reader, writer)
        self.connections.append(conn)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                conn.heads.append(head)
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                await reader.readexactly(length)
                if not await self.answer(conn):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


@pytest.fixture
async def raw():
    """Start a ``RawUpstream`` with a given answer; closed at the end of the test."""
    servers: list[asyncio.Server] = []

    async def make(answer: Answer) -> RawUpstream:
        up = RawUpstream(answer)
        server = await asyncio.start_server(up.serve, "127.0.0.1", 0)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        up.url = f"http://127.0.0.1:{port}"
        return up

    yield make
    for s in servers:
        s.close()
        await s.wait_closed()


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n"


async def keep_alive(conn: Conn) -> bool:
    await conn.send(SSE_HEAD + b"\r\n" + chunk(ROLE), pause_s=0.01)
    for part in (TOKEN, TOKEN, DONE):
        await conn.send(chunk(part), pause_s=0.01)
    await conn.send(b"0\r\n\r\n")
    return True


async def post(url: str) -> tuple[int, bytes]:
    async with (
        aiohttp.ClientSession() as s,
        s.post(url + "/v1/chat/completions", json=REQUEST) as r,
    ):
        return r.status, await r.read()


def samples(p, name: str, **labels: str) -> float:
    return p.registry.get_sample_value(name, labels or None) or 0.0


async def test_kept_alive_connection_carries_the_next_request(raw, proxy_factory):
    up = await raw(keep_alive)
    p = await proxy_factory(up.url, inject_usage=False)
    for _ in range(3):
        assert await post(p.url) == (200, BODY)
    assert len(up.connections) == 1
    assert len(up.connections[0].heads) == 3
    assert samples(p, "gen_ai_server_time_to_first_token_seconds_count", **_labels()) == 3


def _labels() -> dict[str, str]:
    return {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "vllm",
        "gen_ai_request_model": "m",
        "server_address": "test-backend",
    }


async def test_a_pooled_connection_closed_by_the_backend_is_replaced(raw, proxy_factory):
    """llama.cpp announces keep-alive and closes after each stream: the next request
    finds the pooled connection dead and goes again on a fresh one."""

    async def close_after(conn: Conn) -> bool:
        await keep_alive(conn)
        await asyncio.sleep(0.05)  # the proxy has pooled the connection by now
        return False

    up = await raw(close_after)
    p = await proxy_factory(up.url, inject_usage=False)
    assert await post(p.url) == (200, BODY)
    await asyncio.sleep(0.2)
    assert await post(p.url) == (200, BODY)
    assert len(up.connections) == 2


async def test_the_head_and_first_events_in_one_packet_keep_their_read_stamp(raw, proxy_factory):
    """Bytes parsed before the relay attaches are relayed and timed all the same."""

    async def one_packet(conn: Conn) -> bool:
        await conn.send(SSE_HEAD + b"\r\n" + chunk(ROLE) + chunk(TOKEN), pause_s=0.2)
        await conn.send(chunk(TOKEN) + chunk(DONE) + b"0\r\n\r\n")
        return True

    up = await raw(one_packet)
    p = await proxy_factory(up.url, inject_usage=False)
    assert await post(p.url) == (200, BODY)
    gaps = samples(p, "gen_ai_client_operation_time_per_output_chunk_seconds_sum", **_labels())
    assert 0.19 < gaps < 0.5  # the one gap: from the first packet's read to the second's


async def test_chunk_framing_split_anywhere_relays_the_same_bytes(raw, proxy_factory):
    async def byte_by_byte(conn: Conn) -> bool:
        wire = SSE_HEAD + b"\r\n" + b"".join(chunk(x) for x in (ROLE, TOKEN, TOKEN, DONE))
        for i in range(len(wire)):
            conn.writer.write(wire[i : i + 1])
            await conn.writer.drain()
            if i % 7 == 0:
                await asyncio.sleep(0)
        await conn.send(b"0\r\n\r\n")
        return True

    up = await raw(byte_by_byte)
    p = await proxy_factory(up.url, inject_usage=False)
    assert await post(p.url) == (200, BODY)
    assert (
        samples(p, "gen_ai_client_operation_time_per_output_chunk_seconds_count", **_labels()) == 1
    )


async def test_a_body_delimited_by_the_connection_end_is_complete(raw, proxy_factory):
    async def until_close(conn: Conn) -> bool:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
        await conn.send(head + ROLE + TOKEN, pause_s=0.02)
        await conn.send(TOKEN + DONE)
        return False

    up = await raw(until_close)
    p = await proxy_factory(up.url, inject_usage=False)
    assert await post(p.url) == (200, BODY)
    outcomes = {
        s.labels["tokenstamp_outcome"]: s.value
        for m in p.registry.collect()
        for s in m.samples
        if s.name == "tokenstamp_requests_total"
    }
    assert outcomes == {"ok": 1.0}
    # It cannot carry another request: the next one opens a new connection.
    assert await post(p.url) == (200, BODY)
    assert len(up.connections) == 2


async def test_a_content_length_body_passes_with_its_length(raw, proxy_factory):
    answer = json.dumps(
        {"id": "c1", "model": "m", "choices": [{"message": {"content": "hi"}}],
         "usage": {"prompt_tokens": 3, "completion_tokens": 1}}
    ).encode()  # fmt: skip

    async def sized(conn: Conn) -> bool:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n"
        await conn.send(head % len(answer) + answer[:10], pause_s=0.02)
        await conn.send(answer[10:])
        return True

    up = await raw(sized)
    p = await proxy_factory(up.url)
    async with (
        aiohttp.ClientSession() as s,
        s.post(p.url + "/v1/chat/completions", json={**REQUEST, "stream": False}) as r,
    ):
        assert r.headers["Content-Length"] == str(len(answer))
        assert await r.read() == answer
    usage = {"gen_ai_token_type": "output", **_labels()}
    assert samples(p, "gen_ai_client_token_usage_sum", **usage) == 1


async def test_request_head_has_the_hops_own_host_and_length():
    from multidict import CIMultiDict

    head = request_head("POST", "/v1/x?a=1", "h:81", CIMultiDict({"X-A": "1"}), 12)
    assert head == b"POST /v1/x?a=1 HTTP/1.1\r\nHost: h:81\r\nX-A: 1\r\nContent-Length: 12\r\n\r\n"
    pool = UpstreamPool("http://[::1]:8000/base/", connect_timeout_s=1, clock=lambda: 0)
    assert (pool.host_header, pool.path_prefix) == ("[::1]:8000", "/base")
    assert UpstreamPool("https://h", connect_timeout_s=1, clock=lambda: 0).host_header == "h"
    with pytest.raises(ValueError, match="http"):
        UpstreamPool("ftp://h", connect_timeout_s=1, clock=lambda: 0)


def _data_segments_in(sock: socket.socket) -> int:
    """TCP segments with data this socket has received (``tcpi_data_segs_in`` of Linux's
    ``struct tcp_info``, at byte 152): the sender's writes, since loopback sends one each."""
    info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 160)
    return int(struct.unpack_from("I", info, 152)[0])


async def _raw_post(url: str) -> tuple[bytes, int]:
    """POST a streamed chat request with a bare socket: the response as it came, framing
    kept, and how many data segments (the proxy's writes) it came in."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps(REQUEST).encode()
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
                 b"application/json\r\nContent-Length: %d\r\n\r\n%b" % (len(body), body))  # fmt: skip
    response = await reader.readuntil(b"\r\n0\r\n\r\n")
    segments = _data_segments_in(writer.get_extra_info("socket"))
    writer.close()
    return response, segments


async def test_the_pieces_of_one_read_reach_the_client_as_chunks_in_one_write(raw, proxy_factory):
    """A read carrying many chunks (a proxy that fell behind) costs the proxy two writes, not
    one per chunk, and the client still gets every chunk framed as the upstream sent it."""
    pieces = {"n": 0}

    async def burst(conn: Conn) -> bool:
        await conn.send(SSE_HEAD + b"\r\n" + chunk(ROLE), pause_s=0.05)
        events = [TOKEN] * pieces["n"] + [DONE]
        await conn.send(b"".join(chunk(e) for e in events) + b"0\r\n\r\n")  # one packet
        return True

    up = await raw(burst)
    p = await proxy_factory(up.url, inject_usage=False)
    writes = {}
    for n in (2, 40):
        pieces["n"] = n
        response, writes[n] = await _raw_post(p.url)
        events = [ROLE] + [TOKEN] * n + [DONE]
        assert response.endswith(b"\r\n\r\n" + b"".join(chunk(e) for e in events) + b"0\r\n\r\n")
    # 38 pieces more, no write more (a segment's worth of slack: the kernel may merge two)
    assert writes[40] <= writes[2] + 1
    count = "gen_ai_client_operation_time_per_output_chunk_seconds_count"
    assert samples(p, count, **_labels()) == 1 + 39  # every token timed

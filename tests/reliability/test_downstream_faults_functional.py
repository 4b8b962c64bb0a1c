"""Faults downstream: clients that leave at every stage, and clients that read slowly.

A client that goes away must cost nothing afterwards: the upstream request is
closed within 100 ms (the backend stops generating), the request is recorded
exactly once, and no task or socket is left behind (counted before and after:
``asyncio.all_tasks()`` of the loop the proxy runs in, and /proc/self/fd).
A slow reader holds a bounded amount of the proxy's memory (measured as the
RSS of a real proxy process) while other streams go on unaffected.
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web

from tests.reliability.helpers import (
    CHAT,
    active,
    chat_body,
    expected_healthy,
    fetch,
    outcomes,
    settled,
    snapshot,
)
from tests.reliability.procs import parse_metrics, rss_bytes, total
from tests.reliability.rawserver import LAST_CHUNK, SSE_HEAD, RawConn, chunked
from tests.reliability.streams import stream_events

REQUEST = json.dumps(chat_body(n=400)).encode()


def http_post(body: bytes, declared: int | None = None) -> bytes:
    """A raw HTTP/1.1 POST of ``body`` to the chat route."""
    length = len(body) if declared is None else declared
    return (b"POST " + CHAT.encode() + b" HTTP/1.1\r\nHost: proxy\r\n"
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % length) + body  # fmt: skip


async def slow_stream(conn: RawConn) -> None:
    """400 tokens, one every 20 ms; returns as soon as the proxy closes its side."""
    events, _ = stream_events(3, 400, usage=False)

    async def writes() -> None:
        try:
            await conn.send(SSE_HEAD)
            for ev in events:
                await conn.send(chunked(ev))
                await asyncio.sleep(0.02)
            await conn.send(LAST_CHUNK)
        except ConnectionError:
            pass

    async with asyncio.TaskGroup() as tg:
        w = tg.create_task(writes())
        await conn.wait_peer_closed(timeout_s=15)
        w.cancel()


async def long_prefill(conn: RawConn) -> None:
    """No status line for 10 s (a long prefill); returns when the proxy gives up."""
    await conn.wait_peer_closed(timeout_s=10)


async def quick_stream(conn: RawConn) -> None:
    """A short stream sent at once, then wait for the proxy to close."""
    events, _ = stream_events(4, 5, usage=False)
    await conn.send(SSE_HEAD + b"".join(chunked(e) for e in events))
    await asyncio.sleep(0.05)
    await conn.send(LAST_CHUNK)
    await conn.wait_peer_closed(timeout_s=5)


async def leave(writer: asyncio.StreamWriter, *, reset: bool) -> None:
    """Close the client's socket: a FIN, or a RST when ``reset``."""
    if reset:
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()
    else:
        writer.close()


async def read_until(reader: asyncio.StreamReader, marker: bytes, limit: int = 1 << 20) -> bytes:
    """Read until ``marker`` has been seen (bounded by ``limit`` bytes)."""
    got = b""
    while marker not in got and len(got) < limit:
        chunk = await reader.read(65536)
        if not chunk:
            break
        got += chunk
    return got


# stage: (upstream behaviour, what the client does before leaving, recorded status class)
Stage = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _in_request_body(reader, writer) -> None:
    writer.write(http_post(REQUEST[:10], declared=len(REQUEST)))
    await writer.drain()
    await asyncio.sleep(0.2)


async def _before_headers(reader, writer) -> None:
    writer.write(http_post(REQUEST))
    await writer.drain()
    await asyncio.sleep(0.3)  # the upstream holds the request, no status line yet


async def _mid_stream(reader, writer) -> None:
    writer.write(http_post(REQUEST))
    await writer.drain()
    await read_until(reader, b"data:")
    await asyncio.sleep(0.1)


async def _at_the_end(reader, writer) -> None:
    writer.write(http_post(REQUEST))
    await writer.drain()
    await read_until(reader, b"[DONE]")


STAGES: dict[str, tuple[Callable[[RawConn], Awaitable[None]], Stage, list[tuple[str, str, str]]]] = {
    "in_request_body": (slow_stream, _in_request_body, []),
    "before_headers": (long_prefill, _before_headers,
                       [("client_disconnect", "none", "client_disconnect")]),
    "mid_stream": (slow_stream, _mid_stream, [("client_disconnect", "2xx", "client_disconnect")]),
    "at_the_end": (quick_stream, _at_the_end, []),
}  # fmt: skip


@pytest.mark.parametrize("reset", [False, True], ids=["fin", "rst"])
@pytest.mark.parametrize("stage", list(STAGES))
async def test_client_leaves(stage, reset, raw_upstream, proxy_factory, figures):
    behave, client, recorded = STAGES[stage]
    up = await raw_upstream(behave)
    p = await proxy_factory(up.url, inject_usage=False)
    loop = asyncio.get_running_loop()
    with figures.fault():
        before = snapshot()
        reader, writer = await asyncio.open_connection(*p.url.removeprefix("http://").split(":"))
        await client(reader, writer)
        await leave(writer, reset=reset)
        left_at = loop.time()
        if stage == "in_request_body":
            await asyncio.sleep(0.3)
            assert up.conns == []  # nothing was forwarded
        else:
            conn = up.conns[0]
            for _ in range(100):
                if conn.peer_closed_at is not None:
                    break
                await asyncio.sleep(0.01)
            assert conn.peer_closed_at is not None, "upstream request still open"
            if stage != "at_the_end":
                assert conn.peer_closed_at - left_at < 0.1
        after = await settled(before)
        assert after.tasks <= before.tasks, "tasks left behind"
        assert after.fds <= before.fds, "sockets left behind"
        got = outcomes(p)
        if stage == "at_the_end":  # either is right; once is the point
            assert [r[3] for r in got] == [1.0]
            assert got[0][:2] in (("ok", "2xx"), ("client_disconnect", "2xx"))
        else:
            assert got == [(*r, 1.0) for r in recorded]
        assert active(p) == 0


async def test_many_clients_leaving_at_once_leave_nothing_behind(raw_upstream, proxy_factory,
                                                                 figures):  # fmt: skip
    up = await raw_upstream(slow_stream)
    p = await proxy_factory(up.url, inject_usage=False)
    host, port = p.url.removeprefix("http://").split(":")
    before = snapshot()

    async def one(i: int) -> None:
        reader, writer = await asyncio.open_connection(host, port)
        await _mid_stream(reader, writer)
        await leave(writer, reset=i % 2 == 1)

    with figures.fault():
        await asyncio.gather(*(one(i) for i in range(50)))
        for _ in range(100):
            if all(c.peer_closed_at is not None for c in up.conns):
                break
            await asyncio.sleep(0.01)
        assert len(up.conns) == 50
        assert all(c.peer_closed_at is not None for c in up.conns)
        after = await settled(before, timeout_s=3)
        assert (after.tasks <= before.tasks, after.fds <= before.fds) == (True, True)
        assert outcomes(p) == [("client_disconnect", "2xx", "client_disconnect", 50.0)]
        assert active(p) == 0


SLOW_EVENT = b'data: {"choices":[{"index":0,"delta":{"content":"' + b"x" * 65000 + b'"}}]}\n\n'
SLOW_TOTAL = 4096  # events of 64 KiB: 256 MiB offered to a client reading 1 byte per second


async def test_slow_reader_holds_bounded_memory_and_others_are_unaffected(
    aiohttp_server, proxy_process, figures
):
    written = [0]
    upstream_done: list[str] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        if body.get("slow"):
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(request)
            try:
                for _ in range(SLOW_TOTAL):
                    await resp.write(SLOW_EVENT)
                    written[0] += len(SLOW_EVENT)
            except (ConnectionError, asyncio.CancelledError):
                upstream_done.append("closed by proxy")
                raise
            return resp
        events, _ = stream_events(int(body["seed"]), int(body["max_tokens"]),
                                         usage="stream_options" in body)  # fmt: skip
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for ev in events:
            await resp.write(ev)
            await asyncio.sleep(0.005)
        return resp

    app = web.Application()
    app.router.add_post(CHAT, handler)
    server = await aiohttp_server(app)
    p = await proxy_process(str(server.make_url("")).rstrip("/"))
    host, port = p.url.removeprefix("http://").split(":")
    for _ in range(5):  # warm up: imports, first allocations, pools
        got = await fetch(p.url + CHAT, chat_body())
        assert got.body == expected_healthy()
    rss_before = rss_bytes(p.pid)

    with figures.fault():
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, (host, int(port)))
        reader, writer = await asyncio.open_connection(sock=sock)
        writer.write(http_post(json.dumps(chat_body(slow=True)).encode()))
        await writer.drain()
        peak = rss_before
        others = []
        for second in range(4):  # one byte per second, while 20 other streams run
            assert len(await reader.read(1)) == 1
            if second == 1:
                others = await asyncio.gather(
                    *(fetch(p.url + CHAT, chat_body(seed=s)) for s in range(20))
                )
            peak = max(peak, rss_bytes(p.pid))
            await asyncio.sleep(1)
        held_back = written[0]
        await leave(writer, reset=True)
        for _ in range(100):
            if upstream_done:
                break
            await asyncio.sleep(0.02)

        growth = peak - rss_before
        figures.measures["slow reader: proxy RSS growth (256 MiB offered)"] = (
            f"{growth / 2**20:.1f} MiB"
        )
        assert growth < 16 * 2**20, f"the proxy grew {growth / 2**20:.1f} MiB for a slow reader"
        # Backpressure reached the upstream: it could only fill the kernel's buffers.
        assert held_back < 96 * 2**20
        assert upstream_done == ["closed by proxy"]
        assert all(o.body == expected_healthy(s, 8) and o.error == "" for s, o in
                   enumerate(others))  # fmt: skip
        async with aiohttp.ClientSession() as s, s.get(p.admin_url + "/metrics") as r:
            samples = parse_metrics(await r.text())
        assert total(samples, "tokenstamp_requests_total", tokenstamp_outcome="ok") == 25
        assert total(samples, "tokenstamp_requests_total",
                     tokenstamp_outcome="client_disconnect") == 1  # fmt: skip

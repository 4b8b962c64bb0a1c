"""A client that closes at the stream's terminal event had the whole answer.

Many clients stop reading at ``data: [DONE]`` and close (guidellm, httpx-based
ones). When that close reaches the proxy before the upstream's last bytes (the
chunked terminator 50 ms later here), the request is still ``ok``, and the
upstream connection is read to its end and reused, not closed. A client that
closes before the terminal event is a disconnect, and its upstream connection
is closed (the backend stops generating).
"""

from __future__ import annotations

import asyncio

import pytest
from aiohttp import web

from exporters import names
from tests.proxy.edge.test_app_functional import LABELS, body, chat_chunk

CHAT = "/v1/chat/completions"
FINAL_AFTER_S = 0.05
DONE = b"data: [DONE]\n\n"


def _outcomes(p) -> dict[str, float]:
    out: dict[str, float] = {}
    for family in p.registry.collect():
        for s in family.samples:
            if s.name == names.REQUESTS.prom_series:
                o = s.labels["tokenstamp_outcome"]
                out[o] = out.get(o, 0.0) + s.value
    return out


async def _read_until_then_close(port: int, marker: bytes) -> bytes:
    """A raw HTTP/1.1 client: POST a stream, read until ``marker``, close at once."""
    import json

    payload = json.dumps(body(max_tokens=3)).encode()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST %b HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n%b" % (CHAT.encode(), len(payload), payload)
    )
    got = b""
    while marker not in got:
        data = await asyncio.wait_for(reader.read(65536), 5)
        assert data, got
        got += data
    writer.close()
    return got


@pytest.fixture
def peers(upstream):
    """The upstream answers its role chunk, 50 ms later 3 tokens and ``[DONE]``, then its
    chunked terminator 50 ms later; it notes the client port of every request (a reused connection keeps it)."""
    ports: list[int] = []
    ended: list[bool] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        ports.append(request.transport.get_extra_info("peername")[1])
        resp = web.StreamResponse()
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        try:
            await resp.write(chat_chunk("", role=True))
            await asyncio.sleep(FINAL_AFTER_S)  # a client closing at the role chunk is early
            for token in ("a", "b", "c"):
                await resp.write(chat_chunk(token))
            await resp.write(chat_chunk(None, finish="length"))
            await resp.write(DONE)
            await asyncio.sleep(FINAL_AFTER_S)
            await resp.write_eof()
            ended.append(True)
        except (ConnectionError, asyncio.CancelledError):
            ended.append(False)
            raise
        return resp

    upstream.handler = handler
    return ports, ended


async def _settle(p, want: int) -> None:
    for _ in range(100):
        if sum(_outcomes(p).values()) >= want:
            return
        await asyncio.sleep(0.01)


async def test_a_client_closing_at_done_is_ok_and_the_connection_is_reused(
    upstream, proxy_factory, peers
):
    ports, ended = peers
    p = await proxy_factory(upstream.url)
    port = int(p.url.rsplit(":", 1)[1])
    for _ in range(3):
        got = await _read_until_then_close(port, DONE)
        assert got.rstrip().endswith(b"[DONE]")
        await asyncio.sleep(FINAL_AFTER_S * 2)  # the upstream's terminator arrives
    await _settle(p, 3)
    assert _outcomes(p) == {"ok": 3.0}
    assert ended == [True, True, True]
    assert len(set(ports)) == 1  # one upstream connection, read to its end and reused
    ttft = p.registry.get_sample_value(names.TTFT.prom_name + "_count", LABELS)
    assert ttft == 3


async def test_a_client_closing_before_done_is_a_disconnect_and_the_connection_closes(
    upstream, proxy_factory, peers
):
    ports, _ = peers
    p = await proxy_factory(upstream.url)
    port = int(p.url.rsplit(":", 1)[1])
    for _ in range(2):
        await _read_until_then_close(port, b'"role"')
        await asyncio.sleep(FINAL_AFTER_S * 2)
    await _settle(p, 2)
    assert _outcomes(p) == {"client_disconnect": 2.0}
    assert len(set(ports)) == 2  # closed: the next request needed a new connection


async def test_a_body_that_goes_on_after_done_is_not_drained_forever(upstream, proxy_factory):
    """After ``[DONE]`` the upstream keeps sending (not what a backend does): the proxy reads
    on at most its bound, then closes; the request is still ``ok``."""
    ports: list[int] = []

    async def handler(request: web.Request) -> web.StreamResponse:
        ports.append(request.transport.get_extra_info("peername")[1])
        resp = web.StreamResponse()
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        await resp.write(chat_chunk("a"))
        await resp.write(DONE)
        for _ in range(400):
            await resp.write(b": keep-alive " + b"x" * 1000 + b"\n\n")
            await asyncio.sleep(0.005)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    p = await proxy_factory(upstream.url)
    port = int(p.url.rsplit(":", 1)[1])
    await _read_until_then_close(port, DONE)
    await _settle(p, 1)
    assert _outcomes(p) == {"ok": 1.0}
    await asyncio.sleep(0.3)
    await _read_until_then_close(port, DONE)
    assert len(set(ports)) == 2  # the first connection was closed, not reused

"""The max-rate load in process, through real relays over sockets: requests end, bodies match.

The load (``bench.maxrate.run``: backend and client in this event loop) drives a small
aiohttp relay standing for a target; the relay can close every connection after its
response, or change a byte, so the load's reconnecting and its body check are seen to work.
Counts are checked for consistency, never a speed.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable

import aiohttp
from aiohttp import web

from bench.backend import DONE, STAMP_FIELD
from bench.children import free_ports
from bench.maxrate import run
from bench.maxrate_wire import Hub
from proxy.core.decoders.openai import interpret
from proxy.core.decoders.sse import SseDecoder


def _relay(upstream: str, *, close: bool, alter: Callable[[bytes], bytes]) -> web.Application:
    """A pass-through of chat completions to ``upstream``, one write per read."""
    app = web.Application()
    sessions: list[aiohttp.ClientSession] = []

    async def session(app: web.Application):
        sessions.append(aiohttp.ClientSession())
        yield
        await sessions[0].close()

    async def forward(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        async with sessions[0].post(upstream + "/v1/chat/completions", data=body,
                                    headers={"Content-Type": "application/json"}) as up:  # fmt: skip
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            if close:
                resp.force_close()
            await resp.prepare(request)
            async for chunk in up.content.iter_any():
                await resp.write(alter(chunk))
            await resp.write_eof()
        return resp

    app.cleanup_ctx.append(session)
    app.router.add_post("/v1/chat/completions", forward)
    return app


async def _through_relay(aiohttp_server, max_tokens, *, close=False, alter=lambda b: b):
    (backend_port,) = free_ports(1)
    relay = await aiohttp_server(_relay(f"http://127.0.0.1:{backend_port}", close=close,
                                        alter=alter))  # fmt: skip
    url = str(relay.make_url("")).rstrip("/")
    return await run(backend_port, url, 4, 0.6, 0.2, (), max_tokens)


def test_first_requests_are_staggered_so_streams_end_out_of_step():
    hub = Hub(200, "127.0.0.1", 1, streams=4)
    assert [hub.first_length(k) for k in range(4)] == [50, 100, 150, 200]
    assert Hub(3, "127.0.0.1", 1, streams=8).first_length(0) == 1


def _whole_requests(res, n, streams=4):
    """Tokens are counted as they arrive, requests when they end: they differ by at most
    the requests in progress at the window's two edges."""
    assert abs(res.tokens - res.requests * n) <= 2 * streams * n, (res.tokens, res.requests)


def test_the_answer_is_the_steady_backends_shape():
    """Role, N tokens, finish, [DONE]; usage only when the request asked, as vLLM does."""
    tail, tail_usage, body = Hub(10, "127.0.0.1", 1).ends(10)
    events = SseDecoder(1 << 20).feed(body)
    infos = [interpret(e.data) for e in events]
    assert [i.output for i in infos] == [False, *[True] * 10, False, False]
    assert infos[-2].finish_reasons == ("length",)
    assert infos[-1].done
    assert body.count(STAMP_FIELD) == 10
    assert body.endswith(DONE)
    assert tail.endswith(b"\r\n0\r\n\r\n")
    usage = SseDecoder(1 << 20).feed(tail_usage.split(b"\r\n", 1)[1].rsplit(b"\r\n0", 1)[0])
    assert json.loads(usage[1].data)["usage"]["completion_tokens"] == 10


async def test_every_request_ends_with_the_backends_body(aiohttp_server):
    res = await _through_relay(aiohttp_server, 10)
    assert res.errors == 0, res.error_samples
    assert res.requests > 0
    _whole_requests(res, 10)
    assert res.body_sha256 == hashlib.sha256(Hub(10, "h", 1).ends(10)[2]).hexdigest()
    assert res.connections == 4  # kept alive: each stream's requests on one connection


async def test_a_target_that_closes_each_connection_gets_a_new_one(aiohttp_server):
    res = await _through_relay(aiohttp_server, 5, close=True)
    assert res.errors == 0, res.error_samples
    # Each stream reconnected after every response.
    assert res.requests > 4
    assert res.connections >= res.requests
    _whole_requests(res, 5)


async def test_a_changed_byte_is_counted_and_never_a_request(aiohttp_server):
    res = await _through_relay(aiohttp_server, 5, alter=lambda b: b.replace(b"assistant", b"Assistant"))  # fmt: skip
    assert res.errors > 0
    assert res.requests == 0
    assert res.body_sha256 != hashlib.sha256(Hub(5, "h", 1).ends(5)[2]).hexdigest()
    assert "differs from the backend's" in res.error_samples[0]


async def test_endless_streams_count_tokens_and_no_requests(aiohttp_server):
    res = await _through_relay(aiohttp_server, 0)
    assert res.errors == 0, res.error_samples
    assert res.requests == 0
    assert res.tokens > 0
    assert res.body_sha256 == ""

"""The body watchdog's one look inside aiohttp: is a read blocked waiting for upstream bytes."""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from proxy.edge.tasks import TaskSet
from proxy.edge.watchdog import waiting_for_data


async def test_waiting_for_data_tells_a_blocked_read_from_unread_bytes(aiohttp_server):
    """Pins aiohttp's ``StreamReader._waiter``: were it renamed, this fails, not the watchdog."""
    gates = [asyncio.Event(), asyncio.Event()]

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        await resp.write(b"a")
        for i, gate in enumerate(gates):
            await gate.wait()
            await resp.write(b"bc"[i : i + 1])
        return resp

    app = web.Application()
    app.router.add_get("/", handler)
    server = await aiohttp_server(app)
    tasks = TaskSet()
    async with aiohttp.ClientSession() as s, s.get(server.make_url("/")) as r:
        body = r.content
        assert await body.readany() == b"a"
        assert not waiting_for_data(body)  # nobody reads: whatever the upstream does
        read = tasks.spawn(body.readany())
        await asyncio.sleep(0.05)
        assert waiting_for_data(body)  # a read is blocked on the upstream
        gates[0].set()
        assert await read == b"b"
        gates[1].set()
        await asyncio.sleep(0.05)
        assert not waiting_for_data(body)  # bytes wait for the reader, not the other way
        assert await body.read() == b"c"

"""The advisor's one question to the upstream, which engine it is, over real sockets."""

from __future__ import annotations

import asyncio
import itertools
import socket

import pytest
from aiohttp import web

from proxy.advisor.web import PROBE_RETRY_S, Advisor, probe_engine
from proxy.edge.server import start_proxy
from tests.proxy.advisor.advisorkit import get_advice
from tests.stallkit import simulator_proxy_config


async def _models(request: web.Request) -> web.Response:
    body = {"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "llamacpp"}]}
    return web.json_response(body, headers={"Server": "llama.cpp"})


@pytest.mark.timeout(30)
async def test_the_server_header_and_owned_by_are_read(aiohttp_server):
    app = web.Application()
    app.router.add_get("/v1/models", _models)
    server = await aiohttp_server(app)
    got = await probe_engine(str(server.make_url("/")))
    assert got == {
        "server": "llama.cpp", "owned_by": "llamacpp", "model": "tiny", "status": "200",
        "error": None,
    }  # fmt: skip


@pytest.mark.timeout(30)
async def test_an_upstream_without_models_still_names_its_server(aiohttp_server):
    server = await aiohttp_server(web.Application())  # every path 404
    got = await probe_engine(str(server.make_url("")))
    assert got["server"] is not None
    assert got["server"].startswith("Python/")
    assert got["owned_by"] is None
    assert got["status"] == "404"
    assert got["error"] == "GET /v1/models: HTTP 404"


@pytest.mark.timeout(30)
async def test_an_upstream_not_there_is_an_error_not_an_exception():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    got = await probe_engine(f"http://127.0.0.1:{port}", timeout_s=2.0)
    assert got["server"] is None
    assert got["status"] is None
    assert got["error"] is not None
    assert got["error"].startswith("GET /v1/models: ")


async def _asked(upstream: str, times: int, meanwhile=None) -> dict[str, str | None] | None:  # type: ignore[no-untyped-def]
    """Ask an advisor for its engine ``times`` times, each a retry interval apart on its
    clock (``meanwhile`` awaited before the last); what it learnt of the engine."""
    step_ns = int((PROBE_RETRY_S + 1) * 1e9)
    clock = itertools.count(0, step_ns).__next__
    advisor = Advisor([], tpot_target_s=0.05, clock=clock, upstream=upstream)
    for k in range(times):
        if meanwhile is not None and k == times - 1:
            await meanwhile()
        await advisor.ask_engine()
    return advisor.engine


@pytest.mark.timeout(30)
async def test_an_http_answer_is_final_whatever_its_status(aiohttp_server):
    """An upstream without /v1/models is asked once, not every retry interval for ever."""
    asked: list[str] = []

    @web.middleware
    async def count(request: web.Request, handler):  # type: ignore[no-untyped-def]
        asked.append(request.path)
        return await handler(request)

    server = await aiohttp_server(web.Application(middlewares=[count]))  # every path 404
    engine = await _asked(str(server.make_url("")), times=5)
    assert engine is not None
    assert engine["status"] == "404"
    assert asked == ["/v1/models"]


@pytest.mark.timeout(30)
async def test_an_upstream_not_reached_is_asked_again_until_it_answers(aiohttp_server):
    """A sidecar may start before its model server: the probe is retried until it answers."""
    with socket.socket() as s:  # a port nothing listens on yet
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    app = web.Application()
    app.router.add_get("/v1/models", _models)

    async def start() -> None:
        await aiohttp_server(app, port=port)

    engine = await _asked(f"http://127.0.0.1:{port}", times=3, meanwhile=start)
    assert engine is not None
    assert engine["status"] == "200"
    assert engine["owned_by"] == "llamacpp"


@pytest.mark.timeout(30)
async def test_the_upstream_is_asked_only_when_advice_is(aiohttp_server):
    """A proxy nobody asks for advice sends its upstream nothing of its own."""
    asked: list[str] = []

    @web.middleware
    async def count(request: web.Request, handler):  # type: ignore[no-untyped-def]
        asked.append(request.path)
        return await handler(request)

    upstream = await aiohttp_server(web.Application(middlewares=[count]))
    proxy = await start_proxy(simulator_proxy_config(str(upstream.make_url("")).rstrip("/")))
    try:
        await asyncio.sleep(1.5)  # more than a fit interval of the background task
        assert asked == []
        advice = await get_advice(proxy.admin_url)
        await get_advice(proxy.admin_url)
    finally:
        await proxy.close()
    assert asked == ["/v1/models"]
    assert advice["backends"][0]["engine"]["probe_error"] == "GET /v1/models: HTTP 404"

"""Shared fixtures: a scripted upstream and the proxy in front of it, over real sockets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from proxy.config import HostPort, ProxyConfig
from proxy.edge.server import RunningProxy, start_proxy
from tests.otlp_collector import Collector, start_collector


@dataclass
class Script:
    """A scripted streaming answer: (delay before, bytes) pairs."""

    parts: list[tuple[float, bytes]]
    status: int = 200
    content_type: str = "text/event-stream"
    headers: dict[str, str] = field(default_factory=dict)


@dataclass
class Upstream:
    """The in-process upstream: what it received and what it answers."""

    url: str
    script: Script | None = None
    requests: list[dict] = field(default_factory=list)
    closed: list[float] = field(default_factory=list)
    handler: Callable | None = None


@pytest.fixture
async def upstream(aiohttp_server) -> Upstream:
    """An aiohttp upstream that records requests and plays ``upstream.script``."""
    state = Upstream(url="")

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        state.requests.append(
            {
                "method": request.method,
                "path": request.path_qs,
                "headers": dict(request.headers),
                "body": body,
            }
        )
        if state.handler is not None:
            return await state.handler(request)
        script = state.script or Script([(0, b"ok")], content_type="text/plain")
        resp = web.StreamResponse(status=script.status, headers=script.headers)
        resp.content_type = script.content_type
        await resp.prepare(request)
        try:
            for delay, data in script.parts:
                if delay:
                    await asyncio.sleep(delay)
                await resp.write(data)
            await resp.write_eof()
        except (asyncio.CancelledError, ConnectionError):
            state.closed.append(asyncio.get_running_loop().time())
            raise
        return resp

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handle)
    server = await aiohttp_server(app)
    state.url = str(server.make_url("")).rstrip("/")
    return state


ProxyFactory = Callable[..., "asyncio.Future[RunningProxy]"]


@pytest.fixture
async def proxy_factory() -> AsyncIterator[Callable[..., object]]:
    """Start proxies on free ports; all are closed at the end of the test."""
    started: list[RunningProxy] = []

    async def make(upstream_url: str, **overrides: object) -> RunningProxy:
        cfg = ProxyConfig(
            upstream=upstream_url,
            listen=HostPort("127.0.0.1", 0),
            admin=HostPort("127.0.0.1", 0),
            backend_name="test-backend",
            provider="vllm",
            **overrides,  # type: ignore[arg-type]
        )
        p = await start_proxy(cfg, registry=CollectorRegistry())
        started.append(p)
        return p

    yield make
    for p in started:
        await p.close(drain_timeout_s=1.0)


@pytest.fixture
def no_view_errors(caplog, request):
    """Fails the test if the stall view logged an error (it swallows its own: traffic first).

    Used by the stall tests (``pytest.mark.usefixtures("no_view_errors")``); a
    test that provokes such an error asks for a ``view_errors_allowed`` fixture.
    """
    yield
    if "view_errors_allowed" in request.fixturenames:
        return
    # At teardown ``caplog.records`` holds teardown's records only: read the test's own.
    records = caplog.get_records("setup") + caplog.get_records("call")
    errors = [r for r in records if r.name == "tokenstamp.stalls" and r.levelno >= 40]
    assert not errors, errors[0].getMessage()


@pytest.fixture
async def collector(aiohttp_server) -> Collector:
    """An in-test OTLP/HTTP collector on a free 127.0.0.1 port (``tests.otlp_collector``)."""
    return await start_collector(aiohttp_server)

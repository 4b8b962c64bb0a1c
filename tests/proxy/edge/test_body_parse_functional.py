"""Every request body, through the real proxy, is forwarded and read as ``json.loads`` reads it.

The upstream must receive the bytes the ``json`` path would have sent (the body,
or the body with usage injected when the parsed body asks for a stream without
choosing usage), and what the proxy reads from the parsed body (the model,
the ``gen_ai.request.*`` parameters, the captured prompt) must be what it reads
from ``json.loads``'s object.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterator
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from exporters import names
from exporters.otel_content import input_messages
from exporters.otel_spans import INPUT_MESSAGES, REQUEST_PARAMS, request_attributes
from proxy.config import HostPort, ProxyConfig
from proxy.core.usage import inject, wants_injection
from proxy.edge.server import RunningProxy, start_proxy
from tests.proxy.core.test_body_json import ODD_BODIES, bodies, reference

ANSWER = b'{"id":"r","object":"chat.completion","model":"m","choices":[]}'
UNOBSERVED = {
    "gen_ai_provider_name": "vllm",
    "server_address": "test-backend",
    "tokenstamp_reason": "body_not_json",
}


class World:
    """An upstream that records bodies and the proxy before it, on one loop the tests drive."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.received: list[bytes] = []
        self.exporter = InMemorySpanExporter()
        self.proxy: RunningProxy | None = None
        self.runner: web.AppRunner | None = None

    def __repr__(self) -> str:
        return "World()"

    async def start(self) -> None:
        async def handle(request: web.Request) -> web.Response:
            self.received.append(await request.read())
            return web.Response(body=ANSWER, content_type="application/json")

        app = web.Application(client_max_size=1 << 24)
        app.router.add_route("*", "/{tail:.*}", handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        cfg = ProxyConfig(
            upstream=f"http://127.0.0.1:{port}",
            listen=HostPort("127.0.0.1", 0),
            admin=HostPort("127.0.0.1", 0),
            backend_name="test-backend",
            provider="vllm",
            capture_content=True,
        )
        self.proxy = await start_proxy(cfg, registry=CollectorRegistry(), tracer_provider=provider)

    async def close(self) -> None:
        if self.proxy is not None:
            await self.proxy.close(drain_timeout_s=1.0)
        if self.runner is not None:
            await self.runner.cleanup()

    def unobserved(self) -> float:
        assert self.proxy is not None
        value = self.proxy.registry.get_sample_value(
            "tokenstamp_requests_unobserved_total", UNOBSERVED
        )
        return value or 0.0

    async def send(self, body: bytes) -> tuple[int, list[bytes], dict[str, Any] | None]:
        """Post ``body``; the status, what the upstream received, the request span's attributes."""
        assert self.proxy is not None
        self.received.clear()
        self.exporter.clear()
        async with asyncio.timeout(10), aiohttp.ClientSession() as s:
            async with s.post(
                self.proxy.url + "/v1/chat/completions",
                data=body,
                headers={"Content-Type": "application/json"},
            ) as r:
                await r.read()
                status = r.status
        tracing = self.proxy.state.tracing
        assert tracing is not None
        tracing.sweep(1 << 62)  # end a lingering span now
        spans = self.exporter.get_finished_spans()
        assert len(spans) <= 1
        return status, list(self.received), dict(spans[0].attributes or {}) if spans else None


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    loop = asyncio.new_event_loop()
    w = World(loop)
    try:
        loop.run_until_complete(w.start())
        yield w
    finally:
        loop.run_until_complete(w.close())
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _equal(a: object, b: object) -> bool:
    return a == b or (
        isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    )


def through_the_proxy(world: World, body: bytes) -> None:
    try:
        want = reference(body)
    except RecursionError:  # too deep to read: forwarded untouched, counted unobserved
        want = None
    before = world.unobserved()
    status, received, attrs = world.loop.run_until_complete(world.send(body))
    assert status == 200
    if want is None:
        assert received == [body]
        assert attrs is None
        assert world.unobserved() == before + 1
        return
    injected = inject(body) if wants_injection(want) else None
    assert received == [injected if injected is not None else body]
    assert world.unobserved() == before
    assert attrs is not None
    expected: dict[str, Any] = dict(request_attributes(want))
    model = want.get("model")
    if isinstance(model, str) and model:
        expected[names.REQUEST_MODEL] = model
    messages = input_messages(want)
    if messages is not None:
        expected[INPUT_MESSAGES] = messages
    for key in (*REQUEST_PARAMS.values(), names.REQUEST_MODEL, INPUT_MESSAGES):
        assert _equal(attrs.get(key), expected.get(key)), (key, body[:200])


@pytest.mark.parametrize("body", ODD_BODIES, ids=range(len(ODD_BODIES)))
def test_odd_bodies_through_the_proxy(world, body):
    through_the_proxy(world, body)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies())
def test_any_body_through_the_proxy(world, body):
    through_the_proxy(world, body)

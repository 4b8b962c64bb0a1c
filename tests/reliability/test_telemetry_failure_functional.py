"""Telemetry failure: a sink or registry that raises must not touch the bytes or the stream.

The proxy is started with an injected sink whose methods raise (all of them,
or one at a time), and with a registry holding a collector that raises on
scrape. Every stream must still arrive byte for byte and end cleanly, and
the proxy must go on serving.
"""

from __future__ import annotations

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry
from prometheus_client.registry import Collector

from exporters.prometheus import PrometheusSink
from proxy.config import HostPort, ProxyConfig
from proxy.edge.server import start_proxy
from tests.reliability.helpers import CHAT, chat_body, fetch
from tests.reliability.streams import stream_events, visible_bytes

SINK_METHODS = ("request_started", "first_token", "gap", "request_finished", "decoder_error",
                "unobserved", "stall", "prefill_done")  # fmt: skip
BAD_EVENT = b"data: {not json\n\n"


class RaisingSink:
    """A fan-out subscriber whose chosen methods raise (a broken exporter)."""

    takes = SINK_METHODS

    def __init__(self, failing: frozenset[str]) -> None:
        self.failing = failing
        self.calls: dict[str, int] = {}

    def __getattr__(self, name: str):
        if name not in SINK_METHODS:
            raise AttributeError(name)

        def method(*args: object) -> None:
            self.calls[name] = self.calls.get(name, 0) + 1
            if name in self.failing:
                raise RuntimeError(f"exporter {name} is broken")

        return method


async def _stream(request: web.Request) -> web.StreamResponse:
    payload = await request.json()
    events, _usage_at = stream_events(int(payload["seed"]), 12, usage="stream_options" in payload)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for i, ev in enumerate(events):
        await resp.write(ev)
        if i == 3:
            await resp.write(BAD_EVENT)  # a decoder error mid-stream
    return resp


def _expected(seed: int) -> bytes:
    events, usage_at = stream_events(seed, 12, usage=True)
    assert usage_at is not None
    return b"".join(events[:4]) + BAD_EVENT + visible_bytes(events[4:], usage_at - 4)


@pytest.mark.parametrize(
    "failing",
    [
        "all",
        "request_started",
        "first_token",
        "gap",
        "decoder_error",
        "request_finished",
    ],
)
async def test_raising_sink_leaves_the_stream_alone(failing, aiohttp_server, figures):
    app = web.Application()
    app.router.add_post(CHAT, _stream)
    server = await aiohttp_server(app)
    sink = RaisingSink(frozenset(SINK_METHODS) if failing == "all" else frozenset({failing}))
    cfg = ProxyConfig(upstream=str(server.make_url("")).rstrip("/"),
                      listen=HostPort("127.0.0.1", 0), admin=HostPort("127.0.0.1", 0))  # fmt: skip
    p = await start_proxy(cfg, sink=sink)
    try:
        with figures.fault():
            for seed in (1, 2, 3):
                got = await fetch(p.url + CHAT, chat_body(seed=seed))
                assert (got.status, got.error) == (200, "")
                assert got.body == _expected(seed)
            assert sink.calls.get(failing if failing != "all" else "gap", 0) > 0
    finally:
        await p.close(drain_timeout_s=1.0)


class _BrokenCollector(Collector):
    def collect(self):
        raise RuntimeError("collector is broken")


async def test_broken_registry_fails_the_scrape_not_the_streams(aiohttp_server, figures):
    import aiohttp

    app = web.Application()
    app.router.add_post(CHAT, _stream)
    server = await aiohttp_server(app)
    registry = CollectorRegistry()
    cfg = ProxyConfig(upstream=str(server.make_url("")).rstrip("/"),
                      listen=HostPort("127.0.0.1", 0), admin=HostPort("127.0.0.1", 0))  # fmt: skip
    p = await start_proxy(cfg, registry=registry, sink=PrometheusSink(registry))
    registry.register(_BrokenCollector())
    try:
        with figures.fault():
            async with aiohttp.ClientSession() as s, s.get(p.admin_url + "/metrics") as r:
                assert r.status == 500
            got = await fetch(p.url + CHAT, chat_body(seed=4))
            assert (got.status, got.body, got.error) == (200, _expected(4), "")
    finally:
        await p.close(drain_timeout_s=1.0)

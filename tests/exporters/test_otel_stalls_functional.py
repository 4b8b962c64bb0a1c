"""Stalls on spans, through real HTTP: simulator (seed profile) -> proxy -> streams + a long prompt.

A few streams decode while one 4,000-token prompt arrives; unchunked, its
prefill freezes every stream for one long step. The stalled streams' spans
get a ``tokenstamp.stall`` event naming the culprit and a link to its span;
the culprit's span says how many streams it stalled. Real time on a shared
machine: the counts are checked for consistency, not for exact values.
"""

from __future__ import annotations

import asyncio

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from exporters import otel_spans as keys
from proxy.edge.server import start_proxy
from tests.stallkit import simulator_proxy_config, start_simulator, stream_chat

STREAMS = 6
LONG_ID = "long-prompt-otel"


async def _long(session: aiohttp.ClientSession, url: str) -> None:
    body = {
        "model": "tokenstamp-sim",
        "messages": [{"role": "user", "content": "word " * 3200}],
        "stream": True,
        "max_tokens": 5,
    }
    headers = {"X-Request-Id": LONG_ID}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        await resp.read()


@pytest.mark.timeout(60)
async def test_stalled_streams_link_to_the_culprit_span(aiohttp_server):
    sim_url = await start_simulator(aiohttp_server, "seed")
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    config = simulator_proxy_config(sim_url)
    proxy = await start_proxy(config, registry=CollectorRegistry(), tracer_provider=provider)
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async with asyncio.TaskGroup() as group:
                for i in range(STREAMS):
                    group.create_task(stream_chat(session, proxy.url, i, max_tokens=70))
                await asyncio.sleep(0.6)  # all streams past their first tokens
                await _long(session, proxy.url)
            # Before the lingering spans are ended, spans must still be open.
            assert len(exporter.get_finished_spans()) < STREAMS + 1
    finally:
        await proxy.close(drain_timeout_s=1.0)  # ends the lingering spans
    spans = exporter.get_finished_spans()
    assert len(spans) == STREAMS + 1
    by_id = {s.attributes[keys.REQUEST_ID]: s for s in spans if s.attributes}
    long_span = by_id.pop(LONG_ID)

    (stutter,) = [e for e in long_span.events if e.name == keys.STUTTER_EVENT]
    assert stutter.attributes is not None
    stalled_n = stutter.attributes[keys.STALLED_STREAMS]
    assert (long_span.attributes or {})[keys.STALLED_STREAMS] == stalled_n
    assert stutter.attributes[keys.STUTTER_COST] > 0.05 * stalled_n
    print(f"\nculprit stalled {stalled_n} of {STREAMS} streams")
    assert 1 <= stalled_n <= STREAMS

    linked = []
    for span in by_id.values():
        stalls = [e for e in span.events if e.name == keys.STALL_EVENT]
        named = [e for e in stalls if LONG_ID in (e.attributes or {})[keys.STALL_CULPRITS]]
        links = [link for link in span.links if link.context.span_id == long_span.context.span_id]
        if named:
            (link,) = links
            assert link.context.trace_id == long_span.context.trace_id
            assert (link.attributes or {})[keys.LINK_KIND] == "stall_culprit"
            assert all((e.attributes or {})["tokenstamp.stall.cause"] == "prefill" for e in named)
            assert all((e.attributes or {})[keys.STALL_DURATION] > 0.05 for e in named)
            assert (span.attributes or {})[keys.STALLS] >= len(named)
            linked.append(span)
        else:
            assert links == []
    assert len(linked) == stalled_n

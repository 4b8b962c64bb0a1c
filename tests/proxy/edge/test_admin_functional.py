"""``/metrics`` over a real socket: protobuf when the scraper prefers it, text as before."""

from __future__ import annotations

import aiohttp
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics

from exporters.protobuf_exposition import CONTENT_TYPE
from tests.conftest import Script
from tests.exporters.metrics_proto import native_buckets, parse_delimited
from tests.exporters.test_protobuf_exposition import PROMETHEUS_2_42
from tests.proxy.edge.test_app_functional import vllm_like

TTFT = "gen_ai_server_time_to_first_token_seconds"


async def _one_stream(url: str) -> None:
    body = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession() as s, s.post(url + "/v1/chat/completions", json=body) as r:
        await r.read()


async def _scrape(url: str, accept: str | None) -> tuple[str, bytes]:
    headers = {} if accept is None else {"Accept": accept}
    async with aiohttp.ClientSession() as s, s.get(url + "/metrics", headers=headers) as r:
        assert r.status == 200
        return r.headers["Content-Type"], await r.read()


async def test_protobuf_when_the_scraper_prefers_it(upstream, proxy_factory):
    upstream.script = Script(vllm_like([0.02, 0.01, 0.01], usage=True))
    p = await proxy_factory(upstream.url)
    await _one_stream(p.url)
    content_type, body = await _scrape(p.admin_url, PROMETHEUS_2_42)
    assert content_type == CONTENT_TYPE
    families = {f.name: f for f in parse_delimited(body)}
    (ttft,) = families[TTFT].metric
    assert ttft.histogram.sample_count == 1
    assert ttft.histogram.zero_threshold > 0  # what makes Prometheus read it as native
    (count,) = native_buckets(ttft.histogram).values()
    assert count == 1
    assert families["tokenstamp_requests_total"].metric[0].counter.value == 1


async def test_text_and_openmetrics_are_as_before(upstream, proxy_factory):
    upstream.script = Script(vllm_like([0.02, 0.01], usage=True))
    p = await proxy_factory(upstream.url)
    await _one_stream(p.url)
    content_type, body = await _scrape(p.admin_url, None)
    assert content_type.startswith("text/plain")
    assert body == generate_latest(p.registry)
    content_type, body = await _scrape(p.admin_url, "application/openmetrics-text")
    assert content_type.startswith("application/openmetrics-text")
    assert body == generate_openmetrics(p.registry)


async def test_native_histograms_off_answers_text(upstream, proxy_factory):
    upstream.script = Script(vllm_like([0.02, 0.01], usage=True))
    p = await proxy_factory(upstream.url, native_histograms=False)
    await _one_stream(p.url)
    content_type, body = await _scrape(p.admin_url, PROMETHEUS_2_42)
    # prometheus_client's choice for that header, as before native histograms existed
    assert content_type.startswith("application/openmetrics-text")
    assert body == generate_openmetrics(p.registry)

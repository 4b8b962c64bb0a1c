"""Exemplars end to end: a real Prometheus (exemplar storage on) scrapes the proxy's OpenMetrics.

``/api/v1/query_exemplars`` must return, for the TTFT, inter-token gap and
worst-gap histograms, trace ids that belong to spans the proxy exported.
"""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from proxy.edge.server import start_proxy
from tests.conftest import Script
from tests.exporters.test_otel_metrics_functional import config
from tests.promserver import PrometheusServer
from tests.proxy.edge.test_app_functional import body, vllm_like

HISTOGRAMS = (
    "gen_ai_server_time_to_first_token_seconds_bucket",
    "gen_ai_client_operation_time_per_output_chunk_seconds_bucket",
    "tokenstamp_stream_max_gap_seconds_bucket",
)


@pytest.mark.prometheus
@pytest.mark.timeout(60)
async def test_prometheus_stores_exemplars_whose_trace_ids_are_exported_spans(upstream):
    upstream.script = Script(vllm_like([0.03, 0.01, 0.05, 0.01], usage=True))
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    proxy = await start_proxy(
        config(upstream.url, stall_detection=False),
        registry=CollectorRegistry(),
        tracer_provider=provider,
    )
    target = proxy.admin_url.removeprefix("http://")
    try:
        async with PrometheusServer(
            {"tokenstamp": [target]}, extra_args=["--enable-feature=exemplar-storage"]
        ) as prom:
            await prom.scraped("tokenstamp")
            start = time.time() - 5
            async with aiohttp.ClientSession() as s:
                for _ in range(3):
                    async with s.post(proxy.url + "/v1/chat/completions", json=body()) as r:
                        await r.read()
            spans = {format(sp.context.trace_id, "032x") for sp in exporter.get_finished_spans()}
            assert len(spans) == 3
            found: dict[str, set[str]] = {}
            for _ in range(80):
                for name in HISTOGRAMS:
                    data = await prom.api(
                        "query_exemplars", query=name, start=str(start), end=str(time.time() + 5)
                    )
                    found[name] = {
                        ex["labels"]["trace_id"] for series in data for ex in series["exemplars"]
                    }
                if all(found.values()):
                    break
                await asyncio.sleep(0.25)
    finally:
        await proxy.close(drain_timeout_s=1.0)
    for name in HISTOGRAMS:
        assert found[name], f"no exemplar stored for {name}"
        assert found[name] <= spans, name

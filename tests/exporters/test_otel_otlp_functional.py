"""OTLP over HTTP for real: the proxy's SDK exporters -> an in-test collector (aiohttp + protobuf).

The collector decodes what the proxy sends with the ``opentelemetry-proto``
messages. The metrics must translate to exactly the series of a ``/metrics``
scrape (histograms: base-2 exponential by default, with the scrape's counts
and sums and each percentile within a bucket of the exact one; explicit with
``--otlp-histograms explicit``, bucket for bucket); the spans must be the requests'. A collector that is down, or slow,
changes nothing for the client: the same bytes, no waiting on export; failed
exports are counted and their log lines rate-limited; shutdown stays bounded.
"""

from __future__ import annotations

import asyncio
import logging
import time

import aiohttp
import pytest
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from prometheus_client import CollectorRegistry

from exporters import names
from exporters.fanout import Fanout
from exporters.otel import OtelMetricsSink
from exporters.otel_setup import SDK_EXPORT_LOGGERS, OtlpSettings, Telemetry
from exporters.prometheus import PrometheusSink
from proxy.edge.server import start_proxy
from tests.conftest import Script
from tests.exporters.test_otel_metrics_functional import check_same_as_scrape, config, drive
from tests.otlp_prometheus import RawMeterProvider
from tests.promserver import free_port
from tests.proxy.edge.test_app_functional import body, vllm_like


@pytest.fixture
async def simulator_url(aiohttp_server) -> str:
    from simulator.engine import EngineConfig
    from simulator.profile import BUILTIN_PROFILES
    from simulator.server import create_app

    sim = await aiohttp_server(create_app(EngineConfig(BUILTIN_PROFILES["seed"])))
    return str(sim.make_url("")).rstrip("/")


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flag", [None, "explicit"], ids=["default", "explicit"])
async def test_otlp_http_round_trip_equals_the_scrape(simulator_url, collector, flag):
    # Built by start_proxy itself from --otlp-endpoint (and --otlp-histograms), as
    # `tokenstamp serve` does. Beside the scrape, a sink keeps every exact observation.
    given = {} if flag is None else {"otlp_histograms": names.HistogramAggregation(flag)}
    cfg = config(simulator_url, otlp_endpoint=collector.url, **given)
    registry = CollectorRegistry()
    prom = PrometheusSink(registry)
    prom.slo_ttft_s, prom.slo_tpot_s = cfg.slo_ttft_s, cfg.slo_tpot_s
    raw = RawMeterProvider()
    sink = Fanout(prom, OtelMetricsSink(raw))  # type: ignore[arg-type]
    proxy = await start_proxy(cfg, registry=registry, sink=sink)
    telemetry = proxy.telemetry
    assert telemetry is not None
    aggregation = names.HistogramAggregation(flag or "exponential")
    assert telemetry.histograms is aggregation
    try:
        scraped = await drive(proxy)
        assert await telemetry.flush()
        assert collector.metrics, "no metrics arrived"
        seen = check_same_as_scrape(collector.metrics[-1], scraped, aggregation, raw.values)
        assert names.GAP.name in seen  # the bridged instrument, too
        assert names.TTFT.name in seen
        assert proxy.state.tracing is not None
        proxy.state.tracing.sweep(1 << 62)  # end the spans lingering for late stalls
        assert await telemetry.flush()
    finally:
        await proxy.close(drain_timeout_s=1.0)
    assert collector.content_types == {"application/x-protobuf"}
    spans = collector.spans()
    # Four streams, the long prompt and the non-streamed request; the non-JSON one has none.
    assert len(spans) == 6
    assert {s.name for s in spans} == {"chat tokenstamp-sim"}
    assert {s.kind for s in spans} == {ProtoSpan.SPAN_KIND_SERVER}
    assert len({s.trace_id for s in spans}) == 6
    resource = {
        kv.key: kv.value.string_value
        for kv in collector.traces[0].resource_spans[0].resource.attributes
    }
    assert resource["service.name"]  # "tokenstamp" unless OTEL_SERVICE_NAME says otherwise
    assert telemetry.health.failed == {"traces": 0, "metrics": 0}


async def _timed_stream(url: str, delays: list[float]) -> tuple[bytes, float]:
    start = time.monotonic()
    async with aiohttp.ClientSession() as s:
        async with s.post(url + "/v1/chat/completions", json=body()) as r:
            got = await r.read()
    return got, time.monotonic() - start


def _telemetry(endpoint: str, timeout_s: str) -> Telemetry:
    settings = OtlpSettings(endpoint + "/v1/traces", endpoint + "/v1/metrics")
    return Telemetry(settings, {"OTEL_EXPORTER_OTLP_TIMEOUT": timeout_s})


@pytest.mark.timeout(60)
async def test_dead_collector_changes_nothing_for_the_client(upstream, caplog):
    delays = [0.02] * 10
    upstream.script = Script(vllm_like(delays, usage=True))
    expected = b"".join(d for _, d in vllm_like(delays, usage=False))
    telemetry = _telemetry(f"http://127.0.0.1:{free_port()}", "1")
    proxy = await start_proxy(
        config(upstream.url, stall_detection=False),
        registry=CollectorRegistry(),
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    caplog.set_level(logging.WARNING)
    try:
        for _ in range(3):
            got, took_s = await _timed_stream(proxy.url, delays)
            assert got == expected
            assert took_s < sum(delays) + 1.0  # no export on the request path
            assert await telemetry.flush(timeout_s=10)  # each flush: one failed export per signal
    finally:
        await proxy.close(drain_timeout_s=1.0)
        started = time.monotonic()
        await telemetry.shutdown(timeout_s=3)
        assert time.monotonic() - started < 5
    assert telemetry.health.failed["traces"] >= 3
    assert telemetry.health.failed["metrics"] >= 3
    sdk_lines = [r for r in caplog.records if r.name in SDK_EXPORT_LOGGERS]
    per_logger = {name: sum(r.name == name for r in sdk_lines) for name in SDK_EXPORT_LOGGERS}
    assert sdk_lines, "the failure was not logged at all"
    assert max(per_logger.values()) == 1, per_logger  # one line a minute per logger
    assert all("exports failed so far" in r.getMessage() for r in sdk_lines)
    assert telemetry.log_filter.suppressed > 0


@pytest.mark.timeout(60)
async def test_slow_collector_changes_nothing_for_the_client(upstream, collector):
    delays = [0.02] * 10
    upstream.script = Script(vllm_like(delays, usage=True))
    expected = b"".join(d for _, d in vllm_like(delays, usage=False))
    collector.delay_s = 1.5
    telemetry = _telemetry(collector.url, "10")
    proxy = await start_proxy(
        config(upstream.url, stall_detection=False),
        registry=CollectorRegistry(),
        tracer_provider=telemetry.tracer_provider,
        meter_provider=telemetry.meter_provider,
    )
    try:
        got, _ = await _timed_stream(proxy.url, delays)
        assert got == expected
        async with asyncio.TaskGroup() as group:
            flushing = group.create_task(telemetry.flush(timeout_s=20))
            await asyncio.sleep(0.2)  # the export thread now waits on the collector
            assert not flushing.done()
            got, took_s = await _timed_stream(proxy.url, delays)
            assert got == expected
            assert took_s < sum(delays) + 1.0
            assert not flushing.done()  # the stream did not wait for the export
        assert flushing.result()
    finally:
        await proxy.close(drain_timeout_s=1.0)
        await telemetry.shutdown(timeout_s=10)
    assert len(collector.spans()) == 2
    assert telemetry.health.failed == {"traces": 0, "metrics": 0}

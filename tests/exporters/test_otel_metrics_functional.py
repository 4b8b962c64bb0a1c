"""OpenTelemetry metrics equal the Prometheus scrape, series for series (in-memory reader).

The proxy runs in front of the simulator with an injected ``MeterProvider``
(an ``InMemoryMetricReader``, never a global); a few streams, a long prompt
that stalls them, a non-streamed request and an unobservable one go through.
The OpenTelemetry data is encoded as OTLP (what an exporter sends) and
translated the way an OTLP-to-Prometheus pipeline does (``tests.otlp_prometheus``):
the result must equal the samples of a ``/metrics`` scrape taken at the same
moment, with units and descriptions from ``exporters.names``. Explicit-bucket
histograms equal it bucket for bucket. Exponential ones (the views of
``exporters.otel_setup``) have the scrape's count and sum, agree with every
classic bucket to within one of their own buckets, and, given the exact
observations, give each percentile within their buckets' width.
``tests/exporters/test_otel_otlp_functional.py`` does the same over a real
OTLP/HTTP round trip, with the helpers below.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.utils import floatToGoString

from exporters import names
from exporters.otel_setup import histogram_views
from proxy.config import ProxyConfig
from proxy.edge.server import RunningProxy, start_proxy
from tests.otlp_prometheus import Labels, labels, metrics, prometheus_name, quantile, split
from tests.otlp_prometheus import relative_error as exponential_error
from tests.stallkit import simulator_proxy_config, start_simulator

Samples = dict[tuple[str, Labels], float]
#: Exact observations by (instrument name, labels), as ``RawMeterProvider`` keeps them.
Exact = dict[tuple[str, Labels], list[float]]
BY_NAME = {inst.name: inst for inst in names.ALL}
QUANTILES = (0.5, 0.9, 0.99)
#: The widest bucket the exponential views may end at for any of this traffic: scale 4.
MAX_ERROR = 2 ** (2**-4) - 1


def scrape_samples(text: str) -> Samples:
    """Samples of a Prometheus text exposition, ``_created`` left out."""
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if not s.name.endswith("_created"):
                out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def otlp_samples(request: ExportMetricsServiceRequest) -> Samples:
    """Samples an OTLP-to-Prometheus pipeline makes of one (cumulative) export; an
    exponential histogram gives its ``_sum`` and ``_count`` (its buckets are native)."""
    out: Samples = {}
    for metric in metrics(request):
        name = prometheus_name(metric)
        kind = metric.WhichOneof("data")
        if kind in ("histogram", "exponential_histogram"):
            for p in getattr(metric, kind).data_points:
                if kind == "histogram":
                    total = 0
                    bounds = [*p.explicit_bounds, float("inf")]
                    for bound, count in zip(bounds, p.bucket_counts, strict=True):
                        total += count
                        le = (("le", floatToGoString(bound)),)
                        out[(name + "_bucket", labels(p.attributes, le))] = total
                out[(name + "_sum", labels(p.attributes))] = p.sum
                out[(name + "_count", labels(p.attributes))] = p.count
        else:
            assert kind in ("sum", "gauge"), metric  # gauges: the advisor's fit
            for p in getattr(metric, kind).data_points:
                v = p.as_double if p.WhichOneof("value") == "as_double" else p.as_int
                out[(name, labels(p.attributes))] = v
    return out


def _check_exponential(
    inst: names.Instrument, point: Any, want: Samples, exact: Exact | None
) -> set[tuple[str, Labels]]:
    """One exponential data point against the scrape's classic buckets and the exact
    observations; returns the bucket samples it accounted for."""
    series = labels(point.attributes)
    assert point.negative.bucket_counts in ([], [0]), inst.name  # durations, sizes: >= 0
    if any(point.positive.bucket_counts):
        assert exponential_error(point) <= MAX_ERROR, (inst.name, point.scale)
    checked = set()
    for bound in (*inst.buckets, math.inf):
        key = (inst.prom_name + "_bucket", series | {("le", floatToGoString(bound))})
        classic = want[key]
        if bound == math.inf:
            assert classic == point.count, key
        elif bound > 0:
            surely, maybe = split(point, bound)
            assert surely <= classic <= maybe, (key, surely, classic, maybe)
        else:
            assert classic == point.zero_count, key  # le="0": exact zeros only
        checked.add(key)
    if exact is not None:
        values = sorted(exact[(inst.name, series)])
        assert len(values) == point.count, inst.name
        assert (min(values), max(values)) == (point.min, point.max)
        for q in QUANTILES:
            truth = values[math.ceil(q * len(values)) - 1]  # the observation at rank q * count
            got = quantile(point, q)
            assert abs(got - truth) <= exponential_error(point) * truth, (inst.name, q, got, truth)
    return checked


def check_same_as_scrape(
    request: ExportMetricsServiceRequest,
    scraped: str,
    aggregation: names.HistogramAggregation = names.HistogramAggregation.EXPLICIT,
    exact: Exact | None = None,
) -> set[str]:
    """Assert the OTLP export and the scrape agree; return the instrument names seen.

    Histograms must arrive with ``aggregation``; ``exact``: the observations, to judge
    an exponential histogram's percentiles."""
    seen: set[str] = set()
    want = scrape_samples(scraped)
    bucket_samples: set[tuple[str, Labels]] = set()
    for rm in request.resource_metrics:
        for sm in rm.scope_metrics:
            assert sm.scope.name == "tokenstamp"
    for metric in metrics(request):
        inst = BY_NAME[metric.name]
        assert metric.unit == inst.unit, metric.name
        assert metric.description == inst.description
        assert prometheus_name(metric) == (
            inst.prom_series if inst.kind is names.Kind.COUNTER else inst.prom_name
        )
        if inst.kind is names.Kind.HISTOGRAM:
            kind = metric.WhichOneof("data")
            if aggregation is names.HistogramAggregation.EXPLICIT:
                assert kind == "histogram", metric.name
                for p in metric.histogram.data_points:
                    assert tuple(p.explicit_bounds) == inst.buckets, metric.name
            else:
                assert kind == "exponential_histogram", metric.name
                for p in metric.exponential_histogram.data_points:
                    bucket_samples |= _check_exponential(inst, p, want, exact)
        seen.add(metric.name)
    got = otlp_samples(request)
    assert len(want) > 150  # the comparison covers real data
    assert set(got) == set(want) - bucket_samples, set(got) ^ (set(want) - bucket_samples)
    for key, value in got.items():
        assert value == pytest.approx(want[key], rel=1e-9, abs=1e-12), key
    return seen


async def _stream(session: aiohttp.ClientSession, url: str, i: int, max_tokens: int) -> None:
    body = {
        "model": "tokenstamp-sim",
        "messages": [{"role": "user", "content": ("word " * 3200) if i < 0 else f"s {i}"}],
        "stream": True,
        "max_tokens": max_tokens,
    }
    headers = {"X-Tenant": f"team-{i % 2}"}  # labelled only with --tenant-header
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        await resp.read()


async def drive(proxy: RunningProxy, settle_s: float = 0.0) -> str:
    """Streams, a stalling long prompt, a non-streamed and an unobservable request; the scrape.

    Every stall is made final by moving the stall view's clock 10 s ahead; for a
    proxy that serves more waves of traffic after this one, ``settle_s`` waits that
    long instead (the stall view decides within 2 s)."""
    url = proxy.url
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with asyncio.TaskGroup() as group:
            for i in range(4):
                group.create_task(_stream(session, url, i, 50))
            await asyncio.sleep(0.5)
            await _stream(session, url, -1, 3)
        body = {"model": "tokenstamp-sim", "messages": [{"role": "user", "content": "x"}]}
        # A streams' tenant: the scrape holds a zero gap series for every label set it saw
        # (the child is made at the request's start), OTLP only those that had a gap.
        team = {"X-Tenant": "team-0"}
        async with session.post(url + "/v1/chat/completions", json=body, headers=team) as resp:
            assert resp.status == 200
        async with session.post(url + "/v1/chat/completions", data=b"not json") as resp:
            await resp.read()
        assert proxy.stalls is not None
        if settle_s:
            await asyncio.sleep(settle_s)
            proxy.stalls.flush(time.monotonic_ns())
        else:
            proxy.stalls.flush(time.monotonic_ns() + 10 * 10**9)  # every stall and prefill final
        async with session.get(proxy.admin_url + "/metrics") as resp:
            return await resp.text()


@pytest.fixture
async def simulator_url(aiohttp_server) -> str:
    return await start_simulator(aiohttp_server, "seed")


def config(upstream: str, **overrides: Any) -> ProxyConfig:
    return replace(simulator_proxy_config(upstream), slo_ttft_s=0.5, **overrides)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("tenants", "aggregation"),
    [((), names.HistogramAggregation.EXPLICIT), (("x-tenant",), names.HistogramAggregation.EXPLICIT),
     ((), names.HistogramAggregation.EXPONENTIAL)],
    ids=["no-tenants", "tenants", "exponential"],
)  # fmt: skip
async def test_in_memory_metrics_equal_the_prometheus_scrape(simulator_url, tenants, aggregation):
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader], views=histogram_views(aggregation))
    proxy = await start_proxy(
        config(simulator_url, tenant_headers=tenants),
        registry=CollectorRegistry(),
        meter_provider=provider,
    )
    try:
        scraped = await drive(proxy)
        data = reader.get_metrics_data()
    finally:
        await proxy.close(drain_timeout_s=1.0)
        provider.shutdown()
    assert data is not None
    seen = check_same_as_scrape(encode_metrics(data), scraped, aggregation)
    # Everything this traffic can produce was produced (the stall path included).
    assert seen >= {
        names.TTFT.name, names.TPOT.name, names.GAP.name, names.DURATION.name,
        names.TOKEN_USAGE.name, names.MAX_GAP.name, names.REQUESTS.name, names.SLO_REQUESTS.name,
        names.UNOBSERVED.name, names.STREAMS_ACTIVE.name, names.STALLS.name,
        names.STALL_DURATION.name, names.STALLED_STREAMS.name, names.STUTTER_COST.name,
    }  # fmt: skip
    assert (names.TENANTS_OVERFLOW.name in seen) == bool(tenants)
    assert ('tokenstamp_tenant="team-1"' in scraped) == bool(tenants)

"""Every dashboard query and rule on native histograms, in a real Prometheus 2.42.

Prometheus 2.42 (Debian 12's) has native histograms behind
``--enable-feature=native-histograms``, but ``promtool test rules`` cannot write
them as input series, and the proxy's own ``/metrics`` serves classic buckets.
So the native histograms come the way an OTLP pipeline delivers them: the
proxy (simulator behind it, ``--otlp-endpoint`` set, histograms exponential by
default) exports to an in-test OTLP/HTTP collector after each of two waves of
traffic; each export is translated as Prometheus's OTLP receiver does
(``tests.otlp_prometheus``) and remote-written, timestamped a minute apart, into
a Prometheus holding the recording and alerting rules. It holds no classic
``_bucket``, ``_sum`` or ``_count`` series at all, so a query that read only
those would come back empty.

Then: every dashboard query and every rule evaluates; the panels that must have
data have it; percentiles are within one exponential bucket of the exact
observations of the second wave (kept by a raw-recording sink), shares above a
target between the exact shares above the edges of the bucket that holds it,
and sums exact. Last, the same traffic's classic series (the scrapes) are
written beside the native ones, as a Prometheus scraping both encodings holds
them: the panels must not change (a group with both is read native, not
dropped, and not counted twice).

The second test is the scrape itself: where the proxy's ``/metrics`` serves
Prometheus's protobuf exposition with native buckets, a Prometheus 2.42 with
native histograms on scrapes it, keeps only the native series, and every query
and rule must work there too.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping
from typing import Any

import aiohttp
import pytest
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from dashboards import build, rules
from dashboards.config import Config
from exporters import names
from exporters.fanout import Fanout
from exporters.otel import OtelMetricsSink
from exporters.prometheus import PrometheusSink
from proxy.edge.server import start_proxy
from tests.dashboards.test_dashboards_e2e_functional import (
    DASHBOARDS,
    MUST_HAVE_DATA,
    VARIABLES,
    _dashboard_queries,
    _has_value,
)
from tests.exporters.test_otel_metrics_functional import config, drive
from tests.otlp_prometheus import Labels, RawMeterProvider, metrics, relative_error, write_batch
from tests.promserver import PrometheusServer
from tests.remotewrite import WriteBatch, remote_write
from tests.stallkit import start_simulator

pytestmark = pytest.mark.prometheus

#: The two exports' timestamps, seconds before the queries; the rate window spans both.
AGES_S = (100, 20)
WINDOW = "3m"
NATIVE = (("job", "tokenstamp"), ("instance", "native"))
CLASSIC = (("job", "tokenstamp"), ("instance", "classic"))
LATENCY = "tokenstamp-serving-latency.json"
#: What Prometheus with native histograms on asks a target for first.
PROTOBUF = (
    "application/vnd.google.protobuf;proto=io.prometheus.client.MetricFamily;"
    "encoding=delimited;q=1,text/plain;version=0.0.4;q=0.5"
)


@pytest.fixture
async def simulator_url(aiohttp_server) -> str:
    return await start_simulator(aiohttp_server, "seed")


def _classic(scraped: str, timestamp_ms: int) -> WriteBatch:
    """A scrape's samples (``_created`` left out) as remote-write float samples."""
    batch = WriteBatch()
    for family in text_string_to_metric_families(scraped):
        for s in family.samples:
            if not s.name.endswith("_created"):
                series = {"__name__": s.name, **s.labels, **dict(CLASSIC)}
                batch.sample(series, s.value, timestamp_ms)
    return batch


def _values(prom_samples: list[dict[str, Any]]) -> list[float]:
    """The samples' values; a native histogram's (a heatmap's) is its count."""
    return [
        float(x["value"][1]) if "value" in x else float(x["histogram"][1]["count"])
        for x in prom_samples
    ]


async def _panels(prom: PrometheusServer) -> dict[tuple[str, str, int], list[float]]:
    """Every dashboard query's values (by dashboard, panel, query index); raises on an error."""
    out: dict[tuple[str, str, int], list[float]] = {}
    variables = {**VARIABLES, "$__rate_interval": WINDOW, "$__range": WINDOW}
    for name, title, expr in _dashboard_queries(variables):
        key = (name, title, sum(k[:2] == (name, title) for k in out))
        out[key] = _values(await prom.query(expr))
    return out


def _second_wave(raw: RawMeterProvider, before: Mapping[tuple[str, Labels], int], inst: str):
    """The exact observations of ``inst`` in the second wave, all label sets together."""
    return sorted(
        v
        for (name, labels), values in raw.values.items()
        if name == inst
        for v in values[before.get((name, labels), 0) :]
    )


def _coarsest_error(exports: list[ExportMetricsServiceRequest], inst: str) -> float:
    """The widest relative bucket of ``inst`` in either export (the rate's resolution)."""
    return max(
        relative_error(p)
        for request in exports
        for metric in metrics(request)
        if metric.name == inst
        for p in metric.exponential_histogram.data_points
    )


def _share_above(values: list[float], bound: float) -> float:
    return sum(v > bound for v in values) / len(values)


def _check_must_have_data(panels: Mapping[tuple[str, str, int], list[float]]) -> None:
    by_panel: dict[tuple[str, str], list[float]] = {}
    for (name, title, _), values in panels.items():
        by_panel.setdefault((name, title), []).extend(values)
    empty = [key for key in MUST_HAVE_DATA if not _has_value(
        [{"value": [0, str(v)]} for v in by_panel.get(key, [])])]  # fmt: skip
    assert not empty, f"panels without data on native histograms: {empty}"


async def _check_rules(prom: PrometheusServer) -> None:
    for template in (rules.TTFT_ERRORS, rules.TPOT_ERRORS, rules.STUTTER_RATE):
        await prom.wait_for(rules.record_name(template, "5m"), bool, timeout_s=30)
    groups = (await prom.api("rules"))["groups"]
    broken = [(r["name"], r.get("lastError")) for g in groups for r in g["rules"]
              if r.get("health") == "err"]  # fmt: skip
    assert not broken, broken


@pytest.mark.timeout(120)
async def test_every_dashboard_query_and_rule_on_native_histograms(simulator_url, collector):
    cfg = config(simulator_url, otlp_endpoint=collector.url)
    registry = CollectorRegistry()
    prom_sink = PrometheusSink(registry)
    prom_sink.slo_ttft_s, prom_sink.slo_tpot_s = cfg.slo_ttft_s, cfg.slo_tpot_s
    raw = RawMeterProvider()
    sink = Fanout(prom_sink, OtelMetricsSink(raw))  # type: ignore[arg-type]
    proxy = await start_proxy(cfg, registry=registry, sink=sink)
    telemetry = proxy.telemetry
    assert telemetry is not None
    assert telemetry.histograms is names.HistogramAggregation.EXPONENTIAL  # the default
    exports: list[ExportMetricsServiceRequest] = []
    scrapes: list[str] = []
    try:
        for wave in range(2):
            scrapes.append(await drive(proxy, settle_s=2.5))
            assert await telemetry.flush()
            exports.append(collector.metrics[-1])
            if wave == 0:
                before = {key: len(values) for key, values in raw.values.items()}
    finally:
        await proxy.close(drain_timeout_s=1.0)
    kinds = {m.WhichOneof("data") for m in metrics(exports[-1])}
    assert "exponential_histogram" in kinds
    assert "histogram" not in kinds

    rule_files = [DASHBOARDS / build.RECORDING_FILE, DASHBOARDS / build.ALERTS_FILE]
    flags = ["--enable-feature=native-histograms", "--web.enable-remote-write-receiver"]
    async with PrometheusServer({}, rule_files=rule_files, extra_args=flags) as prom:
        now_ms = int(time.time() * 1000)
        stamps = [now_ms - age * 1000 for age in AGES_S]
        write_url = prom.url + "/api/v1/write"
        waves = list(zip(exports, scrapes, stamps, strict=True))
        await remote_write(write_url, [write_batch([e], t, NATIVE) for e, _, t in waves])
        assert await prom.query(f'{names.TTFT.prom_name}_count{{job="tokenstamp"}}') == []
        assert await prom.query(f'{names.TTFT.prom_name}{{job="tokenstamp"}}')  # native only

        native = await _panels(prom)
        _check_must_have_data(native)
        await _check_rules(prom)

        # Percentiles: within one bucket of the second wave's exact observations.
        ttft = _second_wave(raw, before, names.TTFT.name)
        error = _coarsest_error(exports, names.TTFT.name)
        assert error <= 2 ** (2**-4) - 1  # 5 %: scale 4 or finer
        for i, q in enumerate((0.5, 0.9, 0.99)):
            (got,) = native[(LATENCY, "TTFT p50 / p90 / p99", i)]
            truth = ttft[math.ceil(q * len(ttft)) - 1]
            assert abs(got - truth) <= error * truth, (q, got, truth)
        # A share above a target: between the exact shares above its bucket's edges.
        tpot = _second_wave(raw, before, names.TPOT.name)
        target = Config().tpot_target_s
        err = _coarsest_error(exports, names.TPOT.name)
        record = rules.record_name(rules.TPOT_ERRORS, "5m")
        (got,) = _values(await prom.wait_for(record, bool, timeout_s=30))
        low, high = _share_above(tpot, target * (1 + err)), _share_above(tpot, target / (1 + err))
        assert low <= got <= high
        # 2 s, a power of two, is a bucket boundary at every scale: exact.
        (got,) = native[(LATENCY, "TTFT SLO misses", 0)]
        assert got == pytest.approx(_share_above(ttft, Config().ttft_target_s))
        # Sums are exact (the rate's extrapolation cancels in a ratio).
        durations = _second_wave(raw, before, names.DURATION.name)
        (got,) = native[(LATENCY, "Decode share of request time", 0)]
        assert got == pytest.approx(1 - sum(ttft) / sum(durations), rel=1e-6)

        await prom.wait_for(rules.record_name(rules.ANSWER_TTFT_ERRORS, "5m"), bool)
        # Every stall here has a culprit, so the unattributed stall seconds record nothing:
        # the same rule on the prefill stalls reads the native sum.
        recording = {r["record"]: r["expr"] for g in rules.recording_groups(Config())
                     for r in g["rules"]}  # fmt: skip
        unattributed = recording[rules.record_name(rules.UNATTRIBUTED_RATE, "5m")]
        (got,) = _values(await prom.query(unattributed.replace('"unattributed"', '"prefill"')))
        assert got > 0

        # Both encodings of the same traffic: each group is read native, as before.
        await remote_write(write_url, [_classic(text, t) for _, text, t in waves])
        assert await prom.query(f'{names.TTFT.prom_name}_count{{job="tokenstamp"}}')
        both = await _panels(prom)
        for title in ("TTFT p50 / p90 / p99", "TTFT SLO misses", "Decode share of request time",
                      "Worst gap per stream", "TTFT distribution"):  # fmt: skip
            keys = [k for k in native if k[:2] == (LATENCY, title)]
            assert keys, title
            for key in keys:
                assert both[key] == pytest.approx(native[key]), key


async def _serves_native(admin_url: str) -> bool:
    """The admin listener answers Prometheus's protobuf exposition (native buckets)."""
    async with aiohttp.ClientSession() as session:
        async with session.get(admin_url + "/metrics", headers={"Accept": PROTOBUF}) as resp:
            await resp.read()
            return resp.content_type == "application/vnd.google.protobuf"


@pytest.mark.timeout(120)
async def test_every_dashboard_query_and_rule_on_scraped_native_histograms(simulator_url):
    """A Prometheus 2.42 with native histograms on scrapes the proxy's protobuf exposition:
    it keeps the native histograms and none of their classic series (2.42 cannot keep
    both), and every panel and rule still works. Skipped while ``/metrics`` serves text only."""
    proxy = await start_proxy(config(simulator_url), registry=CollectorRegistry())
    try:
        if not await _serves_native(proxy.admin_url):
            pytest.skip("this build's /metrics has no protobuf exposition (native buckets)")
        rule_files = [DASHBOARDS / build.RECORDING_FILE, DASHBOARDS / build.ALERTS_FILE]
        target = {"tokenstamp": [proxy.admin_url.removeprefix("http://")]}
        flags = ["--enable-feature=native-histograms"]
        async with PrometheusServer(target, rule_files=rule_files, extra_args=flags) as prom:
            await prom.scraped("tokenstamp")
            for _ in range(2):  # the first wave makes the series, the second moves them
                await drive(proxy, settle_s=2.5)
            await asyncio.sleep(2)  # two more scrapes
            assert await prom.query(f'{names.TTFT.prom_name}{{job="tokenstamp"}}')
            assert await prom.query(f'{names.TTFT.prom_name}_count{{job="tokenstamp"}}') == []
            _check_must_have_data(await _panels(prom))
            await _check_rules(prom)
    finally:
        await proxy.close(drain_timeout_s=1.0)

"""A real Prometheus reads the native histograms: its quantiles within 5% of the exact ones.

The simulator behind the proxy serves 120 streamed requests of varied prompt
sizes and lengths, arriving over a few seconds so TTFT, gaps, TPOT and
duration spread. A recording sink keeps every value the proxy observed, so the
exact quantiles are known. Two Prometheus servers scrape the proxy: one with
``--enable-feature=native-histograms`` (it asks for the protobuf exposition
first and stores the native histograms), one without (text, classic buckets).

The exact quantile is the one a histogram estimates: ``histogram_quantile(q, h)``
looks for the observation of rank ``q * count`` and returns a value inside the
bucket that holds it, so the exact figure is the ``ceil(q * n)``-th smallest
value (the nearest-rank definition). Native buckets of schema 4 or finer are at
most 4.4% wide, so the native estimate must be within 5% of it; the classic
estimate is printed beside it for the record.
"""

from __future__ import annotations

import asyncio
import math
import random

import aiohttp
import pytest
from prometheus_client import CollectorRegistry

from exporters.fast_histogram import HistogramFamily
from exporters.prometheus import PrometheusSink
from proxy.edge.server import start_proxy
from tests.promserver import PrometheusServer
from tests.stallkit import RecordingSink, simulator_proxy_config, start_simulator

pytestmark = pytest.mark.prometheus

REQUESTS = 120
QUANTILES = (0.5, 0.9, 0.99)
TOLERANCE = 0.05
FAMILIES = {
    "TTFT": "gen_ai_server_time_to_first_token_seconds",
    "gap": "gen_ai_client_operation_time_per_output_chunk_seconds",
    "TPOT": "gen_ai_server_time_per_output_token_seconds",
    "duration": "gen_ai_server_request_duration_seconds",
}


def exact_quantile(values: list[float], q: float) -> float:
    """The ``ceil(q * n)``-th smallest value: the observation ``histogram_quantile`` aims at."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


async def _load(url: str) -> None:
    """120 streams, arriving over ~6 s, prompts of 30 to 3,000 tokens, 6 to 48 tokens out."""
    rng = random.Random(29)
    log_prompt = (math.log(30), math.log(3000))
    plan = [
        (
            i * 0.05 + rng.uniform(0, 0.05),
            round(math.exp(rng.uniform(*log_prompt))),
            rng.randint(6, 48),
        )
        for i in range(REQUESTS)
    ]

    async def one(session: aiohttp.ClientSession, delay: float, prompt: int, out: int) -> None:
        await asyncio.sleep(delay)
        body = {
            "model": "tokenstamp-sim",
            "messages": [{"role": "user", "content": "native histograms"}],
            "stream": True,
            "max_tokens": out,
            "sim_prompt_tokens": prompt,
        }
        async with session.post(url + "/v1/chat/completions", json=body) as resp:
            assert resp.status == 200
            await resp.read()

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(*(one(session, *p) for p in plan))


def _exact_values(tee: RecordingSink) -> dict[str, list[float]]:
    records = list(tee.requests.values())
    return {
        "TTFT": list(tee.first_tokens.values()),
        "gap": [g for gaps in tee.gaps.values() for g in gaps],
        "TPOT": [t for r in records for t in r.stream_tpots_s],
        "duration": [r.duration_s for r in records],
    }


async def _one_value(prom: PrometheusServer, expr: str) -> float:
    (sample,) = await prom.query(expr)
    return float(sample["value"][1])


@pytest.mark.timeout(120)
async def test_native_quantiles_within_5_percent_of_exact(aiohttp_server):
    sim_url = await start_simulator(aiohttp_server, "seed")
    registry = CollectorRegistry()
    tee = RecordingSink(PrometheusSink(registry))
    proxy = await start_proxy(simulator_proxy_config(sim_url), registry=registry, sink=tee)
    target = proxy.admin_url.removeprefix("http://")
    try:
        async with (
            PrometheusServer({"tokenstamp": [target]}, features=["native-histograms"]) as native,
            PrometheusServer({"tokenstamp": [target]}) as classic,
        ):
            await native.scraped("tokenstamp")
            await classic.scraped("tokenstamp")
            await _load(proxy.url)
            exact = _exact_values(tee)
            assert len(exact["TTFT"]) == len(exact["duration"]) == REQUESTS
            for label, family in FAMILIES.items():
                n = len(exact[label])
                await native.wait_for(
                    f"histogram_count(sum({family}))", lambda r, n=n: r and float(r[0]["value"][1]) == n
                )  # fmt: skip
                await classic.wait_for(
                    f"sum({family}_count)", lambda r, n=n: r and float(r[0]["value"][1]) == n
                )  # fmt: skip
            # Prometheus 2.42 keeps only the native series of a histogram it scraped native.
            assert await native.query(f"{FAMILIES['TTFT']}_bucket") == []
            rows = []
            for label, family in FAMILIES.items():
                for q in QUANTILES:
                    want = exact_quantile(exact[label], q)
                    got = await _one_value(native, f"histogram_quantile({q}, sum({family}))")
                    old = await _one_value(
                        classic, f"histogram_quantile({q}, sum by (le) ({family}_bucket))"
                    )
                    rows.append((label, q, len(exact[label]), want, got, old))
            schemas = {
                m.name: sorted({c.schema for _, c in m.children})
                for m in registry.collect()
                if isinstance(m, HistogramFamily) and m.name in FAMILIES.values()
            }
    finally:
        await proxy.close(drain_timeout_s=1.0)
    print(f"\nnative schemas in use: {schemas}")
    print("metric    q     n      exact     native    error   classic    error")
    for label, q, n, want, got, old in rows:
        print(
            f"{label:8s} {q:4.2f} {n:5d} {want:9.4f} {got:9.4f} {got / want - 1:+7.1%} "
            f"{old:9.4f} {old / want - 1:+7.1%}"
        )
    bad = [r for r in rows if abs(r[4] / r[3] - 1) > TOLERANCE]
    assert bad == []

"""The advisor's gauges through a real Prometheus, read by the dashboard row that draws them.

The simulator (a random cost profile) behind the proxy; a real Prometheus
scrapes the proxy's ``/metrics`` every second; after the fit workload, every
query of the "The trade on this backend" row of the committed dashboard
returns data, and the gauges equal the fit ``/advice`` reports.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from tests.promserver import PrometheusServer
from tests.proxy.advisor.advisorkit import (
    fit_workload,
    get_advice,
    random_profile,
    start_proxy_for,
    start_sim,
)

DASHBOARD = (
    Path(__file__).resolve().parents[3] / "dashboards/grafana/tokenstamp-prefill-stutter.json"
)
ROW = "The trade on this backend"


def _row_queries() -> dict[str, list[str]]:
    """Panel title -> its PromQL, for the panels of ``ROW`` (variables filled in)."""
    panels = json.loads(DASHBOARD.read_text(encoding="utf-8"))["panels"]
    start = next(i for i, p in enumerate(panels) if p["type"] == "row" and p["title"] == ROW)
    out: dict[str, list[str]] = {}
    for panel in panels[start + 1 :]:
        if panel["type"] == "row":
            break
        out[panel["title"]] = [t["expr"].replace("$backend", ".*") for t in panel["targets"]]
    return out


@pytest.mark.timeout(60)
async def test_the_trade_row_shows_the_fitted_model(aiohttp_server):
    queries = _row_queries()
    assert len(queries) == 4
    rng = random.Random(random.SystemRandom().randrange(10**6))
    profile = random_profile(rng)
    sim_url = await start_sim(aiohttp_server, profile)
    proxy, _ = await start_proxy_for(sim_url)
    admin = proxy.admin_url.removeprefix("http://")
    try:
        async with PrometheusServer({"tokenstamp": [admin]}, interval="1s") as prom:
            await prom.scraped("tokenstamp")
            await fit_workload(proxy.url, profile.cost.decode_s(8), [4200, 5600, 3100])
            (backend,) = (await get_advice(proxy.admin_url))["backends"]
            fit = backend["fit"]
            assert fit["chunked"] is True, backend["missing"]
            # The fit of a backend with no new traffic stays; wait for its first scrape.
            rate = queries["Fitted prefill throughput"][0]
            want = fit["prefill_tokens_per_s"]
            await prom.wait_for(
                rate, lambda r: bool(r) and float(r[0]["value"][1]) == pytest.approx(want)
            )
            results = {
                title: [await prom.query(q) for q in exprs] for title, exprs in queries.items()
            }
            # Not drawn in the row: the fixed cost per prefill step (0 on the simulator).
            step_samples = await prom.query("tokenstamp_backend_prefill_step_seconds")
    finally:
        await proxy.close(drain_timeout_s=1.0)

    def value(title: str, i: int = 0) -> float:
        (sample,) = results[title][i]
        assert sample["metric"] == {"server_address": "sim"}
        return float(sample["value"][1])

    assert value("Chunk size in use") == fit["chunk_size"]
    assert value("Fitted prefill throughput") == pytest.approx(fit["prefill_tokens_per_s"])
    base, per_stream = fit["decode_step_s"]["base"], fit["decode_step_s"]["per_stream"]
    assert value("Fitted decode step", 0) == pytest.approx(base)
    assert value("Fitted decode step", 1) == pytest.approx(per_stream)
    step, with_chunk = (
        value("Step now, and with one chunk of prefill", 0),
        value("Step now, and with one chunk of prefill", 1),
    )
    assert step == pytest.approx(base)  # no stream open any more
    assert with_chunk == pytest.approx(base + fit["chunk_size"] / fit["prefill_tokens_per_s"])
    (step_sample,) = step_samples
    assert step_sample["metric"]["server_address"] == "sim"
    assert float(step_sample["value"][1]) == pytest.approx(fit["prefill_step_s"], abs=1e-12)

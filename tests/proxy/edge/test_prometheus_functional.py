"""A real Prometheus scrapes the proxy; PromQL over the histograms returns what was sent."""

from __future__ import annotations

import asyncio
import json

import aiohttp
from aiohttp import web

from tests.promserver import PrometheusServer


async def stream(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await asyncio.sleep(0.05)  # prefill
    for i in range(5):
        chunk = {"id": "c", "model": "m", "choices": [{"index": 0, "delta": {"content": f"{i}"}}]}
        await resp.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        await asyncio.sleep(0.02)
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def test_promql_over_ttft_histogram(aiohttp_server, proxy_factory):
    app = web.Application()
    app.router.add_post("/v1/chat/completions", stream)
    server = await aiohttp_server(app)
    p = await proxy_factory(str(server.make_url("")).rstrip("/"))
    target = p.admin_url.removeprefix("http://")
    async with PrometheusServer({"tokenstamp": [target]}) as prom:
        await prom.scraped("tokenstamp")
        async with aiohttp.ClientSession() as s:

            async def one(model: str) -> None:
                async with s.post(p.url + "/v1/chat/completions",
                                  json={"model": model, "stream": True, "messages": []}) as r:  # fmt: skip
                    await r.read()

            await asyncio.gather(*(one("m") for _ in range(6)), *(one("n") for _ in range(2)))
        total = 'sum(gen_ai_server_time_to_first_token_seconds_count{job="tokenstamp"})'
        await prom.wait_for(total, lambda r: r and float(r[0]["value"][1]) == 8)
        by_model = await prom.query(
            "sum by (gen_ai_request_model) (gen_ai_server_time_to_first_token_seconds_count)"
        )
        assert {r["metric"]["gen_ai_request_model"]: r["value"][1] for r in by_model} == {
            "m": "6",
            "n": "2",
        }
        # Every TTFT was >= 50 ms and, on an idle loopback, well under 2.5 s.
        below = await prom.query('sum(gen_ai_server_time_to_first_token_seconds_bucket{le="0.04"})')
        assert float(below[0]["value"][1]) == 0
        q = await prom.query(
            "histogram_quantile(0.5, sum by (le) "
            "(gen_ai_client_operation_time_per_output_chunk_seconds_bucket))"
        )
        assert 0.01 <= float(q[0]["value"][1]) <= 0.1
        gaps = await prom.query("sum(gen_ai_client_operation_time_per_output_chunk_seconds_count)")
        assert float(gaps[0]["value"][1]) == 8 * 4

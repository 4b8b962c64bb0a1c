"""The demo's reasoning model, end to end: simulator -> proxy -> client, the proxy's figures
beside the engine's own record, the table, the picture; and n > 1 choices through the proxy.

Tolerances: the engine counts from the request's arrival at the engine, the proxy from its
own arrival, so the proxy's waits are the engine's plus delivery (the request's trip through
the proxy, the simulator writing and the proxy reading a token). ``DELIVERY_S`` is generous:
two shared cores, every process of the run waking for the same step's tokens.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from openai import AsyncOpenAI
from prometheus_client import CollectorRegistry

from demo.reasoning import REQUESTS, run_reasoning
from demo.recording import RecordingSink
from demo.report import render_reasoning
from proxy.config import HostPort, ProxyConfig
from proxy.edge.server import start_proxy
from simulator.cost import CostModel
from simulator.engine import EngineConfig
from simulator.profile import Profile
from simulator.records import FinishRecord, TokenRecord
from simulator.server import ENGINE_KEY, create_app

DELIVERY_S = 0.05
"""Most the proxy's stamps may trail the engine's (see the module's docstring)."""


def later_by_delivery(proxy: float | None, engine: float | None) -> bool:
    if proxy is None or engine is None:
        return proxy is None and engine is None
    return 0 <= proxy - engine <= DELIVERY_S


def same_within_delivery(proxy: float | None, engine: float | None) -> bool:
    if proxy is None or engine is None:
        return proxy is None and engine is None
    return abs(proxy - engine) <= DELIVERY_S


@pytest.mark.timeout(60)
async def test_reasoning_table_measured_by_the_proxy_beside_the_engine(tmp_path: Path):
    results = await run_reasoning(out=tmp_path)
    rows = {q["request_id"]: q for q in results["requests"]}
    assert list(rows) == [rid for rid, _, _ in REQUESTS]
    for rid, q in rows.items():
        p, e = q["proxy"], q["engine"]
        assert later_by_delivery(p["ttft_s"], e["ttft_s"]), (rid, p, e)
        assert later_by_delivery(p["answer_ttft_s"], e["answer_ttft_s"]), (rid, p, e)
        assert same_within_delivery(p["reasoning_s"], e["reasoning_s"]), (rid, p, e)
        assert p["reasoning_tokens"] == (e["reasoning_tokens"] or None), (rid, p, e)
        assert p["output_tokens"] == e["output_tokens"], (rid, p, e)

    default = rows["reasoning-default"]
    assert default["engine"]["reasoning_tokens"] == results["model_reasoning_tokens"]
    # A user of a reasoning model waits far longer than the TTFT says.
    assert default["proxy"]["answer_ttft_s"] > 10 * default["proxy"]["ttft_s"]
    cut = rows["reasoning-cut-off"]["proxy"]
    assert cut["answer_ttft_s"] is None  # max_tokens ran out while it reasoned
    assert cut["reasoning_tokens"] == 48
    none = rows["reasoning-none"]["proxy"]
    assert none["answer_ttft_s"] == none["ttft_s"]
    assert none["reasoning_s"] is None
    tool = rows["reasoning-tool"]["proxy"]
    assert tool["tool_call_ttft_s"] == tool["answer_ttft_s"]

    table = render_reasoning(results)
    assert "first answer token" in table
    assert "reasoning tokens" in table
    for _, label, _ in REQUESTS:
        assert label in table

    data, png = await asyncio.to_thread(read_pictures, results["pictures"])
    streams = {s["id"]: s for s in data["backends"][0]["streams"]}
    assert streams["reasoning-default"]["reasoning_us"] is not None
    assert streams["reasoning-default"]["answer_us"] > streams["reasoning-default"]["reasoning_us"]
    assert streams["reasoning-none"]["reasoning_us"] is None
    if png is not None:
        assert png[:8] == b"\x89PNG\r\n\x1a\n"


def read_pictures(pictures: dict[str, str | None]) -> tuple[dict, bytes | None]:
    """The data inlined in the run's HTML page, and the PNG's bytes (None without matplotlib)."""
    assert pictures["html"] is not None
    html = Path(pictures["html"]).read_text(encoding="utf-8")
    data = json.loads(
        html.split('<script id="timeline-data" type="application/json">')[1]
        .split("</script>")[0]
        .replace("<\\/", "</")
    )
    return data, None if pictures["png"] is None else Path(pictures["png"]).read_bytes()


STEP_S = 0.010
STEPPED = CostModel(decode_base_s=STEP_S, decode_per_seq_s=0.0, prefill_s_per_token=0.000001)


@pytest.mark.timeout(30)
async def test_n_choices_through_the_proxy_are_timed_per_choice(aiohttp_server):
    upstream = await aiohttp_server(create_app(EngineConfig(Profile("n", STEPPED))))
    engine = upstream.app[ENGINE_KEY]
    registry = CollectorRegistry()
    sink = RecordingSink(registry)
    config = ProxyConfig(
        upstream=str(upstream.make_url("")).rstrip("/"),
        listen=HostPort("127.0.0.1", 0),
        admin=HostPort("127.0.0.1", 0),
        backend_name="simulator",
        provider="tokenstamp-sim",
    )
    proxy = await start_proxy(config, registry=registry, sink=sink)
    try:
        async with AsyncOpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0) as client:
            stream = await client.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "x"}], stream=True, n=3,
                max_tokens=6, stream_options={"include_usage": True},
                extra_body={"sim_reasoning_tokens": 2},
                extra_headers={"X-Request-Id": "three-choices"},
            )  # fmt: skip
            chunks = [c async for c in stream]
    finally:
        await proxy.close(drain_timeout_s=2.0)
    # The client gets the simulator's interleaving, untouched.
    indexes = [c.choices[0].index for c in chunks if c.choices]
    assert indexes == [0, 1, 2] * 7
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 18

    truth = list(engine.ground_truth)
    [finish] = [r for r in truth if isinstance(r, FinishRecord)]
    emits = sorted({r.emit_ns for r in truth if isinstance(r, TokenRecord)})
    record = sink.records["three-choices"]
    assert record.reasoning_tokens == finish.reasoning_tokens == 6
    assert record.first_reasoning_ns is not None
    assert record.first_answer_ns is not None
    assert finish.first_answer_ns is not None
    assert same_within_delivery(record.reasoning_s, (finish.first_answer_ns - emits[0]) / 1e9)
    # Per choice: six events each, a step apart, not three times as many gaps a third as long.
    assert sorted(c.choice for c in record.choices) == [0, 1, 2]
    for choice in record.choices:
        assert choice.events == 6
        assert choice.gap_count == 5
    engine_tpot_s = (emits[-1] - emits[0]) / 1e9 / 5
    assert record.tpot_s is not None
    assert abs(record.tpot_s - engine_tpot_s) <= DELIVERY_S / 5, (record.tpot_s, engine_tpot_s)

"""The techniques over real sockets: what a client and the ground truth see."""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from simulator.cost import CostModel
from simulator.engine import EngineConfig
from simulator.profile import Profile
from simulator.records import PrefillRecord, StepRecord, records_from_jsonl
from simulator.server import ENGINE_KEY, create_app
from simulator.techniques import Disaggregated, KvBudget, Speculative, StaticBatching, Techniques

QUICK = CostModel(decode_base_s=0.002, decode_per_seq_s=0.00001, prefill_s_per_token=0.000001)


@pytest.fixture
def make_sim(aiohttp_server):
    async def make(techniques: Techniques, **config):
        profile = Profile("test", QUICK, output_tokens=8, techniques=techniques)
        server = await aiohttp_server(create_app(EngineConfig(profile, **config)))
        return str(server.make_url("")).rstrip("/"), server.app[ENGINE_KEY]

    return make


async def stream(session: aiohttp.ClientSession, url: str, rid: str, max_tokens: int) -> list:
    body = {
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": max_tokens,
        "stream_options": {"include_usage": True},
        "sim_prompt_tokens": 50,
    }
    events = []
    async with session.post(
        url + "/v1/chat/completions", json=body, headers={"X-Request-Id": rid}
    ) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: {"):
                events.append(json.loads(line[6:]))
    return events


async def ground_truth(session: aiohttp.ClientSession, url: str) -> list:
    async with session.get(url + "/sim/ground_truth") as r:
        return records_from_jsonl(await r.text())


async def test_speculative_tokens_of_one_step_arrive_in_one_chunk(make_sim):
    url, _ = await make_sim(Techniques(speculative=Speculative(acceptance_rate=0.8, seed=3)))
    async with aiohttp.ClientSession() as session:
        events = await stream(session, url, "spec", 40)
        records = await ground_truth(session, url)
    content = [e["choices"][0]["delta"]["content"] for e in events if e["choices"]][1:]
    assert "".join(content) == "".join(f" tok{i}" for i in range(40))
    assert events[-1]["usage"]["completion_tokens"] == 40
    # 1 + accepted tokens per step: far fewer events than tokens, and just as many as steps.
    steps = [r for r in records if isinstance(r, StepRecord)]
    assert len(content) == len(steps) < 25
    assert sum(s.accepted_tokens for s in steps) == 40 - len(steps)


async def test_disaggregated_pools_and_the_kv_transfer_in_the_ground_truth(make_sim):
    transfer = Disaggregated(kv_transfer_s_per_token=0.0001)  # 5 ms for a 50-token prompt
    url, _ = await make_sim(Techniques(disaggregated=transfer))
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(*(stream(session, url, f"r{i}", 6) for i in range(3)))
        records = await ground_truth(session, url)
    assert all(events[-1]["usage"]["completion_tokens"] == 6 for events in results)
    steps = [r for r in records if isinstance(r, StepRecord)]
    assert {s.pool for s in steps} == {"prefill", "decode"}
    assert all(s.prefill_tokens == 0 for s in steps if s.pool == "decode")
    assert all(s.decode_batch == 0 for s in steps if s.pool == "prefill")
    prefills = [r for r in records if isinstance(r, PrefillRecord)]
    assert [p.transfer_s for p in prefills] == pytest.approx([0.005] * 3)
    # The prefill pool's step: the prompt, then its KV sent (the first token comes with it).
    durations = [s.duration_s for s in steps if s.pool == "prefill"]
    assert durations == pytest.approx([QUICK.step_s(0, 50) + 0.005] * 3)


async def test_static_batching_prefills_the_batch_together(make_sim):
    url, engine = await make_sim(Techniques(static_batching=StaticBatching(fill_s=0.05)))
    async with aiohttp.ClientSession() as session:
        first = asyncio.gather(*(stream(session, url, f"a{i}", 20) for i in range(3)))
        await asyncio.sleep(0.1)  # the first batch is running; this one must wait for it
        late = await stream(session, url, "late", 2)
        await first
        records = await ground_truth(session, url)
    assert late[-1]["usage"]["completion_tokens"] == 2
    steps = sorted((r for r in records if isinstance(r, StepRecord)), key=lambda s: s.step)
    prefilling = [s for s in steps if s.prefill_tokens]
    assert [sorted(s.prefill_x_request_ids) for s in prefilling] == [["a0", "a1", "a2"], ["late"]]
    # The late request was admitted only once the whole first batch was done.
    first_batch_end = max(s.end_ns for s in steps if s.step < prefilling[1].step)
    assert prefilling[1].start_ns >= first_batch_end
    assert engine.num_running == 0


async def test_kv_budget_queues_what_does_not_fit(make_sim):
    budget = KvBudget(capacity_tokens=4096, tokens_per_seq=2048)
    url, _ = await make_sim(Techniques(kv_budget=budget))
    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(stream(session, url, f"r{i}", 10) for i in range(4)))
        records = await ground_truth(session, url)
    steps = [r for r in records if isinstance(r, StepRecord)]
    assert max(s.running for s in steps) == 2
    assert max(s.kv_tokens_used for s in steps) == 4096
    assert any(s.running == 2 and s.waiting == 2 for s in steps)

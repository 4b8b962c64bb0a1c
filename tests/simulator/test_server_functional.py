"""The simulator over real sockets: OpenAI SDK and raw clients, ground truth, timing, aborts."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import time
from collections import defaultdict
from dataclasses import replace
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI, BadRequestError

from simulator.cost import CostModel, predict_seed_stutter
from simulator.engine import EngineConfig
from simulator.profile import Profile
from simulator.server import ENGINE_KEY, create_app

# Fast enough for tests, slow enough that a stall stands out from scheduling noise.
TIMING = CostModel(decode_base_s=0.010, decode_per_seq_s=0.00025, prefill_s_per_token=0.000025)
QUICK = CostModel(decode_base_s=0.002, decode_per_seq_s=0.00001, prefill_s_per_token=0.000001)


@pytest.fixture
def make_sim(aiohttp_server):
    async def make(cost: CostModel = QUICK, *, output_tokens: int = 8, **config):
        profile = Profile("test", cost, output_tokens=output_tokens)
        server = await aiohttp_server(create_app(EngineConfig(profile, **config)))
        return str(server.make_url("")).rstrip("/"), server.app[ENGINE_KEY]

    return make


@pytest.fixture
async def openai_client(make_sim):
    url, engine = await make_sim()
    async with AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
        yield client, engine


MESSAGES = [{"role": "user", "content": "Say something."}]


async def test_chat_stream_with_usage(openai_client):
    client, _ = openai_client
    stream = await client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        stream=True,
        max_tokens=5,
        stream_options={"include_usage": True},
        extra_body={"sim_prompt_tokens": 100},
    )
    chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[0].choices[0].delta.content == ""
    content = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert [c.choices[0].delta.content for c in content] == [f" tok{i}" for i in range(5)]
    assert [c.choices[0].finish_reason for c in content] == [None] * 4 + ["length"]
    usage_chunk = chunks[-1]
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.prompt_tokens == 100
    assert usage_chunk.usage.completion_tokens == 5
    assert usage_chunk.usage.total_tokens == 105
    assert usage_chunk.usage.prompt_tokens_details.cached_tokens == 0
    assert {c.id for c in chunks} == {chunks[0].id}
    assert chunks[0].id.startswith("chatcmpl-")
    assert chunks[0].model == "m"


async def test_streams_without_usage_unless_asked(openai_client):
    client, _ = openai_client
    stream = await client.chat.completions.create(model="m", messages=MESSAGES, stream=True)
    chunks = [chunk async for chunk in stream]
    assert all(c.usage is None for c in chunks)
    assert all(c.choices for c in chunks)
    # No max_tokens: the profile's default length, finish reason "stop".
    assert len(chunks) == 1 + 8
    assert chunks[-1].choices[0].finish_reason == "stop"

    stream = await client.completions.create(
        model="m", prompt="Once upon", stream=True, max_tokens=3
    )
    chunks = [chunk async for chunk in stream]
    assert [c.choices[0].text for c in chunks] == [" tok0", " tok1", " tok2"]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert chunks[0].id.startswith("cmpl-")


async def test_non_streaming(openai_client):
    client, _ = openai_client
    chat = await client.chat.completions.create(model="m", messages=MESSAGES, max_tokens=3)
    assert chat.object == "chat.completion"
    assert chat.choices[0].message.content == " tok0 tok1 tok2"
    assert chat.choices[0].message.role == "assistant"
    assert chat.choices[0].finish_reason == "length"
    assert chat.usage is not None
    assert chat.usage.completion_tokens == 3
    text = await client.completions.create(model="m", prompt=[1, 2, 3, 4, 5], max_tokens=2)
    assert text.object == "text_completion"
    assert text.choices[0].text == " tok0 tok1"
    assert text.usage is not None
    assert text.usage.prompt_tokens == 5
    assert text.usage.prompt_tokens_details.cached_tokens == 0


async def test_bad_requests_get_openai_errors(openai_client, make_sim):
    client, _ = openai_client
    with pytest.raises(BadRequestError) as err:
        await client.chat.completions.create(model="m", messages=[], max_tokens=3)
    assert "messages" in str(err.value)
    with pytest.raises(BadRequestError):
        await client.chat.completions.create(
            model="m", messages=MESSAGES, extra_body={"sim_prompt_tokens": 0}
        )
    url, _ = await make_sim()
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", data=b"{not json") as resp:
            assert resp.status == 400
            body = await resp.json()
        assert body["error"]["code"] == 400
        assert "invalid JSON" in body["error"]["message"]
        async with session.post(url + "/v1/completions", json=["a"]) as resp:
            assert resp.status == 400


async def test_models_and_health(openai_client, make_sim):
    client, _ = openai_client
    models = await client.models.list()
    assert [m.id for m in models.data] == ["tokenstamp-sim"]
    url, _ = await make_sim()
    async with aiohttp.ClientSession() as session, session.get(url + "/health") as resp:
        assert resp.status == 200


def expected_stream(rid: str, created: int, *, chat: bool, usage: bool) -> bytes:
    """The exact bytes vLLM sends for a 2-token answer to a 7-token prompt."""
    if chat:
        head = f'{{"id":"{rid}","object":"chat.completion.chunk","created":{created},"model":"m",'
        events = [
            head + '"choices":[{"index":0,"delta":{"role":"assistant","content":""},'
            '"logprobs":null,"finish_reason":null}]}',
            head + '"choices":[{"index":0,"delta":{"content":" tok0"},'
            '"logprobs":null,"finish_reason":null}]}',
            head + '"choices":[{"index":0,"delta":{"content":" tok1"},'
            '"logprobs":null,"finish_reason":"length","stop_reason":null}]}',
        ]
    else:
        head = f'{{"id":"{rid}","object":"text_completion","created":{created},"model":"m",'
        events = [
            head + '"choices":[{"index":0,"text":" tok0","logprobs":null,'
            '"finish_reason":null,"stop_reason":null}]}',
            head + '"choices":[{"index":0,"text":" tok1","logprobs":null,'
            '"finish_reason":"length","stop_reason":null}]}',
        ]
    if usage:
        events.append(
            head + '"choices":[],"usage":{"prompt_tokens":7,"total_tokens":9,'
            '"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":0}}}'
        )
    events.append("[DONE]")
    return "".join(f"data: {e}\n\n" for e in events).encode()


@pytest.mark.parametrize(("path", "usage"), [("chat/completions", True), ("completions", False)])
async def test_exact_stream_bytes(make_sim, path, usage):
    url, _ = await make_sim()
    body: dict[str, object] = {"model": "m", "stream": True, "max_tokens": 2}
    body["sim_prompt_tokens"] = 7
    if path == "chat/completions":
        body["messages"] = MESSAGES
    else:
        body["prompt"] = "hello"
    if usage:
        body["stream_options"] = {"include_usage": True}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{url}/v1/{path}", json=body) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        raw = await resp.read()
    first = json.loads(raw.split(b"\n\n", 1)[0].removeprefix(b"data: "))
    chat = path == "chat/completions"
    assert raw == expected_stream(first["id"], first["created"], chat=chat, usage=usage)


async def read_stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, object],
    headers: dict[str, str] | None = None,
) -> tuple[str, list[int]]:
    """Stream one request; (response id, [client receipt ns per output event])."""
    rid = ""
    stamps: list[int] = []
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200
        async for line in resp.content:
            now_ns = time.monotonic_ns()
            if line.startswith(b"data: {"):
                event = json.loads(line[6:])
                rid = event["id"]
                if event["choices"] and event["choices"][0]["delta"].get("content"):
                    stamps.append(now_ns)
    return rid, stamps


def chat_body(prompt_tokens: int, max_tokens: int) -> dict[str, object]:
    return {
        "model": "m",
        "messages": MESSAGES,
        "stream": True,
        "max_tokens": max_tokens,
        "sim_prompt_tokens": prompt_tokens,
    }


async def test_ground_truth_is_complete_and_consistent(make_sim):
    url, engine = await make_sim(
        CostModel(0.002, 0.00001, 0.000002, chunk_size=256), prefix_cache=True
    )
    async with aiohttp.ClientSession() as session:
        results = await asyncio.gather(
            *(
                read_stream(
                    session, url, chat_body(300 + 100 * i, 4 + i), {"X-Request-Id": f"r{i}"}
                )
                for i in range(5)
            )
        )
        async with session.get(url + "/sim/ground_truth") as resp:
            lines = (await resp.text()).splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) == len(engine.ground_truth)
    steps = {r["step"]: r for r in records if r["type"] == "step"}
    by_request: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in records:
        if r["type"] != "step":
            by_request[r["response_id"]][r["type"]].append(r)
    ordered = [steps[k] for k in sorted(steps)]
    for before, after in itertools.pairwise(ordered):
        assert before["end_ns"] <= after["start_ns"]
    for i, (rid, client_stamps) in enumerate(results):
        recs = by_request[rid]
        tokens = recs["token"]
        assert [t["index"] for t in tokens] == list(range(4 + i))
        assert {r["x_request_id"] for kind in recs.values() for r in kind} == {f"r{i}"}
        for token, received_ns in zip(tokens, client_stamps, strict=True):
            step = steps[token["step"]]
            assert step["start_ns"] <= token["emit_ns"] == step["end_ns"]
            assert received_ns >= token["emit_ns"]
        (prefill,) = recs["prefill"]
        carried = [s for s in ordered if rid in s["prefill_response_ids"]]
        assert prefill["start_ns"] == carried[0]["start_ns"]
        assert prefill["end_ns"] == carried[-1]["end_ns"] == tokens[0]["emit_ns"]
        assert prefill["steps"] == len(carried)
        assert prefill["arrival_ns"] <= prefill["start_ns"]
        assert prefill["prompt_tokens"] == 300 + 100 * i
        (finish,) = recs["finish"]
        assert finish["finish_reason"] == "length"
        assert finish["output_tokens"] == 4 + i
        assert finish["end_ns"] == tokens[-1]["emit_ns"]
    prefilled = sum(s["prefill_tokens"] for s in ordered)
    cached = sum(by_request[rid]["prefill"][0]["cached_tokens"] for rid, _ in results)
    assert prefilled + cached == sum(300 + 100 * i for i in range(5))

    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/sim/reset") as resp:
            assert resp.status == 204
        async with session.get(url + "/sim/ground_truth?type=token") as resp:
            assert await resp.text() == ""


async def test_prefix_cache_reports_cached_tokens(make_sim):
    url, _ = await make_sim(prefix_cache=True)
    async with AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
        system: Any = {"role": "system", "content": "You are a careful assistant. " * 50}
        usages = []
        for question in ("first?", "second?"):
            reply = await client.chat.completions.create(
                model="m", messages=[system, {"role": "user", "content": question}], max_tokens=2
            )
            assert reply.usage is not None
            usages.append(reply.usage)
    details = [u.prompt_tokens_details for u in usages]
    assert details[0] is not None
    assert details[0].cached_tokens == 0
    shared_tokens = len("<|system|>" + system["content"]) // 4
    assert details[1] is not None
    assert details[1].cached_tokens == shared_tokens // 16 * 16


async def wait_for(predicate, timeout_s: float = 5.0) -> None:
    """Poll engine state (it has no events to wait on); fail after ``timeout_s``."""
    async with asyncio.timeout(timeout_s):
        while not predicate():  # noqa: ASYNC110
            await asyncio.sleep(0.005)


async def test_client_disconnect_shrinks_the_batch(make_sim):
    url, engine = await make_sim(QUICK)
    async with aiohttp.ClientSession() as session:
        streams = [
            await session.post(url + "/v1/chat/completions", json=chat_body(10, 100_000))
            for _ in range(3)
        ]
        await wait_for(lambda: engine.num_decoding == 3)
        await streams[0].content.readline()
        streams[0].close()
        await wait_for(lambda: engine.num_running == 2)
        step_before = max(r.step for r in engine.ground_truth if r.type == "step")
        await wait_for(
            lambda: any(r.type == "step" and r.step > step_before + 2 for r in engine.ground_truth)
        )
        later = [r for r in engine.ground_truth if r.type == "step" and r.step > step_before]
        assert later
        assert all(r.decode_batch == 2 for r in later)
        aborts = [r for r in engine.ground_truth if r.type == "finish"]
        assert [r.finish_reason for r in aborts] == ["abort"]
        for resp in streams[1:]:
            resp.close()
        await wait_for(lambda: engine.num_running == 0)


async def test_disconnect_while_queued_leaves_the_queue(make_sim):
    url, engine = await make_sim(CostModel(0.002, 0.00001, 0.000001, max_num_seqs=1))
    async with aiohttp.ClientSession() as session:
        running = await session.post(url + "/v1/chat/completions", json=chat_body(10, 100_000))
        await wait_for(lambda: engine.num_decoding == 1)
        queued = await session.post(url + "/v1/chat/completions", json=chat_body(10, 5))
        await wait_for(lambda: engine.num_waiting == 1)
        queued.close()  # headers came, no token yet: only the poll can notice
        await wait_for(lambda: engine.num_waiting == 0)
        assert engine.num_running == 1
        running.close()
        await wait_for(lambda: engine.num_running == 0)


@pytest.mark.parametrize("chunk", [None, 512])
async def test_measured_gaps_follow_the_cost_model(make_sim, chunk):
    """40 streams decode; a 4,000-token prompt arrives; gaps as the model says (loosely)."""
    cost = replace(TIMING, chunk_size=chunk)
    prediction = predict_seed_stutter(cost, 40, 4000)
    url, engine = await make_sim(cost)
    async with (
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session,
        asyncio.TaskGroup() as group,
    ):
        streams = [
            group.create_task(read_stream(session, url, chat_body(16, 60 + i // 2)))
            for i in range(40)
        ]
        await wait_for(lambda: engine.num_decoding == 40, timeout_s=10)
        long = group.create_task(
            read_stream(session, url, chat_body(4000, 2), {"X-Request-Id": "long"})
        )
    results = [task.result() for task in streams]
    long_id, long_stamps = long.result()

    steps = [r for r in engine.ground_truth if r.type == "step"]
    prefill = next(
        r for r in engine.ground_truth if r.type == "prefill" and r.x_request_id == "long"
    )
    carrying = [s for s in steps if long_id in s.prefill_response_ids]
    assert len(carrying) == prediction.prefill_steps
    assert all(s.decode_batch == 40 for s in carrying)
    # Ground truth: the engine slept the modelled durations. It makes up at most
    # 5 ms of timer overshoot per step; above: generous room for a busy machine.
    index = {s.step: s for s in steps}
    gt_gaps = [(s.end_ns - index[s.step - 1].end_ns) / 1e9 for s in carrying]
    assert prediction.worst_gap_s - 0.006 <= max(gt_gaps) <= 2 * prediction.worst_gap_s + 0.05
    ttft_s = (prefill.end_ns - prefill.start_ns) / 1e9
    assert prediction.ttft_s - 0.006 <= ttft_s <= 2 * prediction.ttft_s + 0.05
    # Client side: every existing stream saw its worst gap during the long prefill.
    window = (carrying[0].start_ns, carrying[-1].end_ns)
    for _, stamps in results:
        gaps = [(b - a, b) for a, b in itertools.pairwise(stamps)]
        worst_ns, at_ns = max(gaps)
        assert worst_ns / 1e9 >= 0.7 * prediction.worst_gap_s
        if chunk is None:
            assert window[0] <= at_ns <= window[1] + 50_000_000
        median_s = statistics.median(g for g, _ in gaps) / 1e9
        assert 0.5 * prediction.steady_gap_s <= median_s <= 3 * prediction.steady_gap_s
    assert len(long_stamps) == 2

"""A reasoning model, tool calls and n > 1 choices, over real sockets: bytes, SDK, ground truth."""

from __future__ import annotations

import argparse
import json
from typing import Any

import aiohttp
import pytest
from openai import AsyncOpenAI

from simulator.cli import register, start_simulator
from simulator.cost import CostModel
from simulator.engine import EngineConfig
from simulator.planner import SequenceSpec, StepPlanner
from simulator.profile import Profile, profile_from_mapping, profile_to_mapping
from simulator.records import (
    FinishRecord,
    PrefillRecord,
    StepRecord,
    TokenRecord,
    records_from_jsonl,
)
from simulator.server import ENGINE_KEY, create_app

QUICK = CostModel(decode_base_s=0.002, decode_per_seq_s=0.00001, prefill_s_per_token=0.000001)
STEPPED = CostModel(decode_base_s=0.010, decode_per_seq_s=0.0, prefill_s_per_token=0.000001)
MESSAGES = [{"role": "user", "content": "Think first."}]


@pytest.fixture
def make_sim(aiohttp_server):
    async def make(cost: CostModel = QUICK, **profile: Any):
        server = await aiohttp_server(create_app(EngineConfig(Profile("test", cost, **profile))))
        return str(server.make_url("")).rstrip("/"), server.app[ENGINE_KEY]

    return make


async def sse(url: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST a streamed chat completion; every event's JSON, ``[DONE]`` checked and left off."""
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/v1/chat/completions", json={"stream": True, **body}) as r:
            assert r.status == 200, await r.text()
            raw = (await r.read()).decode()
    events = [e.removeprefix("data: ") for e in raw.split("\n\n") if e]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


def deltas(events: list[dict[str, Any]], choice: int = 0) -> list[dict[str, Any]]:
    """The deltas of one choice, role chunk included."""
    return [c["delta"] for e in events for c in e["choices"] if c["index"] == choice]


async def test_exactly_n_reasoning_deltas_then_the_answer(make_sim):
    url, _ = await make_sim(output_tokens=3)
    body = {
        "messages": MESSAGES,
        "sim_reasoning_tokens": 4,
        "stream_options": {"include_usage": True},
    }
    events = await sse(url, body)
    assert deltas(events) == [
        {"role": "assistant", "content": ""},
        *({"reasoning": f" think{i}"} for i in range(4)),
        *({"content": f" tok{i}"} for i in range(3)),
    ]
    finishes = [c["finish_reason"] for e in events for c in e["choices"]]
    assert finishes == [None] * 7 + ["stop"]
    assert events[-1]["choices"] == []
    assert events[-1]["usage"] == {
        "prompt_tokens": events[-1]["usage"]["prompt_tokens"],
        "total_tokens": events[-1]["usage"]["prompt_tokens"] + 7,
        "completion_tokens": 7,
        "prompt_tokens_details": {"cached_tokens": 0},
        "completion_tokens_details": {"reasoning_tokens": 4},
    }


async def test_profile_makes_every_chat_request_reason_unless_it_says(make_sim):
    url, _ = await make_sim(
        output_tokens=2, reasoning_tokens=3, reasoning_field="reasoning_content"
    )
    events = await sse(url, {"messages": MESSAGES})
    assert [list(d) for d in deltas(events)[1:]] == [["reasoning_content"]] * 3 + [["content"]] * 2
    # A request that says 0 answers at once, as a model asked not to think.
    events = await sse(url, {"messages": MESSAGES, "sim_reasoning_tokens": 0})
    assert deltas(events)[1:] == [{"content": " tok0"}, {"content": " tok1"}]
    # The field can be chosen per request too.
    events = await sse(url, {"messages": MESSAGES, "sim_reasoning_field": "reasoning"})
    assert deltas(events)[1] == {"reasoning": " think0"}


async def test_max_tokens_counts_the_reasoning_and_can_cut_off_the_answer(make_sim):
    url, engine = await make_sim()
    events = await sse(
        url,
        {
            "messages": MESSAGES,
            "sim_reasoning_tokens": 6,
            "max_tokens": 4,
            "stream_options": {"include_usage": True},
        },
    )
    assert deltas(events)[1:] == [{"reasoning": f" think{i}"} for i in range(4)]
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 4}
    [finish] = [r for r in engine.ground_truth if isinstance(r, FinishRecord)]
    assert finish.reasoning_tokens == 4
    assert finish.first_answer_ns is None


async def test_tool_call_streams_as_vllm_tool_parsers_do(make_sim):
    url, _ = await make_sim()
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    body = {
        "messages": MESSAGES,
        "sim_reasoning_tokens": 2,
        "sim_tool_call": True,
        "max_tokens": 6,
        "tools": tools,
    }
    events = await sse(url, body)
    rid = events[0]["id"].removeprefix("chatcmpl-")
    assert deltas(events)[1:] == [
        {"reasoning": " think0"},
        {"reasoning": " think1"},
        {
            "tool_calls": [
                {
                    "id": f"chatcmpl-tool-{rid}-0",
                    "type": "function",
                    "index": 0,
                    "function": {"name": "get_weather"},
                }
            ]
        },
        {"tool_calls": [{"index": 0, "function": {"arguments": '{"q":"tok1'}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": " tok2"}}]},
        {"tool_calls": [{"index": 0, "function": {"arguments": ' tok3"}'}}]},
    ]
    assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"

    # The OpenAI SDK puts the pieces together into one call with valid JSON arguments.
    async with AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0) as client:
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, tools=tools,
            extra_body={"sim_tool_call": True, "sim_reasoning_tokens": 1}, max_tokens=4,
        )  # fmt: skip
        name, arguments, finish = "", "", None
        async for chunk in stream:
            for choice in chunk.choices:
                finish = choice.finish_reason or finish
                for call in choice.delta.tool_calls or ():
                    assert call.function is not None
                    name += call.function.name or ""
                    arguments += call.function.arguments or ""
        assert (name, json.loads(arguments), finish) == (
            "get_weather", {"q": "tok1 tok2"}, "tool_calls"
        )  # fmt: skip
        whole = await client.chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=3,
            extra_body={"sim_tool_call": True, "sim_reasoning_tokens": 1},
        )  # fmt: skip
    message = whole.choices[0].message
    assert message.content is None
    assert message.tool_calls is not None
    assert message.tool_calls[0].function.name == "sim_tool"  # no tools listed
    assert json.loads(message.tool_calls[0].function.arguments) == {"q": "tok1"}
    assert whole.choices[0].finish_reason == "tool_calls"
    assert (message.model_extra or {})["reasoning"] == " think0"


async def test_n_choices_interleave_with_their_indexes_and_usage_counts_all(make_sim):
    url, engine = await make_sim(STEPPED)
    body = {
        "messages": MESSAGES,
        "n": 3,
        "max_tokens": 4,
        "sim_reasoning_tokens": 1,
        "stream_options": {"include_usage": True},
    }
    events = await sse(url, body)
    # Each chunk carries one choice; a step sends one chunk per choice, in index order.
    assert all(len(e["choices"]) == 1 for e in events[:-1])
    assert [e["choices"][0]["index"] for e in events[:-1]] == [0, 1, 2] * 5
    for i in range(3):
        assert deltas(events, i) == [
            {"role": "assistant", "content": ""},
            {"reasoning": " think0"},
            *({"content": f" tok{k}"} for k in range(3)),
        ]
    assert [c["finish_reason"] for e in events[-4:-1] for c in e["choices"]] == ["length"] * 3
    assert events[-1]["usage"]["completion_tokens"] == 12
    assert events[-1]["usage"]["completion_tokens_details"] == {"reasoning_tokens": 3}

    truth = list(engine.ground_truth)
    tokens = [r for r in truth if isinstance(r, TokenRecord)]
    assert sorted((t.index, t.choice) for t in tokens) == [
        (i, c) for i in range(4) for c in range(3)
    ]
    [finish] = [r for r in truth if isinstance(r, FinishRecord)]
    assert (finish.output_tokens, finish.reasoning_tokens, finish.choices) == (12, 3, 3)
    # The three choices decode side by side: three sequences in every decode step.
    decode = [r for r in truth if isinstance(r, StepRecord) and r.decode_batch]
    assert [s.decode_batch for s in decode] == [3, 3, 3]
    assert max(s.running for s in truth if isinstance(s, StepRecord)) == 3

    async with aiohttp.ClientSession() as session:
        async with session.post(
            url + "/v1/chat/completions", json={"messages": MESSAGES, "n": 2, "max_tokens": 2}
        ) as r:
            whole = await r.json()
    assert [c["index"] for c in whole["choices"]] == [0, 1]
    assert {c["message"]["content"] for c in whole["choices"]} == {" tok0 tok1"}
    assert whole["usage"]["completion_tokens"] == 4


async def test_reasoning_costs_decode_steps_and_the_truth_has_the_first_answer_token(make_sim):
    url, engine = await make_sim(STEPPED, output_tokens=2)
    await sse(url, {"messages": MESSAGES, "sim_reasoning_tokens": 5})
    truth = list(engine.ground_truth)
    [prefill] = [r for r in truth if isinstance(r, PrefillRecord)]
    [finish] = [r for r in truth if isinstance(r, FinishRecord)]
    first_answer = next(t for t in truth if isinstance(t, TokenRecord) and t.index == 5)
    assert finish.first_answer_ns == first_answer.emit_ns
    assert (finish.output_tokens, finish.reasoning_tokens) == (7, 5)
    # Five reasoning tokens: the first came with the prefill, four more decode steps of 10 ms
    # to the last, one more to the first answer token.
    assert 0.045 <= (finish.first_answer_ns - prefill.end_ns) / 1e9 <= 0.050 + 0.030
    # The records read back through the HTTP face.
    async with aiohttp.ClientSession() as session:
        async with session.get(url + "/sim/ground_truth", params={"type": "finish"}) as r:
            [back] = records_from_jsonl(await r.text())
    assert back == finish


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"sim_reasoning_tokens": -1}, "sim_reasoning_tokens"),
        ({"sim_reasoning_tokens": "4"}, "sim_reasoning_tokens"),
        ({"sim_reasoning_field": "thinking"}, "sim_reasoning_field"),
        ({"sim_tool_call": "yes"}, "sim_tool_call"),
        ({"n": 0}, "n"),
        ({"n": 300}, "n"),
    ],
)
async def test_bad_extensions_are_rejected_naming_the_key(make_sim, body, param):
    url, _ = await make_sim()
    async with aiohttp.ClientSession() as session:
        async with session.post(
            url + "/v1/chat/completions", json={"messages": MESSAGES, **body}
        ) as r:
            assert r.status == 400
            assert (await r.json())["error"]["param"] == param


async def test_reasoning_and_tool_calls_are_chat_only_but_completions_take_n(make_sim):
    url, _ = await make_sim(output_tokens=2, reasoning_tokens=3)
    async with aiohttp.ClientSession() as session:
        for extra in ({"sim_reasoning_tokens": 2}, {"sim_tool_call": True}):
            async with session.post(url + "/v1/completions", json={"prompt": "x", **extra}) as r:
                assert r.status == 400, extra
        # The profile's reasoning does not reach completions: plain text, as vLLM's.
        async with session.post(url + "/v1/completions", json={"prompt": "x", "n": 2}) as r:
            body = await r.json()
    assert [c["text"] for c in body["choices"]] == [" tok0 tok1"] * 2


def test_profile_keys_round_trip_and_are_checked():
    profile = Profile("r", QUICK, reasoning_tokens=32, reasoning_field="reasoning_content")
    assert profile_from_mapping(profile_to_mapping(profile)) == profile
    with pytest.raises(ValueError, match="reasoning_tokens"):
        profile_from_mapping({**profile_to_mapping(profile), "reasoning_tokens": -1})
    with pytest.raises(ValueError, match="reasoning_field"):
        profile_from_mapping({**profile_to_mapping(profile), "reasoning_field": "thought"})


def test_a_request_with_n_choices_takes_n_places_in_the_batch():
    planner = StepPlanner(CostModel(0.01, 0.001, 0.0, max_num_seqs=3))
    planner.add(SequenceSpec("a", None, 1, 3, "length", 0, choices=3))
    planner.add(SequenceSpec("b", None, 1, 3, "length", 0, choices=2))
    plan = planner.plan()
    assert plan is not None
    planner.commit(plan, 0, 1)
    plan = planner.plan()
    assert plan is not None
    assert plan.decode_ids == ("a",)
    assert plan.prefill == ()  # b does not fit beside a's three choices
    assert plan.decode_batch == 3
    assert plan.duration_s == pytest.approx(0.01 + 3 * 0.001)


async def test_start_simulator_takes_the_reasoning_default():
    sim = await start_simulator(Profile("t", QUICK, output_tokens=1), reasoning_tokens=2)
    try:
        events = await sse(sim.url, {"messages": MESSAGES})
        assert [list(d) for d in deltas(events)[1:]] == [["reasoning"]] * 2 + [["content"]]
        async with aiohttp.ClientSession() as session:
            async with session.get(sim.url + "/sim/state") as r:
                assert (await r.json())["reasoning_tokens"] == 2
    finally:
        await sim.close()


def test_simulate_takes_the_reasoning_flags():
    parser = argparse.ArgumentParser(prog="tokenstamp")
    register(parser.add_subparsers())
    args = parser.parse_args(["simulate"])
    assert (args.reasoning_tokens, args.reasoning_field) == (None, None)  # the profile's
    args = parser.parse_args(
        ["simulate", "--reasoning-tokens", "0", "--reasoning-field", "reasoning_content"]
    )
    assert (args.reasoning_tokens, args.reasoning_field) == (0, "reasoning_content")
    for bad in (["--reasoning-tokens", "-1"], ["--reasoning-field", "thinking"]):
        with pytest.raises(SystemExit):
            parser.parse_args(["simulate", *bad])

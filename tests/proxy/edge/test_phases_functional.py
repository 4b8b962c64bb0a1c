"""Thinking, answering and acting measured apart, in every format, through the real proxy.

A scripted upstream writes reasoning events, then answer events (or a tool
call), and notes the loop time of every write. The proxy's figures for one
request (a histogram's ``_sum`` holds the one observation) must equal the
upstream's: reasoning duration = first answer write - first reasoning write,
time to first answer token - TTFT = the same, within a millisecond (the
proxy stamps its reads; upstream, proxy and client share one event loop
here). TTFT stays the first output event of either kind. Also: a stream that
only thinks, one that goes straight to a tool call, the figures in
``/metrics`` while the stream is still running, the visible-TTFT SLO, and two
interleaved choices (``n > 1``) whose gaps are each choice's own.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import pytest
from aiohttp import web

from exporters import names
from proxy.core.decoders.registry import route
from proxy.edge.server import RunningProxy

AGREEMENT_S = 0.001
THINK_GAP_S = 0.02
ANSWER_AFTER_S = 0.15
REASONING_EVENTS = 5
ANSWER_EVENTS = 3


def sse(obj: object, event: str | None = None) -> bytes:
    head = f"event: {event}\n".encode() if event else b""
    return head + b"data: " + json.dumps(obj).encode() + b"\n\n"


def ndjson(obj: object) -> bytes:
    return json.dumps(obj).encode() + b"\n"


@dataclass(frozen=True)
class Phased:
    """One format's stream: what comes before, each reasoning and answer event, the end."""

    name: str
    path: str
    request: dict[str, object]
    content_type: str
    opening: list[bytes]
    think: Callable[[int], bytes]
    answer: Callable[[int], bytes]
    closing: Callable[[int, int], list[bytes]]
    """Given the output and reasoning events written, the bytes that end the stream (usage
    included)."""
    reports_reasoning_tokens: bool
    tool: Callable[[int], bytes] | None = None


def _chat_chunk(delta: dict[str, object], index: int = 0, finish: str | None = None) -> bytes:
    return sse({"id": "c1", "object": "chat.completion.chunk", "model": "m",
                "choices": [{"index": index, "delta": delta, "finish_reason": finish}]})  # fmt: skip


def _chat_closing(finish: str = "stop") -> Callable[[int, int], list[bytes]]:
    def closing(n: int, reasoning: int) -> list[bytes]:
        usage = {"prompt_tokens": 7, "completion_tokens": n,
                 "completion_tokens_details": {"reasoning_tokens": reasoning}}  # fmt: skip
        return [
            _chat_chunk({}, finish=finish),
            sse({"id": "c1", "object": "chat.completion.chunk", "model": "m", "choices": [],
                 "usage": usage}),
            b"data: [DONE]\n\n",
        ]  # fmt: skip

    return closing


CHAT = {"model": "m", "stream": True, "messages": [{"role": "user", "content": "why?"}]}
TOOL_DELTA = {"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                              "function": {"name": "f", "arguments": "{\"a\":"}}]}  # fmt: skip

VLLM = Phased(
    "openai-chat reasoning_content (vLLM, SGLang)", "/v1/chat/completions", CHAT,
    "text/event-stream", [_chat_chunk({"role": "assistant", "content": ""})],
    lambda i: _chat_chunk({"reasoning_content": f"hmm{i}"}),
    lambda i: _chat_chunk({"content": f"ok{i}"}),
    _chat_closing(), True,
    tool=lambda i: _chat_chunk(TOOL_DELTA),
)  # fmt: skip
VLLM_REASONING = Phased(
    "openai-chat reasoning", "/v1/chat/completions", CHAT, "text/event-stream",
    [_chat_chunk({"role": "assistant", "content": ""})],
    lambda i: _chat_chunk({"reasoning": f"hmm{i}"}),
    lambda i: _chat_chunk({"content": f"ok{i}"}),
    _chat_closing(), True,
)  # fmt: skip
LLAMACPP = Phased(
    "openai-chat llama.cpp --reasoning-format", "/v1/chat/completions", CHAT,
    "text/event-stream", [],
    lambda i: sse({"choices": [{"finish_reason": None, "index": 0,
                                "delta": {"content": None, "reasoning_content": f"So{i}"}}],
                   "created": 1733000009, "id": "chatcmpl-x", "model": "tiny",
                   "object": "chat.completion.chunk"}),
    lambda i: sse({"choices": [{"finish_reason": None, "index": 0, "delta": {"content": f"A{i}"}}],
                   "created": 1733000009, "id": "chatcmpl-x", "model": "tiny",
                   "object": "chat.completion.chunk"}),
    _chat_closing(), True,
)  # fmt: skip


def _responses_closing(n: int, reasoning: int) -> list[bytes]:
    usage = {"input_tokens": 7, "output_tokens": n,
             "output_tokens_details": {"reasoning_tokens": reasoning}}  # fmt: skip
    done = {"type": "response.completed",
            "response": {"id": "r1", "model": "m", "status": "completed", "usage": usage}}  # fmt: skip
    return [sse(done, "response.completed")]


RESPONSES = Phased(
    "responses", "/v1/responses", {"model": "m", "stream": True, "input": "why?"},
    "text/event-stream",
    [sse({"type": "response.created",
          "response": {"id": "r1", "model": "m", "status": "in_progress"}}, "response.created")],
    lambda i: sse({"type": "response.reasoning_summary_text.delta", "delta": f"h{i}"},
                  "response.reasoning_summary_text.delta"),
    lambda i: sse({"type": "response.output_text.delta", "delta": f"ok{i}"},
                  "response.output_text.delta"),
    _responses_closing, True,
    tool=lambda i: sse({"type": "response.function_call_arguments.delta", "delta": "{\"a\":"},
                       "response.function_call_arguments.delta"),
)  # fmt: skip


def _anthropic_closing(n: int, reasoning: int) -> list[bytes]:
    return [
        sse({"type": "content_block_stop", "index": 1}, "content_block_stop"),
        sse({"type": "message_delta", "delta": {"stop_reason": "end_turn"},
             "usage": {"output_tokens": n}}, "message_delta"),
        sse({"type": "message_stop"}, "message_stop"),
    ]  # fmt: skip


ANTHROPIC = Phased(
    "anthropic messages thinking", "/v1/messages",
    {"model": "claude", "stream": True, "max_tokens": 64,
     "thinking": {"type": "enabled", "budget_tokens": 32},
     "messages": [{"role": "user", "content": "why?"}]},
    "text/event-stream",
    [sse({"type": "message_start", "message": {"id": "msg_1", "model": "claude", "content": [],
          "usage": {"input_tokens": 7, "output_tokens": 1}}}, "message_start"),
     sse({"type": "content_block_start", "index": 0,
          "content_block": {"type": "thinking", "thinking": ""}}, "content_block_start")],
    lambda i: sse({"type": "content_block_delta", "index": 0,
                   "delta": {"type": "thinking_delta", "thinking": f"h{i}"}},
                  "content_block_delta"),
    lambda i: sse({"type": "content_block_delta", "index": 1,
                   "delta": {"type": "text_delta", "text": f"ok{i}"}}, "content_block_delta"),
    _anthropic_closing, False,
    tool=lambda i: sse({"type": "content_block_delta", "index": 1,
                        "delta": {"type": "input_json_delta", "partial_json": "{\"a\":"}},
                       "content_block_delta"),
)  # fmt: skip


def _ollama_closing(n: int, reasoning: int) -> list[bytes]:
    return [ndjson({"model": "qwen3", "created_at": "2026-01-01T00:00:00Z",
                    "message": {"role": "assistant", "content": ""}, "done": True,
                    "done_reason": "stop", "prompt_eval_count": 7, "eval_count": n})]  # fmt: skip


def _ollama_line(message: dict[str, object]) -> bytes:
    return ndjson({"model": "qwen3", "created_at": "2026-01-01T00:00:00Z",
                   "message": {"role": "assistant", **message}, "done": False})  # fmt: skip


OLLAMA_CHAT = Phased(
    "ollama chat think", "/api/chat",
    {"model": "qwen3", "think": True, "messages": [{"role": "user", "content": "why?"}]},
    "application/x-ndjson", [],
    lambda i: _ollama_line({"content": "", "thinking": f"h{i}"}),
    lambda i: _ollama_line({"content": f"ok{i}"}),
    _ollama_closing, False,
    tool=lambda i: _ollama_line({"content": "", "tool_calls": [
        {"function": {"name": "f", "arguments": {"a": 1}}}]}),
)  # fmt: skip
OLLAMA_GENERATE = Phased(
    "ollama generate think", "/api/generate", {"model": "qwen3", "think": True, "prompt": "why?"},
    "application/x-ndjson", [],
    lambda i: ndjson({"model": "qwen3", "created_at": "t", "response": "", "thinking": f"h{i}",
                      "done": False}),
    lambda i: ndjson({"model": "qwen3", "created_at": "t", "response": f"ok{i}", "done": False}),
    lambda n, r: [ndjson({"model": "qwen3", "created_at": "t", "response": "", "done": True,
                       "done_reason": "stop", "prompt_eval_count": 7, "eval_count": n})],
    False,
)  # fmt: skip

FORMATS = [VLLM, VLLM_REASONING, LLAMACPP, RESPONSES, ANTHROPIC, OLLAMA_CHAT, OLLAMA_GENERATE]
WITH_TOOLS = [f for f in FORMATS if f.tool is not None]


class Played:
    """The loop time of every write of the upstream, by what it was."""

    def __init__(self) -> None:
        self.reasoning: list[float] = []
        self.answer: list[float] = []
        self.tool: list[float] = []


def play(upstream, f: Phased, steps: list[tuple[str, float]], *, hold_s: float = 0.0) -> Played:
    """The upstream plays ``steps`` ((``think`` | ``answer`` | ``tool``, delay before)),
    noting when it wrote each; ``hold_s``: a pause before the closing events."""
    played = Played()

    async def handler(request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        resp = web.StreamResponse()
        resp.content_type = f.content_type
        await resp.prepare(request)
        for data in f.opening:
            await resp.write(data)
        for i, (kind, delay) in enumerate(steps):
            await asyncio.sleep(delay)
            make = {"think": f.think, "answer": f.answer, "tool": f.tool}[kind]
            assert make is not None
            stamps = {"think": played.reasoning, "answer": played.answer, "tool": played.tool}
            stamps[kind].append(loop.time())
            await resp.write(make(i))
        await asyncio.sleep(hold_s)
        thinking = sum(1 for kind, _ in steps if kind == "think")
        for data in f.closing(len(steps), thinking):
            await resp.write(data)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    return played


def labels(f: Phased) -> dict[str, str]:
    fmt = route("POST", f.path)
    assert fmt is not None
    model = fmt.request_model(f.request)
    return {"gen_ai_operation_name": fmt.operation.value, "gen_ai_provider_name": "vllm",
            "gen_ai_request_model": model if isinstance(model, str) else "unknown",
            "server_address": "test-backend"}  # fmt: skip


def one(p: RunningProxy, f: Phased, inst: names.Instrument) -> tuple[float, float]:
    """``(count, sum)`` of a histogram for ``f``'s labels."""
    ls = labels(f)
    count = p.registry.get_sample_value(inst.prom_name + "_count", ls) or 0.0
    total = p.registry.get_sample_value(inst.prom_name + "_sum", ls) or 0.0
    return count, total


async def post(p: RunningProxy, f: Phased, request: dict[str, object] | None = None) -> bytes:
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + f.path, json=request or f.request) as r:
            assert r.status == 200
            return await r.read()


def thinking_then_answer() -> list[tuple[str, float]]:
    think = [("think", THINK_GAP_S)] * REASONING_EVENTS
    return [*think, ("answer", ANSWER_AFTER_S)] + [("answer", THINK_GAP_S)] * (ANSWER_EVENTS - 1)


@pytest.mark.parametrize("f", FORMATS, ids=lambda f: f.name)
async def test_reasoning_then_answer_stamps_equal_the_upstreams(upstream, proxy_factory, f):
    played = play(upstream, f, thinking_then_answer())
    p = await proxy_factory(upstream.url)
    await post(p, f)
    truth = played.answer[0] - played.reasoning[0]
    ttft = one(p, f, names.TTFT)
    answer = one(p, f, names.ANSWER_TTFT)
    reasoning = one(p, f, names.REASONING_DURATION)
    assert ttft[0] == answer[0] == reasoning[0] == 1
    assert reasoning[1] == pytest.approx(truth, abs=AGREEMENT_S)
    assert answer[1] - ttft[1] == pytest.approx(truth, abs=AGREEMENT_S)
    count, tokens = one(p, f, names.REASONING_TOKENS)
    assert count == 1
    assert tokens == REASONING_EVENTS  # from usage where reported, else the events counted
    assert one(p, f, names.TOOL_CALL_TTF)[0] == 0
    # Gaps: every output event of either kind is one; the longest is the wait for the answer.
    assert one(p, f, names.GAP)[0] == REASONING_EVENTS + ANSWER_EVENTS - 1
    worst = p.registry.get_sample_value(names.MAX_GAP.prom_name + "_sum", labels(f))
    assert worst == pytest.approx(ANSWER_AFTER_S, abs=0.05)


@pytest.mark.parametrize("f", WITH_TOOLS, ids=lambda f: f.name)
async def test_straight_to_a_tool_call(upstream, proxy_factory, f):
    """No reasoning: the first token is the tool call and the first answer at once."""
    play(upstream, f, [("tool", 0.05), ("tool", THINK_GAP_S)])
    p = await proxy_factory(upstream.url)
    await post(p, f)
    ttft = one(p, f, names.TTFT)
    tool = one(p, f, names.TOOL_CALL_TTF)
    answer = one(p, f, names.ANSWER_TTFT)
    assert ttft[0] == tool[0] == answer[0] == 1
    assert ttft[1] == tool[1] == answer[1]  # one read, one stamp
    assert one(p, f, names.REASONING_DURATION)[0] == 0
    assert one(p, f, names.REASONING_TOKENS)[0] == 0


@pytest.mark.parametrize("f", [VLLM, RESPONSES, ANTHROPIC, OLLAMA_CHAT], ids=lambda f: f.name)
async def test_think_then_call_a_tool(upstream, proxy_factory, f):
    """An agent's turn: thinking, then a tool call; the call is the first answer."""
    assert f.tool is not None
    played = play(upstream, f, [("think", 0.02)] * 3 + [("tool", 0.1)])
    p = await proxy_factory(upstream.url)
    await post(p, f)
    tool, answer, ttft = (
        one(p, f, i) for i in (names.TOOL_CALL_TTF, names.ANSWER_TTFT, names.TTFT)
    )
    assert tool == answer
    assert tool[1] - ttft[1] == pytest.approx(played.tool[0] - played.reasoning[0], abs=AGREEMENT_S)


@pytest.mark.parametrize("f", [VLLM, ANTHROPIC, OLLAMA_GENERATE], ids=lambda f: f.name)
async def test_a_stream_that_only_thinks(upstream, proxy_factory, f):
    """Cut off while thinking: no answer, reasoning to the end; the visible-TTFT SLO
    counts it missed, while the TTFT/TPOT SLO alone would have met it."""
    played = play(upstream, f, [("think", THINK_GAP_S)] * REASONING_EVENTS, hold_s=0.1)
    p = await proxy_factory(upstream.url, slo_ttft_s=10.0, slo_tpot_s=10.0, slo_answer_ttft_s=10.0)
    await post(p, f)
    assert one(p, f, names.TTFT)[0] == 1
    assert one(p, f, names.ANSWER_TTFT)[0] == 0
    count, duration = one(p, f, names.REASONING_DURATION)
    assert count == 1
    assert duration >= played.reasoning[-1] - played.reasoning[0] + 0.1 - AGREEMENT_S
    slo = p.registry.get_sample_value(
        names.SLO_REQUESTS.prom_series,
        {**labels(f), "tokenstamp_slo": "missed", "tokenstamp_slo_source": "default"},
    )
    assert slo == 1


async def test_the_visible_ttft_slo_judges_the_answer(upstream, proxy_factory):
    """TTFT 20 ms, first answer after ~0.25 s: met against 1 s, missed against 0.1 s."""
    f = VLLM
    play(upstream, f, thinking_then_answer())
    for target, verdict in ((1.0, "met"), (0.1, "missed")):
        p = await proxy_factory(upstream.url, slo_ttft_s=0.1, slo_answer_ttft_s=target)
        await post(p, f)
        slo = p.registry.get_sample_value(
            names.SLO_REQUESTS.prom_series,
            {**labels(f), "tokenstamp_slo": verdict, "tokenstamp_slo_source": "default"},
        )
        assert slo == 1, (target, verdict)


@pytest.mark.parametrize("f", [VLLM, ANTHROPIC, OLLAMA_CHAT], ids=lambda f: f.name)
async def test_metrics_show_each_phase_while_the_stream_runs(upstream, proxy_factory, f):
    """Scraped over HTTP mid-stream: TTFT at the first thinking token; the time to first
    answer only once the answer started; the request not finished yet."""
    gate, end = asyncio.Event(), asyncio.Event()

    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        resp.content_type = f.content_type
        await resp.prepare(request)
        for data in f.opening:
            await resp.write(data)
        await resp.write(f.think(0))
        await gate.wait()
        await resp.write(f.answer(1))
        await end.wait()
        for data in f.closing(2, 1):
            await resp.write(data)
        await resp.write_eof()
        return resp

    upstream.handler = handler
    p = await proxy_factory(upstream.url)

    async def scrape(inst: names.Instrument) -> float:
        async with aiohttp.ClientSession() as s, s.get(p.admin_url + "/metrics") as r:
            text = await r.text()
        name = inst.prom_name + "_count{"
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith(name))  # fmt: skip

    async def until(inst: names.Instrument, value: float) -> None:
        for _ in range(200):
            if await scrape(inst) == value:
                return
            await asyncio.sleep(0.01)
        raise AssertionError(f"{inst.name} never reached {value}")

    async def watch() -> None:
        await until(names.TTFT, 1)
        assert await scrape(names.ANSWER_TTFT) == 0
        gate.set()
        await until(names.ANSWER_TTFT, 1)
        assert await scrape(names.REASONING_DURATION) == 1
        assert await scrape(names.DURATION) == 0  # still running
        end.set()

    await asyncio.gather(post(p, f), watch())
    assert await scrape(names.DURATION) == 1


def _choice_chunk(index: int, content: str) -> bytes:
    return _chat_chunk({"content": content}, index=index)


async def test_two_interleaved_choices_have_their_own_gaps(upstream, proxy_factory):
    """n = 2: each choice writes every 60 ms, choice 1 30 ms after choice 0. Measured as
    one stream the gaps would be 30 ms; per choice they are 60 ms, and choice 1 thinks."""
    played: dict[int, list[float]] = {0: [], 1: []}
    rounds = 6

    async def handler(request: web.Request) -> web.StreamResponse:
        loop = asyncio.get_running_loop()
        resp = web.StreamResponse()
        resp.content_type = "text/event-stream"
        await resp.prepare(request)
        for r in range(rounds):
            for choice in (0, 1):
                await asyncio.sleep(0.03)
                played[choice].append(loop.time())
                if choice == 1 and r < 2:
                    await resp.write(_chat_chunk({"reasoning_content": "h"}, index=1))
                else:
                    await resp.write(_choice_chunk(choice, f"t{r}"))
        for choice in (0, 1):
            await resp.write(_chat_chunk({}, index=choice, finish="stop"))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    upstream.handler = handler
    p = await proxy_factory(upstream.url)
    await post(p, VLLM, {**CHAT, "n": 2})
    ls = labels(VLLM)
    gaps = p.registry.get_sample_value(names.GAP.prom_name + "_count", ls)
    assert gaps == 2 * (rounds - 1)
    under = p.registry.get_sample_value(names.GAP.prom_name + "_bucket", {**ls, "le": "0.05"})
    assert under == 0  # no gap is the 30 ms between two choices
    gap_sum = p.registry.get_sample_value(names.GAP.prom_name + "_sum", ls)
    truth = sum(b - a for c in (0, 1) for a, b in zip(played[c], played[c][1:], strict=False))
    assert gap_sum == pytest.approx(truth, abs=2 * (rounds - 1) * AGREEMENT_S)
    assert p.registry.get_sample_value(names.TPOT.prom_name + "_count", ls) == 2
    assert p.registry.get_sample_value(names.MAX_GAP.prom_name + "_count", ls) == 2
    tpot = p.registry.get_sample_value(names.TPOT.prom_name + "_sum", ls)
    assert tpot == pytest.approx(2 * 0.06, abs=0.02)
    # TTFT: choice 0's first token; the first answer is choice 0's too (choice 1 thinks first).
    ttft = one(p, VLLM, names.TTFT)
    answer = one(p, VLLM, names.ANSWER_TTFT)
    assert ttft[1] == answer[1]
    assert one(p, VLLM, names.REASONING_TOKENS) == (1, 2)

"""llama.cpp's reasoning extraction behind tokenstamp: thinking and answering measured apart.

llama.cpp's server (``xllamacpp``) splits ``<think>`` ... ``</think>`` out of the
text into ``reasoning_content`` (``reasoning_format`` ``deepseek``, its default)
only when the chat template knows the tags: with the model's plain ChatML
template they come back as ``content``, and so they do with a template that
only opens ``<think>`` in its generation prompt. So the server runs with a
Qwen3-shaped template (``THINKING_CHATML``): past assistant turns render their
``reasoning_content`` in ``<think>`` tags (how llama.cpp finds the markers) and
the generation prompt ends inside ``<think>`` (llama.cpp's "thinking forced
open"). The random model would think forever, so a grammar makes it write
``REASONING_WORDS`` words, ``</think>``, then ``ANSWER_WORDS`` words: llama.cpp
streams the first as ``reasoning_content`` deltas, holds the closing tag back
(its tokens are in ``completion_tokens`` but in no chunk) and streams the rest
as ``content``.

Three streams through the proxy, each checked against what the client saw:
one that thinks then answers (TTFT at the first reasoning delta, the time to
first answer token at the first content delta, both within ``AGREEMENT_S`` of
the kernel's receive stamps at the client); one that only thinks (no answer:
reasoning lasts to the end); and the first one's request with
``reasoning_format: none``, where the tags come back as text and every event is
an answer event. llama.cpp's usage carries no ``completion_tokens_details``, so
reasoning tokens are the reasoning events.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from exporters import names
from proxy.core.records import Phase
from tests.realbackend.client import Capture, Prompts, chat, output_text
from tests.realbackend.llamacpp_server import LlamaCppServer
from tests.realbackend.rawclient import stream_raw
from tests.realbackend.recorder import ProxyFactory, RecordedProxy
from tests.realbackend.scrape import Samples, scrape
from tests.realbackend.test_llamacpp_bytes_functional import settle

pytestmark = [pytest.mark.realbackend, pytest.mark.timeout(60)]

THINKING_CHATML = r"""
{%- for message in messages -%}
{%- if message.role == 'assistant' -%}
{{- '<|im_start|>assistant\n' -}}
{%- if message.reasoning_content is defined and message.reasoning_content -%}
{{- '<think>\n' + message.reasoning_content + '\n</think>\n\n' -}}
{%- endif -%}
{{- message.content + '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' -}}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}
{{- '<|im_start|>assistant\n<think>\n' -}}
{%- endif -%}
"""
"""ChatML whose assistant turn opens a thinking block (the shape of Qwen3's template)."""

REASONING_WORDS = 12
ANSWER_WORDS = 6
WORD = r'w ::= " " [a-z] [a-z] [a-z]'
THINK_THEN_ANSWER = f'root ::= w{{{REASONING_WORDS}}} "</think>" w{{{ANSWER_WORDS}}}\n{WORD}'
"""GBNF: the reasoning words, the closing tag, the answer words, then the end."""
THINK_ONLY = f"root ::= w+\n{WORD}"
"""GBNF: words without end (``max_tokens`` cuts the stream inside the thinking block)."""
WORDS_RE = re.compile(r"( [a-z]{3})+")

AGREEMENT_S = 0.005
"""Proxy read stamp to the kernel's receive stamp at the client (same clock): a few ms."""


def events_by_kind(cap: Capture) -> list[str]:
    """The kind of each output event the client saw (``reasoning`` or ``answer``), in order.

    Aligned with ``cap.output_ns``; a chunk carrying both kinds fails the test."""
    kinds = []
    for obj in cap.json_events():
        if not output_text(obj):
            continue
        delta = obj["choices"][0]["delta"]
        thought, said = delta.get("reasoning_content"), delta.get("content")
        assert bool(thought) != bool(said), f"one kind per chunk: {delta}"
        kinds.append("reasoning" if thought else "answer")
    assert len(kinds) == len(cap.output_ns)
    return kinds


def text_of(cap: Capture, key: str) -> str:
    """All of ``delta[key]`` the client got, joined."""
    return "".join(o["choices"][0]["delta"].get(key) or "" for o in cap.json_events()
                   if o.get("choices"))  # fmt: skip


def first_ns(cap: Capture, kinds: list[str], kind: str) -> int:
    """Client stamp of the first output event of ``kind`` (there must be one)."""
    found = [ns for ns, k in zip(cap.output_ns, kinds, strict=True) if k == kind]
    assert found, f"the client saw no {kind} event"
    return found[0]


def assert_agrees(client_ns: int, proxy_ns: int | None, what: str) -> float:
    """The client got the event after the proxy read it, at most ``AGREEMENT_S`` later.

    Returns that lag in seconds."""
    assert proxy_ns is not None, f"the proxy saw no {what}"
    lag_s = (client_ns - proxy_ns) / 1e9
    assert 0 <= lag_s <= AGREEMENT_S, f"{what}: client - proxy = {lag_s * 1e3:.3f} ms"
    return lag_s


async def _traced(
    proxy: RecordedProxy, body: dict[str, object], rid: str
) -> tuple[Capture, Samples]:
    """Stream ``body`` through ``proxy``; the capture and what ``/metrics`` gained by it.

    The client takes the kernel's receive stamp of each read (``rawclient``): its own
    wake-up on a shared machine is not blamed on the proxy."""
    before = await scrape(proxy.admin_url + "/metrics")
    cap = (await stream_raw(proxy.url, body, rid)).parse()
    await settle()
    gained = (await scrape(proxy.admin_url + "/metrics")).minus(before)
    assert cap.status == 200, bytes(cap.body[:500])
    assert not cap.error
    return cap, gained


def _observed(gained: Samples, inst: names.Instrument) -> tuple[float, float]:
    """``(count, sum)`` a histogram gained."""
    return gained.sum(inst.prom_name + "_count"), gained.sum(inst.prom_name + "_sum")


async def test_reasoning_then_answer_measured_apart(
    llamacpp_factory: Callable[..., LlamaCppServer],
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
) -> None:
    server = llamacpp_factory(chat_template=THINKING_CHATML, n_parallel=2, n_ctx=2048, n_batch=512)
    proxy = await recorded_proxy(server.url, provider="llama.cpp")
    prompts = Prompts(tokenizer_json, "reasoning")

    # Thinks, then answers.
    body = chat(prompts.text(30), 80, grammar=THINK_THEN_ANSWER,
                stream_options={"include_usage": True})  # fmt: skip
    cap, gained = await _traced(proxy, body, "thinks")
    kinds = events_by_kind(cap)
    n_thought = kinds.count("reasoning")
    assert n_thought >= REASONING_WORDS, bytes(cap.body[:1000])
    assert kinds == ["reasoning"] * n_thought + ["answer"] * (len(kinds) - n_thought)
    assert len(kinds) > n_thought
    assert WORDS_RE.fullmatch(text_of(cap, "reasoning_content"))
    assert WORDS_RE.fullmatch(text_of(cap, "content"))
    assert "think>" not in bytes(cap.body).decode()
    usage = cap.json_events()[-1]["usage"]
    assert "completion_tokens_details" not in usage  # llama.cpp does not count reasoning
    # The closing tag's tokens (and the end of the grammar) are generated but never sent.
    assert usage["completion_tokens"] > len(kinds)

    rec = proxy.sink.requests["thinks"]
    assert rec.outcome == "ok"
    assert rec.finish_reasons == ("stop",)
    assert rec.output_events == len(kinds)
    assert rec.reasoning_events == n_thought
    assert rec.reported_reasoning_tokens is None
    assert rec.reasoning_tokens == n_thought
    assert rec.completion_tokens == usage["completion_tokens"]
    # TTFT is the first reasoning delta; the answer comes later, and each is where the
    # client saw it.
    assert rec.first_token_ns == rec.first_reasoning_ns
    client_thought_ns = first_ns(cap, kinds, "reasoning")
    client_answer_ns = first_ns(cap, kinds, "answer")
    thought_lag_s = assert_agrees(client_thought_ns, rec.first_reasoning_ns, "reasoning delta")
    answer_lag_s = assert_agrees(client_answer_ns, rec.first_answer_ns, "content delta")
    ttft_s, answer_ttft_s, reasoning_s = rec.ttft_s, rec.answer_ttft_s, rec.reasoning_s
    assert ttft_s is not None
    assert answer_ttft_s is not None
    assert reasoning_s is not None
    assert answer_ttft_s > ttft_s
    assert reasoning_s == pytest.approx(answer_ttft_s - ttft_s, abs=1e-9)
    # Not compared: TTFT from the client's send stamp (the proxy's t0 is taken after it
    # read the request, a loop turn or a preemption later on a busy machine).
    client_reasoning_s = (client_answer_ns - client_thought_ns) / 1e9
    assert reasoning_s == pytest.approx(client_reasoning_s, abs=AGREEMENT_S)
    print(f"\nllama.cpp reasoning: TTFT {ttft_s * 1e3:.1f} ms, first answer "
          f"{answer_ttft_s * 1e3:.1f} ms, {n_thought} reasoning events; client - proxy "
          f"{thought_lag_s * 1e3:.3f} ms (first reasoning), "
          f"{answer_lag_s * 1e3:.3f} ms (first answer)")  # fmt: skip
    # Observed live, once each, and exported as recorded.
    live = proxy.sink.phases["thinks"]
    assert proxy.sink.first_tokens["thinks"] == pytest.approx(ttft_s, abs=1e-9)
    assert live[Phase.ANSWER] == pytest.approx(answer_ttft_s, abs=1e-9)
    assert live[Phase.REASONING] == pytest.approx(reasoning_s, abs=1e-9)
    assert _observed(gained, names.TTFT) == pytest.approx((1, ttft_s))
    assert _observed(gained, names.ANSWER_TTFT) == pytest.approx((1, answer_ttft_s))
    assert _observed(gained, names.REASONING_DURATION) == pytest.approx((1, reasoning_s))
    assert _observed(gained, names.REASONING_TOKENS) == (1, n_thought)

    # Only thinks: cut by max_tokens inside the block, no answer.
    cap, gained = await _traced(proxy, chat(prompts.text(30), 16, grammar=THINK_ONLY), "only")
    kinds = events_by_kind(cap)
    assert kinds == ["reasoning"] * 16
    rec = proxy.sink.requests["only"]
    assert rec.finish_reasons == ("length",)
    assert rec.first_token_ns == rec.first_reasoning_ns
    assert rec.first_answer_ns is None
    assert_agrees(first_ns(cap, kinds, "reasoning"), rec.first_reasoning_ns, "first reasoning")
    assert rec.reasoning_s == pytest.approx((rec.end_ns - rec.first_token_ns) / 1e9)
    assert rec.reasoning_tokens == 16
    assert Phase.ANSWER not in proxy.sink.phases["only"]
    assert proxy.sink.phases["only"][Phase.REASONING] == pytest.approx(rec.reasoning_s, abs=1e-9)
    assert _observed(gained, names.ANSWER_TTFT) == (0, 0)
    assert _observed(gained, names.REASONING_DURATION) == pytest.approx((1, rec.reasoning_s))
    assert _observed(gained, names.REASONING_TOKENS) == (1, 16)

    # Extraction off for this request: the tags are text, and all of it is the answer.
    body = chat(prompts.text(30), 80, grammar=THINK_THEN_ANSWER, reasoning_format="none")
    cap, gained = await _traced(proxy, body, "raw")
    kinds = events_by_kind(cap)
    assert set(kinds) == {"answer"}
    content = text_of(cap, "content")
    assert content.startswith("<think>")
    assert "</think>" in content
    rec = proxy.sink.requests["raw"]
    assert rec.output_events == len(kinds)
    assert rec.first_reasoning_ns is None
    assert rec.reasoning_tokens is None
    assert rec.first_answer_ns == rec.first_token_ns
    assert_agrees(cap.output_ns[0], rec.first_answer_ns, "first content delta")
    assert _observed(gained, names.ANSWER_TTFT) == pytest.approx((1, rec.answer_ttft_s))
    assert _observed(gained, names.REASONING_DURATION) == (0, 0)

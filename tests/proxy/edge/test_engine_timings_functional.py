"""Tokens per output event and the engine's own timings, through the proxy over real sockets.

The scripted upstreams send what vLLM (``metrics`` in the final usage chunk,
``--enable-per-request-metrics``, ``--per-request-spec-decode-metrics``) and
SGLang (``meta_info`` on the finishing choice, ``--enable-metrics`` and
``return_meta_info``) send; the histograms must hold the truth of the script.
"""

from __future__ import annotations

import json

import pytest

from exporters import names
from tests.conftest import Script
from tests.proxy.edge.test_app_functional import LABELS, body, chat_chunk, post, sse

CHAT = "/v1/chat/completions"
PREFILL_S = 0.12


def _usage_chunk(completion_tokens: int, **extra: object) -> bytes:
    usage = {"prompt_tokens": 5, "completion_tokens": completion_tokens,
             "total_tokens": 5 + completion_tokens}  # fmt: skip
    return sse({"id": "chatcmpl-1", "choices": [], "usage": usage, **extra})


def _stream(texts: list[str], tail: list[bytes]) -> Script:
    parts = [(0.0, chat_chunk("", role=True))]
    for i, text in enumerate(texts):
        parts.append((PREFILL_S if i == 0 else 0.02, chat_chunk(text)))
    parts += [(0.0, b) for b in tail]
    parts.append((0.0, b"data: [DONE]\n\n"))
    return Script(parts)


def _value(p, inst: names.Instrument, suffix: str) -> float | None:
    return p.registry.get_sample_value(inst.prom_name + suffix, LABELS)


@pytest.mark.parametrize(
    ("tokens_per_chunk", "expected_bucket"), [([1, 1, 1, 1], "1.0"), ([3, 2, 4, 3, 3], "3.0")]
)
async def test_tokens_per_event_is_the_scripts_truth(
    upstream, proxy_factory, tokens_per_chunk, expected_bucket
):
    # Each chunk carries that many tokens (a speculative step, a stream interval).
    texts = [" tok" * n for n in tokens_per_chunk]
    upstream.script = _stream(texts, [_usage_chunk(sum(tokens_per_chunk))])
    p = await proxy_factory(upstream.url)
    status, _, _ = await post(p.url + CHAT, body())
    assert status == 200
    truth = sum(tokens_per_chunk) / len(tokens_per_chunk)
    assert _value(p, names.TOKENS_PER_EVENT, "_count") == 1
    assert _value(p, names.TOKENS_PER_EVENT, "_sum") == pytest.approx(truth)
    below = p.registry.get_sample_value(
        names.TOKENS_PER_EVENT.prom_name + "_bucket", {**LABELS, "le": expected_bucket}
    )
    assert below == 1
    # TPOT is per token, the gaps per chunk: with several tokens a chunk they differ.
    tpot = _value(p, names.TPOT, "_sum")
    gaps = _value(p, names.GAP, "_sum")
    assert tpot is not None
    assert gaps is not None
    assert tpot == pytest.approx(gaps / (sum(tokens_per_chunk) - 1), rel=0.05)
    # No speculative-decoding report from this backend: no acceptance length.
    assert _value(p, names.ACCEPTANCE_LENGTH, "_count") is None


async def test_no_tokens_per_event_without_a_completion_count(upstream, proxy_factory):
    upstream.script = _stream(["a", "b"], [])
    p = await proxy_factory(upstream.url, inject_usage=False)
    status, _, _ = await post(p.url + CHAT, body())
    assert status == 200
    assert _value(p, names.TTFT, "_count") == 1
    assert _value(p, names.TOKENS_PER_EVENT, "_count") is None


async def test_vllm_per_request_metrics_give_queue_time_and_acceptance(upstream, proxy_factory):
    metrics = {
        "time_to_first_token_ms": 80.0,  # vLLM: scheduled to first token
        "generation_time_ms": 40.0,
        "queue_time_ms": 25.0,
        "mean_itl_ms": 20.0,
        "tokens_per_second": 50.0,
        "speculative_decoding": {"mean_acceptance_length": 2.5, "num_spec_steps": 4},
    }
    upstream.script = _stream(["a b c", "d e", "f g h i j"], [_usage_chunk(10, metrics=metrics)])
    p = await proxy_factory(upstream.url)
    status, got, _ = await post(p.url + CHAT, body())
    assert status == 200
    assert b"metrics" not in got  # the usage chunk the proxy asked for is removed again
    ttft = _value(p, names.TTFT, "_sum")
    assert ttft is not None
    assert ttft == pytest.approx(PREFILL_S, abs=0.05)
    assert _value(p, names.QUEUE_TIME, "_count") == 1
    assert _value(p, names.QUEUE_TIME, "_sum") == pytest.approx(ttft - 0.080)
    assert _value(p, names.ACCEPTANCE_LENGTH, "_sum") == 2.5
    assert _value(p, names.TOKENS_PER_EVENT, "_sum") == pytest.approx(10 / 3)


async def test_sglang_meta_info_gives_queue_time_and_acceptance(upstream, proxy_factory):
    meta = {
        "id": "x", "prompt_tokens": 5, "completion_tokens": 9, "cached_tokens": 0,
        "queue_time": 0.02, "forward_entry_time": 1000.0, "prefill_finished_time": 1000.05,
        "e2e_latency": 0.3, "spec_verify_ct": 3,
    }  # fmt: skip
    finish = sse({
        "id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
        "choices": [{"index": 0, "delta": {}, "finish_reason": "stop", "meta_info": meta}],
    })  # fmt: skip
    upstream.script = _stream(["a b c", "d e f", "g h i"], [finish, _usage_chunk(9)])
    p = await proxy_factory(upstream.url)  # the meaning is read whatever the provider label
    status, _, _ = await post(p.url + CHAT, body(return_meta_info=True))
    assert status == 200
    assert json.loads(upstream.requests[0]["body"])["return_meta_info"] is True
    ttft = _value(p, names.TTFT, "_sum")
    assert ttft is not None
    assert _value(p, names.QUEUE_TIME, "_sum") == pytest.approx(ttft - 0.05, abs=1e-6)
    assert _value(p, names.ACCEPTANCE_LENGTH, "_sum") == pytest.approx(3.0)
    assert _value(p, names.TOKENS_PER_EVENT, "_sum") == pytest.approx(3.0)

"""The engine's own timings in OpenAI-compatible chunks: vLLM ``metrics``, SGLang ``meta_info``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.core.decoders.engine_metrics import engine_timings, sglang_timings, vllm_timings
from proxy.core.decoders.openai import interpret
from proxy.core.records import BackendTimings

# The usage chunk of vLLM's docs/features/per_request_metrics.md, with the spec-decode summary.
VLLM_USAGE = {
    "id": "chatcmpl-abc123", "object": "chat.completion.chunk", "choices": [],
    "usage": {"prompt_tokens": 42, "completion_tokens": 128, "total_tokens": 170},
    "metrics": {
        "time_to_first_token_ms": 85.2, "generation_time_ms": 1240.5, "queue_time_ms": 12.3,
        "mean_itl_ms": 9.1, "tokens_per_second": 103.2,
        "speculative_decoding": {"mean_acceptance_length": 1.2325581395348837,
                                 "num_spec_steps": 43, "num_accepted_draft_tokens": 10},
    },
}  # fmt: skip


def test_vllm_usage_chunk_metrics():
    info = interpret(json.dumps(VLLM_USAGE), known_ids=True)
    assert info is not None
    assert info.usage_only
    t = info.backend_timings
    assert t == BackendTimings(
        prefill_s=pytest.approx(0.0852),
        decode_s=pytest.approx(1.2405),
        per_token_s=pytest.approx(0.0091),
        queue_s=pytest.approx(0.0123),
        acceptance_length=pytest.approx(1.2325581395348837),
    )


def test_vllm_nulls_and_a_null_metrics_object():
    # All fields null (no timing data), or metrics null (n > 1): nothing known.
    nulls = dict.fromkeys(("time_to_first_token_ms", "generation_time_ms", "queue_time_ms"))
    assert vllm_timings(nulls) is None
    assert interpret(json.dumps({**VLLM_USAGE, "metrics": None})).backend_timings is None
    single = vllm_timings({"queue_time_ms": 3, "mean_itl_ms": None})
    assert single == BackendTimings(queue_s=0.003)
    assert vllm_timings({"queue_time_ms": 10**400, "generation_time_ms": -1.0}) is None


def test_sglang_meta_info_on_the_finishing_choice():
    meta = {"queue_time": 0.25, "forward_entry_time": 10.0, "prefill_finished_time": 10.5,
            "e2e_latency": 2.0, "spec_verify_ct": 4, "completion_tokens": 10}  # fmt: skip
    chunk = {"id": "x", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop",
                                     "meta_info": meta}]}  # fmt: skip
    t = interpret(json.dumps(chunk), known_ids=True).backend_timings
    assert t == BackendTimings(prefill_s=0.5, total_s=2.0, queue_s=0.25, acceptance_length=2.5)
    # A newer server's own acceptance length wins over the ratio.
    assert sglang_timings({**meta, "spec_accept_length": 3.0}).acceptance_length == 3.0


def test_sglang_without_metrics_says_nothing():
    # Without --enable-metrics the stamps are 0.0 and queue_time absent; no speculation.
    meta = {"forward_entry_time": 0.0, "prefill_finished_time": 0.0, "completion_tokens": 3}
    assert sglang_timings(meta) is None
    # Stamps out of order, steps of zero, a length below one token: unknown, never negative.
    bad = {"forward_entry_time": 5.0, "prefill_finished_time": 4.0, "spec_verify_ct": 0,
           "spec_accept_length": 0.5, "completion_tokens": 3}  # fmt: skip
    assert sglang_timings(bad) is None


def test_content_chunks_are_not_searched():
    # A plain token chunk (the per-token path) never carries timings, even with the key.
    chunk = {"id": "x", "choices": [{"index": 0, "delta": {"content": "a"}}],
             "metrics": {"queue_time_ms": 1}}  # fmt: skip
    assert interpret(json.dumps(chunk), known_ids=True).backend_timings is None


@given(st.recursive(
    st.none() | st.booleans() | st.floats(allow_nan=True) | st.integers() | st.text(max_size=4),
    lambda children: st.lists(children, max_size=3)
    | st.dictionaries(st.sampled_from(["metrics", "meta_info", "queue_time_ms", "queue_time",
                                       "speculative_decoding", "mean_acceptance_length",
                                       "spec_verify_ct", "completion_tokens", "choices",
                                       "forward_entry_time", "prefill_finished_time"]),
                      children, max_size=5),
    max_leaves=20,
))  # fmt: skip
def test_any_shape_never_raises(value):
    obj = value if isinstance(value, dict) else {"metrics": value}
    t = engine_timings(obj, obj.get("choices"))
    assert t is None or isinstance(t, BackendTimings)
    if t is not None:
        for v in (t.prefill_s, t.queue_s, t.total_s, t.decode_s, t.per_token_s):
            assert v is None or v >= 0
        assert t.acceptance_length is None or t.acceptance_length >= 1

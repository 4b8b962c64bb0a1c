"""Content capture: GenAI message JSON from request bodies and response bytes; never raises."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporters.otel_content import TRUNCATED, input_messages, output_messages


def test_completions_prompt_and_json_body():
    assert json.loads(input_messages({"prompt": "once upon"}) or "") == [
        {"role": "user", "parts": [{"type": "text", "content": "once upon"}]}
    ]
    assert input_messages({"prompt": [1, 2, 3]}) is None  # token ids: nothing to show
    answer = {"choices": [{"index": 0, "text": "a time", "finish_reason": "length"}]}
    assert json.loads(output_messages(json.dumps(answer).encode(), streamed=False) or "") == [
        {"role": "assistant", "parts": [{"type": "text", "content": "a time"}],
         "finish_reason": "length"}
    ]  # fmt: skip


def test_streamed_tool_calls_reasoning_and_two_choices():
    chunks = [
        {"choices": [{"index": 0, "delta": {"reasoning_content": "think"}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "call_1", "function": {"name": "get", "arguments": '{"a":'}}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "function": {"arguments": "1}"}}]}, "finish_reason": "tool_calls"}]},
        {"choices": [{"index": 1, "delta": {"content": "hi"}, "finish_reason": "stop"}]},
    ]  # fmt: skip
    raw = b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks)
    raw += b"data: [DONE]\n\n"
    assert json.loads(output_messages(raw, streamed=True) or "") == [
        {"role": "assistant", "finish_reason": "tool_calls", "parts": [
            {"type": "reasoning", "content": "think"},
            {"type": "tool_call", "id": "call_1", "name": "get", "arguments": '{"a":1}'}]},
        {"role": "assistant", "finish_reason": "stop",
         "parts": [{"type": "text", "content": "hi"}]},
    ]  # fmt: skip


def test_the_cap_spans_all_messages_of_one_attribute():
    body = {
        "messages": [{"role": "user", "content": "a" * 10}, {"role": "user", "content": "b" * 10}]
    }
    got = json.loads(input_messages(body, cap_chars=15) or "")
    assert got[0]["parts"][0]["content"] == "a" * 10
    assert got[1]["parts"][0]["content"] == "b" * 5 + TRUNCATED


@given(st.binary(max_size=400), st.booleans())
def test_output_never_raises(raw, streamed):
    out = output_messages(raw, streamed=streamed)
    assert out is None or isinstance(json.loads(out), list)


SHARED_CORES = settings(suppress_health_check=[HealthCheck.too_slow])
"""Generating nested JSON on 2 shared, busy cores can trip the too-slow check; the
property is what is tested, not how fast examples come."""

JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["role", "content", "type", "text", "tool_calls", "function", "prompt",
                         "messages", "choices", "delta", "index"]), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


@SHARED_CORES
@given(st.dictionaries(st.sampled_from(["messages", "prompt", "model"]), JSONISH, max_size=3))
def test_input_never_raises(body):
    out = input_messages(body)
    assert out is None or isinstance(json.loads(out), list)


@SHARED_CORES
@given(JSONISH)
def test_any_json_response_never_raises(obj):
    raw = json.dumps(obj).encode()
    for streamed, data in ((False, raw), (True, b"data: " + raw + b"\n\n")):
        out = output_messages(data, streamed=streamed)
        assert out is None or isinstance(json.loads(out), list)

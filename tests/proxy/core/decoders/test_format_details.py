"""Each format interpreter's details, and the shared readers, one case at a time."""

from __future__ import annotations

import json
import math

import pytest

from proxy.core.decoders import anthropic, llamacpp, ollama, responses, tgi
from proxy.core.decoders.meaning import (
    STREAM_ERROR,
    BackendTimings,
    ChunkMeaning,
    error_kind,
    load_object,
    queue_time_s,
    seconds,
)
from proxy.core.decoders.openai import OUTPUT, Usage

# --- details of each format -----------------------------------------------------------------


def test_plain_output_events_are_the_shared_constant():
    # The relay times ``info is OUTPUT`` without looking further: the per-token fast path.
    delta = {
        "type": "content_block_delta",
        "index": 0,
        "delta": {"type": "text_delta", "text": "x"},
    }
    assert anthropic.interpret(json.dumps(delta)) is OUTPUT
    assert responses.interpret('{"type": "response.output_text.delta", "delta": "x"}') is OUTPUT
    assert tgi.interpret('{"index": 3, "token": {"text": "x", "special": false}}') is OUTPUT
    assert llamacpp.interpret('{"content": "x", "stop": false, "tokens_predicted": 3}') is OUTPUT
    line = '{"model": "m", "response": "x", "done": false}'
    assert ollama.interpret(line, "", known_ids=True) is OUTPUT
    first = ollama.interpret(line, "")
    assert first is not None
    assert (first.output, first.model) == (True, "m")


def test_anthropic_non_output_deltas_and_unknown_events():
    for delta in (
        {"type": "signature_delta", "signature": "abc"},
        {"type": "citations_delta", "citation": {"cited_text": "x"}},
        {"type": "text_delta", "text": ""},
        {"type": "text_delta"},
        {"type": "input_json_delta", "partial_json": ""},
        {"type": "future_delta", "text": "x"},
        "not an object",
    ):
        data = json.dumps({"type": "content_block_delta", "index": 0, "delta": delta})
        info = anthropic.interpret(data, "content_block_delta")
        assert info is not None
        assert info.output is False
    assert anthropic.interpret('{"type": "some_new_event"}') == ChunkMeaning(output=False)
    # The SSE event name stands in for a data object without "type".
    info = anthropic.interpret(
        '{"delta": {"type": "text_delta", "text": "x"}}', "content_block_delta"
    )
    assert info is not None
    assert info.output is True


def test_anthropic_message_delta_with_cumulative_input_usage():
    data = json.dumps({
        "type": "message_delta", "delta": {"stop_reason": "max_tokens"},
        "usage": {"input_tokens": 10, "cache_read_input_tokens": 90,
                  "cache_creation_input_tokens": 5, "output_tokens": 64},
    })  # fmt: skip
    info = anthropic.interpret(data)
    assert info is not None
    assert info.usage == Usage(prompt_tokens=105, completion_tokens=64, cached_tokens=90)
    assert info.finish_reasons == ("max_tokens",)


def test_anthropic_error_without_type_and_bodies():
    info = anthropic.interpret('{"type": "error", "error": {"message": "boom"}}')
    assert info is not None
    assert info.error == STREAM_ERROR
    body = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude",
            "content": [{"type": "text", "text": "Hi"}], "stop_reason": "end_turn",
            "usage": {"input_tokens": 12, "output_tokens": 6}}  # fmt: skip
    info = anthropic.interpret_body(body)
    assert (info.usage, info.finish_reasons, info.model, info.response_id) == (
        Usage(12, 6, None), ("end_turn",), "claude", "msg_1")  # fmt: skip
    err = anthropic.interpret_body({"type": "error", "error": {"type": "invalid_request_error"}})
    assert err.error == "invalid_request_error"


def test_responses_error_kinds_are_safe_labels():
    for payload, kind in (
        ({"type": "error", "code": "Rate limit exceeded!", "message": "x"}, STREAM_ERROR),
        ({"type": "error", "code": None, "error": {"type": "server_error"}}, "server_error"),
        ({"type": "error"}, STREAM_ERROR),
    ):
        info = responses.interpret(json.dumps(payload))
        assert info is not None
        assert info.error == kind
    failed = responses.interpret(
        json.dumps({"type": "response.failed", "response": {"status": "failed"}})
    )
    assert failed is not None
    assert (failed.error, failed.status, failed.done) == ("response_failed", "failed", True)


def test_responses_terminal_without_status_and_bodies():
    info = responses.interpret('{"type": "response.incomplete", "response": {}}')
    assert info is not None
    assert (info.status, info.finish_reasons) == ("incomplete", ("incomplete",))
    body = {"id": "resp_1", "object": "response", "status": "completed", "model": "gpt",
            "usage": {"input_tokens": 5, "input_tokens_details": {"cached_tokens": 0},
                      "output_tokens": 7}}  # fmt: skip
    info = responses.interpret_body(body)
    assert (info.usage, info.status, info.done) == (Usage(5, 7, 0), "completed", False)
    err = responses.interpret_body({"error": {"code": "invalid_api_key", "message": "no"}})
    assert err.error == "invalid_api_key"


def test_ollama_details():
    assert ollama.interpret('{"error": {"message": "x"}}') == ChunkMeaning(
        output=False, error=STREAM_ERROR
    )
    info = ollama.interpret('{"response": "", "thinking": "hm", "done": false}')
    assert info is not None
    assert info.output is True
    info = ollama.interpret('{"message": {"role": "assistant", "content": "", "tool_calls": []}}')
    assert info is not None
    assert info.output is False
    # The last line may still carry text (some servers send it).
    last = ollama.interpret(
        '{"model": "m", "response": "!", "done": true, "eval_count": 0, "eval_duration": 5}'
    )
    assert last is not None
    assert (last.output, last.done) == (True, True)
    assert last.backend_timings == BackendTimings(decode_s=5e-9, per_token_s=None)


def test_tgi_special_token_is_not_output_even_with_text():
    info = tgi.interpret('{"index": 1, "token": {"id": 2, "text": "</s>", "special": true}}')
    assert info == ChunkMeaning(output=False)
    body = tgi.interpret_body({"generated_text": "Hi", "details": {"finish_reason": "length",
                                                                  "generated_tokens": 2}})  # fmt: skip
    assert (body.usage, body.finish_reasons, body.done) == (Usage(None, 2, None), ("length",), True)


def test_llamacpp_legacy_stop_flags_and_openai_timings():
    info = llamacpp.interpret(
        '{"content": "", "stop": true, "stopped_eos": true, "stopped_limit": false}'
    )
    assert info is not None
    assert (info.finish_reasons, info.done) == (("eos",), True)
    info = llamacpp.interpret('{"content": "", "stop": true, "stop_type": "none"}')
    assert info is not None
    assert info.finish_reasons == ()
    chunk = {"choices": [], "timings": {"prompt_ms": 12.5, "predicted_per_token_ms": 8.0}}
    assert llamacpp.timings_of(chunk) == BackendTimings(prefill_s=0.0125, per_token_s=0.008)
    assert llamacpp.timings_of({"timings": {"prompt_ms": "fast"}}) is None
    err = llamacpp.interpret('{"error": "plain text"}')
    assert err is not None
    assert err.error == STREAM_ERROR


# --- the shared readers ---------------------------------------------------------------------


def test_queue_time():
    assert queue_time_s(0.5, BackendTimings(prefill_s=0.2, load_s=0.1)) == pytest.approx(0.2)
    assert queue_time_s(0.1, BackendTimings(prefill_s=0.2)) == 0.0  # clamped
    assert queue_time_s(None, BackendTimings(prefill_s=0.2)) is None
    assert queue_time_s(0.5, BackendTimings(decode_s=1.0)) is None
    assert queue_time_s(0.5, None) is None


def test_readers_reject_wrong_types():
    assert seconds(True, 1e3) is None
    assert seconds(-1, 1e3) is None
    assert seconds(float("nan"), 1e3) is None
    assert seconds(1e308, 1e-9) is None  # overflows to inf
    assert seconds("1", 1e3) is None
    assert seconds(1500, 1e3) == 1.5
    assert load_object("[" * 100_000) is None
    assert load_object("[1]") is None
    assert load_object("{") is None
    assert error_kind(None, 3, "has space", "ok_kind") == "ok_kind"
    assert error_kind("x" * 65) == STREAM_ERROR
    assert not math.isnan(seconds(0, 1e9) or 0.0)

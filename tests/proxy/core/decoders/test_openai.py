"""What counts as an output event (DESIGN.md), for every backend's chunk shape."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from proxy.core.decoders.openai import (
    OUTPUT,
    REASONING,
    TOOL_CALL,
    _general,
    interpret,
    interpret_object,
)


def chunk(delta=None, *, text=None, finish=None, **top):
    choice: dict[str, object] = {"index": 0, "finish_reason": finish}
    if delta is not None:
        choice["delta"] = delta
    if text is not None:
        choice["text"] = text
    return json.dumps({"id": "x", "model": "m", "choices": [choice], **top})


@pytest.mark.parametrize(
    ("data", "output"),
    [
        (chunk({"role": "assistant", "content": ""}), False),  # role chunk
        (chunk({"role": "assistant"}), False),
        (chunk({}), False),  # empty delta
        (chunk({"content": ""}, finish="stop"), False),  # finish chunk with empty delta
        (chunk({"content": "hi"}), True),
        (chunk({"content": "hi"}, finish="length"), True),  # vLLM: finish on the last content
        (chunk({"reasoning_content": "hmm"}), True),
        (chunk({"reasoning": "hmm"}), True),
        (chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{"}}]}), True),
        (chunk({"tool_calls": []}), False),
        (chunk({"content": None}), False),
        (chunk(text="a"), True),  # completions
        (chunk(text=""), False),
        (json.dumps({"id": "x", "choices": [], "usage": {"prompt_tokens": 1}}), False),
    ],
)
def test_output_events(data, output):
    info = interpret(data)
    assert info is not None
    assert info.output is output


def test_usage_only_chunk_and_cached_tokens():
    data = json.dumps(
        {
            "id": "x",
            "choices": [],
            "usage": {"prompt_tokens": 9, "completion_tokens": 3,
                      "prompt_tokens_details": {"cached_tokens": 4}},
        }
    )  # fmt: skip
    info = interpret(data)
    assert info is not None
    assert info.usage_only
    assert info.usage is not None
    assert (info.usage.prompt_tokens, info.usage.completion_tokens) == (9, 3)
    assert info.usage.cached_tokens == 4


def test_usage_on_a_content_chunk_is_not_usage_only():
    info = interpret(chunk({"content": "a"}, usage={"prompt_tokens": 1, "completion_tokens": 1}))
    assert info is not None
    assert info.output
    assert not info.usage_only


def test_openai_null_usage_on_every_chunk():
    info = interpret(chunk({"content": "a"}, usage=None))
    assert info is not None
    assert info.usage is None


def test_done_error_and_garbage():
    done = interpret("[DONE]")
    assert done is not None
    assert done.done
    err = interpret('{"error": {"message": "boom", "type": "InternalServerError"}}')
    assert err is not None
    assert err.error == "InternalServerError"
    assert interpret("{not json") is None
    assert interpret("[1, 2]") is None
    assert interpret('"str"') is None


def test_finish_reasons_and_weird_types():
    info = interpret(chunk({"content": "a"}, finish="stop"))
    assert info is not None
    assert info.finish_reasons == ("stop",)
    weird = interpret(
        json.dumps({"choices": [None, 3, {"delta": "x"}], "usage": {"prompt_tokens": -1}})
    )
    assert weird is not None
    assert not weird.output
    assert weird.usage is not None
    assert weird.usage.prompt_tokens is None


# The one-choice and no-choice paths of ``interpret_object`` against the general walk.

_CONSTANTS = (OUTPUT, REASONING, TOOL_CALL, interpret_object({}))


def same_as_general(obj: dict[str, Any], known_ids: bool) -> None:
    fast = interpret_object(obj, known_ids=known_ids)
    general = _general(obj, known_ids)
    assert fast == general, obj
    for shared in _CONSTANTS:  # the relay tells a plain token by identity (``is OUTPUT``)
        assert (fast is shared) == (general is shared), obj


_ID = "chatcmpl-8f2a1c"
_M = "meta-llama/Llama-3.1-8B-Instruct"
_USAGE = {"prompt_tokens": 12, "total_tokens": 22, "completion_tokens": 10}
_TIMINGS = {"prompt_n": 12, "prompt_ms": 20.3, "predicted_n": 10, "predicted_ms": 93.6}

REAL_LAYOUTS = [
    # vLLM chat (ChatCompletionStreamResponse): role, token, finish on the last token,
    # finish with an empty delta, usage chunk (include_usage), with per-request metrics.
    {"id": _ID, "object": "chat.completion.chunk", "created": 1733500000, "model": _M,
     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}]},
    {"id": _ID, "object": "chat.completion.chunk", "created": 1733500000, "model": _M,
     "choices": [{"index": 0, "delta": {"content": "Hi"}, "logprobs": None,
                  "finish_reason": "length", "stop_reason": None}]},
    {"id": _ID, "object": "chat.completion.chunk", "created": 1733500000, "model": _M,
     "choices": [{"index": 0, "delta": {"content": ""}, "logprobs": None,
                  "finish_reason": "stop", "stop_reason": None}]},
    {"id": _ID, "object": "chat.completion.chunk", "created": 1733500000, "model": _M,
     "choices": [], "usage": _USAGE},
    {"id": _ID, "object": "chat.completion.chunk", "created": 1733500000, "model": _M,
     "choices": [], "usage": {**_USAGE, "prompt_tokens_details": {"cached_tokens": 8}},
     "metrics": {"queue_time_ms": 1.5, "time_to_first_token_ms": 20.0,
                 "generation_time_ms": 90.0, "mean_itl_ms": 10.0}},
    # vLLM with continuous usage stats: usage on every chunk, also the role chunk.
    {"id": _ID, "object": "chat.completion.chunk", "created": 1733500000, "model": _M,
     "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                  "logprobs": None, "finish_reason": None}],
     "usage": {"prompt_tokens": 12, "total_tokens": 12, "completion_tokens": 0}},
    # vLLM with continuous_usage_stats: usage on every token too.
    {"id": _ID, "object": "chat.completion.chunk", "created": 1733500000, "model": _M,
     "choices": [{"index": 0, "delta": {"content": " sea"}, "logprobs": None,
                  "finish_reason": None}],
     "usage": {"prompt_tokens": 12, "total_tokens": 15, "completion_tokens": 3}},
    # vLLM reasoning and tool-call finishes.
    {"id": _ID, "object": "chat.completion.chunk", "created": 1, "model": _M,
     "choices": [{"index": 0, "delta": {"reasoning_content": "hm"}, "logprobs": None,
                  "finish_reason": "length"}]},
    {"id": _ID, "object": "chat.completion.chunk", "created": 1, "model": _M,
     "choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function":
                  {"arguments": "}"}}]}, "logprobs": None, "finish_reason": "tool_calls"}]},
    # vLLM completions (CompletionStreamResponse).
    {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": _M,
     "choices": [{"index": 0, "text": "", "logprobs": None, "finish_reason": "length",
                  "stop_reason": None}]},
    {"id": "cmpl-1", "object": "text_completion", "created": 1, "model": _M,
     "choices": [], "usage": _USAGE},
    # llama.cpp server: role chunk with null content, finish with an empty delta, usage and
    # timings on the finish chunk (tools/server, to_json_oaicompat_chat_stream).
    {"choices": [{"finish_reason": None, "index": 0,
                  "delta": {"role": "assistant", "content": None}}],
     "created": 1754523863, "id": _ID, "model": "gpt-oss:20b",
     "system_fingerprint": "b6097-9515c613", "object": "chat.completion.chunk"},
    {"choices": [{"finish_reason": "stop", "index": 0, "delta": {}}], "created": 1754524122,
     "id": _ID, "model": "gpt-oss:20b", "system_fingerprint": "b6097-9515c613",
     "object": "chat.completion.chunk", "usage": _USAGE, "timings": _TIMINGS},
    {"choices": [], "created": 1, "id": _ID, "model": "gpt-oss:20b",
     "object": "chat.completion.chunk", "usage": _USAGE, "timings": _TIMINGS},
    # SGLang: meta_info on the finishing choice (return_meta_info), usage chunk.
    {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "default",
     "choices": [{"index": 0, "delta": {"role": None, "content": ""}, "logprobs": None,
                  "finish_reason": "stop", "matched_stop": 128009,
                  "meta_info": {"forward_entry_time": 1.0, "prefill_finished_time": 1.2,
                                "queue_time": 0.01, "e2e_latency": 0.5}}],
     "usage": None},
    {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": "default",
     "choices": [], "usage": {**_USAGE, "prompt_tokens_details": None}},
    # TGI's OpenAI route: usage on the finish chunk, system_fingerprint, no id prefix.
    {"object": "chat.completion.chunk", "id": "", "created": 1, "model": "tgi",
     "system_fingerprint": "3.0.1-sha", "choices": [{"index": 0, "delta":
     {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": "stop"}],
     "usage": _USAGE},
    # OpenAI: usage null on every chunk, refusal null, service_tier.
    {"id": _ID, "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
     "service_tier": "default", "system_fingerprint": "fp_1",
     "choices": [{"index": 0, "delta": {"role": "assistant", "content": "", "refusal": None},
                  "logprobs": None, "finish_reason": None}], "usage": None},
    {"id": _ID, "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
     "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}],
     "usage": None},
    {"id": _ID, "object": "chat.completion.chunk", "created": 1, "model": "gpt-4o-mini",
     "choices": [], "usage": {**_USAGE, "prompt_tokens_details": {"cached_tokens": 0,
     "audio_tokens": 0}, "completion_tokens_details": {"reasoning_tokens": 4}}},
    # A non-streaming body (message, not delta).
    {"id": _ID, "object": "chat.completion", "model": _M, "choices": [{"index": 0,
     "message": {"role": "assistant", "content": "Hi"}, "finish_reason": "stop"}],
     "usage": _USAGE},
    # vLLM with n > 1: each chunk carries one choice, named by its index.
    {"id": _ID, "object": "chat.completion.chunk", "created": 1, "model": _M,
     "choices": [{"index": 1, "delta": {"content": "a"}, "logprobs": None,
                  "finish_reason": None}]},
    {"id": _ID, "object": "chat.completion.chunk", "created": 1, "model": _M,
     "choices": [{"index": 2, "delta": {"reasoning_content": "a"}, "logprobs": None,
                  "finish_reason": None}]},
    # Several choices in one chunk (the general walk), an error, odd choices.
    {"id": _ID, "model": _M, "choices": [{"index": 1, "delta": {"content": "a"}},
                                         {"index": 0, "delta": {"content": "b"}}]},
    {"id": _ID, "model": _M, "choices": [{"index": 1, "delta": {"content": "a"},
                                          "finish_reason": "stop"}]},
    {"error": {"message": "boom", "type": "InternalServerError"}, "choices": []},
    {"id": _ID, "choices": None, "usage": _USAGE},
    {"id": _ID, "choices": ["x"]},
]  # fmt: skip


@pytest.mark.parametrize("known_ids", [False, True])
@pytest.mark.parametrize("obj", REAL_LAYOUTS, ids=range(len(REAL_LAYOUTS)))
def test_real_layouts_read_as_the_general_walk_reads_them(obj, known_ids):
    same_as_general(obj, known_ids)


_ANY = st.one_of(
    st.none(), st.booleans(), st.integers(-2, 3), st.sampled_from(["", "a", "stop", "length"])
)
_TEXT = st.one_of(st.sampled_from([None, "", "hi", 0, True]), _ANY)
_DELTA = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["assistant", None]),
        "content": _TEXT,
        "reasoning_content": _TEXT,
        "reasoning": _TEXT,
        "tool_calls": st.sampled_from([None, [], [{"index": 0}], "x"]),
        "refusal": st.none(),
    },
)
_META = st.fixed_dictionaries(
    {},
    optional={
        "forward_entry_time": st.sampled_from([1.0, 0, None]),
        "prefill_finished_time": st.sampled_from([1.5, 0.5, "x"]),
        "e2e_latency": st.sampled_from([0.5, -1, None]),
    },
)
_CHOICE = st.fixed_dictionaries(
    {},
    optional={
        "index": st.one_of(st.sampled_from([0, 0, 1, 3, -1, 1.0, 1 << 16, None, "0"]), _ANY),
        "delta": st.one_of(_DELTA, _ANY),
        "message": st.one_of(_DELTA, _ANY),
        "text": _TEXT,
        "logprobs": st.none(),
        "finish_reason": st.one_of(st.sampled_from(["stop", "length", "tool_calls"]), _ANY),
        "stop_reason": st.sampled_from([None, 128009, "</s>"]),
        "meta_info": st.one_of(_META, _ANY),
    },
)
_COUNT = st.one_of(st.integers(-1, 50), st.none(), st.booleans(), st.just("3"))
_USAGES = st.one_of(
    st.none(),
    _ANY,
    st.fixed_dictionaries(
        {},
        optional={
            "prompt_tokens": _COUNT,
            "completion_tokens": _COUNT,
            "total_tokens": _COUNT,
            "prompt_tokens_details": st.one_of(
                st.none(), st.fixed_dictionaries({}, optional={"cached_tokens": _COUNT})
            ),
            "completion_tokens_details": st.one_of(
                st.none(), st.fixed_dictionaries({}, optional={"reasoning_tokens": _COUNT})
            ),
        },
    ),
)
CHUNKS = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.just(_ID), _ANY),
        "object": st.just("chat.completion.chunk"),
        "created": st.just(1733500000),
        "model": st.one_of(st.just(_M), _ANY),
        "choices": st.one_of(
            st.lists(st.one_of(_CHOICE, _ANY), max_size=1),
            st.lists(_CHOICE, min_size=1, max_size=1),
            st.lists(_CHOICE, min_size=2, max_size=3),
            _ANY,
        ),
        "usage": _USAGES,
        "error": st.one_of(st.none(), st.just({"type": "BadRequestError"}), _ANY),
        "metrics": st.one_of(
            st.fixed_dictionaries({}, optional={"time_to_first_token_ms": _COUNT}), _ANY
        ),
        "meta_info": st.one_of(_META, _ANY),
        "timings": st.just(_TIMINGS),
    },
)


# Chunks as servers send them, varied where the paths branch.
PLAUSIBLE = st.builds(
    lambda top, choice, extra: {**top, "choices": [choice], **extra},
    st.fixed_dictionaries({"id": st.just(_ID), "model": st.just(_M)}),
    st.fixed_dictionaries(
        {"index": st.sampled_from([0, 0, 0, 1, None]), "delta": _DELTA},
        optional={
            "logprobs": st.none(),
            "finish_reason": st.sampled_from([None, None, "", "stop", "length"]),
        },
    ),
    st.fixed_dictionaries({}, optional={"usage": _USAGES, "metrics": st.just({"mean_itl_ms": 9})}),
)


@settings(max_examples=3000, deadline=None)
@given(obj=st.one_of(CHUNKS, PLAUSIBLE), known_ids=st.booleans())
def test_any_chunk_reads_as_the_general_walk_reads_it(obj, known_ids):
    same_as_general(obj, known_ids)

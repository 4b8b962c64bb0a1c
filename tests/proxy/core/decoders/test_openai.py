"""What counts as an output event (DESIGN.md), for every backend's chunk shape."""

from __future__ import annotations

import json

import pytest

from proxy.core.decoders.openai import interpret


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

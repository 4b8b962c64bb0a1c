"""What output tokens say: reasoning, answer text, tool-call pieces (pure)."""

from __future__ import annotations

import json

from simulator.deltas import OutputShape


def test_a_step_across_the_end_of_reasoning_carries_both_fields_in_one_delta():
    # Speculative decoding emits several tokens in one event, as vLLM's parser does.
    shape = OutputShape(output_tokens=6, reasoning_tokens=3)
    assert shape.chat_delta(2, 3, "id") == {"content": " tok0 tok1", "reasoning": " think2"}
    assert list(shape.chat_delta(0, 2, "id")) == ["reasoning"]


def test_tool_call_pieces_make_valid_json_however_the_tokens_are_grouped():
    shape = OutputShape(output_tokens=7, reasoning_tokens=2, tool="f")
    for group in (1, 2, 3, 7):
        arguments = ""
        for index in range(0, 7, group):
            for call in shape.chat_delta(index, min(group, 7 - index), "id").get("tool_calls", []):
                arguments += call["function"].get("arguments", "")
        assert json.loads(arguments) == {"q": "tok1 tok2 tok3 tok4"}, group


def test_a_one_token_tool_call_has_empty_arguments():
    shape = OutputShape(output_tokens=1, tool="f")
    call = shape.chat_delta(0, 1, "id")["tool_calls"][0]
    assert call == {
        "id": "id",
        "type": "function",
        "index": 0,
        "function": {"name": "f", "arguments": "{}"},
    }
    assert shape.finish_reason("length") == "tool_calls"


def test_no_answer_no_tool_call():
    shape = OutputShape(output_tokens=3, reasoning_tokens=5, tool="f")
    assert shape.answer_tokens == 0
    assert shape.finish_reason("length") == "length"
    assert shape.message(3, "id") == {
        "role": "assistant",
        "content": None,
        "reasoning": " think0 think1 think2",
    }


def test_without_reasoning_the_answer_reads_as_before():
    shape = OutputShape(output_tokens=3)
    assert [shape.chat_delta(i, 1, "id") for i in range(3)] == [
        {"content": " tok0"},
        {"content": " tok1"},
        {"content": " tok2"},
    ]
    assert shape.message(3, "id") == {"role": "assistant", "content": " tok0 tok1 tok2"}

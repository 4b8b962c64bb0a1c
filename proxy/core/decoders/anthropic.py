"""Meaning of Anthropic Messages stream events (``POST /v1/messages``).

Follows Anthropic's "Streaming Messages" documentation: every event has an SSE
``event:`` name and the same name in its data's ``type``. The flow is
``message_start`` (a Message with empty content and the input usage), then
per content block ``content_block_start``, ``content_block_delta`` events and
``content_block_stop``, then ``message_delta`` (``stop_reason`` and the
cumulative usage) and ``message_stop``. ``ping`` events may come anywhere and
an ``error`` event (``{"type": "error", "error": {"type": "overloaded_error",
...}}``) may end the stream. Unknown event types are to be ignored.

Output events: a ``content_block_delta`` whose delta is a ``text_delta``
(an answer event), ``thinking_delta`` (a reasoning event) or
``input_json_delta`` (a tool call's input: a tool-call event) with a
non-empty payload.
``signature_delta`` (a thinking block's signature) and ``citations_delta``
carry no generated tokens.

Usage: Anthropic's ``input_tokens`` excludes the prompt tokens read from or
written to the prompt cache, so the prompt size reported here is
``input_tokens + cache_read_input_tokens + cache_creation_input_tokens``
(what ``prompt_tokens`` means for OpenAI, and what the OpenTelemetry GenAI
conventions ask of ``gen_ai.usage.input_tokens``); ``cache_read_input_tokens``
is the prefix-cache hit. The ``output_tokens`` of ``message_start`` is a
placeholder and is not reported; ``message_delta`` carries the final count.

Pure: no I/O, never raises on bad data (returns ``None`` for "not decodable").
"""

from __future__ import annotations

from typing import Any

from proxy.core.decoders.meaning import (
    NOT_OUTPUT,
    OUTPUT,
    REASONING,
    TOOL_CALL,
    ChunkMeaning,
    count,
    error_kind,
    event_type,
    known_usage,
    load_object,
    obj_at,
    text,
)
from proxy.core.decoders.openai import ChunkInfo, Usage

OUTPUT_DELTAS = {
    "text_delta": ("text", OUTPUT),
    "thinking_delta": ("thinking", REASONING),
    "input_json_delta": ("partial_json", TOOL_CALL),
}
"""Delta type: (its payload's field, the meaning of a non-empty one)."""
_DONE = ChunkMeaning(output=False, done=True)


def interpret(data: str, event: str = "message", *, known_ids: bool = False) -> ChunkInfo | None:
    """Interpret one event's data (``event`` is its SSE name); ``None`` when not decodable."""
    obj = load_object(data)
    if obj is None:
        return None
    kind = event_type(obj, event)
    if kind == "content_block_delta":
        return _delta(obj.get("delta"))
    if kind == "message_start":
        return _message(obj_at(obj, "message") or {}, start=True)
    if kind == "message_delta":
        return _message_delta(obj)
    if kind == "message_stop":
        return _DONE
    if kind == "error":
        return _error(obj)
    return NOT_OUTPUT


def interpret_body(obj: dict[str, Any]) -> ChunkMeaning:
    """Interpret a non-streaming response body (a Message, or an error object)."""
    if obj.get("type") == "error":
        return _error(obj)
    return _message(obj, start=False)


def _error(obj: dict[str, Any]) -> ChunkMeaning:
    """An error event or body: ``{"type": "error", "error": {"type": ...}}``."""
    err = obj_at(obj, "error")
    return ChunkMeaning(output=False, error=error_kind(err.get("type") if err else None))


def _delta(delta: Any) -> ChunkInfo:
    if not isinstance(delta, dict):
        return NOT_OUTPUT
    known = OUTPUT_DELTAS.get(text(delta.get("type")))
    if known is None:
        return NOT_OUTPUT
    field, meaning = known
    return meaning if text(delta.get(field)) else NOT_OUTPUT


def _message(msg: dict[str, Any], *, start: bool) -> ChunkMeaning:
    """A whole Message: from ``message_start`` (placeholder output count) or a body."""
    reason = text(msg.get("stop_reason"))
    return ChunkMeaning(
        output=False,
        usage=_usage(obj_at(msg, "usage"), with_output=not start),
        finish_reasons=(reason,) if reason else (),
        model=text(msg.get("model")),
        response_id=text(msg.get("id")),
    )


def _message_delta(obj: dict[str, Any]) -> ChunkMeaning:
    reason = text((obj_at(obj, "delta") or {}).get("stop_reason"))
    return ChunkMeaning(
        output=False,
        usage=_usage(obj_at(obj, "usage"), with_output=True),
        finish_reasons=(reason,) if reason else (),
    )


def _usage(u: dict[str, Any] | None, *, with_output: bool) -> Usage | None:
    if u is None:
        return None
    fresh = count(u.get("input_tokens"))
    read = count(u.get("cache_read_input_tokens"))
    written = count(u.get("cache_creation_input_tokens"))
    prompt = None if fresh is None else fresh + (read or 0) + (written or 0)
    output = count(u.get("output_tokens")) if with_output else None
    # A message_delta with only output_tokens leaves message_start's prompt counts in force.
    return known_usage(prompt, output, read)

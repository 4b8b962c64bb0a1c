"""Meaning of OpenAI Responses API stream events (``POST /v1/responses``).

Follows OpenAI's "Streaming API responses" guide and the API reference's
streaming events: semantic events typed by ``type`` (also sent as the SSE
``event:`` name), each with a ``sequence_number``; no ``[DONE]`` sentinel. The
stream opens with ``response.created`` (the Response object: ``id``,
``model``, ``status``) and ends with one of ``response.completed``,
``response.incomplete`` or ``response.failed``, each carrying the final
Response with its ``usage`` (``input_tokens``, ``input_tokens_details.
cached_tokens``, ``output_tokens``). An ``error`` event (``code``,
``message``) may come instead.

Output events: the ``*.delta`` events whose non-empty ``delta`` is model
output: output text, refusal, reasoning text and reasoning summary text,
function call arguments, custom tool call input, MCP call arguments and code
interpreter code. Lifecycle, item, content-part, annotation and ``*.done``
events are not.

A failed response is an error (``error.type`` from ``response.error.code``);
an incomplete one is a normal end whose finish reason is
``incomplete_details.reason`` (``max_output_tokens``, ``content_filter``). The
terminal ``status`` is reported either way.

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
    load_object,
    obj_at,
    text,
)
from proxy.core.decoders.openai import ChunkInfo, Usage

OUTPUT_DELTAS = {
    "response.output_text.delta": OUTPUT,
    "response.refusal.delta": OUTPUT,
    "response.reasoning_text.delta": REASONING,
    "response.reasoning_summary_text.delta": REASONING,
    "response.function_call_arguments.delta": TOOL_CALL,
    "response.custom_tool_call_input.delta": TOOL_CALL,
    "response.mcp_call_arguments.delta": TOOL_CALL,
    "response.code_interpreter_call_code.delta": TOOL_CALL,
}
"""Event types whose non-empty ``delta`` is an output event, and of which kind: reasoning
(text or summary), a tool call (arguments, input, code), else an answer."""

_OPENING = frozenset({"response.created", "response.in_progress", "response.queued"})
_TERMINAL = frozenset({"response.completed", "response.incomplete", "response.failed"})


def interpret(data: str, event: str = "message", *, known_ids: bool = False) -> ChunkInfo | None:
    """Interpret one event's data (``event`` is its SSE name); ``None`` when not decodable."""
    obj = load_object(data)
    if obj is None:
        return None
    kind = event_type(obj, event)
    meaning = OUTPUT_DELTAS.get(kind)
    if meaning is not None:
        return meaning if text(obj.get("delta")) else NOT_OUTPUT
    if kind in _OPENING:
        resp = obj_at(obj, "response")
        if resp is None:
            return NOT_OUTPUT
        return ChunkMeaning(
            output=False, model=text(resp.get("model")), response_id=text(resp.get("id"))
        )
    if kind in _TERMINAL:
        return _response(obj_at(obj, "response") or {}, terminal=True, event_kind=kind)
    if kind == "error":
        nested = obj_at(obj, "error") or {}
        code = error_kind(obj.get("code"), nested.get("code"), nested.get("type"))
        return ChunkMeaning(output=False, error=code)
    return NOT_OUTPUT


def interpret_body(obj: dict[str, Any]) -> ChunkMeaning:
    """Interpret a non-streaming response body (a Response, or an error object)."""
    if obj.get("object") != "response" and isinstance(obj.get("error"), dict):
        err = obj["error"]
        return ChunkMeaning(output=False, error=error_kind(err.get("code"), err.get("type")))
    return _response(obj, terminal=False, event_kind="")


def _response(resp: dict[str, Any], *, terminal: bool, event_kind: str) -> ChunkMeaning:
    """A Response object, final when ``terminal`` (from a terminal stream event)."""
    status = text(resp.get("status"))
    if not status and event_kind:
        status = event_kind.removeprefix("response.")
    reasons: tuple[str, ...] = ()
    error = ""
    if status == "incomplete":
        reason = text((obj_at(resp, "incomplete_details") or {}).get("reason"))
        reasons = (reason or "incomplete",)
    elif status == "failed":
        err = obj_at(resp, "error")
        error = error_kind(err.get("code") if err else None, "response_failed")
    return ChunkMeaning(
        output=False,
        done=terminal,
        usage=_usage(obj_at(resp, "usage")),
        finish_reasons=reasons,
        model=text(resp.get("model")),
        response_id=text(resp.get("id")),
        error=error,
        status=status,
    )


def _usage(u: dict[str, Any] | None) -> Usage | None:
    if u is None:
        return None
    cached = (obj_at(u, "input_tokens_details") or {}).get("cached_tokens")
    reasoning = (obj_at(u, "output_tokens_details") or {}).get("reasoning_tokens")
    return Usage(
        prompt_tokens=count(u.get("input_tokens")),
        completion_tokens=count(u.get("output_tokens")),
        cached_tokens=count(cached),
        reasoning_tokens=count(reasoning),
    )

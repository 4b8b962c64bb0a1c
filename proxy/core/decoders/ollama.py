"""Meaning of Ollama's native stream lines (``POST /api/generate``, ``POST /api/chat``).

Follows Ollama's API documentation (docs/api.md, "Streaming", "Errors"): the
two endpoints stream by default (``"stream": false`` turns it off) as
newline-delimited JSON (``application/x-ndjson``), one object per line with
``model``, ``created_at`` and ``done``. ``/api/generate`` lines carry the
text in ``response`` (and a thinking model's reasoning in ``thinking``);
``/api/chat`` lines carry a ``message`` with ``content``, ``thinking`` and
``tool_calls``. The final line has ``done: true``, ``done_reason`` and the
statistics: ``prompt_eval_count``, ``eval_count`` and, in nanoseconds,
``total_duration``, ``load_duration``, ``prompt_eval_duration`` and
``eval_duration``. An error after the stream started is a line
``{"error": "<message>"}`` (the HTTP status stays 200).

Output events: a line with a non-empty ``response`` or ``thinking``, or a
``message`` with non-empty ``content`` or ``thinking`` or a non-empty
``tool_calls`` list. ``thinking`` alone makes a reasoning event, tool calls a
tool-call event, the rest an answer event. The same function reads a non-streaming body, which is
one such object with ``done: true``.

Ollama reports no prefix-cache count, and omits ``prompt_eval_count`` when
the whole prompt was cached: the prompt size is then unknown.

Pure: no I/O, never raises on bad data (returns ``None`` for "not decodable").
"""

from __future__ import annotations

from typing import Any

from proxy.core.decoders.meaning import (
    NOT_OUTPUT,
    OUTPUT,
    REASONING,
    TOOL_CALL,
    BackendTimings,
    ChunkMeaning,
    count,
    error_kind,
    known_usage,
    load_object,
    seconds,
    text,
)
from proxy.core.decoders.openai import ChunkInfo

_NS = 1e9


def interpret(data: str, event: str = "", *, known_ids: bool = False) -> ChunkInfo | None:
    """Interpret one NDJSON line (``event`` is unused); ``None`` when not decodable.

    ``known_ids``: the caller already has the model, so a plain line may come
    back as a shared constant (the per-token fast path).
    """
    obj = load_object(data)
    return None if obj is None else interpret_body(obj, known_ids=known_ids)


def interpret_body(obj: dict[str, Any], *, known_ids: bool = False) -> ChunkInfo:
    """Interpret one decoded line, or a whole non-streaming body."""
    if obj.get("error") is not None:
        # The message is free text: never a label. Ollama gives no error type.
        return ChunkMeaning(output=False, error=error_kind())
    meaning = _output(obj)
    output = meaning is not None
    if obj.get("done") is not True:
        model = "" if known_ids else text(obj.get("model"))
        if not model:
            return NOT_OUTPUT if meaning is None else meaning
        if meaning is None:
            return ChunkMeaning(output=False, model=model)
        return ChunkMeaning(output=True, model=model, kind=meaning.kind)
    reason = text(obj.get("done_reason"))
    prompt = count(obj.get("prompt_eval_count"))
    completion = count(obj.get("eval_count"))
    return ChunkMeaning(
        output=output,
        kind=meaning.kind if meaning is not None else OUTPUT.kind,
        done=True,
        usage=known_usage(prompt, completion),
        finish_reasons=(reason,) if reason else (),
        model=text(obj.get("model")),
        backend_timings=_timings(obj, completion),
    )


def _output(obj: dict[str, Any]) -> ChunkInfo | None:
    """The output event ``obj`` carries (shared constants), ``None`` when none."""
    if text(obj.get("response")):
        return OUTPUT
    msg = obj.get("message")
    if isinstance(msg, dict):
        calls = msg.get("tool_calls")
        if isinstance(calls, list) and calls:
            return TOOL_CALL
        if text(msg.get("content")):
            return OUTPUT
        if text(msg.get("thinking")):
            return REASONING
    return REASONING if text(obj.get("thinking")) else None


def _timings(obj: dict[str, Any], completion: int | None) -> BackendTimings | None:
    prefill = seconds(obj.get("prompt_eval_duration"), _NS)
    decode = seconds(obj.get("eval_duration"), _NS)
    load = seconds(obj.get("load_duration"), _NS)
    total = seconds(obj.get("total_duration"), _NS)
    if prefill is None and decode is None and load is None and total is None:
        return None
    per_token = decode / completion if decode is not None and completion else None
    return BackendTimings(
        prefill_s=prefill, decode_s=decode, per_token_s=per_token, load_s=load, total_s=total
    )

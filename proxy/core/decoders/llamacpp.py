"""Meaning of llama.cpp's native stream (``POST /completion``, ``/completions``, ``/infill``).

Follows llama.cpp's ``tools/server/README.md`` ("POST /completion", response
format): with ``"stream": true`` the server sends server-sent events whose
data is a JSON object with ``content`` (the next piece of text), ``tokens``
and ``stop: false``; the last one has ``stop: true`` and the statistics:
``model``, ``stop_type`` (``eos``, ``limit``, ``word``; older servers send the
booleans ``stopped_eos``, ``stopped_limit``, ``stopped_word``),
``tokens_predicted``, ``tokens_evaluated`` (the prompt's tokens) and
``timings`` (``cache_n``, ``prompt_n``, ``prompt_ms``, ``predicted_n``,
``predicted_ms``, ``predicted_per_token_ms``, ...). With
``timings_per_token`` every event carries ``timings``; with
``return_progress`` prompt-progress events without text come first. No
``[DONE]``. Since late 2025 an error after the stream started is an event
whose data is ``{"error": {"code", "message", "type"}}``; older servers wrote
a non-standard ``error:`` field, which the WHATWG rules ignore (the stream
then just ends without its ``stop: true`` event).

Output events: an event with non-empty ``content``. Counts, timings and the
stop reason are read from the final event only.

``timings.cache_n`` is the prefix-cache hit; ``tokens_cached`` is not used,
as it counts every token in the slot's cache, generated ones included.

``timings_of`` also reads the ``timings`` object llama.cpp adds to its
OpenAI-compatible chunks (``/v1/chat/completions``, ``/v1/completions``).

Pure: no I/O, never raises on bad data (returns ``None`` for "not decodable").
"""

from __future__ import annotations

from typing import Any

from proxy.core.decoders.meaning import (
    NOT_OUTPUT,
    OUTPUT,
    BackendTimings,
    ChunkMeaning,
    count,
    error_kind,
    known_usage,
    load_object,
    obj_at,
    seconds,
    text,
)
from proxy.core.decoders.openai import ChunkInfo

_MS = 1e3
_STOPPED = (("stopped_eos", "eos"), ("stopped_limit", "limit"), ("stopped_word", "word"))


def interpret(data: str, event: str = "message", *, known_ids: bool = False) -> ChunkInfo | None:
    """Interpret one event's data (``event`` is unused); ``None`` when not decodable."""
    obj = load_object(data)
    return None if obj is None else interpret_body(obj)


def interpret_body(obj: dict[str, Any]) -> ChunkInfo:
    """Interpret one decoded event, or a non-streaming ``/completion`` body."""
    err = obj.get("error")
    if err is not None:
        return ChunkMeaning(
            output=False, error=error_kind(err.get("type") if isinstance(err, dict) else None)
        )
    output = bool(text(obj.get("content")))
    if obj.get("stop") is not True:
        # Partial results repeat running counts (and timings, with timings_per_token):
        # the final event has them all, so a token stays on the fast path.
        return OUTPUT if output else NOT_OUTPUT
    timings_obj = obj_at(obj, "timings")
    prompt = count(obj.get("tokens_evaluated"))
    completion = count(obj.get("tokens_predicted"))
    cached = count(timings_obj.get("cache_n")) if timings_obj is not None else None
    reason = _stop_reason(obj)
    return ChunkMeaning(
        output=output,
        done=True,
        usage=known_usage(prompt, completion, cached),
        finish_reasons=(reason,) if reason else (),
        model=text(obj.get("model")),
        backend_timings=timings_of(obj),
    )


def timings_of(obj: dict[str, Any]) -> BackendTimings | None:
    """The backend's timings from a chunk's ``timings`` object, when it has one."""
    t = obj_at(obj, "timings")
    if t is None:
        return None
    prefill = seconds(t.get("prompt_ms"), _MS)
    decode = seconds(t.get("predicted_ms"), _MS)
    per_token = seconds(t.get("predicted_per_token_ms"), _MS)
    if prefill is None and decode is None and per_token is None:
        return None
    return BackendTimings(prefill_s=prefill, decode_s=decode, per_token_s=per_token)


def _stop_reason(obj: dict[str, Any]) -> str:
    kind = text(obj.get("stop_type"))
    if kind and kind != "none":
        return kind
    for key, reason in _STOPPED:
        if obj.get(key) is True:
            return reason
    return ""

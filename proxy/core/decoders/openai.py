"""Meaning of OpenAI-compatible stream chunks: chat completions and completions.

One SSE event's ``data`` in, one ``ChunkInfo`` out. Output events follow
DESIGN.md: a chunk carrying non-empty ``content``, ``reasoning_content`` or
``reasoning``, a ``tool_calls`` delta (chat), or non-empty ``text``
(completions). The role-only first chunk, empty deltas, the finish chunk with
an empty delta and the usage-only chunk are not output events. Covers vLLM,
SGLang, TGI's OpenAI route, llama.cpp's server, Ollama's /v1 and OpenAI. The
engine's own per-request timings (vLLM's ``metrics``, SGLang's ``meta_info``)
are read by ``proxy.core.decoders.engine_metrics``.

Pure: no I/O, never raises on bad data (returns ``None`` for "not decodable").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orjson import loads

from proxy.core.decoders.engine_metrics import engine_timings
from proxy.core.records import BackendTimings

DONE = "[DONE]"


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts a backend reported."""

    prompt_tokens: int | None
    """Input tokens."""
    completion_tokens: int | None
    """Output tokens."""
    cached_tokens: int | None
    """Input tokens served from the prefix cache, when reported."""


@dataclass(frozen=True, slots=True)
class ChunkInfo:
    """What one stream chunk (or one non-streaming body) says."""

    output: bool
    """Carries generated output (an output event)."""
    done: bool = False
    """The stream's terminal event: ``[DONE]``, ``message_stop``, ``done: true``, ..."""
    usage: Usage | None = None
    """Usage, when the chunk has a non-null ``usage`` object."""
    usage_only: bool = False
    """A usage chunk with ``choices: []`` and nothing else of note."""
    finish_reasons: tuple[str, ...] = ()
    """Non-null ``finish_reason`` values in this chunk."""
    model: str = ""
    """``model`` field, when present."""
    response_id: str = ""
    """``id`` field, when present."""
    error: str = ""
    """Error type or message class when the chunk is an error object."""
    backend_timings: BackendTimings | None = None
    """Timings the backend reported about itself in this chunk (llama.cpp, Ollama, vLLM, SGLang)."""
    status: str = ""
    """Terminal status when the format reports one (``completed``, ``incomplete``, ``failed``)."""


SAFE_KIND = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")
"""A low-cardinality label value: a short identifier (error types), never free text."""

_NOT_OUTPUT = ChunkInfo(output=False)
_OUTPUT = ChunkInfo(output=True)
OUTPUT = _OUTPUT
"""The shared meaning of a plain output chunk (``interpret`` with ``known_ids``)."""
_DONE = ChunkInfo(output=False, done=True)


def _usage(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    details = obj.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        prompt_tokens=_int(obj.get("prompt_tokens")),
        completion_tokens=_int(obj.get("completion_tokens")),
        cached_tokens=_int(cached),
    )


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _choice_output(choice: dict[str, Any]) -> bool:
    text = choice.get("text")
    if isinstance(text, str) and text:
        return True
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        # Non-streaming bodies carry ``message`` instead of ``delta``.
        delta = choice.get("message")
        if not isinstance(delta, dict):
            return False
    for key in ("content", "reasoning_content", "reasoning"):
        v = delta.get(key)
        if isinstance(v, str) and v:
            return True
    calls = delta.get("tool_calls")
    return isinstance(calls, list) and bool(calls)


def interpret(data: str, event: str = "message", *, known_ids: bool = False) -> ChunkInfo | None:
    """Interpret one chunk's JSON text; ``None`` when it is not decodable.

    ``event`` (the SSE event name) is unused: it makes this a
    ``proxy.core.decoders.registry.Interpreter`` with no wrapper on the hot path.

    ``known_ids``: the caller already has the response's ``id`` and ``model``,
    so a chunk that carries nothing else of note may come back as a shared
    constant (the per-token fast path).
    """
    if data == DONE:
        return _DONE
    try:
        obj = loads(data)
    except ValueError:
        return None
    if type(obj) is not dict:
        return None
    return interpret_object(obj, known_ids=known_ids)


def interpret_object(obj: dict[str, Any], *, known_ids: bool = False) -> ChunkInfo:
    """Interpret a decoded chunk or non-streaming response body."""
    if known_ids and obj.get("usage") is None and obj.get("error") is None:
        # The per-token shape: one choice, no finish reason, ids already known.
        choices = obj.get("choices")
        if type(choices) is list and len(choices) == 1:
            c = choices[0]
            if type(c) is dict and not c.get("finish_reason"):
                delta = c.get("delta")
                if type(delta) is dict:  # a chat token: decided without the general walk
                    content = delta.get("content")
                    if type(content) is str and content:
                        return _OUTPUT
                return _OUTPUT if _choice_output(c) else _NOT_OUTPUT
    err = obj.get("error")
    if err is not None:
        kind = ""
        if isinstance(err, dict):
            t = err.get("type") or err.get("code")
            # A label value: a short identifier, never a free-text message.
            if isinstance(t, str) and SAFE_KIND.fullmatch(t):
                kind = t
        return ChunkInfo(output=False, error=kind or "stream_error")
    choices = obj.get("choices")
    output = False
    reasons: list[str] = []
    if isinstance(choices, list):
        for c in choices:
            if isinstance(c, dict):
                output = output or _choice_output(c)
                r = c.get("finish_reason")
                if isinstance(r, str) and r:
                    reasons.append(r)
    raw_usage = obj.get("usage")
    if known_ids and raw_usage is None and not reasons:
        return _OUTPUT if output else _NOT_OUTPUT
    usage = _usage(raw_usage)
    model = obj.get("model")
    rid = obj.get("id")
    if not output and not reasons and usage is None and not isinstance(model, str):
        return _NOT_OUTPUT
    # The engine's own timings ride the usage chunk (vLLM) or the finishing choice (SGLang).
    timings = engine_timings(obj, choices) if raw_usage is not None or reasons else None
    return ChunkInfo(
        output=output,
        usage=usage,
        usage_only=usage is not None and choices == [],
        finish_reasons=tuple(reasons),
        model=model if isinstance(model, str) else "",
        response_id=rid if isinstance(rid, str) else "",
        backend_timings=timings,
    )

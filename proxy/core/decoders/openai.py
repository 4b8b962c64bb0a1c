"""Meaning of OpenAI-compatible stream chunks: chat completions and completions.

One SSE event's ``data`` in, one ``ChunkInfo`` out. Output events follow
DESIGN.md: a chunk carrying non-empty ``content``, ``reasoning_content`` or
``reasoning``, a ``tool_calls`` delta (chat), or non-empty ``text``
(completions). The role-only first chunk, empty deltas, the finish chunk with
an empty delta and the usage-only chunk are not output events. Covers vLLM,
SGLang, TGI's OpenAI route, llama.cpp's server, Ollama's /v1 and OpenAI. The
engine's own per-request timings (vLLM's ``metrics``, SGLang's ``meta_info``)
are read by ``proxy.core.decoders.engine_metrics``.

Each output event has a kind (DESIGN.md): a reasoning event when the delta
carries only ``reasoning_content`` or ``reasoning``; a tool-call event when it
carries a ``tool_calls`` delta; else an answer event (content, text). With
several choices (``n > 1``) each event names its choice by ``index``.

Pure: no I/O, never raises on bad data (returns ``None`` for "not decodable").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from orjson import loads

from proxy.core.decoders.engine_metrics import engine_timings
from proxy.core.records import BackendTimings, EventKind

DONE = "[DONE]"


# Not ``frozen``: a frozen dataclass's ``__init__`` sets each field through
# ``object.__setattr__``, four times the cost of the whole construction otherwise
# (callgrind: 21k against 5k instructions for a ChunkInfo, also compiled), and a stream
# builds one for its first, last and usage chunks. ``unsafe_hash`` keeps them hashable as
# before; nothing assigns to a field (the shared constants below must never change).
@dataclass(slots=True, unsafe_hash=True)
class Usage:
    """Token counts a backend reported."""

    prompt_tokens: int | None
    """Input tokens."""
    completion_tokens: int | None
    """Output tokens."""
    cached_tokens: int | None
    """Input tokens served from the prefix cache, when reported."""
    reasoning_tokens: int | None = None
    """Output tokens spent reasoning (``completion_tokens_details.reasoning_tokens``), when
    reported; part of ``completion_tokens``."""


@dataclass(slots=True, unsafe_hash=True)
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
    kind: EventKind = EventKind.ANSWER
    """What the output event is (with ``output``): an answer, a reasoning or a tool-call event."""
    choice: int = 0
    """The choice (``index``) the output event belongs to."""
    more: tuple[tuple[int, EventKind], ...] = ()
    """Output events of further choices carried in the same chunk: (choice, kind) each."""


SAFE_KIND = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")
"""A low-cardinality label value: a short identifier (error types), never free text."""

_NOT_OUTPUT = ChunkInfo(output=False)
_OUTPUT = ChunkInfo(output=True)
OUTPUT = _OUTPUT
"""The shared meaning of a plain output chunk (``interpret`` with ``known_ids``)."""
_DONE = ChunkInfo(output=False, done=True)
REASONING = ChunkInfo(output=True, kind=EventKind.REASONING)
"""The shared meaning of a plain reasoning chunk of choice 0."""
TOOL_CALL = ChunkInfo(output=True, kind=EventKind.TOOL_CALL)
"""The shared meaning of a plain tool-call chunk of choice 0."""
_TOOL_CALL = TOOL_CALL


def _usage(obj: Any) -> Usage | None:
    if not isinstance(obj, dict):
        return None
    details = obj.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    out_details = obj.get("completion_tokens_details")
    reasoning = out_details.get("reasoning_tokens") if isinstance(out_details, dict) else None
    return Usage(
        prompt_tokens=_int(obj.get("prompt_tokens")),
        completion_tokens=_int(obj.get("completion_tokens")),
        cached_tokens=_int(cached),
        reasoning_tokens=_int(reasoning),
    )


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def _choice_kind(choice: dict[str, Any]) -> EventKind | None:
    """The kind of output event ``choice`` carries; ``None`` when it carries none.

    A tool-call delta makes it a tool-call event, then any content or text an
    answer event; reasoning alone makes it a reasoning event.
    """
    text = choice.get("text")
    if isinstance(text, str) and text:
        return EventKind.ANSWER
    delta = choice.get("delta")
    if not isinstance(delta, dict):
        # Non-streaming bodies carry ``message`` instead of ``delta``.
        delta = choice.get("message")
        if not isinstance(delta, dict):
            return None
    calls = delta.get("tool_calls")
    if isinstance(calls, list) and calls:
        return EventKind.TOOL_CALL
    v = delta.get("content")
    if isinstance(v, str) and v:
        return EventKind.ANSWER
    for key in ("reasoning_content", "reasoning"):
        v = delta.get(key)
        if isinstance(v, str) and v:
            return EventKind.REASONING
    return None


def _index(choice: dict[str, Any]) -> int:
    """A choice's ``index`` (0 when absent or not a small non-negative integer)."""
    i = choice.get("index", 0)
    return i if type(i) is int and 0 <= i < 1 << 16 else 0


_BY_KIND = {
    EventKind.ANSWER: _OUTPUT,
    EventKind.REASONING: REASONING,
    EventKind.TOOL_CALL: _TOOL_CALL,
}


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
    if obj.get("error") is None:
        choices = obj.get("choices")
        if type(choices) is list and len(choices) < 2:
            if not choices:
                return _no_choice(obj, choices, known_ids)
            c = choices[0]
            if type(c) is dict:
                if known_ids and obj.get("usage") is None and not c.get("finish_reason"):
                    # The per-token shape: a chat token of choice 0, the ids already known.
                    delta = c.get("delta")
                    if type(delta) is dict:
                        content = delta.get("content")
                        if (
                            type(content) is str
                            and content
                            and not delta.get("tool_calls")
                            and not c.get("index")
                        ):
                            return _OUTPUT
                return _one_choice(obj, c, choices, known_ids)
    return _general(obj, known_ids)


def _one_choice(
    obj: dict[str, Any], c: dict[str, Any], choices: list[Any], known_ids: bool
) -> ChunkInfo:
    """``_general`` for a chunk with exactly one choice (a dict) and no ``error``.

    Most chunks of every OpenAI-compatible server: the role chunk, the tokens, the
    finish chunk (with usage on llama.cpp). Same result, without the general walk's lists
    (``tests/proxy/core/decoders/test_openai.py`` compares them).
    """
    raw_usage = obj.get("usage")
    r = c.get("finish_reason")
    kind = _choice_kind(c)
    reasons = (r,) if isinstance(r, str) and r else ()
    if known_ids and raw_usage is None and not reasons:
        if kind is None:
            return _NOT_OUTPUT
        index = _index(c)
        return _BY_KIND[kind] if index == 0 else ChunkInfo(output=True, kind=kind, choice=index)
    usage = None if raw_usage is None else _usage(raw_usage)
    model = obj.get("model")
    if kind is None and not reasons and usage is None and not isinstance(model, str):
        return _NOT_OUTPUT
    rid = obj.get("id")
    return ChunkInfo(
        output=kind is not None,
        usage=usage,
        finish_reasons=reasons,
        model=model if isinstance(model, str) else "",
        response_id=rid if isinstance(rid, str) else "",
        backend_timings=(
            engine_timings(obj, choices) if raw_usage is not None or reasons else None
        ),
        kind=EventKind.ANSWER if kind is None else kind,
        choice=0 if kind is None else _index(c),
    )


def _no_choice(obj: dict[str, Any], choices: list[Any], known_ids: bool) -> ChunkInfo:
    """``_general`` for a chunk with ``choices: []`` and no ``error``: the usage chunk."""
    raw_usage = obj.get("usage")
    if known_ids and raw_usage is None:
        return _NOT_OUTPUT
    usage = None if raw_usage is None else _usage(raw_usage)
    model = obj.get("model")
    if usage is None and not isinstance(model, str):
        return _NOT_OUTPUT
    rid = obj.get("id")
    return ChunkInfo(
        output=False,
        usage=usage,
        usage_only=usage is not None,
        model=model if isinstance(model, str) else "",
        response_id=rid if isinstance(rid, str) else "",
        backend_timings=engine_timings(obj, choices) if raw_usage is not None else None,
    )


def _general(obj: dict[str, Any], known_ids: bool) -> ChunkInfo:
    """Any chunk or body: an error, several choices, odd ``choices`` values."""
    err = obj.get("error")
    if err is not None:
        kind_ = ""
        if isinstance(err, dict):
            t = err.get("type") or err.get("code")
            # A label value: a short identifier, never a free-text message.
            if isinstance(t, str) and SAFE_KIND.fullmatch(t):
                kind_ = t
        return ChunkInfo(output=False, error=kind_ or "stream_error")
    choices = obj.get("choices")
    events: list[tuple[int, EventKind]] = []
    reasons: list[str] = []
    if isinstance(choices, list):
        for c in choices:
            if isinstance(c, dict):
                kind = _choice_kind(c)
                if kind is not None:
                    events.append((_index(c), kind))
                r = c.get("finish_reason")
                if isinstance(r, str) and r:
                    reasons.append(r)
    raw_usage = obj.get("usage")
    if known_ids and raw_usage is None and not reasons and len(events) <= 1:
        if not events:
            return _NOT_OUTPUT
        index, kind = events[0]
        if index == 0:
            return _BY_KIND[kind]
        return ChunkInfo(output=True, kind=kind, choice=index)
    usage = _usage(raw_usage)
    model = obj.get("model")
    rid = obj.get("id")
    if not events and not reasons and usage is None and not isinstance(model, str):
        return _NOT_OUTPUT
    # The engine's own timings ride the usage chunk (vLLM) or the finishing choice (SGLang).
    timings = engine_timings(obj, choices) if raw_usage is not None or reasons else None
    first = events[0] if events else (0, EventKind.ANSWER)
    return ChunkInfo(
        output=bool(events),
        usage=usage,
        usage_only=usage is not None and choices == [],
        finish_reasons=tuple(reasons),
        model=model if isinstance(model, str) else "",
        response_id=rid if isinstance(rid, str) else "",
        backend_timings=timings,
        kind=first[1],
        choice=first[0],
        more=tuple(events[1:]),
    )

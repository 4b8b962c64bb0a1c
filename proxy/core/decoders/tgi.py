"""Meaning of Text Generation Inference's native stream (``POST /generate_stream``).

Follows TGI's API (the router's OpenAPI schema ``StreamResponse`` and the
``huggingface_hub`` ``TextGenerationStreamOutput`` type): server-sent events
with unnamed ``data:`` lines, one per generated token, each a JSON object with
``index``, ``token`` (``id``, ``text``, ``logprob``, ``special``),
``top_tokens``, and ``generated_text`` and ``details`` that are null until the
last event. With ``parameters.details: true`` the last event's ``details``
has ``finish_reason`` (``length``, ``eos_token``, ``stop_sequence``),
``generated_tokens``, ``input_length`` and ``seed``; without it ``details``
stays null and the token counts are unknown. An error is an event whose data
is ``{"error": "<message>", "error_type": "<kind>"}`` (``generation``,
``overloaded``, ``validation``, ``incomplete_generation``). No ``[DONE]``.

Output events: a token with non-empty ``text`` that is not ``special`` (the
end-of-sequence token is special and shows nothing to the reader).

``POST /generate`` answers the same shape once, as plain JSON
(``generated_text`` and ``details``): ``interpret_body`` reads it.

Pure: no I/O, never raises on bad data (returns ``None`` for "not decodable").
"""

from __future__ import annotations

from typing import Any

from proxy.core.decoders.meaning import (
    NOT_OUTPUT,
    OUTPUT,
    ChunkMeaning,
    count,
    error_kind,
    known_usage,
    load_object,
    obj_at,
    text,
)
from proxy.core.decoders.openai import ChunkInfo


def interpret(data: str, event: str = "message", *, known_ids: bool = False) -> ChunkInfo | None:
    """Interpret one event's data (``event`` is unused); ``None`` when not decodable."""
    obj = load_object(data)
    return None if obj is None else interpret_body(obj)


def interpret_body(obj: dict[str, Any]) -> ChunkInfo:
    """Interpret one decoded event, or a non-streaming ``/generate`` body."""
    if obj.get("error") is not None:
        return ChunkMeaning(output=False, error=error_kind(obj.get("error_type")))
    token = obj_at(obj, "token")
    output = (
        token is not None and token.get("special") is not True and bool(text(token.get("text")))
    )
    details = obj_at(obj, "details")
    if details is None and obj.get("generated_text") is None:
        return OUTPUT if output else NOT_OUTPUT
    usage = None
    reasons: tuple[str, ...] = ()
    if details is not None:
        prompt = count(details.get("input_length"))
        completion = count(details.get("generated_tokens"))
        usage = known_usage(prompt, completion)
        reason = text(details.get("finish_reason"))
        reasons = (reason,) if reason else ()
    return ChunkMeaning(output=output, done=True, usage=usage, finish_reasons=reasons)

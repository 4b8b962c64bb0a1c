"""Deterministic OpenAI-style token streams, so a sender and a checker agree on bytes.

``stream_events(seed, n)`` gives the events one backend stream sends; the same
seed always gives the same bytes, so the backend can announce the sha256 of
what the client must receive before it sends a byte, and the load client can
check every stream without keeping them. Streams mix end-of-line styles, and
hold multi-byte characters, so a split anywhere lands inside a character, a
CRLF or an event.
"""

from __future__ import annotations

import hashlib
import json
import random

_WORDS = ("the", " token", " ✓", " prefill", " décodé", "\n", " 🦙", " gap", ",", ' \\"q\\"')
_EOLS = (b"\n", b"\r\n", b"\r")
DONE = b"data: [DONE]"


def _event(payload: bytes, eol: bytes) -> bytes:
    return b"data: " + payload + eol + eol


def chat_chunk(stream_id: str, content: str | None, *, role: bool = False,
               finish: str | None = None) -> dict[str, object]:  # fmt: skip
    """One ``chat.completion.chunk`` object."""
    delta: dict[str, str] = {"role": "assistant"} if role else {}
    if content is not None:
        delta["content"] = content
    return {
        "id": stream_id,
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


def usage_chunk(stream_id: str, prompt: int, completion: int) -> dict[str, object]:
    """The usage-only chunk vLLM sends when ``include_usage`` is asked for."""
    return {
        "id": stream_id,
        "object": "chat.completion.chunk",
        "model": "m",
        "choices": [],
        "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                  "total_tokens": prompt + completion},
    }  # fmt: skip


def stream_events(seed: int, n_tokens: int, *, usage: bool) -> tuple[list[bytes], int | None]:
    """Events of one stream and the index of its usage event (``None`` without one)."""
    rng = random.Random(seed)
    eol = _EOLS[seed % len(_EOLS)]
    sid = f"chatcmpl-{seed}"
    events = [_event(json.dumps(chat_chunk(sid, "", role=True)).encode(), eol)]
    for i in range(n_tokens):
        text = "".join(rng.choice(_WORDS) for _ in range(rng.randint(1, 3)))
        finish = "length" if i == n_tokens - 1 else None
        events.append(_event(json.dumps(chat_chunk(sid, text, finish=finish),
                                        ensure_ascii=rng.random() < 0.5).encode(), eol))  # fmt: skip
    usage_at = None
    if usage:
        usage_at = len(events)
        events.append(_event(json.dumps(usage_chunk(sid, 7, n_tokens)).encode(), eol))
    events.append(_event(b"[DONE]", eol))
    return events, usage_at


def visible_bytes(events: list[bytes], usage_at: int | None) -> bytes:
    """What the client must receive: every event but the usage one the proxy asked for."""
    return b"".join(e for i, e in enumerate(events) if i != usage_at)


def sha256(data: bytes) -> str:
    """Hex sha256."""
    return hashlib.sha256(data).hexdigest()


def random_splits(data: bytes, rng: random.Random, max_pieces: int = 12) -> list[bytes]:
    """``data`` cut at random points (inside events, characters and CRLFs alike)."""
    if not data:
        return [data]
    cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(0, max_pieces))))
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True)]

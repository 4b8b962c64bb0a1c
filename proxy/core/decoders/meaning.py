"""Shared by the format interpreters: ``ChunkMeaning`` (an alias of ``ChunkInfo``),
``BackendTimings`` and ``queue_time_s`` (re-exported from ``proxy.core.records``).

Also here: the defensive JSON readers every interpreter uses, and the rules
several formats follow (a typed event's kind, usage from counts). Upstream
data is untrusted: a reader returns ``None`` for anything of the wrong type
or range and never raises.

Pure: no I/O, no framework imports.
"""

from __future__ import annotations

import math
from typing import Any

from orjson import loads

from proxy.core.decoders.openai import OUTPUT as _OPENAI_OUTPUT
from proxy.core.decoders.openai import REASONING as _OPENAI_REASONING
from proxy.core.decoders.openai import SAFE_KIND, ChunkInfo, Usage
from proxy.core.decoders.openai import TOOL_CALL as _OPENAI_TOOL_CALL
from proxy.core.records import BackendTimings, queue_time_s

__all__ = ["BackendTimings", "ChunkMeaning", "queue_time_s"]

STREAM_ERROR = "stream_error"
"""``error.type`` of an in-stream error whose own type is missing or not a safe label value."""


ChunkMeaning = ChunkInfo
"""``ChunkInfo`` carries ``backend_timings`` and ``status`` itself now."""


NOT_OUTPUT = ChunkMeaning(output=False)
"""A decodable chunk that says nothing the timer keeps (ping, block start, progress)."""
OUTPUT = _OPENAI_OUTPUT
"""A plain answer event: the shared constant the relay's fast path recognises by identity."""
REASONING = _OPENAI_REASONING
"""A plain reasoning event (thinking), shared: the relay recognises it by identity too."""
TOOL_CALL = _OPENAI_TOOL_CALL
"""A plain tool-call event (an answer event that acts)."""


def load_object(data: str | bytes) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object; ``None`` for anything else (never raises).

    orjson: several times faster than ``json`` and bounded in nesting depth
    (a deeply nested array is an error, not a ``RecursionError``).
    """
    try:
        obj = loads(data)
    except ValueError:
        return None
    return obj if type(obj) is dict else None


def event_type(obj: dict[str, Any], event: str) -> str:
    """A typed event's kind: its data's ``type`` when a string, else its SSE ``event`` name."""
    kind = obj.get("type")
    return kind if isinstance(kind, str) else event


def count(v: Any) -> int | None:
    """A token count: a non-negative integer (not a bool), else ``None``."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


def known_usage(
    prompt: int | None, completion: int | None, cached: int | None = None
) -> Usage | None:
    """``Usage`` of the counts read, or ``None`` when none of them is known."""
    if prompt is None and completion is None and cached is None:
        return None
    return Usage(prompt_tokens=prompt, completion_tokens=completion, cached_tokens=cached)


def seconds(v: Any, per_second: float) -> float | None:
    """A non-negative finite number in units of ``1 / per_second`` s, as seconds; else ``None``."""
    if isinstance(v, bool) or not isinstance(v, int | float):
        return None
    s = v / per_second
    return s if math.isfinite(s) and s >= 0 else None


def text(v: Any) -> str:
    """``v`` when it is a string, else empty."""
    return v if isinstance(v, str) else ""


def obj_at(parent: Any, key: str) -> dict[str, Any] | None:
    """``parent[key]`` when both are JSON objects, else ``None``."""
    if not isinstance(parent, dict):
        return None
    v = parent.get(key)
    return v if isinstance(v, dict) else None


def error_kind(*candidates: Any) -> str:
    """The first candidate that is a safe low-cardinality label value, else ``stream_error``.

    Error types (``overloaded_error``, ``server_error``, ``validation``) pass;
    free-text messages ("model 'x' not found") never become a label.
    """
    for c in candidates:
        if isinstance(c, str) and SAFE_KIND.fullmatch(c):
            return c
    return STREAM_ERROR

"""What a chunk of any supported format means, beyond ``ChunkInfo``: shared by the interpreters.

``ChunkMeaning`` is a ``ChunkInfo`` with two additive fields the native
formats need: the backend's own timings (llama.cpp ``timings``, Ollama's
``*_duration``) and a terminal status (OpenAI Responses ``completed`` /
``incomplete`` / ``failed``). It is a subclass so the stream timer takes it
as it is; once ``ChunkInfo`` carries the two fields itself, this class
becomes an alias.

Also here: the defensive JSON readers every interpreter uses. Upstream data
is untrusted: a reader returns ``None`` for anything of the wrong type or
range and never raises.

Pure: no I/O, no framework imports.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Any

from proxy.decoders.openai import ChunkInfo

STREAM_ERROR = "stream_error"
"""``error.type`` of an in-stream error whose own type is missing or not a safe label value."""

_SAFE_KIND = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")


@dataclass(frozen=True, slots=True)
class BackendTimings:
    """Durations the backend measured itself for one request, in seconds (on its own clock)."""

    prefill_s: float | None = None
    """Prompt processing (llama.cpp ``prompt_ms``, Ollama ``prompt_eval_duration``)."""
    decode_s: float | None = None
    """Token generation (llama.cpp ``predicted_ms``, Ollama ``eval_duration``)."""
    per_token_s: float | None = None
    """Generation time per output token (llama.cpp ``predicted_per_token_ms``)."""
    load_s: float | None = None
    """Model loading before the prompt was processed (Ollama ``load_duration``)."""
    total_s: float | None = None
    """The backend's own end-to-end time (Ollama ``total_duration``)."""


@dataclass(frozen=True, slots=True)
class ChunkMeaning(ChunkInfo):
    """A ``ChunkInfo`` with the fields the native formats add (see the module docstring)."""

    backend_timings: BackendTimings | None = None
    """Timings the backend reported in this chunk (usually the last one)."""
    status: str = ""
    """Terminal status when the format reports one (``completed``, ``incomplete``, ``failed``)."""


NOT_OUTPUT = ChunkMeaning(output=False)
"""A decodable chunk that says nothing the timer keeps (ping, block start, progress)."""


def queue_time_s(ttft_s: float | None, timings: BackendTimings | None) -> float | None:
    """Observed TTFT minus the backend's prefill (and model load): queueing and transport.

    ``None`` when either is unknown. Clamped at 0: the backend's clock and ours
    differ by a little, and the proxy's window always encloses the backend's.
    """
    if ttft_s is None or timings is None or timings.prefill_s is None:
        return None
    return max(0.0, ttft_s - timings.prefill_s - (timings.load_s or 0.0))


def load_object(data: str) -> dict[str, Any] | None:
    """``data`` parsed as a JSON object; ``None`` for anything else (never raises)."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        # RecursionError: a deeply nested array or object within the size limit.
        return None
    return obj if isinstance(obj, dict) else None


def count(v: Any) -> int | None:
    """A token count: a non-negative integer (not a bool), else ``None``."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else None


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
        if isinstance(c, str) and _SAFE_KIND.fullmatch(c):
            return c
    return STREAM_ERROR

"""The fitted cost model of one backend, as the exporters see it.

Pure: a record type only. The advisor (``proxy.advisor``) fits it from the
proxy's own observations; exporters publish it as the gauges of METRICS.md
(``tokenstamp.backend.prefill_rate``, ``.decode_step.base``, ``.per_stream``,
``tokenstamp.backend.prefill_step``, ``tokenstamp.backend.prefill_chunk``). A field is
``None`` while there is not enough data for it: its gauge is then absent, never a
made-up number.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.core.records import Backend


@dataclass(frozen=True, slots=True)
class BackendFitRecord:
    """What a step of this backend costs: ``base + per_stream x streams``, plus
    ``prefill_step + prefill / rate`` when it carries prefill."""

    backend: Backend
    """The upstream it describes."""
    prefill_tokens_per_s: float | None
    """Prefill throughput, uncached prompt tokens per second."""
    decode_base_s: float | None
    """Fixed cost of a decode step (s)."""
    decode_per_stream_s: float | None
    """Extra decode step cost per decoding stream (s)."""
    chunk_size: int | None
    """Prompt tokens per step when prefill is chunked; ``None`` when unchunked or unknown."""
    chunked: bool | None
    """Whether prefill is chunked: ``False`` when no observed prompt was split, ``None`` unknown."""
    prefill_step_s: float | None = None
    """Fixed cost of a step that carries prefill, besides its tokens (s); 0 when the fit cannot
    tell it from 0, ``None`` while the prefill rate is unknown."""

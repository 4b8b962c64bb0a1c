"""The seed's trade table for one backend: what each chunk size would do, from its fitted model.

Pure. For ``streams`` decoding and one new prompt of ``prompt_tokens`` (uncached)
arriving, at chunk size ``C`` (``None``: the whole prompt in one step) the prompt
is computed in pieces of ``C``; every step that carries a piece also decodes the
``streams`` existing ones::

    step_j           = base + per_stream x streams + prefill_step + piece_j / rate
                       + context x piece_j x (before_j + piece_j)
    worst gap        = max_j step_j                    (an existing stream's longest gap)
    rate during it   = steps / sum_j step_j            (tokens per existing stream per second)
    TTFT             = decode step / 2 + sum_j step_j  (it first waits, on average, half a
                                                        running step)

where ``before_j`` is the prompt's tokens computed by the pieces before ``j``
(``proxy.advisor.context``: attention makes later pieces dearer; ``context`` is 0
when the fit could not tell it from 0).

A separate prefill pool (disaggregation) computes the prompt alone, in one
step, and hands the KV cache over: the decode pool's streams see one decode
step at worst, TTFT = ``base + prefill_step + prompt / rate + context x prompt^2
+ kv_transfer``.

Capacity: the most decoding streams whose decode step stays within the TPOT
target; with the observed prefill load (uncached prompt tokens per second) the
engine spends ``load / rate`` of each second on prefill, stretching every step
by ``1 / (1 - load / rate)`` (the fixed cost per prefill step left out: how many
steps the load takes depends on its prompts and the chunk).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.advisor.context import piece_s
from proxy.advisor.fit import Fit
from proxy.advisor.pieces import piece_sizes

DEFAULT_CHUNK_SIZES: tuple[int | None, ...] = (256, 512, 1024, 2048, 4096, 8192, None)
"""Candidates when none are given (``None``: unchunked)."""


@dataclass(frozen=True, slots=True)
class Row:
    """What one chunk size does to the existing streams and the new request."""

    chunk_size: int | None
    """Prompt tokens per step; ``None``: unchunked."""
    prompt_tokens: int
    """The new prompt (uncached tokens)."""
    streams: int
    """Streams decoding when it arrives."""
    worst_gap_s: float
    """Longest gap of an existing stream while it is prefilled."""
    rate_during_prefill_per_s: float
    """Tokens per second of one existing stream during the prefill."""
    ttft_s: float
    """The new request's time to first token (half a running step of wait included)."""
    steps: int
    """Steps that carry a piece of the prompt."""


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The largest chunk whose worst gap stays within the ITL target, and its TTFT cost."""

    itl_target_s: float
    """The worst gap allowed."""
    fits: bool
    """Some candidate keeps the worst gap within the target."""
    row: Row | None
    """The recommended candidate (``None`` when none fits)."""
    next_larger: Row | None
    """The next larger candidate (``None`` when the recommendation is the largest)."""
    largest_chunk_within_target: int | None
    """The largest chunk of any size whose worst piece of the scenario's prompt is within the
    target (without a context term: ``(target - decode step - prefill_step) x rate``)."""


@dataclass(frozen=True, slots=True)
class Capacity:
    """How many decoding streams keep TPOT within its target."""

    tpot_target_s: float
    """The TPOT target."""
    streams: int | None
    """Most decoding streams with the decode step within the target (``None``: unbounded)."""
    prefill_load_tokens_per_s: float
    """Uncached prompt tokens per second the backend was seen to get."""
    streams_with_prefill_load: int | None
    """The same with that prefill load stretching every step (``None``: unbounded)."""


@dataclass(frozen=True, slots=True)
class PrefillPool:
    """What a separate prefill pool (disaggregated serving) would give."""

    kv_transfer_s: float
    """Time to hand the KV cache from the prefill to the decode pool (given)."""
    worst_gap_s: float
    """An existing stream's worst gap: one decode step."""
    rate_during_prefill_per_s: float
    """Tokens per second of one existing stream: unchanged."""
    ttft_s: float
    """The new request's first token: its prefill alone plus the transfer."""


def table(
    fitted: Fit, prompt_tokens: int, streams: int, chunk_sizes: Sequence[int | None]
) -> list[Row]:
    """The seed's table for ``chunk_sizes``; ValueError when the fit lacks a parameter."""
    base, per_stream, rate, step_s, context_s = _params(fitted)
    if prompt_tokens < 1 or streams < 0:
        raise ValueError("table: prompt_tokens must be >= 1 and streams >= 0")
    decode_s = base + per_stream * streams
    rows = []
    for chunk in chunk_sizes:
        steps = _steps_s(decode_s, step_s, 1 / rate, context_s, pieces(prompt_tokens, chunk))
        window_s = sum(steps)
        rows.append(
            Row(
                chunk_size=chunk,
                prompt_tokens=prompt_tokens,
                streams=streams,
                worst_gap_s=max(steps),
                rate_during_prefill_per_s=len(steps) / window_s,
                ttft_s=window_s + decode_s / 2,
                steps=len(steps),
            )
        )
    return rows


def pieces(prompt_tokens: int, chunk_size: int | None) -> list[int]:
    """How a prompt is split over steps at ``chunk_size`` (``None``: one piece)."""
    return list(piece_sizes(prompt_tokens, chunk_size))


def _steps_s(
    decode_s: float, step_s: float, inv_rate: float, context_s: float, split: list[int]
) -> list[float]:
    """Each step's duration: the decode step plus its piece, at the context before it."""
    out, before = [], 0
    for piece in split:
        out.append(decode_s + piece_s(step_s, inv_rate, context_s, piece, before))
        before += piece
    return out


def largest_chunk(fitted: Fit, prompt_tokens: int, streams: int, itl_target_s: float) -> int | None:
    """The largest chunk whose worst step of a ``prompt_tokens`` prompt is within the target
    (``None``: not even one token a step is)."""
    base, per_stream, rate, step_s, context_s = _params(fitted)
    decode_s = base + per_stream * streams
    room_s = itl_target_s - (decode_s + step_s)
    if room_s <= 0:
        return None
    if context_s <= 0:
        return math.floor(room_s * rate)

    def worst(chunk: int) -> float:
        return max(_steps_s(decode_s, step_s, 1 / rate, context_s, pieces(prompt_tokens, chunk)))

    if worst(1) > itl_target_s:
        return None
    if worst(prompt_tokens) <= itl_target_s:
        return math.floor(room_s * rate)  # beyond the prompt: its one step, bounded as before
    low, high = 1, prompt_tokens  # worst(low) within, worst(high) not: bisect (monotone)
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if worst(mid) <= itl_target_s else (low, mid)
    return low


def recommend(fitted: Fit, rows: Sequence[Row], itl_target_s: float) -> Recommendation:
    """The largest candidate (unchunked largest of all) whose worst gap is within the target."""
    ordered = sorted(rows, key=lambda r: math.inf if r.chunk_size is None else r.chunk_size)
    fitting = [i for i, r in enumerate(ordered) if r.worst_gap_s <= itl_target_s]
    streams = rows[0].streams if rows else 0
    prompt = rows[0].prompt_tokens if rows else 1
    largest = largest_chunk(fitted, prompt, streams, itl_target_s)
    if not fitting:
        return Recommendation(itl_target_s, False, None, ordered[0] if ordered else None, largest)
    best = fitting[-1]
    after = ordered[best + 1] if best + 1 < len(ordered) else None
    return Recommendation(itl_target_s, True, ordered[best], after, largest)


def capacity(fitted: Fit, tpot_target_s: float, prefill_load_tokens_per_s: float) -> Capacity:
    """Most decoding streams within ``tpot_target_s``, without and with the prefill load."""
    base, per_stream, rate, _, _ = _params(fitted)
    share = prefill_load_tokens_per_s / rate

    def most(budget_s: float) -> int | None:
        if budget_s < base + per_stream:
            return 0
        if per_stream <= 0:
            return None
        return math.floor((budget_s - base) / per_stream)

    loaded = most(tpot_target_s * (1 - share)) if share < 1 else 0
    return Capacity(tpot_target_s, most(tpot_target_s), prefill_load_tokens_per_s, loaded)


def prefill_pool(
    fitted: Fit, prompt_tokens: int, streams: int, kv_transfer_s: float
) -> PrefillPool:
    """A separate prefill pool: the decode pool's worst gap is one step; TTFT prefill + transfer."""
    base, per_stream, rate, step_s, context_s = _params(fitted)
    decode_s = base + per_stream * streams
    return PrefillPool(
        kv_transfer_s=kv_transfer_s,
        worst_gap_s=decode_s,
        rate_during_prefill_per_s=1 / decode_s,
        ttft_s=base + piece_s(step_s, 1 / rate, context_s, prompt_tokens, 0) + kv_transfer_s,
    )


def _params(fitted: Fit) -> tuple[float, float, float, float, float]:
    """(base, per_stream, rate, prefill_step, context); ValueError naming what is missing."""
    r = fitted.fit_record
    if r.decode_base_s is None or r.decode_per_stream_s is None or r.prefill_tokens_per_s is None:
        raise ValueError("not enough data: " + "; ".join(fitted.missing))
    step_s = fitted.prefill_step_s or 0.0
    context_s = fitted.prefill_context_s or 0.0
    return r.decode_base_s, r.decode_per_stream_s, r.prefill_tokens_per_s, step_s, context_s

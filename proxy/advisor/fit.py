"""The cost model of one backend, fitted from an ``ObservationSnapshot``.

Pure: no clock, no framework. The model (the linear form of Sarathi-Serve's and
BLIS's step models)::

    step_s = base + per_stream x decoding streams + prefill tokens in the step / rate

- **Decode step** (``base``, ``per_stream``): the median clean decode gap at each
  number of decoding streams, fitted by weighted least squares over the counts
  seen. Needs gaps at two or more different counts.
- **Prefill rate**: for a window alone in its busy period, each reference
  stream's gaps that ended in ``(tf, t1 + tol]`` minus the decode step they
  would have been: the *excess*, summed, is the time the engine spent on the
  prompt (its steps telescope, so a late step followed by an early one cancels
  out). ``uncached prompt tokens = rate x excess``, fitted through the origin
  over all windows. A window on an idle backend adds its upstream TTFT minus a
  base per step. Needs two windows whose excess is measurable.
- **Chunk size**: the number of steps with a clear excess tells how many
  pieces one prompt took. One step: the prompt was not split (chunk at least
  that big). Several: ``chunk = rate x (excess of a full piece)``; each such
  window also bounds it, ``P / k <= chunk < P / (k - 1)``, and the estimate is
  clamped into the bounds all windows agree on.

Where it stops holding: attention cost that grows with context length (long
conversations make later steps dearer), a token budget shared by decode and
prefill (vLLM's ``max_num_batched_tokens`` counts each decoding stream as one
token: the prompt piece is budget minus streams), speculative decoding or
stream intervals (several tokens per event), prefix caching the proxy cannot see,
and an engine that queues requests (TTFT then contains waiting, not prefill).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from proxy.advisor.observations import ObservationSnapshot, WindowObservation
from proxy.core.backend_fit import BackendFitRecord

MIN_GAPS_PER_COUNT = 5
"""Clean gaps a number of decoding streams needs before its median is used."""
MIN_WINDOWS = 2
"""Prefill windows needed for the rate."""
TOLERANCE_NS = 25_000_000
"""Most a stream's token of the culprit's last prefill step is read after its first token."""
ELEVATED_MIN_S = 0.002
"""A step is "carrying prefill" above this excess (s) ..."""
ELEVATED_RATIO = 0.15
"""... and above this share of the decode step."""
MEASURABLE_MIN_S = 0.003
"""A window's total excess must exceed this (s) ..."""
MEASURABLE_RATIO = 0.25
"""... and this share of the decode step to measure the prefill rate."""
SPLIT_RATIO = 0.9
"""A window whose full piece is below this share of its prompt was split into chunks."""


@dataclass(frozen=True, slots=True)
class WindowFit:
    """What one prefill window showed, once the decode step is known."""

    request_id: str
    """The request prefilled."""
    prompt_tokens: int
    """Its uncached prompt tokens."""
    excess_s: float
    """Time the engine spent on its prompt (median over reference streams), s."""
    pieces: int
    """Steps that carried a piece of it (median over reference streams); 0 when alone."""
    full_piece_s: float
    """Excess of one full piece, s."""
    alone: bool
    """No stream was decoding: measured from its upstream TTFT."""


@dataclass(frozen=True, slots=True)
class Fit:
    """The fitted cost model of one backend, how well it explains what was seen, what is missing."""

    fit_record: BackendFitRecord
    """The fitted parameters (``None`` where unknown)."""
    observations: dict[str, int | list[int] | None]
    """How much evidence of each kind was used."""
    quality: dict[str, float | None]
    """Residuals: relative RMS of each fit (0.05 = the model is 5% off on average)."""
    missing: tuple[str, ...]
    """What observations are still missing, one sentence each (empty: fully fitted)."""
    windows: tuple[WindowFit, ...] = field(default=())
    """The prefill windows used."""

    def decode_step_s(self, streams: int) -> float | None:
        """``base + per_stream x streams``, or ``None`` before the decode step is fitted."""
        r = self.fit_record
        if r.decode_base_s is None or r.decode_per_stream_s is None:
            return None
        return r.decode_base_s + r.decode_per_stream_s * streams


def fit(snapshot: ObservationSnapshot) -> Fit:
    """Fit the cost model to ``snapshot``; unknown parts stay ``None``, named in ``missing``."""
    missing: list[str] = []
    base, per_stream, decode_rel, counts, decode_gaps = _fit_decode(snapshot, missing)
    record = BackendFitRecord(snapshot.backend, None, base, per_stream, None, None)
    observations: dict[str, int | list[int] | None] = {
        "decode_gaps": decode_gaps,
        "stream_counts": counts,
        "prefill_windows": 0,
        "prefill_windows_alone": 0,
        "prefill_windows_chunked": 0,
        "windows_without_prompt_size": 0,
        "overlapping_prefills": snapshot.overlapping_periods,
        "stalls": snapshot.stalls,
        "largest_unsplit_prompt_tokens": None,
    }
    quality: dict[str, float | None] = {
        "decode_residual_rel": decode_rel,
        "prefill_residual_rel": None,
        "chunk_size_spread_rel": None,
    }
    empty = Fit(record, observations, quality, tuple(missing))
    if base is None or per_stream is None:
        missing.append("prefill windows (the decode step comes first)")
        return Fit(record, observations, quality, tuple(missing))
    windows = _window_fits(snapshot, empty, observations)
    usable = [w for w in windows if w.excess_s > 0]
    observations["prefill_windows"] = sum(1 for w in usable if not w.alone)
    observations["prefill_windows_alone"] = sum(1 for w in usable if w.alone)
    if len(usable) < MIN_WINDOWS:
        seen = len(snapshot.windows)
        missing.append(
            f"prefills of a known prompt size that measurably slow the other streams or, on an "
            f"idle backend, show in the first token: {len(usable)} of {MIN_WINDOWS} needed "
            f"({seen} prefill windows alone seen; no long prompts yet?)"
        )
        return Fit(record, observations, quality, tuple(missing), tuple(windows))
    inv_rate = sum(w.prompt_tokens * w.excess_s for w in usable) / sum(
        w.prompt_tokens**2 for w in usable
    )
    if inv_rate <= 0:
        missing.append("prefills that cost measurable time (all excesses were zero)")
        return Fit(record, observations, quality, tuple(missing), tuple(windows))
    rate = 1.0 / inv_rate
    quality["prefill_residual_rel"] = _rms(
        [(w.excess_s - w.prompt_tokens * inv_rate) / w.excess_s for w in usable]
    )
    chunk, chunked, spread, largest_unsplit, n_split = _fit_chunk(usable, rate)
    observations["prefill_windows_chunked"] = n_split
    observations["largest_unsplit_prompt_tokens"] = largest_unsplit
    quality["chunk_size_spread_rel"] = spread
    if chunked is None:
        missing.append("a prefill seen while streams decode (to tell whether prompts are chunked)")
    record = BackendFitRecord(snapshot.backend, rate, base, per_stream, chunk, chunked)
    return Fit(record, observations, quality, tuple(missing), tuple(windows))


def _fit_decode(
    snapshot: ObservationSnapshot, missing: list[str]
) -> tuple[float | None, float | None, float | None, list[int], int]:
    points = []
    total = 0
    for n, gaps in sorted(snapshot.clean_gaps_ns.items()):
        total += len(gaps)
        if len(gaps) >= MIN_GAPS_PER_COUNT and n >= 1:
            points.append((n, statistics.median(gaps) / 1e9, min(len(gaps), 64)))
    counts = [n for n, _, _ in points]
    if not points:
        missing.append(
            f"decode gaps with no prefill going on: {total} seen, need {MIN_GAPS_PER_COUNT} "
            "at one number of decoding streams (too little traffic?)"
        )
        return None, None, None, counts, total
    if len(points) < 2:
        missing.append(
            f"decode gaps at two or more different numbers of decoding streams "
            f"(seen only at {counts[0]}): the per-stream cost cannot be told from the base"
        )
        return None, None, None, counts, total
    w_sum = sum(w for _, _, w in points)
    x_mean = sum(n * w for n, _, w in points) / w_sum
    y_mean = sum(y * w for _, y, w in points) / w_sum
    sxx = sum(w * (n - x_mean) ** 2 for n, _, w in points)
    sxy = sum(w * (n - x_mean) * (y - y_mean) for n, y, w in points)
    per_stream = max(0.0, sxy / sxx)  # below 0 only by noise: a step never gets cheaper
    base = y_mean - per_stream * x_mean
    if base <= 0:
        missing.append("decode gaps over a wider range of stream counts (the fit's base was < 0)")
        return None, None, None, counts, total
    rel = _rms([(y - base - per_stream * n) / y for n, y, _ in points])
    return base, per_stream, rel, counts, total


def _window_fits(
    snapshot: ObservationSnapshot, decode: Fit, observations: dict[str, int | list[int] | None]
) -> list[WindowFit]:
    out: list[WindowFit] = []
    no_size = 0
    for window in snapshot.windows:
        size = snapshot.prompts.get(window.request_id)
        if size is None or size.uncached_tokens <= 0:
            no_size += 1
            continue
        one = _window_fit(window, size.uncached_tokens, decode)
        if one is not None:
            out.append(one)
    observations["windows_without_prompt_size"] = no_size
    return out


def _window_fit(window: WindowObservation, prompt_tokens: int, decode: Fit) -> WindowFit | None:
    tf, t1 = window.forwarded_ns, window.first_token_ns
    if not window.references:
        if window.decoding_at_start:
            return None  # streams were decoding but none covered the window
        base = decode.decode_step_s(0)
        assert base is not None
        excess = (t1 - tf) / 1e9 - base
        return WindowFit(window.request_id, prompt_tokens, max(0.0, excess), 0, 0.0, alone=True)
    totals: list[float] = []
    pieces: list[int] = []
    full: list[float] = []
    step_s = 0.0
    for gaps in window.references:
        total = 0.0
        elevated: list[float] = []
        for g in gaps:
            # From its first token on, the culprit is counted among the decoding streams,
            # but the step that produced that token did not decode it.
            step = decode.decode_step_s(g.streams - (g.end_ns >= t1))
            assert step is not None
            step_s = step
            tol_ns = min(TOLERANCE_NS, step * 5e8)
            if g.end_ns > t1 + tol_ns:
                break
            excess = (g.end_ns - g.start_ns) / 1e9 - step
            total += excess
            if excess > max(ELEVATED_MIN_S, ELEVATED_RATIO * step):
                elevated.append(excess)
        totals.append(total)
        pieces.append(len(elevated))
        elevated.sort()
        if len(elevated) >= 3:
            full.append(statistics.median(elevated[1:]))
        elif elevated:
            full.append(elevated[-1])
    excess_s = statistics.median(totals)
    if excess_s < max(MEASURABLE_MIN_S, MEASURABLE_RATIO * step_s):
        return WindowFit(window.request_id, prompt_tokens, 0.0, 0, 0.0, alone=False)
    return WindowFit(
        window.request_id,
        prompt_tokens,
        excess_s,
        round(statistics.median(pieces)),
        statistics.median(full) if full else excess_s,
        alone=False,
    )


def _fit_chunk(
    windows: list[WindowFit], rate: float
) -> tuple[int | None, bool | None, float | None, int | None, int]:
    """(chunk size, chunked?, spread of the estimates, largest unsplit prompt, split windows)."""
    seen = [w for w in windows if not w.alone and w.pieces >= 1]
    if not seen:
        return None, None, None, None, 0
    split: list[WindowFit] = []
    unsplit: list[int] = []
    for w in seen:
        piece_tokens = w.full_piece_s * rate
        if w.pieces >= 2 and piece_tokens < SPLIT_RATIO * w.prompt_tokens:
            split.append(w)
        else:
            unsplit.append(w.prompt_tokens)
    largest_unsplit = max(unsplit) if unsplit else None
    if not split:
        return None, False, None, largest_unsplit, 0
    estimates = [w.full_piece_s * rate for w in split]
    chunk = statistics.median(estimates)
    spread = _rms([(e - chunk) / chunk for e in estimates])
    low, high = 1.0, math.inf
    for w in split:
        # k pieces of at most ``chunk``: P / k <= chunk < P / (k - 1).
        lo, hi = w.prompt_tokens / w.pieces, w.prompt_tokens / (w.pieces - 1)
        if lo * 0.9 <= chunk < hi * 1.1:  # a miscounted piece would mislead: skip it
            low, high = max(low, lo), min(high, hi)
    if low < high:
        chunk = min(max(chunk, low), math.nextafter(high, 0))
    return round(chunk), True, spread, largest_unsplit, len(split)


def _rms(values: list[float]) -> float | None:
    if not values:
        return None
    return math.sqrt(sum(v * v for v in values) / len(values))

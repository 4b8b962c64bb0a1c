"""The cost model of one backend, fitted from an ``ObservationSnapshot``.

Pure: no clock, no framework. The model (the linear form of Sarathi-Serve's and
BLIS's step models)::

    step_s = base + per_stream x decoding streams
             + (prefill_step + x / rate + context x x (L + x), if it carries a
                piece of x prompt tokens after L of the same prompt)

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
- **Fixed cost per prefill step** (``prefill_step``): a step that carries prefill
  can cost a constant besides its tokens (kernel launches, batch setup,
  sampling). Each prefill step seen by decoding streams is a point: an unsplit
  prompt of ``P`` tokens, ``prefill_step + P / rate``; a split one in ``k``
  pieces, its full piece ``prefill_step + chunk / rate`` and its last
  ``prefill_step + (P - (k - 1) chunk) / rate``, linear in ``(prefill_step,
  1 / rate, chunk / rate)``: least squares over all of them. On an idle backend
  only, the first tokens of prompts of different sizes are the points. Kept
  only when its 95% interval (Student's t, ``proxy.advisor.regression``) lies
  above 0 and when it explains the windows' telescoped totals better than none
  does; else (too few or too
  alike steps, e.g. prompts of 3 and 2 pieces whose remainders tell nothing,
  or a negative intercept: bigger steps dearer per token, as attention over a
  long prompt makes them) it is 0, the rate is fitted through the origin as
  above, and ``observations["prefill_step_note"]`` says why. Kept, the chunk
  is ``(full piece - prefill_step) x rate``.
- **Context term** (``context``): attention makes later pieces of a prompt dearer;
  fitted on each prefill step at the context it had, kept only where the steps tell it
  from 0 (``proxy.advisor.context``). Kept, the rate beside it is set on the windows'
  totals and the chunk is found again as the size whose steps it explains best;
  ``observations["prefill_context_note"]`` says why either way.
- **A window's start**: a "piece" smaller than ``START_PIECE_RATIO`` of the next one
  at the start of a window is no step of the prompt (its first piece is a full one, and
  the next costs at most a few times as much even where context dominates) but the
  engine's API server busy taking the request in (vLLM's delays the streams' tokens by a
  few decode steps; the next gaps, shorter, give the time back): it is not counted as a
  piece, nor one before it that small beside it. Nor is a last one below that share of
  the one before it and below ``END_DELAY_STEPS`` decode steps of excess: the API server,
  late sending the first token, lets the streams' next step fall into the window (a real
  remainder that small costs less than 1.5 decode steps and is miscounted; llama.cpp's
  108-token remainder beside 8 streams costs 1.7).
- **Chunk size**: the number of steps with a clear excess tells how many
  pieces one prompt took. One step: the prompt was not split (chunk at least
  that big). Several: ``chunk = rate x (excess of a full piece)``; each such
  window also bounds it, ``P / k <= chunk < P / (k - 1)``, and the estimate is
  clamped into the bounds all windows agree on.

Where it stops holding: attention over context the fit does not see (a cached prefix,
the decoding streams' own growing contexts), a token budget shared by decode and
prefill (vLLM's ``max_num_batched_tokens`` counts each decoding stream as one
token: the prompt piece is budget minus streams), speculative decoding or
stream intervals (several tokens per event), prefix caching the proxy cannot see,
and an engine that queues requests (TTFT then contains waiting, not prefill).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

from proxy.advisor.context import fit_context, total_s
from proxy.advisor.observations import ObservationSnapshot, WindowObservation
from proxy.advisor.pieces import (
    WindowFit,
    chunk_by_pieces,
    context_points,
    fit_chunk,
    is_split,
    piece_sizes,
    rms,
    step_line,
    windows_residual,
)
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
START_PIECE_RATIO = 0.3
"""A window's first elevated step below this share of the next is the API server's delay."""
END_DELAY_STEPS = 1.5
"""... and its last one, below that share of the one before and this many decode steps of
excess, the API server's delay sending the first token (read after the streams' next one)."""
MEASURABLE_MIN_S = 0.003
"""A window's total excess must exceed this (s) ..."""
MEASURABLE_RATIO = 0.25
"""... and this share of the decode step to measure the prefill rate."""


@dataclass(frozen=True, slots=True)
class Fit:
    """The fitted cost model of one backend, how well it explains what was seen, what is missing."""

    fit_record: BackendFitRecord
    """The fitted parameters (``None`` where unknown)."""
    observations: dict[str, int | list[int] | str | None]
    """How much evidence of each kind was used (and, as a sentence, why a part was not fitted)."""
    quality: dict[str, float | None]
    """Residuals: relative RMS of each fit (0.05 = the model is 5% off on average)."""
    missing: tuple[str, ...]
    """What observations are still missing, one sentence each (empty: fully fitted)."""
    windows: tuple[WindowFit, ...] = field(default=())
    """The prefill windows used."""
    prefill_step_s: float | None = None
    """Fixed cost of a step that carries prefill, besides its tokens (s); 0 when it cannot be
    told from the rate, ``None`` while the rate is unknown."""
    prefill_context_s: float | None = None
    """Seconds a prompt token costs more per token of its prompt already in context
    (``proxy.advisor.context``); 0 when not told from 0, ``None`` while the rate is unknown."""

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
    observations: dict[str, int | list[int] | str | None] = {
        "decode_gaps": decode_gaps,
        "stream_counts": counts,
        "prefill_windows": 0,
        "prefill_windows_alone": 0,
        "prefill_windows_chunked": 0,
        "windows_without_prompt_size": 0,
        "overlapping_prefills": snapshot.overlapping_periods,
        "stalls": snapshot.stalls,
        "largest_unsplit_prompt_tokens": None,
        "prefill_steps": 0,
        "prefill_step_tokens": None,
        "prefill_step_note": None,
        "prefill_context_steps": 0,
        "prefill_context_note": None,
    }
    quality: dict[str, float | None] = {
        "decode_residual_rel": decode_rel,
        "prefill_residual_rel": None,
        "chunk_size_spread_rel": None,
        "prefill_step_residual_rel": None,
        "prefill_context_fitted": None,
        "prefill_context_stderr": None,
        "prefill_context_residual_rel": None,
        "prefill_context_residual_without_rel": None,
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
    chunk, chunked, spread, largest_unsplit, n_split = fit_chunk(usable, 1.0 / inv_rate, 0.0)
    split = [w for w in usable if is_split(w, 1.0 / inv_rate, 0.0)] if chunked else []
    line = step_line(usable, split, chunk)
    step_s = 0.0
    note = line.note
    if line.step_s is not None:
        again = fit_chunk(usable, 1.0 / line.inv_rate, line.step_s) if chunked else None
        new_chunk = again[0] if again is not None else chunk
        # The windows' totals telescope (a late step and an early one cancel): the step cost
        # must explain them better than none does, else single steps' jitter made it.
        with_step = windows_residual(usable, new_chunk, line.step_s, line.inv_rate)
        without = windows_residual(usable, chunk, 0.0, inv_rate)
        if with_step < without:
            note = (
                f"{line.note} and explains the windows' totals better than none (residual "
                f"{with_step:.1%} against {without:.1%}); kept"
            )
            step_s, inv_rate = line.step_s, line.inv_rate
            quality["prefill_step_residual_rel"] = line.residual_rel
            if again is not None:
                chunk, chunked, spread, largest_unsplit, n_split = again
        else:
            note = (
                f"{len(line.tokens)} prefill steps: a fixed cost per step of "
                f"{line.step_s * 1e3:.1f} ms explains the windows' totals no better than none "
                f"(residual {with_step:.1%} against {without:.1%}); taken as 0"
            )
    observations["prefill_steps"] = len(line.tokens)
    observations["prefill_step_tokens"] = line.tokens_range(chunk)
    points, totals = context_points(usable, split, chunk)
    context = fit_context(points, totals, step_s, inv_rate)
    if context.kept and chunked and chunk is not None:
        # The chunk found without the term is off (the pieces' context made them dearer, so
        # fewer tokens seemed to fit): the one whose steps the context term explains best.
        better = chunk_by_pieces(usable, split, chunk)
        if better != chunk:
            points, totals = context_points(usable, split, better)
            refit = fit_context(points, totals, step_s, inv_rate)
            if refit.kept:
                chunk, context = better, refit
    if context.kept:
        if context.step_s > 0:
            note = f"{context.step_note}; kept"
        elif step_s > 0:
            note = f"{context.step_note}; taken as 0"
        step_s, inv_rate = context.step_s, context.inv_rate
    observations["prefill_step_note"] = note
    observations["prefill_context_note"] = context.note
    observations["prefill_context_steps"] = len(points)
    quality["prefill_context_fitted"] = context.fitted_s
    quality["prefill_context_stderr"] = context.stderr_s
    quality["prefill_context_residual_rel"] = context.residual_rel
    quality["prefill_context_residual_without_rel"] = context.residual_without_rel
    rate = 1.0 / inv_rate
    c_s = context.context_s
    modelled = [total_s(step_s, inv_rate, c_s, piece_sizes(w.prompt_tokens, chunk)) for w in usable]
    quality["prefill_residual_rel"] = rms(
        [(w.excess_s - m) / w.excess_s for w, m in zip(usable, modelled, strict=True)]
    )
    observations["prefill_windows_chunked"] = n_split
    observations["largest_unsplit_prompt_tokens"] = largest_unsplit
    quality["chunk_size_spread_rel"] = spread
    if chunked is None:
        missing.append("a prefill seen while streams decode (to tell whether prompts are chunked)")
    record = BackendFitRecord(
        snapshot.backend, rate, base, per_stream, chunk, chunked, prefill_step_s=step_s
    )
    return Fit(
        record, observations, quality, tuple(missing), tuple(windows), step_s, context.context_s
    )


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
    rel = rms([(y - base - per_stream * n) / y for n, y, _ in points])
    return base, per_stream, rel, counts, total


def _window_fits(
    snapshot: ObservationSnapshot,
    decode: Fit,
    observations: dict[str, int | list[int] | str | None],
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
        excess = max(0.0, (t1 - tf) / 1e9 - base)
        return WindowFit(window.request_id, prompt_tokens, excess, 0, 0.0, excess, alone=True)
    totals: list[float] = []
    pieces: list[int] = []
    full: list[float] = []
    last: list[float] = []
    ordered: list[list[float]] = []
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
        while len(elevated) >= 2 and elevated[0] < START_PIECE_RATIO * elevated[1]:
            del elevated[0]  # the API server's delay, not a piece
        while (
            len(elevated) >= 2
            and elevated[-1] < START_PIECE_RATIO * elevated[-2]
            and elevated[-1] < END_DELAY_STEPS * step_s
        ):
            del elevated[-1]  # the API server's delay sending the first token, not a piece
        totals.append(total)
        pieces.append(len(elevated))
        ordered.append(list(elevated))
        if elevated:
            last.append(elevated[-1])
        elevated.sort()
        if len(elevated) >= 3:
            full.append(statistics.median(elevated[1:]))
        elif elevated:
            full.append(elevated[-1])
    excess_s = statistics.median(totals)
    if excess_s < max(MEASURABLE_MIN_S, MEASURABLE_RATIO * step_s):
        return WindowFit(window.request_id, prompt_tokens, 0.0, 0, 0.0, 0.0, alone=False)
    n_pieces = round(statistics.median(pieces))
    agreeing = [o for o in ordered if len(o) == n_pieces]
    return WindowFit(
        window.request_id,
        prompt_tokens,
        excess_s,
        n_pieces,
        statistics.median(full) if full else excess_s,
        statistics.median(last) if last else excess_s,
        alone=False,
        piece_s=tuple(statistics.median(step) for step in zip(*agreeing, strict=True)),
    )

"""The cost model of one backend, fitted from an ``ObservationSnapshot``.

Pure: no clock, no framework. The model (the linear form of Sarathi-Serve's and
BLIS's step models)::

    step_s = base + per_stream x decoding streams
             + (prefill_step + x / rate + context x (L x + x^2 / 2), if it carries a
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
  only ``STEP_SIGNIFICANCE`` standard errors above 0 and when it explains the
  windows' telescoped totals better than none does; else (too few or too
  alike steps, e.g. prompts of 3 and 2 pieces whose remainders tell nothing,
  or a negative intercept: bigger steps dearer per token, as attention over a
  long prompt makes them) it is 0, the rate is fitted through the origin as
  above, and ``observations["prefill_step_note"]`` says why. Kept, the chunk
  is ``(full piece - prefill_step) x rate``.
- **Context term** (``context``): attention makes later pieces of a prompt dearer;
  fitted on each prefill step at the context it had, kept only where the steps tell it
  from 0 (``proxy.advisor.context``). Kept, the chunk is found again as the size whose
  steps it explains best; ``observations["prefill_context_note"]`` says why either way.
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

import math
import statistics
from dataclasses import dataclass, field

from proxy.advisor.context import StepPoint, WindowTotal, fit_context, total_s
from proxy.advisor.observations import ObservationSnapshot, WindowObservation
from proxy.advisor.regression import least_squares
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
STEP_SIGNIFICANCE = 2.0
"""A fixed cost per prefill step is kept only this many standard errors above 0."""
CHUNK_CANDIDATES = 48
"""Chunk sizes tried at most per round when the context term moves the chunk."""


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
    last_piece_s: float
    """Excess of the last step that carried a piece of it (the remainder when split), s."""
    alone: bool
    """No stream was decoding: measured from its upstream TTFT."""
    piece_s: tuple[float, ...] = ()
    """Excess of each step that carried a piece of it, in order (per step, the median over the
    reference streams that saw ``pieces`` of them); empty when alone or none agreed."""


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
    chunk, chunked, spread, largest_unsplit, n_split = _fit_chunk(usable, 1.0 / inv_rate, 0.0)
    split = [w for w in usable if _is_split(w, 1.0 / inv_rate, 0.0)] if chunked else []
    line = _step_line(usable, split, chunk)
    step_s = 0.0
    note = line.note
    if line.step_s is not None:
        again = _fit_chunk(usable, 1.0 / line.inv_rate, line.step_s) if chunked else None
        new_chunk = again[0] if again is not None else chunk
        # The windows' totals telescope (a late step and an early one cancel): the step cost
        # must explain them better than none does, else single steps' jitter made it.
        with_step = _totals_residual(usable, new_chunk, line.step_s, line.inv_rate)
        without = _totals_residual(usable, chunk, 0.0, inv_rate)
        if with_step < without:
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
    points, totals = _context_points(usable, split, chunk)
    context = fit_context(points, totals, step_s, inv_rate)
    if context.kept and chunked and chunk is not None:
        # The chunk found without the term is off (the pieces' context made them dearer, so
        # fewer tokens seemed to fit): the one whose steps the context term explains best.
        better = _chunk_by_pieces(usable, split, chunk)
        if better != chunk:
            points, totals = _context_points(usable, split, better)
            refit = fit_context(points, totals, step_s, inv_rate)
            if refit.kept:
                chunk, context = better, refit
    if context.kept:
        if context.step_s > 0 and step_s == 0:
            note = None  # told from 0 beside the context term
        elif context.step_s == 0 and step_s > 0:
            note = "the fixed cost per step is not told from 0 beside the context term; taken as 0"
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
    quality["prefill_residual_rel"] = _rms(
        [
            (
                w.excess_s
                - total_s(step_s, inv_rate, c_s, w.prompt_tokens, _steps(w.prompt_tokens, chunk))
            )
            / w.excess_s
            for w in usable
        ]
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
    rel = _rms([(y - base - per_stream * n) / y for n, y, _ in points])
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


def _fit_chunk(
    windows: list[WindowFit], rate: float, step_s: float
) -> tuple[int | None, bool | None, float | None, int | None, int]:
    """(chunk size, chunked?, spread of the estimates, largest unsplit prompt, split windows).

    A full piece costs ``step_s + chunk / rate`` (with a context term, ``_chunk_by_pieces``
    finds it again).
    """
    seen = [w for w in windows if not w.alone and w.pieces >= 1]
    if not seen:
        return None, None, None, None, 0
    split: list[WindowFit] = []
    unsplit: list[int] = []
    for w in seen:
        if _is_split(w, rate, step_s):
            split.append(w)
        else:
            unsplit.append(w.prompt_tokens)
    largest_unsplit = max(unsplit) if unsplit else None
    if not split:
        return None, False, None, largest_unsplit, 0
    estimates = [(w.full_piece_s - step_s) * rate for w in split]
    chunk = max(1.0, statistics.median(estimates))
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


def _context_points(
    windows: list[WindowFit], split: list[WindowFit], chunk: int | None
) -> tuple[list[StepPoint], list[WindowTotal]]:
    """Each prefill step seen at the context before it, and each window's total.

    A split window's pieces are used when their count is what ``chunk`` gives its prompt
    (then the j-th one has ``j x chunk`` tokens before it); an unsplit window is one step.
    A window measured alone (from its first token) is one step too when prompts are not
    split (else it is several, whose costs its first token cannot tell apart).
    """
    points: list[StepPoint] = []
    totals: list[WindowTotal] = []
    for w in windows:
        totals.append(WindowTotal(w.prompt_tokens, _steps(w.prompt_tokens, chunk), w.excess_s))
        if w.alone:
            if chunk is None:
                points.append(StepPoint(w.prompt_tokens, 0, w.excess_s))
            continue
        if w in split:
            k = _steps(w.prompt_tokens, chunk)
            if chunk is None or len(w.piece_s) != k or w.pieces != k:
                continue
            for j, y in enumerate(w.piece_s):
                tokens = chunk if j < k - 1 else w.prompt_tokens - (k - 1) * chunk
                points.append(StepPoint(tokens, j * chunk, y))
        else:
            points.append(StepPoint(w.prompt_tokens, 0, w.excess_s))
    return points, totals


def _chunk_by_pieces(windows: list[WindowFit], split: list[WindowFit], chunk: int) -> int:
    """The chunk within the bounds the split windows agree on whose steps, at the context
    each had, fit ``step + tokens / rate + context x (L x + x^2 / 2)`` best (least squares);
    a coarse grid, then every size around the best."""
    low, high = 1.0, math.inf
    for w in split:
        lo, hi = w.prompt_tokens / w.pieces, w.prompt_tokens / (w.pieces - 1)
        if lo * 0.9 <= chunk < hi * 1.1:  # as ``_fit_chunk``: a miscounted window is skipped
            low, high = max(low, lo), min(high, hi)
    first, last = math.ceil(low), math.ceil(high) - 1
    if high == math.inf or first >= last:
        return chunk

    def sse(size: int) -> float:
        points = _context_points(windows, split, size)[0]
        xs = [[p.context_tokens * p.tokens + p.tokens**2 / 2, 1.0, p.tokens] for p in points]
        ys = [p.excess_s for p in points]
        solved = least_squares(xs, ys)
        if solved is None:
            return math.inf
        beta = solved[0]
        return sum(
            (y - sum(b * v for b, v in zip(beta, x, strict=True))) ** 2
            for x, y in zip(xs, ys, strict=True)
        )

    stride = max(1, (last - first) // CHUNK_CANDIDATES)
    best = min(range(first, last + 1, stride), key=sse)
    return min(range(max(first, best - stride), min(last, best + stride) + 1), key=sse)


def _is_split(w: WindowFit, rate: float, step_s: float) -> bool:
    """Several steps carried it, each a clear part of it."""
    piece_tokens = (w.full_piece_s - step_s) * rate
    return not w.alone and w.pieces >= 2 and piece_tokens < SPLIT_RATIO * w.prompt_tokens


@dataclass(frozen=True, slots=True)
class _StepLine:
    """Prefill steps' excess against their tokens (see the module's docstring)."""

    tokens: tuple[tuple[int, int], ...]
    """(prompt tokens, pieces) of each point's window; pieces 0: the full piece of a split one,
    1: unsplit, else the last piece of a split one."""
    step_s: float | None
    """The fixed cost per step; ``None``: not told from 0."""
    inv_rate: float
    """s per prompt token (meaningful only with ``step_s``)."""
    residual_rel: float | None
    """Relative RMS of the points about the fit."""
    note: str | None
    """Why ``step_s`` is ``None``."""

    def tokens_range(self, chunk: int | None) -> list[int] | None:
        """Fewest and most prompt tokens one of the points carried, at ``chunk``."""
        sizes = [
            p if k == 1 else (chunk or 0) if k == 0 else p - (k - 1) * (chunk or 0)
            for p, k in self.tokens
        ]
        return [min(sizes), max(sizes)] if sizes else None


def _step_line(windows: list[WindowFit], split: list[WindowFit], chunk: int | None) -> _StepLine:
    """Least squares of each prefill step's excess = ``step_s + tokens / rate``.

    A split window of ``P`` tokens in ``k`` pieces gives two points with the chunk unknown:
    its full piece, ``step_s + chunk / rate``, and its last, ``step_s + (P - (k - 1) chunk)
    / rate``; linear in ``(step_s, 1 / rate, chunk / rate)``. An unsplit window is one point.
    The last piece is used only when ``k`` agrees with ``chunk`` (the first estimate): a
    piece too small to tell from a decode step goes uncounted, and its window's last step
    seen is a full one.
    """
    xs: list[list[float]] = []
    ys: list[float] = []
    tokens: list[tuple[int, int]] = []
    for w in windows:
        if w.alone:
            continue
        if w in split:
            xs.append([1.0, 0.0, 1.0])
            ys.append(w.full_piece_s)
            tokens.append((w.prompt_tokens, 0))
            if w.pieces == _steps(w.prompt_tokens, chunk):
                xs.append([1.0, float(w.prompt_tokens), 1.0 - w.pieces])
                ys.append(w.last_piece_s)
                tokens.append((w.prompt_tokens, w.pieces))
        else:
            xs.append([1.0, float(w.prompt_tokens), 0.0])
            ys.append(w.excess_s)
            tokens.append((w.prompt_tokens, 1))
    if not xs:  # an idle backend: first tokens, one step each as far as is known
        for w in windows:
            xs.append([1.0, float(w.prompt_tokens), 0.0])
            ys.append(w.excess_s)
            tokens.append((w.prompt_tokens, 1))
    n_params = 3 if split else 2
    xs = [x[:n_params] for x in xs]
    seen = f"{len(ys)} prefill steps"
    solved = least_squares(xs, ys) if len(ys) > n_params else None
    if solved is None:
        note = f"{seen}: too few, or too alike, to tell a fixed cost per step from the rate"
        return _StepLine(tuple(tokens), None, 0.0, None, note + "; taken as 0")
    beta, se_step = solved
    step_s, inv_rate = beta[0], beta[1]
    if inv_rate <= 0 or step_s < 2 * se_step:
        why = (
            "bigger steps dearer per token, e.g. attention over a long prompt"
            if step_s < -se_step - 1e-6
            else f"not {STEP_SIGNIFICANCE:g} standard errors above it"
        )
        note = (
            f"{seen}: the fixed cost per step, {step_s * 1e3:.1f} +- {se_step * 1e3:.1f} ms, "
            f"is not told from 0 ({why})"
        )
        return _StepLine(tuple(tokens), None, 0.0, None, note + "; taken as 0")
    residual = _rms(
        [
            (y - sum(b * xi for b, xi in zip(beta, x, strict=True))) / y
            for x, y in zip(xs, ys, strict=True)
            if y > 0
        ]
    )
    return _StepLine(tuple(tokens), step_s, inv_rate, residual, None)


def _totals_residual(
    windows: list[WindowFit], chunk: int | None, step_s: float, inv_rate: float
) -> float:
    """Relative RMS of the windows' total excess about ``steps x step_s + P x inv_rate``."""
    rel = [
        (w.excess_s - _steps(w.prompt_tokens, chunk) * step_s - w.prompt_tokens * inv_rate)
        / w.excess_s
        for w in windows
        if w.excess_s > 0
    ]
    return _rms(rel) or 0.0


def _steps(prompt_tokens: int, chunk: int | None) -> int:
    """Steps a prompt takes at ``chunk`` (``None``: one)."""
    return 1 if chunk is None else max(1, math.ceil(prompt_tokens / chunk))


def _rms(values: list[float]) -> float | None:
    if not values:
        return None
    return math.sqrt(sum(v * v for v in values) / len(values))

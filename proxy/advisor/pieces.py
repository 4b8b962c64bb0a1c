"""A prompt's prefill pieces as the decoding streams saw them: chunk size and fixed cost.

Pure helpers of ``proxy.advisor.fit``: from each window's steps, the chunk a split
prompt was cut into, the fixed cost per prefill step (kept or dropped, with why) and
the points the context term is fitted on. The model they serve is in
``proxy.advisor.fit``'s docstring.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from proxy.advisor.context import StepPoint, WindowTotal, attended
from proxy.advisor.regression import least_squares

SPLIT_RATIO = 0.9
"""A window whose full piece is below this share of its prompt was split into chunks."""
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


def fit_chunk(
    windows: list[WindowFit], rate: float, step_s: float
) -> tuple[int | None, bool | None, float | None, int | None, int]:
    """(chunk size, chunked?, spread of the estimates, largest unsplit prompt, split windows).

    A full piece costs ``step_s + chunk / rate`` (with a context term, ``chunk_by_pieces``
    finds it again).
    """
    seen = [w for w in windows if not w.alone and w.pieces >= 1]
    if not seen:
        return None, None, None, None, 0
    split: list[WindowFit] = []
    unsplit: list[int] = []
    for w in seen:
        if is_split(w, rate, step_s):
            split.append(w)
        else:
            unsplit.append(w.prompt_tokens)
    largest_unsplit = max(unsplit) if unsplit else None
    if not split:
        return None, False, None, largest_unsplit, 0
    estimates = [(w.full_piece_s - step_s) * rate for w in split]
    chunk = max(1.0, statistics.median(estimates))
    spread = rms([(e - chunk) / chunk for e in estimates])
    low, high = 1.0, math.inf
    for w in split:
        # k pieces of at most ``chunk``: P / k <= chunk < P / (k - 1).
        lo, hi = w.prompt_tokens / w.pieces, w.prompt_tokens / (w.pieces - 1)
        if lo * 0.9 <= chunk < hi * 1.1:  # a miscounted piece would mislead: skip it
            low, high = max(low, lo), min(high, hi)
    if low < high:
        chunk = min(max(chunk, low), math.nextafter(high, 0))
    return round(chunk), True, spread, largest_unsplit, len(split)


def context_points(
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
        totals.append(WindowTotal(piece_sizes(w.prompt_tokens, chunk), w.excess_s))
        if w.alone:
            if chunk is None:
                points.append(StepPoint(w.prompt_tokens, 0, w.excess_s))
            continue
        if w in split:
            k = piece_count(w.prompt_tokens, chunk)
            if chunk is None or len(w.piece_s) != k or w.pieces != k:
                continue
            for j, y in enumerate(w.piece_s):
                tokens = chunk if j < k - 1 else w.prompt_tokens - (k - 1) * chunk
                points.append(StepPoint(tokens, j * chunk, y))
        else:
            points.append(StepPoint(w.prompt_tokens, 0, w.excess_s))
    return points, totals


def chunk_by_pieces(windows: list[WindowFit], split: list[WindowFit], chunk: int) -> int:
    """The chunk within the bounds the split windows agree on whose steps, at the context
    each had, fit ``step + tokens / rate + context x x (L + x)`` best (least squares);
    a coarse grid, then every size around the best."""
    low, high = 1.0, math.inf
    for w in split:
        lo, hi = w.prompt_tokens / w.pieces, w.prompt_tokens / (w.pieces - 1)
        if lo * 0.9 <= chunk < hi * 1.1:  # as ``fit_chunk``: a miscounted window is skipped
            low, high = max(low, lo), min(high, hi)
    first, last = math.ceil(low), math.ceil(high) - 1
    if high == math.inf or first >= last:
        return chunk

    def sse(size: int) -> float:
        points = context_points(windows, split, size)[0]
        xs = [[float(attended(p.tokens, p.context_tokens)), 1.0, p.tokens] for p in points]
        ys = [p.excess_s for p in points]
        solved = least_squares(xs, ys)
        if solved is None:
            return math.inf
        beta = solved.beta
        return sum(
            (y - sum(b * v for b, v in zip(beta, x, strict=True))) ** 2
            for x, y in zip(xs, ys, strict=True)
        )

    stride = max(1, (last - first) // CHUNK_CANDIDATES)
    best = min(range(first, last + 1, stride), key=sse)
    return min(range(max(first, best - stride), min(last, best + stride) + 1), key=sse)


def is_split(w: WindowFit, rate: float, step_s: float) -> bool:
    """Several steps carried it, each a clear part of it."""
    piece_tokens = (w.full_piece_s - step_s) * rate
    return not w.alone and w.pieces >= 2 and piece_tokens < SPLIT_RATIO * w.prompt_tokens


@dataclass(frozen=True, slots=True)
class StepLine:
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
    note: str
    """Why ``step_s`` is ``None`` (ends "taken as 0"), or its 95% interval, told from 0."""

    def tokens_range(self, chunk: int | None) -> list[int] | None:
        """Fewest and most prompt tokens one of the points carried, at ``chunk``."""
        sizes = [
            p if k == 1 else (chunk or 0) if k == 0 else p - (k - 1) * (chunk or 0)
            for p, k in self.tokens
        ]
        return [min(sizes), max(sizes)] if sizes else None


def step_line(windows: list[WindowFit], split: list[WindowFit], chunk: int | None) -> StepLine:
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
            if w.pieces == piece_count(w.prompt_tokens, chunk):
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
        return StepLine(tuple(tokens), None, 0.0, None, note + "; taken as 0")
    beta = solved.beta
    step_s, inv_rate = beta[0], beta[1]
    if inv_rate <= 0 or not solved.above_zero(0):
        why = (
            "bigger steps dearer per token, e.g. attention over a long prompt"
            if step_s < -solved.stderr[0] - 1e-6
            else "its 95% interval reaches 0"
        )
        note = (
            f"{seen}: the fixed cost per step, {solved.interval(0, 1e3, ' ms')}, "
            f"is not told from 0 ({why})"
        )
        return StepLine(tuple(tokens), None, 0.0, None, note + "; taken as 0")
    residual = rms(
        [
            (y - sum(b * xi for b, xi in zip(beta, x, strict=True))) / y
            for x, y in zip(xs, ys, strict=True)
            if y > 0
        ]
    )
    told = f"{seen}: the fixed cost per step, {solved.interval(0, 1e3, ' ms')}, is told from 0"
    return StepLine(tuple(tokens), step_s, inv_rate, residual, told)


def windows_residual(
    windows: list[WindowFit], chunk: int | None, step_s: float, inv_rate: float
) -> float:
    """Relative RMS of the windows' total excess about ``steps x step_s + P x inv_rate``."""
    rel = [
        (w.excess_s - piece_count(w.prompt_tokens, chunk) * step_s - w.prompt_tokens * inv_rate)
        / w.excess_s
        for w in windows
        if w.excess_s > 0
    ]
    return rms(rel) or 0.0


def piece_sizes(prompt_tokens: int, chunk: int | None) -> tuple[int, ...]:
    """How a prompt is split over steps at ``chunk`` (``None``: one piece): full pieces, then
    the rest."""
    if chunk is None or chunk >= prompt_tokens:
        return (prompt_tokens,)
    full, rest = divmod(prompt_tokens, chunk)
    return (chunk,) * full + ((rest,) if rest else ())


def piece_count(prompt_tokens: int, chunk: int | None) -> int:
    """Steps a prompt takes at ``chunk`` (``None``: one)."""
    return 1 if chunk is None else max(1, math.ceil(prompt_tokens / chunk))


def rms(values: list[float]) -> float | None:
    if not values:
        return None
    return math.sqrt(sum(v * v for v in values) / len(values))

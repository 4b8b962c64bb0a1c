"""The context term of the cost model: a prompt piece costs more the more context it attends to.

Pure. On a CPU (and for long prompts on any engine) attention makes a prompt
piece's cost grow with the tokens before it. A piece of ``x`` tokens after ``L``
of the same prompt already in the KV cache attends, as engines compute it, an
``x`` by ``L + x`` block (the causal mask hides half of the last ``x`` columns but
the kernels still compute them; vLLM's CPU build and llama.cpp both do)::

    piece_s = prefill_step + x / rate + context x x (L + x)

the ``a (2 L x + x^2)`` term of ROCm ATOM's step model, with the ``x^2`` of the
block computed whole. It does not telescope: a prompt of ``P`` tokens in pieces
``x_1 .. x_k`` costs ``context x (P^2 + sum x_j^2) / 2``, ``context x P^2`` in one
piece and about half that in many small ones, so each window carries its pieces
(``WindowTotal.pieces``).

Fitted by least squares on the prefill steps (each piece of a split prompt, at
the context the pieces before it left; an unsplit prompt's one step), jointly
with ``prefill_step`` and the rate. Kept only when all of these hold, else 0 and
the note says which failed:

- the 95% interval of ``context`` (Student's t, ``proxy.advisor.regression``)
  lies above 0;
- the rate, fitted again on the windows' totals beside it (below), is above 0;
- it matters: over the longest prompt seen it adds at least
  ``CONTEXT_MIN_SHARE`` of that prompt's modelled prefill time.

A fixed cost per prefill step comes back with it only when its own 95% interval
in the joint fit lies above 0.

The steps tell the term; the windows' totals set the rate beside it. A window's
total excess telescopes (a step read late and the next read early cancel), so it
holds the engine's cost level better than single steps, each a median of a few
gaps; but the totals of chunked prompts cannot tell the term: for prompts of 600
to 1,200 tokens in pieces of 504 the context they attend per token moves by 60%,
which at llama.cpp's term changes a window's total by a few percent, about its
noise. Judged on the totals (kept only where they fit better with it), the term
was dropped in 5 of 7 real llama.cpp fits at ``n_batch`` 512 whose steps told it
from 0, and each of the 5 under-predicted the unsplit prompt's worst gap (-4% to
-23%); kept as here, all 7 predicted it within 20% (-14% to +19%,
docs/advisor.md#validation). The totals' residual with and without the term is
still reported (``Fit.quality``). For unsplit prompts steps and totals are the
same points, and the rate is the joint fit's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from proxy.advisor.regression import LeastSquares, least_squares

CONTEXT_MIN_SHARE = 0.03
"""... and only when it is at least this share of the longest prompt's modelled prefill."""


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One prefill step seen: a piece of a prompt, at the context before it, and its cost."""

    tokens: int
    """Prompt tokens in the piece (``x``)."""
    context_tokens: int
    """Prompt tokens of the same prompt computed by earlier steps (``L``)."""
    excess_s: float
    """What the step cost beyond a decode step, s."""


@dataclass(frozen=True, slots=True)
class WindowTotal:
    """One prompt's whole prefill: its tokens, its steps, the time they took beyond decoding."""

    pieces: tuple[int, ...]
    """Prompt tokens of each step that carried a piece of it, in order (sum: ``P``)."""
    excess_s: float
    """Their total excess, s."""

    @property
    def tokens(self) -> int:
        """Uncached prompt tokens (``P``)."""
        return sum(self.pieces)


@dataclass(frozen=True, slots=True)
class ContextFit:
    """The context term, kept or dropped, and why."""

    context_s: float
    """Seconds a prompt token costs more per token already in context (``context``); 0 dropped."""
    step_s: float
    """The fixed cost per prefill step to use with it."""
    inv_rate: float
    """Seconds per prompt token to use with it."""
    kept: bool
    """The term was kept (else ``step_s`` and ``inv_rate`` are the model's without it)."""
    fitted_s: float | None
    """The joint fit's value, kept or not (``None``: no fit was possible)."""
    stderr_s: float | None
    """Its standard error."""
    residual_rel: float | None
    """Relative RMS residual of the windows' totals with the term (``None``: not fitted)."""
    residual_without_rel: float
    """The same without it (the model it is compared with)."""
    note: str
    """Why it was kept or dropped, one sentence."""
    step_note: str = ""
    """Kept, what the joint fit said of a fixed cost per step beside it (its 95% interval,
    told from 0 or not)."""


def attended(tokens: int, before: int) -> int:
    """The context term's factor of a piece of ``tokens`` after ``before``: ``x (L + x)``."""
    return tokens * (before + tokens)


def piece_s(step_s: float, inv_rate: float, context_s: float, tokens: int, before: int) -> float:
    """What a piece of ``tokens`` after ``before`` tokens of the same prompt costs (s)."""
    return step_s + tokens * inv_rate + context_s * attended(tokens, before)


def attended_all(pieces: Sequence[int]) -> int:
    """The context term's factor of a whole prompt computed in ``pieces``, in order:
    ``sum_j x_j (L_j + x_j)``."""
    out, before = 0, 0
    for x in pieces:
        out += attended(x, before)
        before += x
    return out


def total_s(step_s: float, inv_rate: float, context_s: float, pieces: Sequence[int]) -> float:
    """A whole prompt computed in ``pieces`` (tokens of each step, in order), s."""
    return len(pieces) * step_s + sum(pieces) * inv_rate + context_s * attended_all(pieces)


def totals_residual(
    totals: list[WindowTotal], step_s: float, inv_rate: float, context_s: float
) -> float:
    """RMS of the windows' totals about the model, relative to their RMS: a long prompt
    weighs more than a short one (the fit is for long prompts; a short one's total is
    mostly jitter), unlike the mean of each window's relative error."""
    sq = sum((t.excess_s - total_s(step_s, inv_rate, context_s, t.pieces)) ** 2 for t in totals)
    norm = sum(t.excess_s**2 for t in totals)
    return math.sqrt(sq / norm) if norm > 0 else 0.0


def rate_on_totals(totals: list[WindowTotal], step_s: float, context_s: float) -> float:
    """Seconds per prompt token that fit the windows' totals best (least squares through the
    origin, as the rate without the term is fitted) beside ``step_s`` a piece and
    ``context_s``; 0 without totals."""
    rest = [
        (t.tokens, t.excess_s - len(t.pieces) * step_s - context_s * attended_all(t.pieces))
        for t in totals
    ]
    norm = sum(p * p for p, _ in rest)
    return sum(p * y for p, y in rest) / norm if norm > 0 else 0.0


def fit_context(
    points: list[StepPoint], totals: list[WindowTotal], step_s: float, inv_rate: float
) -> ContextFit:
    """Fit the context term beside the model ``(step_s, inv_rate)`` fitted without it."""
    without = totals_residual(totals, step_s, inv_rate, 0.0)
    seen = f"{len(points)} prefill steps of {len(totals)} prompts"

    def dropped(why: str, fitted: float | None = None, se: float | None = None) -> ContextFit:
        note = f"{seen}: {why}; taken as 0"
        return ContextFit(0.0, step_s, inv_rate, False, fitted, se, None, without, note)

    if len({p.context_tokens + p.tokens for p in points}) < 3:
        return dropped("fewer than 3 different context lengths, too few to tell a context term")
    solved = _joint(points)
    if solved is None:
        return dropped("too few, or too alike, steps to tell a context term from the rate")
    fitted, step_kept, step_note = solved
    c_s, c_se = fitted.beta[0], fitted.stderr[0]
    s_s = fitted.beta[1] if step_kept else 0.0
    inv_s = fitted.beta[-1]
    value = fitted.interval(0, 1e9, " us a token per 1,000 tokens of context")
    if inv_s <= 0:
        return dropped(f"the rate came out <= 0 beside a context term of {value}", c_s, c_se)
    if not fitted.above_zero(0):
        return dropped(f"the context term, {value}, is not told from 0", c_s, c_se)
    inv_s = rate_on_totals(totals, s_s, c_s)
    if inv_s <= 0:
        return dropped(
            f"the rate on the windows' totals came out <= 0 beside a context term of {value}",
            c_s,
            c_se,
        )
    longest = max(totals, key=lambda t: t.tokens)
    share = c_s * attended(longest.tokens, 0) / total_s(s_s, inv_s, c_s, [longest.tokens])
    if share < CONTEXT_MIN_SHARE:
        return dropped(
            f"the context term, {value}, adds {share:.1%} to the longest prompt's "
            f"({longest.tokens} tokens) prefill, below {CONTEXT_MIN_SHARE:.0%}",
            c_s,
            c_se,
        )
    with_term = totals_residual(totals, s_s, inv_s, c_s)
    note = (
        f"{seen}: the context term, {value} (+{share:.0%} on the longest prompt, "
        f"{longest.tokens} tokens), is told from 0, the rate set on the windows' totals beside "
        f"it (their residual {with_term:.1%}, {without:.1%} without it); kept"
    )
    return ContextFit(c_s, s_s, inv_s, True, c_s, c_se, with_term, without, note, step_note)


def _joint(points: list[StepPoint]) -> tuple[LeastSquares, bool, str] | None:
    """The fit ``(context, step cost, s per token)`` when the step cost's 95% interval lies
    above 0 beside the context term, else ``(context, s per token)``; whether the step cost
    was kept, and a sentence saying why; ``None`` when neither can be solved."""
    ys = [p.excess_s for p in points]
    cols = [float(attended(p.tokens, p.context_tokens)) for p in points]
    joint = least_squares(
        [[c, 1.0, float(p.tokens)] for c, p in zip(cols, points, strict=True)], ys
    )
    why = "too few steps to fit a fixed cost per step beside the context term"
    if joint is not None:
        step = joint.interval(1, 1e3, " ms")
        if joint.above_zero(1):
            return (
                joint,
                True,
                f"beside the context term, the fixed cost per step, {step}, is told from 0",
            )
        why = f"beside the context term, the fixed cost per step, {step}, is not told from 0"
    alone = least_squares([[c, float(p.tokens)] for c, p in zip(cols, points, strict=True)], ys)
    if alone is None:
        return None
    return alone, False, why

"""The context term of the cost model: a prompt piece costs more the more context it attends to.

Pure. On a CPU (and for long prompts on any engine) attention makes a prompt
token's cost grow with the tokens before it. A token at position ``t`` costs
``1 / rate + context x t``; a piece of ``x`` tokens after ``L`` already in the KV
cache then costs (summed over its tokens, continuous form)::

    piece_s = prefill_step + x / rate + context x (L x + x^2 / 2)

the ``a (2 L x + x^2)`` term of ROCm ATOM's step model with ``a = context / 2``.
Summed over the pieces of one prompt of ``P`` tokens the context term
telescopes to ``context x P^2 / 2`` whatever the split: a window's total excess is
``steps x prefill_step + P / rate + context x P^2 / 2``, and how the pieces were
counted does not matter to it.

Fitted by least squares on the prefill steps (each piece of a split prompt, at
the context the pieces before it left; an unsplit prompt's one step), jointly
with ``prefill_step`` and the rate. Kept only when all of these hold, else 0 and
the note says which failed:

- ``context`` is ``CONTEXT_SIGNIFICANCE`` standard errors above 0;
- it matters: over the longest prompt seen it adds at least
  ``CONTEXT_MIN_SHARE`` of that prompt's modelled prefill time;
- it explains the windows' telescoped totals better than the model without it
  (their RMS residual, relative to their RMS, is lower).

A fixed cost per prefill step comes back with it only when it is itself
``CONTEXT_SIGNIFICANCE`` standard errors above 0 in the joint fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from proxy.advisor.regression import least_squares

CONTEXT_SIGNIFICANCE = 2.0
"""The context term (and a step cost fitted with it) is kept only this many standard errors
above 0."""
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

    tokens: int
    """Uncached prompt tokens (``P``)."""
    steps: int
    """Steps that carried a piece of it."""
    excess_s: float
    """Their total excess, s."""


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


def piece_s(step_s: float, inv_rate: float, context_s: float, tokens: int, before: int) -> float:
    """What a piece of ``tokens`` after ``before`` tokens of the same prompt costs (s)."""
    return step_s + tokens * inv_rate + context_s * (before * tokens + tokens * tokens / 2)


def total_s(step_s: float, inv_rate: float, context_s: float, tokens: int, steps: int) -> float:
    """A whole prompt of ``tokens`` in ``steps`` pieces (the context term telescopes)."""
    return steps * step_s + tokens * inv_rate + context_s * tokens * tokens / 2


def totals_residual(
    totals: list[WindowTotal], step_s: float, inv_rate: float, context_s: float
) -> float:
    """RMS of the windows' totals about the model, relative to their RMS: a long prompt
    weighs more than a short one (the fit is for long prompts; a short one's total is
    mostly jitter), unlike the mean of each window's relative error."""
    sq = sum(
        (t.excess_s - total_s(step_s, inv_rate, context_s, t.tokens, t.steps)) ** 2 for t in totals
    )
    norm = sum(t.excess_s**2 for t in totals)
    return math.sqrt(sq / norm) if norm > 0 else 0.0


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
        return dropped("too alike to tell a context term from the rate")
    c_s, c_se, s_s, inv_s = solved
    value = f"{c_s * 1e9:.2f} +- {c_se * 1e9:.2f} us a token per 1,000 tokens of context"
    if inv_s <= 0:
        return dropped(f"the rate came out <= 0 beside a context term of {value}", c_s, c_se)
    if c_s <= 0 or c_s < CONTEXT_SIGNIFICANCE * c_se:
        why = f"not {CONTEXT_SIGNIFICANCE:g} standard errors above 0"
        return dropped(f"the context term, {value}, is {why}", c_s, c_se)
    longest = max(t.tokens for t in totals)
    share = c_s * longest * longest / 2 / total_s(s_s, inv_s, c_s, longest, 1)
    if share < CONTEXT_MIN_SHARE:
        return dropped(
            f"the context term, {value}, adds {share:.1%} to the longest prompt's ({longest} "
            f"tokens) prefill, below {CONTEXT_MIN_SHARE:.0%}",
            c_s,
            c_se,
        )
    with_term = totals_residual(totals, s_s, inv_s, c_s)
    if with_term >= without:
        return dropped(
            f"the context term, {value}, explains the windows' totals no better than none "
            f"(residual {with_term:.1%} against {without:.1%})",
            c_s,
            c_se,
        )
    note = (
        f"{seen}: the context term, {value} (+{share:.0%} on the longest prompt, {longest} "
        f"tokens), explains the windows' totals better than none (residual {with_term:.1%} "
        f"against {without:.1%}); kept"
    )
    return ContextFit(c_s, s_s, inv_s, True, c_s, c_se, with_term, without, note)


def _joint(points: list[StepPoint]) -> tuple[float, float, float, float] | None:
    """(context, its standard error, step cost, s per token): with a step cost when it is
    ``CONTEXT_SIGNIFICANCE`` standard errors above 0 beside the context term, else without."""

    def ctx(p: StepPoint) -> float:
        return p.context_tokens * p.tokens + p.tokens * p.tokens / 2

    ys = [p.excess_s for p in points]
    # Each column first in turn: ``least_squares`` gives the first one's standard error.
    joint = least_squares([[ctx(p), 1.0, float(p.tokens)] for p in points], ys)
    step = least_squares([[1.0, ctx(p), float(p.tokens)] for p in points], ys)
    if joint is not None and step is not None:
        (c_s, s_s, inv_s), c_se = joint
        if s_s > 0 and s_s >= CONTEXT_SIGNIFICANCE * step[1]:
            return c_s, c_se, s_s, inv_s
    alone = least_squares([[ctx(p), float(p.tokens)] for p in points], ys)
    if alone is None:
        return None
    (c_s, inv_s), c_se = alone
    return c_s, c_se, 0.0, inv_s

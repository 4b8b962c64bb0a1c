"""What a request costs beside its tokens: two request lengths, one line through them.

A target's CPU per request is ``R + T x n`` for a request of ``n`` tokens: ``R`` the
work of a request whatever its length (connection, head, parse, the end-of-request
fan-out), ``T`` the work of a token. Per token that is ``c(n) = R / n + T``; two
lengths measured in the same run give both: ``R = (c1 - c2) / (1/n1 - 1/n2)`` and
``T = c1 - R / n1``. Runs of more than two lengths are fitted by least squares on
``c`` against ``1 / n``. When max-rate ran with a request length in the same run, the
table also shows each target's requests/s on one core at the shortest such length. Every
cost cell of a target also gives its ratio to nginx's in the same run (the C reference:
ratios hold across machines where absolute figures do not). Pure: numbers in, Markdown out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from bench.run import MAX_RATE, BenchReport

_NA = "-"
REFERENCE = "nginx"
"""The target every other's costs are divided by, when it is in the run."""


@dataclass(frozen=True, slots=True)
class Fit:
    """One target's costs, fitted from its CPU per token at several request lengths."""

    name: str
    """The target."""
    per_token_us: dict[int, float]
    """Measured CPU µs per token, by tokens per request."""
    per_request_us: float
    """``R``: CPU µs a request costs beside its tokens (NaN: not fitted)."""
    token_us: float
    """``T``: CPU µs each token costs (NaN: not fitted)."""


def fit_line(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """``(R, T)`` from ``(tokens per request, CPU µs per token)`` points: least squares of
    ``c = R x (1 / n) + T``; NaN for both below two lengths or with a NaN point."""
    pts = [(1.0 / n, c) for n, c in points]
    if len({x for x, _ in pts}) < 2 or any(math.isnan(c) for _, c in pts):
        return math.nan, math.nan
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    sxx = sum((x - mx) ** 2 for x, _ in pts)
    sxy = sum((x - mx) * (y - my) for x, y in pts)
    r = sxy / sxx
    return r, my - r * mx


def fits(reports: Sequence[BenchReport]) -> list[Fit]:
    """Each target's fit over ``reports``: one scenario, each at another request length."""
    lengths = [r.options.max_tokens for r in reports]
    out: list[Fit] = []
    for row in reports[0].rows:
        per_token: dict[int, float] = {}
        for n, report in zip(lengths, reports, strict=True):
            same = [r for r in report.rows if r.name == row.name]
            per_token[n] = same[0].cpu_us_per_token if same else math.nan
        r, t = fit_line(sorted(per_token.items()))
        out.append(Fit(row.name, per_token, r, t))
    return out


def shortest_max_rate(reports: Sequence[BenchReport]) -> BenchReport | None:
    """The max-rate report of ``reports`` at the fewest tokens per request (None: no
    max-rate report with a request length)."""
    finite = [r for r in reports if r.options.scenario == MAX_RATE and r.options.max_tokens]
    return min(finite, key=lambda r: r.options.max_tokens, default=None)


def markdown(reports: Sequence[BenchReport], max_rate: BenchReport | None = None) -> str:
    """The two-point table of ``reports`` (one scenario at several lengths); empty below two.

    With ``max_rate`` (a max-rate report with a request length), a column of each target's
    requests/s there."""
    if len({r.options.max_tokens for r in reports}) < 2:
        return ""
    lengths = [r.options.max_tokens for r in reports]
    header = [
        "target",
        *(f"CPU µs/token at {n} tokens" for n in lengths),
        "µs per request",
        "µs per token",
    ]
    rate: dict[str, float] = {}
    if max_rate is not None:
        header.append(f"max-rate requests/s at {max_rate.options.max_tokens} tokens")
        rate = {row.name: row.requests_per_s for row in max_rate.rows}
    fitted = fits(reports)
    ref = next((f for f in fitted if f.name == REFERENCE), None)
    lines = [
        f"{reports[0].options.scenario}, fitted from {', '.join(map(str, lengths))} tokens per "
        "request in this run: CPU per request = µs per request + µs per token x tokens."
        + (f" In brackets: the ratio to {REFERENCE} in this run." if ref is not None else ""),
        "",
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
    ]
    for f in fitted:
        base = ref if ref is not None and f is not ref else None
        cells = [f.name]
        cells += [_vs(f.per_token_us[n], base.per_token_us[n] if base else None)
                  for n in lengths]  # fmt: skip
        cells += [_vs(f.per_request_us, base.per_request_us if base else None, ",.0f"),
                  _vs(f.token_us, base.token_us if base else None)]  # fmt: skip
        if max_rate is not None:
            cells.append(_num(rate.get(f.name, math.nan), ",.0f"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _vs(x: float, reference: float | None, fmt: str = ".1f") -> str:
    """``x`` formatted, with its ratio to ``reference`` in brackets (``117.2 (2.65x)``); no
    ratio without a reference, or when either is not a positive number."""
    if reference is None or math.isnan(x) or math.isnan(reference) or reference <= 0 or x <= 0:
        return _num(x, fmt)
    return f"{_num(x, fmt)} ({x / reference:.2f}x)"


def _num(x: float, fmt: str = ".1f") -> str:
    return _NA if math.isnan(x) else format(x, fmt)

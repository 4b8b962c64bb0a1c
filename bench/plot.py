"""The benchmark's side-by-side results as a picture, beside its table.

Two panels, one bar group per target: per-token transit (p50 and p99, ms;
receive minus the backend's send stamp) and the target process's CPU time per
token relayed (µs). matplotlib is optional (``pip install 'tokenstamp[pictures]'``):
without it ``write_plot`` raises ``PlotUnavailable``.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from bench.run import BenchReport

_COLORS = {"p50": "#9db4dd", "p99": "#2b3445", "cpu": "#e8590c", "muted": "#6b7482"}


class PlotUnavailable(RuntimeError):
    """matplotlib is not installed; the message says how to install it."""


def write_plot(report: BenchReport, path: Path, *, dpi: int = 120) -> Path:
    """Draw ``report`` as a PNG at ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise PlotUnavailable(
            "the benchmark plot needs matplotlib: pip install 'tokenstamp[pictures]'"
        ) from exc

    rows = report.rows
    names = [r.name for r in rows]
    xs = list(range(len(rows)))
    fig, (transit, cpu) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=dpi)
    width = 0.38
    p50 = [r.transit.p50_ms for r in rows]
    p99 = [r.transit.p99_ms for r in rows]
    bars50 = transit.bar([x - width / 2 for x in xs], p50, width, color=_COLORS["p50"], label="p50")
    bars99 = transit.bar([x + width / 2 for x in xs], p99, width, color=_COLORS["p99"], label="p99")
    transit.bar_label(bars50, fmt="%.2f", fontsize=8, padding=2)
    transit.bar_label(bars99, fmt="%.2f", fontsize=8, padding=2)
    transit.set_title("per-token transit (ms)", fontsize=10, loc="left")
    transit.legend(frameon=False, fontsize=8)

    measured = [(x, r) for x, r in zip(xs, rows, strict=True) if not math.isnan(r.cpu_us_per_token)]
    bars = cpu.bar(
        [x for x, _ in measured],
        [r.cpu_us_per_token for _, r in measured],
        0.55,
        color=_COLORS["cpu"],
    )
    cpu.bar_label(
        bars,
        labels=[
            f"{r.cpu_us_per_token:.1f}"
            + ("" if math.isnan(r.cpu_ratio) else f"\n({r.cpu_ratio:.2f}x)")
            for _, r in measured
        ],
        fontsize=8,
        padding=2,
    )
    for x, r in zip(xs, rows, strict=True):
        if math.isnan(r.cpu_us_per_token):
            cpu.text(x, 0, "the backend\nitself", ha="center", va="bottom", fontsize=8,
                     color=_COLORS["muted"])  # fmt: skip
    cpu.set_title("target CPU per token (µs; x pass-through)", fontsize=10, loc="left")

    for ax in (transit, cpu):
        ax.set_xlim(-0.6, len(rows) - 0.4)
        ax.set_xticks(xs)
        # Long names (passthrough-uvloop, tokenstamp-nostall) collide upright beyond 4 targets.
        slanted = len(names) > 4
        ax.set_xticklabels(names, fontsize=9, rotation=25 if slanted else 0,
                           ha="right" if slanted else "center")  # fmt: skip
        ax.margins(y=0.22)
        ax.tick_params(axis="y", labelsize=8, colors=_COLORS["muted"])
        ax.grid(axis="y", color="#edf0f4")
        ax.set_axisbelow(True)
        for side in ("top", "right"):
            ax.spines[side].set_visible(False)
    o = report.options
    fig.suptitle(
        f"tokenstamp bench: {o.streams} streams x {o.rate_per_s:g} tokens/s, "
        f"{o.rounds} round(s) of {o.window_s:.1f} s per target, medians over rounds, "
        f"{os.cpu_count()} CPU(s)",
        x=0.01,
        ha="left",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def plot_path(explicit: Path | None, *beside: Path | None) -> Path | None:
    """Where the plot goes: ``explicit``, else beside the first given table file (``.png``)."""
    if explicit is not None:
        return explicit
    for other in beside:
        if other is not None:
            return other.with_suffix(".png")
    return None

"""The benchmark's results as a Markdown table (terminal, README) and as JSON.

Columns: target; tokens received in all measured windows; per-token transit
p50 / p99 (receive minus the backend's send stamp, ms); the same minus the
direct run's (what the hop adds); the target process's CPU time per token
relayed (µs, user + system); that CPU per token over the bare pass-through's.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict
from typing import Any

from bench.run import BenchReport, TargetRow
from bench.targets import DIRECT

_NA = "-"


def _ms(x: float, signed: bool = False) -> str:
    if math.isnan(x):
        return _NA
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def _pair(a: float, b: float, signed: bool = False) -> str:
    if math.isnan(a) and math.isnan(b):
        return _NA
    return f"{_ms(a, signed)} / {_ms(b, signed)}"


def _row(r: TargetRow) -> str:
    cpu = _NA if math.isnan(r.cpu_us_per_token) else f"{r.cpu_us_per_token:.1f}"
    ratio = _NA if math.isnan(r.cpu_ratio) else f"{r.cpu_ratio:.2f}x"
    cells = (
        r.name,
        f"{r.tokens:,}",
        _pair(r.transit.p50_ms, r.transit.p99_ms),
        _pair(r.extra_p50_ms, r.extra_p99_ms, signed=True),
        cpu,
        ratio,
    )
    return "| " + " | ".join(cells) + " |"


def markdown(report: BenchReport) -> str:
    """The table with a line saying what was run, and notes under it."""
    o = report.options
    lines = [
        f"{o.streams} streams x {o.rate_per_s:g} tokens/s, {o.max_tokens} tokens per request; "
        f"{o.rounds} round(s) of {o.window_s:.1f} s per target, order rotating; "
        f"medians over rounds; {os.cpu_count()} CPU(s).",
        "",
        "| target | tokens | transit p50 / p99 (ms) | extra transit vs direct p50 / p99 (ms) "
        "| CPU µs/token | CPU vs pass-through |",
        "|---|---:|---:|---:|---:|---:|",
        *(_row(r) for r in report.rows),
        "",
    ]
    notes: list[str] = []
    differing = [r.name for r in report.rows if not r.identical]
    reference = DIRECT if any(r.name == DIRECT for r in report.rows) else report.rows[0].name
    if differing:
        notes.append(f"Bodies NOT byte-identical to {reference}'s: {', '.join(differing)}.")
    else:
        notes.append("Bodies byte-identical through every target (send stamps masked).")
    errors = sum(r.errors for r in report.rows)
    if errors:
        notes.append(f"{errors} request(s) failed; see the JSON report.")
    helpers = [r for r in report.rows if not math.isnan(r.loadgen_us_per_token)]
    if helpers:
        lg = max(r.loadgen_us_per_token for r in helpers)
        be = max(r.backend_us_per_token for r in helpers)
        notes.append(
            f"Load generator {lg:.1f} µs/token, backend {be:.1f} µs/token (worst target run); "
            f"run took {report.elapsed_s:.0f} s."
        )
    lines.extend(notes)
    return "\n".join(lines) + "\n"


def _clean(obj: Any) -> Any:
    """NaN (no value) becomes ``null`` so the JSON is strict."""
    if isinstance(obj, float):
        return None if math.isnan(obj) else obj
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_clean(v) for v in obj]
    return obj


def to_json(report: BenchReport) -> dict[str, Any]:
    """The whole report as strict-JSON-ready data (NaN as ``null``)."""
    o = report.options
    data: dict[str, Any] = _clean(
        {
            "options": {
                "targets": [
                    {"name": t.name, "argv": list(t.argv), "env": dict(t.env)} for t in o.targets
                ],
                "streams": o.streams,
                "rate_per_s": o.rate_per_s,
                "duration_s": o.duration_s,
                "rounds": o.rounds,
                "window_s": o.window_s,
                "max_tokens": o.max_tokens,
                "warmup_s": o.warmup_s,
                "cpu_count": os.cpu_count(),
            },
            "targets": [asdict(r) for r in report.rows],
            "rounds": [
                {
                    "target": r.target,
                    "round": r.round,
                    "cpu_us_per_token": r.cpu_us_per_token,
                    "backend_us_per_token": r.backend_us_per_token,
                    "loadgen_us_per_token": r.loadgen_us_per_token,
                    **r.load.to_dict(),
                }
                for r in report.rounds
            ],
            "elapsed_s": report.elapsed_s,
        }
    )
    return data

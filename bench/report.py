"""The benchmark's results as a Markdown table (terminal, docs/benchmark.md) and as JSON.

Columns (steady): target; tokens received in all measured windows; per-token
transit p50 / p99 (receive minus the backend's send stamp, ms); the same minus
the direct run's (what the hop adds); the target process's CPU time per token
relayed (µs, user + system); that CPU per token over the bare pass-through's;
with the memory figure, RSS per open stream (KiB).

Lockstep adds the transit of each step's last-delivered token (p50 / p99) and
its extra over direct. Max-rate shows tokens/s, the CPU cores the target and
the load used (1.00 is one core saturated), CPU per token, and which side
bounded the rate; with a request length also requests/s and CPU per request.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict
from typing import Any

from bench.run import LOCKSTEP, MAX_RATE, BenchReport, TargetRow
from bench.targets import DIRECT

SATURATED_CORES = 0.9
"""CPU use (cores) from which a max-rate side counts as saturated."""

_NA = "-"


def _ms(x: float, signed: bool = False) -> str:
    if math.isnan(x):
        return _NA
    return f"{x:+.2f}" if signed else f"{x:.2f}"


def _pair(a: float, b: float, signed: bool = False) -> str:
    if math.isnan(a) and math.isnan(b):
        return _NA
    return f"{_ms(a, signed)} / {_ms(b, signed)}"


def _f(x: float, fmt: str) -> str:
    return _NA if math.isnan(x) else format(x, fmt)


def bound(r: TargetRow) -> str:
    """Which side limited a max-rate figure: ``target``, ``load``, or ``neither`` (shared cores)."""
    if r.target_cpu_cores >= SATURATED_CORES:
        return "target"
    if r.load_cpu_cores >= SATURATED_CORES:
        return "load"
    return "neither"


def _cells(report: BenchReport, r: TargetRow, memory: bool) -> list[str]:
    scenario = report.options.scenario
    cpu, ratio = _f(r.cpu_us_per_token, ".1f"), _f(r.cpu_ratio, ".2f")
    ratio = ratio if ratio == _NA else ratio + "x"
    if scenario == MAX_RATE:
        per_request = [_f(r.requests_per_s, ",.0f")] if report.options.max_tokens else []
        cells = [r.name, *per_request, _f(r.tokens_per_s, ",.0f"), _f(r.target_cpu_cores, ".2f"),
                 _f(r.load_cpu_cores, ".2f")]  # fmt: skip
        if report.options.max_tokens:
            cells.append(_f(r.cpu_us_per_request, ",.0f"))
        return [*cells, cpu, ratio, bound(r)]
    cells = [
        r.name,
        f"{r.tokens:,}",
        _pair(r.transit.p50_ms, r.transit.p99_ms),
        _pair(r.extra_p50_ms, r.extra_p99_ms, signed=True),
    ]
    if scenario == LOCKSTEP:
        cells += [_pair(r.last.p50_ms, r.last.p99_ms),
                  _pair(r.extra_last_p50_ms, r.extra_last_p99_ms, signed=True)]  # fmt: skip
    cells += [cpu, ratio]
    if memory:
        cells.append(_f(r.memory_kib_per_stream, ".1f"))
    return cells


def _header(report: BenchReport, memory: bool) -> list[str]:
    if report.options.scenario == MAX_RATE:
        if not report.options.max_tokens:
            return ["target", "tokens/s", "target CPU (cores)", "load CPU (cores)",
                    "CPU µs/token", "CPU vs pass-through", "bound"]  # fmt: skip
        return ["target", "requests/s", "tokens/s", "target CPU (cores)", "load CPU (cores)",
                "CPU µs/request", "CPU µs/token", "CPU vs pass-through", "bound"]  # fmt: skip
    cols = ["target", "tokens", "transit p50 / p99 (ms)", "extra transit vs direct p50 / p99 (ms)"]
    if report.options.scenario == LOCKSTEP:
        cols += ["last of step p50 / p99 (ms)", "extra last vs direct p50 / p99 (ms)"]
    cols += ["CPU µs/token", "CPU vs pass-through"]
    if memory:
        cols.append(f"KiB per open stream ({report.options.memory_streams:,})")
    return cols


def _load_line(report: BenchReport) -> str:
    o = report.options
    common = (f"{o.rounds} round(s) of {o.window_s:.1f} s per target, order rotating; "
              f"medians over rounds; {os.cpu_count()} CPU(s).")  # fmt: skip
    if o.scenario == MAX_RATE and not o.max_tokens:
        return (
            f"max-rate: {o.streams} closed-loop endless streams, one token in flight per stream "
            f"(one token per read), target pinned to one core, load on another; {common}"
        )
    if o.scenario == MAX_RATE:
        return (
            f"max-rate: {o.streams} closed-loop streams, one token in flight per stream "
            f"(one token per read), {o.max_tokens} tokens per request and the next request at "
            f"once, target pinned to one core, load on another; {common}"
        )
    if o.scenario == LOCKSTEP:
        return (
            f"lockstep: {o.streams} streams, {o.step_rate_per_s:g} steps/s, every open "
            f"stream's token written in each step; {o.max_tokens} tokens per request; "
            f"{common}"
        )
    burst = f", {o.tokens_per_write} tokens per write" if o.tokens_per_write > 1 else ""
    return (
        f"steady: {o.streams} streams x {o.rate_per_s:g} tokens/s{burst}, {o.max_tokens} tokens "
        f"per request; {common}"
    )


def markdown(report: BenchReport) -> str:
    """The table with a line saying what was run, and notes under it."""
    memory = bool(report.memory)
    header = _header(report, memory)
    lines = [
        _load_line(report),
        "",
        "| " + " | ".join(header) + " |",
        "|---|" + "---:|" * (len(header) - 1),
        *("| " + " | ".join(_cells(report, r, memory)) + " |" for r in report.rows),
        "",
    ]
    notes: list[str] = []
    differing = [r.name for r in report.rows if not r.identical]
    reference = DIRECT if any(r.name == DIRECT for r in report.rows) else report.rows[0].name
    if report.options.scenario == MAX_RATE and not report.options.max_tokens:
        notes.append(
            "Bodies not compared in endless max-rate (the steady and lockstep runs compare "
            "them). bound: the side whose CPU was saturated; neither: the cores were shared."
        )
    elif report.options.scenario == MAX_RATE and not differing:
        notes.append(
            "Every ended body byte-identical to the backend's, through every target. bound: "
            "the side whose CPU was saturated; neither: the cores were shared."
        )
    elif differing:
        notes.append(f"Bodies NOT byte-identical to {reference}'s: {', '.join(differing)}.")
    else:
        notes.append("Bodies byte-identical through every target (send stamps masked).")
    notes.extend(f"Skipped {name}: {why}." for name, why in report.skipped)
    for name, m in report.memory:
        if m.streams_open < report.options.memory_streams:
            notes.append(f"Memory of {name}: only {m.streams_open} streams opened.")
    errors = sum(r.errors for r in report.rows)
    if errors:
        notes.append(f"{errors} request(s) failed; see the JSON report.")
    helpers = [r for r in report.rows if not math.isnan(r.loadgen_us_per_token)]
    if helpers and report.options.scenario != MAX_RATE:
        lg = max(r.loadgen_us_per_token for r in helpers)
        be = max(r.backend_us_per_token for r in helpers)
        notes.append(
            f"Load generator {lg:.1f} µs/token, backend {be:.1f} µs/token (worst target run); "
            f"run took {report.elapsed_s:.0f} s."
        )
    else:
        notes.append(f"Run took {report.elapsed_s:.0f} s.")
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
                "scenario": o.scenario,
                "step_rate_per_s": o.step_rate_per_s,
                "memory_streams": o.memory_streams,
                "tokens_per_write": o.tokens_per_write,
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
            "skipped": [{"name": n, "reason": why} for n, why in report.skipped],
            "memory": [{"target": n, **asdict(m)} for n, m in report.memory],
            "elapsed_s": report.elapsed_s,
        }
    )
    return data

"""The seed's claim for each technique, judged on what the proxy measured, and the table.

Pure: takes the rows :mod:`demo.techniques` measured (a dict per run) and
returns them with ``claim``, ``held`` and ``evidence``, in the table's order.
Each claim names the numbers the seed says the technique moves; a row holds
when the proxy's numbers moved that way, within tolerances that say where they
come from:

- ``DECODE_TOLERANCE`` (5%): "unchanged" for a decode step of ~25 ms. The
  median over 40 streams of each stream's median gap moves by the timers'
  overshoot (about a millisecond), far less than that.
- one decode step (the baseline's median gap): "within a step" for a first
  token, which depends on where in a running step a prompt arrives; plus
  ``DELIVERY_S`` for the request's trip through the proxy and the stamps.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

ORDER = (
    "baseline",
    "prefix_reuse",
    "speculative",
    "kv_budget",
    "static_batching",
    "disaggregated",
)
"""The table's rows."""
DECODE_TOLERANCE = 0.05
"""A decode step "unchanged": within 5% of the baseline's."""
DELIVERY_S = 0.008
"""Writing, reading and stamping a step's tokens, or a request's trip through the proxy (s)."""
PREFIX_TTFT_CUT = 10.0
"""Prefix reuse cuts TTFT by orders of magnitude: at least 10x at the median."""
STREAMS = 40
"""Streams decoding in the workload (:mod:`demo.techniques`)."""
PROMPTS = 3
"""Long prompts arriving in it."""
KV_TOKENS_GAIN = 1.1
"""More sequences at once, more tokens/s: 40 against 32 sequences is 1.22x; 1.1x at least."""

Row = dict[str, Any]
Verdict = tuple[str, bool, str]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms"


def _baseline(row: Row, base: Row, rows: Mapping[str, Row]) -> Verdict:
    step = base["decode_step_s"]
    # Every prompt stalls every stream once (a stream may just have ended: 90%).
    held = row["prefill_stalls"] >= 0.9 * STREAMS * PROMPTS and row["worst_gap_s"] >= 3 * step
    return (
        "one long prompt's prefill freezes every decoding stream (the stutter the other rows "
        "are read against)",
        held,
        f"{row['prefill_stalls']} prefill stalls ({PROMPTS} prompts x {STREAMS} streams), "
        f"worst gap {_ms(row['worst_gap_s'])} = {row['worst_gap_s'] / step:.0f} decode steps "
        f"of {_ms(step)}",
    )


def _unchanged(value: float, reference: float) -> bool:
    return abs(value - reference) <= DECODE_TOLERANCE * reference


def _prefix(row: Row, base: Row, rows: Mapping[str, Row]) -> Verdict:
    cut = base["ttft_p50_s"] / row["ttft_p50_s"]
    held = cut >= PREFIX_TTFT_CUT and _unchanged(row["decode_step_s"], base["decode_step_s"])
    return (
        "reusing a shared prefix removes prefill work outright: TTFT p50 down >= 10x, "
        "decode step unchanged (5%)",
        held,
        f"TTFT p50 {cut:.0f}x lower; decode step {_ms(row['decode_step_s'])} vs "
        f"{_ms(base['decode_step_s'])}; the first prompt with the prefix still pays in full "
        f"(p99 {_ms(row['ttft_p99_s'])})",
    )


def _speculative(row: Row, base: Row, rows: Mapping[str, Row]) -> Verdict:
    step = base["decode_step_s"]
    ttft_moved = row["ttft_p50_s"] - base["ttft_p50_s"]
    held = (
        row["tpot_s"] < base["tpot_s"]
        and row["tokens_per_event"] > 1
        and abs(ttft_moved) <= step + DELIVERY_S
    )
    return (
        "drafting tokens and checking them in one pass attacks decode: TPOT down, more than "
        "one token per event, TTFT unchanged within a step",
        held,
        f"TPOT {_ms(row['tpot_s'])} vs {_ms(base['tpot_s'])}, "
        f"{row['tokens_per_event']:.2f} tokens per event, each step {_ms(row['decode_step_s'])} "
        f"vs {_ms(step)}; TTFT p50 {ttft_moved * 1000:+,.0f} ms",
    )


def _kv(row: Row, base: Row, rows: Mapping[str, Row]) -> Verdict:
    ref = rows["kv_budget_full"]
    gain = row["tokens_per_s"] / ref["tokens_per_s"]
    return (
        "a smaller attention cache per sequence fits more sequences, so more tokens come out "
        "per weight read: 2,048 tokens each fit 64 sequences in 128K, 4,096 fit 32; tokens/s up",
        gain >= KV_TOKENS_GAIN,
        f"{row['tokens_per_s']:,.0f} tokens/s vs {ref['tokens_per_s']:,.0f} with the full-size "
        f"cache ({gain:.2f}x), where 8 streams and the prompts queue for a cache "
        f"(TTFT p50 {_ms(ref['ttft_p50_s'])})",
    )


def _static(row: Row, base: Row, rows: Mapping[str, Row]) -> Verdict:
    held = row["ttft_p50_s"] >= 2 * base["ttft_p50_s"] and _unchanged(
        row["decode_step_s"], base["decode_step_s"]
    )
    return (
        "continuous admission never leaves a slot idle; static batching makes a new request "
        "wait for the running batch: TTFT up, decode step unchanged (5%)",
        held,
        f"TTFT p50 {row['ttft_p50_s'] / base['ttft_p50_s']:.1f}x the baseline's; decode step "
        f"{_ms(row['decode_step_s'])} vs {_ms(base['decode_step_s'])}",
    )


def _disaggregated(row: Row, base: Row, rows: Mapping[str, Row]) -> Verdict:
    step = base["decode_step_s"]
    transfer_s = row["engine"]["transfer_s"]
    ttft_up = row["ttft_p50_s"] - base["ttft_p50_s"]
    held = (
        row["prefill_stalls"] == 0
        and row["worst_gap_s"] <= step + step
        and abs(ttft_up - transfer_s) <= step + DELIVERY_S
    )
    return (
        "prefill on its own pool ends the stutter: no prefill-induced stall, worst gap within "
        "one decode step of the baseline's, TTFT up by the KV transfer (within a step)",
        held,
        f"{row['prefill_stalls']} prefill stalls, worst gap {_ms(row['worst_gap_s'])} vs a "
        f"{_ms(step)} step; TTFT p50 {ttft_up * 1000:+,.0f} ms for a "
        f"{_ms(transfer_s)} transfer",
    )


_JUDGES: dict[str, Callable[[Row, Row, Mapping[str, Row]], Verdict]] = {
    "baseline": _baseline,
    "prefix_reuse": _prefix,
    "speculative": _speculative,
    "kv_budget": _kv,
    "static_batching": _static,
    "disaggregated": _disaggregated,
}


def judge(rows: Mapping[str, Row]) -> list[Row]:
    """The table's rows with their claim, whether it held and the numbers that say so."""
    base = rows["baseline"]
    out = []
    for name in ORDER:
        claim, held, evidence = _JUDGES[name](rows[name], base, rows)
        row = {**rows[name], "claim": claim, "held": bool(held), "evidence": evidence}
        if name == "kv_budget":
            row["reference"] = rows["kv_budget_full"]
        out.append(row)
    return out


_COLUMNS = (
    ("TTFT p50", "ttft_p50_s", 9),
    ("TTFT p99", "ttft_p99_s", 9),
    ("TPOT", "tpot_s", 8),
    ("worst gap", "worst_gap_s", 10),
    ("tokens/s", "tokens_per_s", 9),
    ("tok/event", "tokens_per_event", 10),
    ("stalls", "prefill_stalls", 7),
    ("stutter", "stutter_cost_s", 9),
)


def _cell(key: str, value: float, width: int) -> str:
    if key == "tokens_per_s":
        text = f"{value:,.0f}"
    elif key == "tokens_per_event":
        text = f"{value:.2f}"
    elif key == "prefill_stalls":
        text = f"{value:d}"
    elif key == "stutter_cost_s":
        text = f"{value:.1f} s"
    elif key == "tpot_s":
        text = f"{value * 1000:.1f} ms"
    else:
        text = _ms(value)
    return text.rjust(width)


def _line(label: str, row: Row, held: str) -> str:
    cells = "".join(_cell(key, row[key], width) for _, key, width in _COLUMNS)
    return f"{label:18}{cells}{held:>6}"


def render_techniques(results: Mapping[str, Any]) -> str:
    """The human-readable table and the claims under it."""
    w = results["workload"]
    lines = [
        f"Which technique targets which: {w['streams']} streams decoding, "
        f"{w['long_prompts']} prompts of {w['long_prompt_tokens']:,} tokens arriving "
        f"{w['long_spacing_s']:g} s apart",
        f"that share a {w['shared_prefix_tokens']:,}-token prefix; measured by the proxy "
        "(TTFT of the prompts, the rest of the 40 streams)",
        f"{'':18}" + "".join(title.rjust(width) for title, _, width in _COLUMNS) + "  held",
    ]
    for row in results["techniques"]:
        lines.append(_line(row["name"], row, "yes" if row["held"] else "NO"))
        if row["name"] == "kv_budget":
            lines.append(_line("  full-size cache", row["reference"], ""))
    lines.append("The seed's claim for each, and what the proxy measured:")
    for row in results["techniques"]:
        verdict = "held" if row["held"] else "did NOT hold"
        lines.append(f"  {row['name']}: {row['claim']}")
        lines.append(f"    {verdict}: {row['evidence']}")
    lines.append(
        "tokens/s: all streams' output in the steady 0.6 s before the first prompt (decode "
        "throughput); worst gap: median over the streams of their largest gap while the "
        "prompts were served; stalls: prefill-induced; stutter: user-seconds of frozen output."
    )
    return "\n".join(lines)

"""The human-readable report of ``tokenstamp demo``: the seed's tables, model, engine, proxy,
and a reasoning model's (:func:`render_reasoning`).

Pure: formats the results dictionary :mod:`demo.cli` builds (and prints as
JSON with ``--json``) and nothing else.
"""

from __future__ import annotations

import textwrap
from typing import Any


def _detected_line(r: dict[str, Any]) -> str:
    d = r["detected"]
    name = "unchunked" if r["chunk_size"] is None else f"chunked at {r['chunk_size']}"
    if not d["culprits"] and not sum(d["stalls_by_cause"].values()):
        steady = r["measured"]["steady_gap_s"]
        return (
            f"  {name}: no stall (worst gap {_ms(r['measured']['worst_gap_s'])} stays "
            f"under 3 x the {_ms(steady)} baseline)"
        )
    parts = []
    for c in d["culprits"]:
        n = c["prompt_tokens"]
        tokens = f" ({n:,} prompt tokens)" if n else ""
        parts.append(
            f"  {name}: culprit {c['request_id']}{tokens} stalled {c['stalled_streams']} "
            f"streams, {c['stalls']} stalls of ~{_ms(d['median_stall_s'] or 0)}, "
            f"stutter cost {c['stutter_cost_s']:.1f} user-seconds"
        )
    un = d["stalls_by_cause"]["unattributed"]
    if un:
        parts.append(f"  {name}: {un} unattributed stalls")
    return "\n".join(parts)


def _sources(u: dict[str, Any], c: dict[str, Any]) -> list[str]:
    """Model vs engine (ground truth) vs proxy, and the CPU waits that stretch delivery."""

    def ms(seconds: float | None) -> str:
        return "?" if seconds is None else f"{seconds * 1000:,.0f}"

    def figures(r: dict[str, Any]) -> dict[str, str]:
        model, engine, proxy = r["model"], r["engine"], r["measured"]
        wait = proxy["cpu_wait"]
        return {
            "model_gap": ms(model["worst_gap_s"]),
            "engine_gap": ms(engine["worst_gap_s"]),
            "proxy_gap": ms(proxy["worst_gap_s"]),
            "model_ttft": f"{ms(model['ttft_min_s'])}-{ms(model['ttft_max_s'])}",
            "engine_ttft": ms(engine["ttft_s"]),
            "proxy_ttft": ms(proxy["ttft_s"]),
            "proxy_wait": ms(wait["proxy_s"]),
            "sim_wait": ms(wait["backend_s"]),
            "client_wait": ms(wait["client_s"]),
            "interval": f"{wait['interval_s']:.2f}",
        }

    fu, fc = figures(u), figures(c)

    def p(key: str) -> str:
        return f"{fu[key]} / {fc[key]}"

    return [
        "Model, engine (the simulator's own record, same clock) and proxy; unchunked / chunked:",
        f"  worst gap         model {p('model_gap')} ms, engine {p('engine_gap')} ms, "
        f"proxy {p('proxy_gap')} ms",
        f"  first token       model {p('model_ttft')} ms, engine {p('engine_ttft')} ms, "
        f"proxy {p('proxy_ttft')} ms",
        f"  waited for a CPU  proxy {p('proxy_wait')} ms, simulator {p('sim_wait')} ms, "
        f"stream client {p('client_wait')} ms (over {p('interval')} s)",
        "  The engine keeps to the model within a timer's overshoot (more if it waits for a CPU);",
        "  its first token counts from the prompt's arrival at the engine. The proxy adds",
        f"  delivery: the simulator writing and the proxy reading {u['streams'] + 1} streams' "
        "tokens, the",
        "  request's trip through the proxy; longer when the processes wait for a CPU.",
    ]


def _ms(s: float) -> str:
    return f"{s * 1000:,.0f} ms"


def _rate(r: float) -> str:
    return f"{r:.0f}/s"


def render(results: dict[str, Any]) -> str:
    """The human-readable report."""
    lines: list[str] = []
    u, c = results["unchunked"], results["chunked"]
    lines.append(
        f"Forty streams decoding, one {u['prompt_tokens']:,}-token prompt arrives "
        "(measured by the proxy; seed / cost model / measured)"
    )
    head = f"{'':34}{'unchunked':^30}{'chunked at 512':^30}"
    lines.append(head)
    lines.append(f"{'':34}" + f"{'seed':>9}{'model':>10}{'measured':>11}" * 2)
    rows = [
        ("worst gap in an existing stream", "worst_gap_s", _ms),
        ("token rate during the prefill", "token_rate_per_s", _rate),
        ("new request's first token", "ttft_s", _ms),
    ]
    for title, key, fmt in rows:
        cells = ""
        for r in (u, c):
            cells += (
                f"{fmt(r['seed'][key]):>9}{fmt(r['model'][key]):>10}{fmt(r['measured'][key]):>11}"
            )
        lines.append(f"{title:34}{cells}")
    ratio = u["measured"]["worst_gap_s"] / c["measured"]["worst_gap_s"]
    lines.append(
        f"stall cut {ratio:.1f}x by chunking (seed: 3.3x); the new request waits "
        f"{c['measured']['ttft_s'] / u['measured']['ttft_s']:.1f}x longer (seed: 2.4x)"
    )
    why = (
        "Why model and seed differ: the seed counts the prefill alone (143 ms) and zero tokens "
        "meanwhile; in the model the step that carries the prefill also decodes the 40 streams "
        f"(+{_ms(u['model']['steady_gap_s'])}, one token each), and the new request first waits "
        f"for the running step to end (0 to {_ms(u['model']['steady_gap_s'])}, half on average)."
    )
    lines.extend(textwrap.wrap(why, width=96))
    lines.extend(_sources(u, c))
    lines.append("Detected by the proxy (stall = gap > max(3 x baseline, 50 ms)):")
    lines.append(_detected_line(u))
    lines.append(_detected_line(c))
    s = results["single"]
    m = s["measured"]
    decode_s = m["e2e_s"] - m["ttft_s"]
    lines.append("")
    lines.append(
        f"One {m['output_tokens']}-token answer alone ({s['prompt_tokens']:,}-token prompt; "
        "seed / measured)"
    )
    lines.append(
        f"  time to first token              {_ms(s['seed']['ttft_s']):>10} {_ms(m['ttft_s']):>10}"
    )
    n_more = m["output_tokens"] - 1
    lines.append(
        f"  {n_more} further tokens at {m['tpot_s'] * 1000:.1f} ms    "
        f"{_ms(479 * 0.022):>10} {_ms(decode_s):>10}"
    )
    lines.append(
        f"  end to end                       {s['seed']['e2e_s']:>8.1f} s {m['e2e_s']:>8.1f} s"
    )
    share = decode_s / m["e2e_s"]
    half = m["ttft_s"] / 2
    shave = 0.002 * n_more
    lines.append(f"  decode is {share:.1%} of the total (seed: 97.1%)")
    lines.append(
        f"  halving time to first token saves {_ms(half)} = {half / m['e2e_s']:.1%} "
        "(seed: 160 ms, 1.5%)"
    )
    lines.append(
        f"  shaving 2 ms off per-token time saves {_ms(shave)} = "
        f"{shave / m['e2e_s']:.1%} (seed: 958 ms, 8.8%)"
    )
    return "\n".join(lines)


def _cell(value: float | int | None, tokens: bool = False) -> str:
    if value is None:
        return "–"
    return f"{value:,}" if tokens else _ms(float(value))


def render_reasoning(r: dict[str, Any]) -> str:
    """The reasoning model's table: per request, the proxy's figures beside the engine's."""
    lines = [
        f"A reasoning model thinks before it answers ({r['prompt_tokens']:,}-token prompts, "
        f"{r['answer_tokens']}-token answers, `{r['reasoning_field']}` deltas; proxy / engine)",
        f"{'':30}{'first token':^20}{'first answer token':^20}{'reasoning':^20}"
        f"{'reasoning tokens':^18}",
        f"{'':30}" + f"{'proxy':>10}{'engine':>10}" * 3 + f"{'proxy':>9}{'engine':>9}",
    ]
    for q in r["requests"]:
        p, e = q["proxy"], q["engine"]
        cells = "".join(
            f"{_cell(p[key]):>10}{_cell(e[key]):>10}"
            for key in ("ttft_s", "answer_ttft_s", "reasoning_s")
        )
        # The engine records 0 for a request that did not reason; the proxy has no count.
        tokens = (_cell(p["reasoning_tokens"], True), _cell(e["reasoning_tokens"] or None, True))
        cells += f"{tokens[0]:>9}{tokens[1]:>9}"
        lines.append(f"{q['label']:30}{cells}")
    waits = [
        (q["proxy"]["ttft_s"], q["proxy"]["answer_ttft_s"])
        for q in r["requests"]
        if q["proxy"]["ttft_s"] is not None and q["proxy"]["answer_ttft_s"] is not None
    ]
    if waits:
        ttft = sum(t for t, _ in waits) / len(waits)
        answer = sum(a for _, a in waits) / len(waits)
        note = (
            "TTFT is the first output event, reasoning or not: the prefill. A user of a reasoning "
            f"model waits for the first answer token: here {_ms(answer)} on average against a "
            f"TTFT of {_ms(ttft)} ({answer / ttft:.0f}x). The engine counts from the request's "
            "arrival at the engine, the proxy from its own: the difference is delivery."
        )
        lines.extend(textwrap.wrap(note, width=108))
    return "\n".join(lines)

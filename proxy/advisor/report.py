"""The advice of one backend as the JSON contract of ``GET /advice`` and as the printed table.

Pure. ``advise`` puts the fit, the scenario (given, or the deployment's own p95
uncached prompt and typical number of decoding streams), the table, the
recommendation, the capacity and the prefill pool into one JSON-ready dict;
where something needed is missing it says what, and gives no number.
``render`` prints the same dict in the demo's style.

It also says which engine was fitted (``engine``: the backend's label, the model its
responses name, and what the upstream answered the advisor's one probe) and the range
the fit saw (``fit.range``: prompt sizes, decoding streams, prompt tokens per step);
a table row outside that range lists why in its ``extrapolation`` (empty: within it),
and the printed table marks its chunk size with ``*``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.advisor.fit import Fit
from proxy.advisor.observations import ObservationSnapshot
from proxy.advisor.predict import (
    DEFAULT_CHUNK_SIZES,
    Row,
    capacity,
    pieces,
    prefill_pool,
    recommend,
    table,
)
from proxy.core.records import Backend

LOAD_WINDOW_NS = 60_000_000_000
"""The prefill load is measured over the last minute of finished requests."""

NOT_ENOUGH_DATA = "not enough data"
"""``status`` of a backend that cannot be advised yet."""


@dataclass(frozen=True, slots=True)
class AdviceOptions:
    """What the user asks about; ``None`` means "the deployment's own"."""

    tpot_target_s: float
    """TPOT target (``--slo-tpot``): capacity, and the ITL target unless given."""
    prompt_tokens: int | None = None
    """New prompt's uncached tokens (default: p95 of recent requests)."""
    streams: int | None = None
    """Decoding streams (default: the typical number while decoding)."""
    chunk_sizes: tuple[int | None, ...] = DEFAULT_CHUNK_SIZES
    """Candidates (``None``: unchunked)."""
    itl_target_s: float | None = None
    """Worst gap allowed (default: the TPOT target)."""
    kv_transfer_s: float = 0.0
    """KV-cache transfer time of a separate prefill pool."""


def p95_prompt_tokens(snapshot: ObservationSnapshot) -> int | None:
    """95th percentile of recent requests' uncached prompt tokens (nearest rank)."""
    sizes = sorted(tokens for _, tokens in snapshot.recent_prompts if tokens > 0)
    if not sizes:
        return None
    return sizes[min(len(sizes) - 1, math.ceil(0.95 * len(sizes)) - 1)]


def typical_streams(snapshot: ObservationSnapshot) -> int | None:
    """Median number of decoding streams over decode steps (each gap weighs 1 / streams)."""
    counts = sorted(n for n in snapshot.stream_counts if n >= 1)
    if not counts:
        return None
    half = sum(1 / n for n in counts) / 2
    acc = 0.0
    for n in counts:
        acc += 1 / n
        if acc >= half:
            return n
    return counts[-1]


def prefill_load(snapshot: ObservationSnapshot) -> float:
    """Uncached prompt tokens per second finished over the last minute (0 when none)."""
    since = snapshot.now_ns - LOAD_WINDOW_NS
    recent = [(t, n) for t, n in snapshot.recent_prompts if t >= since]
    if not recent:
        return 0.0
    span_ns = max(snapshot.now_ns - min(t for t, _ in recent), 1_000_000_000)
    return sum(n for _, n in recent) / (span_ns / 1e9)


def engine(
    backend: Backend, snapshot: ObservationSnapshot, probe: Mapping[str, str | None] | None
) -> dict[str, str | None]:
    """Which engine the fit is of: the backend's label, the model its responses name, and
    the upstream's answer to the probe (``None`` fields: not known); ``name``, the best of
    them (``owned_by``, else the ``Server`` header's product, else the label)."""
    server = probe.get("server") if probe else None
    owned_by = probe.get("owned_by") if probe else None
    product = server.split("/")[0].split(" ")[0] if server else None
    return {
        "name": owned_by or product or backend.provider,
        "provider": backend.provider,
        "backend": backend.address,
        "response_model": snapshot.response_model or None,
        "server": server,
        "owned_by": owned_by,
        "probe_error": probe.get("error") if probe else "not asked yet",
    }


def fit_range(fitted: Fit) -> dict[str, list[int] | None]:
    """What the fit saw: ``[fewest, most]`` uncached prompt tokens of the prefills it used,
    decoding streams of the decode steps, prompt tokens one step carried, and tokens of its
    own prompt a step's piece came after (0 for an unsplit prompt)."""
    windows = [w for w in fitted.windows if w.excess_s > 0]
    r = fitted.fit_record
    chunk = r.chunk_size if r.chunked else None
    steps = [
        p for w in windows for p in (pieces(w.prompt_tokens, chunk) if chunk else [w.prompt_tokens])
    ]
    befores = [
        j * chunk if chunk else 0
        for w in windows
        for j in range(len(pieces(w.prompt_tokens, chunk)))
    ]
    counts = fitted.observations.get("stream_counts")
    counts = counts if isinstance(counts, list) and counts else None
    prompts = [w.prompt_tokens for w in windows]
    return {
        "prompt_tokens": [min(prompts), max(prompts)] if prompts else None,
        "streams": [min(counts), max(counts)] if counts else None,
        "step_tokens": [min(steps), max(steps)] if steps else None,
        "context_tokens": [min(befores), max(befores)] if befores else None,
    }


def extrapolation(row: Row, seen: Mapping[str, list[int] | None]) -> list[str]:
    """Why ``row`` lies outside the range the fit saw, one phrase each (empty: within it)."""
    out = []
    for key, value, what in (
        ("prompt_tokens", row.prompt_tokens, "prompt tokens"),
        ("streams", row.streams, "streams decoding"),
    ):
        bounds = seen.get(key)
        if bounds is not None and not bounds[0] <= value <= bounds[1]:
            out.append(f"{value:,} {what}, outside the {bounds[0]:,}-{bounds[1]:,} seen")
    bounds = seen.get("step_tokens")
    split = pieces(row.prompt_tokens, row.chunk_size)
    if bounds is not None and max(split) > bounds[1]:
        out.append(f"steps of up to {max(split):,} prompt tokens, {bounds[1]:,} at most seen")
    if bounds is not None and max(split) < bounds[0]:  # a small remainder alone is no matter
        out.append(f"steps of at most {max(split):,} prompt tokens, {bounds[0]:,} at least seen")
    bounds = seen.get("context_tokens")
    before = row.prompt_tokens - split[-1]  # the last piece comes after all the others
    if bounds is not None and before > bounds[1]:
        out.append(
            f"pieces after up to {before:,} tokens of their prompt, {bounds[1]:,} at most seen"
        )
    return out


def advise(
    fitted: Fit,
    snapshot: ObservationSnapshot,
    options: AdviceOptions,
    probe: Mapping[str, str | None] | None = None,
) -> dict[str, Any]:
    """The JSON-ready advice of one backend (docs/advisor.md); ``probe``: what the upstream
    said it is (``proxy.advisor.web.probe_engine``)."""
    record = fitted.fit_record
    seen = fit_range(fitted)
    missing = list(fitted.missing)
    prompt = options.prompt_tokens
    prompt_from = "given"
    if prompt is None:
        prompt = p95_prompt_tokens(snapshot)
        prompt_from = f"p95 uncached prompt of {len(snapshot.recent_prompts)} requests"
        if prompt is None:
            missing.append("finished requests with a known prompt size (or give --prompt-tokens)")
    streams = options.streams
    streams_from = "given"
    if streams is None:
        streams = typical_streams(snapshot)
        streams_from = "typical number decoding"
        if streams is None:
            missing.append("streams decoding, for their typical number (or give --streams)")
    itl_target = options.itl_target_s if options.itl_target_s is not None else options.tpot_target_s
    out: dict[str, Any] = {
        "backend": record.backend.address,
        "status": NOT_ENOUGH_DATA if missing else "ok",
        "missing": missing,
        "engine": engine(record.backend, snapshot, probe),
        "fit": {
            "prefill_tokens_per_s": record.prefill_tokens_per_s,
            "prefill_step_s": fitted.prefill_step_s,
            "prefill_context_s": fitted.prefill_context_s,
            "decode_step_s": {
                "base": record.decode_base_s,
                "per_stream": record.decode_per_stream_s,
            },
            "chunk_size": record.chunk_size,
            "chunked": record.chunked,
            "observations": fitted.observations,
            "quality": fitted.quality,
            "range": seen,
        },
        "scenario": {
            "prompt_tokens": prompt,
            "prompt_tokens_from": prompt_from,
            "streams": streams,
            "streams_from": streams_from,
            "itl_target_s": itl_target,
            "tpot_target_s": options.tpot_target_s,
            "kv_transfer_s": options.kv_transfer_s,
        },
        "table": [],
        "recommendation": None,
        "capacity": None,
        "prefill_pool": None,
    }
    if missing or prompt is None or streams is None:
        return out
    rows = table(fitted, prompt, streams, options.chunk_sizes)
    out["table"] = [_row(r, seen) for r in rows]
    rec = recommend(fitted, rows, itl_target)
    out["recommendation"] = {
        "itl_target_s": itl_target,
        "fits": rec.fits,
        "chunk_size": rec.row.chunk_size if rec.row is not None else None,
        "worst_gap_s": rec.row.worst_gap_s if rec.row is not None else None,
        "ttft_s": rec.row.ttft_s if rec.row is not None else None,
        "next_larger": _row(rec.next_larger, seen) if rec.next_larger is not None else None,
        "ttft_cost_s": (
            rec.row.ttft_s - rec.next_larger.ttft_s
            if rec.row is not None and rec.next_larger is not None
            else None
        ),
        "largest_chunk_within_target": rec.largest_chunk_within_target,
        "current_chunk_size": record.chunk_size,
    }
    cap = capacity(fitted, options.tpot_target_s, prefill_load(snapshot))
    out["capacity"] = {
        "tpot_target_s": cap.tpot_target_s,
        "streams": cap.streams,
        "prefill_load_tokens_per_s": cap.prefill_load_tokens_per_s,
        "streams_with_prefill_load": cap.streams_with_prefill_load,
    }
    pool = prefill_pool(fitted, prompt, streams, options.kv_transfer_s)
    out["prefill_pool"] = {
        "kv_transfer_s": pool.kv_transfer_s,
        "worst_gap_s": pool.worst_gap_s,
        "rate_during_prefill_per_s": pool.rate_during_prefill_per_s,
        "ttft_s": pool.ttft_s,
    }
    return out


def _row(r: Row, seen: Mapping[str, list[int] | None]) -> dict[str, Any]:
    return {
        "chunk_size": r.chunk_size,
        "prompt_tokens": r.prompt_tokens,
        "streams": r.streams,
        "worst_gap_s": r.worst_gap_s,
        "rate_during_prefill_per_s": r.rate_during_prefill_per_s,
        "ttft_s": r.ttft_s,
        "extrapolation": extrapolation(r, seen),
    }


def _chunk(value: int | None) -> str:
    return "none" if value is None else str(value)


def _ms(value_s: float) -> str:
    return f"{value_s * 1000:,.0f} ms" if value_s < 10 else f"{value_s:,.1f} s"


def render(advice: dict[str, Any]) -> str:
    """The advice of one backend as text, in the demo's style."""
    lines: list[str] = []
    f = advice["fit"]
    d = f["decode_step_s"]
    name = advice["backend"]
    fitted = []
    if d["base"] is not None and d["per_stream"] is not None:
        fitted.append(
            f"decode step {d['base'] * 1000:.1f} ms + {d['per_stream'] * 1000:.3f} ms x streams"
        )
    if f["prefill_tokens_per_s"] is not None:
        fitted.append(f"prefill {f['prefill_tokens_per_s']:,.0f} tokens/s")
    if f["prefill_step_s"]:
        fitted.append(f"{f['prefill_step_s'] * 1000:,.1f} ms a prefill step")
    if f["prefill_context_s"]:
        fitted.append(
            f"+{f['prefill_context_s'] * 1e9:,.2f} us a token per 1,000 tokens of context"
        )
    if f["chunked"] is True:
        fitted.append(f"chunk size {f['chunk_size']} in use")
    elif f["chunked"] is False:
        most = f["observations"].get("largest_unsplit_prompt_tokens")
        fitted.append(f"prompts not chunked (up to {most:,} tokens seen in one step)")
    lines.append(f"Backend {name}: " + (", ".join(fitted) if fitted else "nothing fitted yet"))
    lines.append(_engine_line(advice["engine"]))
    seen = f.get("range") or {}
    ranges = [
        what.format(_span(seen.get(key)))
        for key, what in (
            ("prompt_tokens", "prompts of {} tokens"),
            ("streams", "{} streams decoding"),
            ("step_tokens", "{} prompt tokens a step"),
        )
        if seen.get(key)
    ]
    if ranges:
        lines.append("fitted on " + ", ".join(ranges))
    if advice["status"] != "ok":
        lines.append(f"{NOT_ENOUGH_DATA}: " + "; ".join(advice["missing"]))
        return "\n".join(lines)
    s = advice["scenario"]
    rows = advice["table"]
    pool = advice["prefill_pool"]
    lines.append(
        f"The trade at a {s['prompt_tokens']:,}-token prompt ({s['prompt_tokens_from']}) with "
        f"{s['streams']} streams decoding ({s['streams_from']}), predicted:"
    )
    marked = [_chunk(r["chunk_size"]) + ("*" if r["extrapolation"] else "") for r in rows]
    head = ["chunk size".ljust(34)] + [m.rjust(9) for m in marked]
    head.append("prefill pool".rjust(14))
    lines.append("".join(head))

    def line(label: str, key: str, fmt: Callable[[float], str]) -> str:
        cells = [fmt(r[key]).rjust(9) for r in rows]
        return label.ljust(34) + "".join(cells) + fmt(pool[key]).rjust(14)

    lines.append(line("worst gap in an existing stream", "worst_gap_s", _ms))
    lines.append(line("token rate during the prefill", "rate_during_prefill_per_s", _rate))
    lines.append(line("new request's first token", "ttft_s", _ms))
    for r in rows:
        if r["extrapolation"]:
            why = "; ".join(r["extrapolation"])
            lines.append(f"  * {_chunk(r['chunk_size'])}: extrapolated ({why})")
    lines.append(_recommendation_line(advice["recommendation"]))
    cap = advice["capacity"]
    target = _ms(cap["tpot_target_s"])
    most = "any number of" if cap["streams"] is None else f"{cap['streams']:,}"
    loaded = cap["streams_with_prefill_load"]
    loaded_text = "any number" if loaded is None else f"{loaded:,}"
    lines.append(
        f"capacity: {most} decoding streams keep TPOT within {target} ({loaded_text} with the "
        f"observed prefill load of {cap['prefill_load_tokens_per_s']:,.0f} prompt tokens/s)"
    )
    lines.append(
        f"a separate prefill pool: worst gap one decode step, first token = prefill + "
        f"{_ms(pool['kv_transfer_s'])} KV transfer"
    )
    return "\n".join(lines)


def _span(bounds: list[int] | None) -> str:
    if not bounds:
        return "?"
    return f"{bounds[0]:,}" if bounds[0] == bounds[1] else f"{bounds[0]:,}-{bounds[1]:,}"


def _engine_line(e: dict[str, Any]) -> str:
    said = [f"{key} {e[key]}" for key in ("server", "owned_by", "response_model") if e.get(key)]
    if e.get("probe_error"):
        said.append(f"probe: {e['probe_error']}")
    return f"engine: {e['name']} (label {e['provider']}" + "".join(f"; {x}" for x in said) + ")"


def _rate(value: float) -> str:
    return f"{value:,.0f}/s"


def _recommendation_line(rec: dict[str, Any]) -> str:
    target = _ms(rec["itl_target_s"])
    if not rec["fits"]:
        return f"recommended: none of these keeps the worst gap within {target}"
    chosen = _chunk(rec["chunk_size"])
    text = f"recommended: {chosen} (worst gap {_ms(rec['worst_gap_s'])} within {target})"
    nxt = rec["next_larger"]
    if nxt is not None and rec["ttft_cost_s"] is not None:
        text += (
            f"; its first token waits {_ms(rec['ttft_cost_s'])} longer than at "
            f"{_chunk(nxt['chunk_size'])}, whose worst gap is {_ms(nxt['worst_gap_s'])}"
        )
    return text


def exit_status(advices: Sequence[dict[str, Any]]) -> int:
    """0 when every backend was advised, 3 when one lacks data (``NOT_ENOUGH_DATA``)."""
    return 3 if not advices or any(a["status"] != "ok" for a in advices) else 0

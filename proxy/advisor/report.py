"""The advice of one backend as the JSON contract of ``GET /advice`` and as the printed table.

Pure. ``advise`` puts the fit, the scenario (given, or the deployment's own p95
uncached prompt and typical number of decoding streams), the table, the
recommendation, the capacity and the prefill pool into one JSON-ready dict;
where something needed is missing it says what, and gives no number.
``render`` prints the same dict in the demo's style.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from proxy.advisor.fit import Fit
from proxy.advisor.observations import ObservationSnapshot
from proxy.advisor.predict import (
    DEFAULT_CHUNK_SIZES,
    Row,
    capacity,
    prefill_pool,
    recommend,
    table,
)

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


def advise(fitted: Fit, snapshot: ObservationSnapshot, options: AdviceOptions) -> dict[str, Any]:
    """The JSON-ready advice of one backend (docs/advisor.md)."""
    record = fitted.fit_record
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
    out["table"] = [_row(r) for r in rows]
    rec = recommend(fitted, rows, itl_target)
    out["recommendation"] = {
        "itl_target_s": itl_target,
        "fits": rec.fits,
        "chunk_size": rec.row.chunk_size if rec.row is not None else None,
        "worst_gap_s": rec.row.worst_gap_s if rec.row is not None else None,
        "ttft_s": rec.row.ttft_s if rec.row is not None else None,
        "next_larger": _row(rec.next_larger) if rec.next_larger is not None else None,
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


def _row(r: Row) -> dict[str, Any]:
    return {
        "chunk_size": r.chunk_size,
        "prompt_tokens": r.prompt_tokens,
        "streams": r.streams,
        "worst_gap_s": r.worst_gap_s,
        "rate_during_prefill_per_s": r.rate_during_prefill_per_s,
        "ttft_s": r.ttft_s,
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
    head = ["chunk size".ljust(34)] + [_chunk(r["chunk_size"]).rjust(9) for r in rows]
    head.append("prefill pool".rjust(14))
    lines.append("".join(head))

    def line(label: str, key: str, fmt: Callable[[float], str]) -> str:
        cells = [fmt(r[key]).rjust(9) for r in rows]
        return label.ljust(34) + "".join(cells) + fmt(pool[key]).rjust(14)

    lines.append(line("worst gap in an existing stream", "worst_gap_s", _ms))
    lines.append(line("token rate during the prefill", "rate_during_prefill_per_s", _rate))
    lines.append(line("new request's first token", "ttft_s", _ms))
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

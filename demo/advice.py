"""The demo's last part: the chunk-size advisor's table beside what the engine really did.

A short run of its own (the seed profile, chunked at 512): streams whose number
falls step by step and a few long prompts one at a time, so the proxy's advisor
sees decode steps at many stream counts and prefills alone. Then ``/advice``
for the seed's scenario (a 4,000-token prompt, 40 streams decoding) is printed
next to what the simulator did in the demo's two stutter runs (unchunked and
chunked at 512): worst gap and token rate from its ground truth, the new
request's first token through the proxy.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import aiohttp

from proxy.advisor.report import render as render_advice_text

CHUNK_SIZES = "256,512,1024,2048,4096,8192,none"
"""The advisor's candidates in the demo (the default set)."""
FIT_STREAMS = 16
"""Streams of the fit run: 16 down to 1, each count for 6 steps."""
FIT_PROMPTS = (3000, 5000, 4000)
"""Long prompts of the fit run, one at a time."""


async def _stream(
    session: aiohttp.ClientSession, url: str, max_tokens: int, prompt_tokens: int | None = None
) -> None:
    body: dict[str, Any] = {
        "model": "tokenstamp-sim",
        "messages": [{"role": "user", "content": "advise"}],
        "stream": True,
        "max_tokens": max_tokens,
    }
    if prompt_tokens is not None:
        body["sim_prompt_tokens"] = prompt_tokens
    async with session.post(url + "/v1/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for _ in resp.content.iter_any():
            pass


async def fit_traffic(url: str, step_s: float) -> None:
    """About three seconds of traffic through the proxy at ``url`` that the advisor can fit."""
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=0)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as session,
        asyncio.TaskGroup() as group,
    ):
        for i in range(FIT_STREAMS):
            group.create_task(_stream(session, url, 30 + 6 * i))
        await asyncio.sleep(12 * step_s)
        for tokens in FIT_PROMPTS:
            await _stream(session, url, 2, tokens)
            await asyncio.sleep(4 * step_s)


async def fetch_advice(admin_url: str, prompt_tokens: int, streams: int) -> dict[str, Any]:
    """``GET /advice`` for ``prompt_tokens`` and ``streams``: the one backend's advice."""
    query = {"prompt_tokens": str(prompt_tokens), "streams": str(streams),
             "chunk_sizes": CHUNK_SIZES}  # fmt: skip
    timeout = aiohttp.ClientTimeout(total=30)
    async with (
        aiohttp.ClientSession(timeout=timeout) as session,
        session.get(admin_url + "/advice", params=query) as resp,
    ):
        resp.raise_for_status()
        data: dict[str, Any] = await resp.json()
    (backend,) = data["backends"]
    advice: dict[str, Any] = backend
    return advice


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value * 1000:,.0f} ms"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}/s"


def did(run: dict[str, Any]) -> dict[str, float]:
    """What the simulator did in one stutter run of the demo (engine truth, proxy's TTFT)."""
    engine = run["engine"]
    return {
        "worst_gap_s": engine["worst_gap_s"],
        "rate_during_prefill_per_s": engine["prefill_steps"] / engine["prefill_window_s"],
        "ttft_s": run["measured"]["ttft_s"],
    }


def render_advice(
    results: dict[str, Any], show_fit: Callable[[dict[str, Any]], str] = render_advice_text
) -> str:
    """The advisor's table, then its rows next to the two runs at 512 and unchunked."""
    advice = results["advice"]
    lines = [
        "",
        "The advisor, fitted by the proxy from a few seconds of the backend's own traffic:",
    ]
    lines.append(show_fit(advice))
    if advice["status"] != "ok":
        return "\n".join(lines)
    rows = {r["chunk_size"]: r for r in advice["table"]}
    runs = {512: results["chunked"], None: results["unchunked"]}
    lines.append("Predicted by the advisor / done by the simulator in the runs above:")
    lines.append(f"{'':34}{'chunked at 512':>24}{'unchunked':>24}")
    for title, key, fmt in (
        ("worst gap in an existing stream", "worst_gap_s", _ms),
        ("token rate during the prefill", "rate_during_prefill_per_s", _rate),
        ("new request's first token", "ttft_s", _ms),
    ):
        cells = ""
        for chunk, run in runs.items():
            cells += f"{fmt(rows[chunk][key]) + ' / ' + fmt(did(run)[key]):>24}"
        lines.append(f"{title:34}{cells}")
    return "\n".join(lines)

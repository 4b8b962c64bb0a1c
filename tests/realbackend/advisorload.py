"""What the advisor validations on real engines share: a stream read to its end, the one-stream
decode step that sizes their workloads to the machine, the fit's workload, and the cells of a
measured prefill window as the existing streams saw it."""

from __future__ import annotations

import asyncio
import itertools
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from tests.realbackend.client import Prompts, chat
from tests.realbackend.recorder import RecordedProxy

ELEVATED = 2.0
"""A gap carried a prompt piece when it is this many times the stream's median gap ..."""
PIECE_SHARE = 0.3
"""... and at least this share of the worst one: a small last piece still costs several
decode steps; an engine's API server, busy taking in the long request, can delay the
streams' tokens by a few decode steps in the same window (vLLM's does: seen once as a
second "step" of an unsplit prompt)."""


async def read_stream(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], rid: str
) -> None:
    """One streamed chat completion through ``url``, read to its end, as request ``rid``.

    The client asks for usage: the advisor then fits on the backend's prompt counts (the
    proxy never asks llama.cpp for them), and the client reads what it reads."""
    body = {**body, "stream_options": {"include_usage": True}}
    headers = {"X-Request-Id": rid}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        async for _ in resp.content.iter_any():
            pass


async def decode_step_s(proxy: RecordedProxy, prompts: Prompts, rid: str) -> float:
    """One stream alone: its mean gap, in seconds (sizes a workload to this machine; not the
    median: an API server behind on a busy machine sends tokens in bursts, most gaps 0)."""
    async with aiohttp.ClientSession() as session:
        await read_stream(session, proxy.url, chat(prompts.text(24), 24), rid)
    stamps = proxy.watcher.output_ns[rid]
    return (stamps[-1] - stamps[0]) / (len(stamps) - 1) / 1e9


async def fit_workload(
    proxy: RecordedProxy,
    prompts: Prompts,
    long_prompts: Sequence[int],
    *,
    streams: int,
    prefill_s_per_token: float,
    most_tokens: int | None = None,
) -> None:
    """What the advisor fits from: ``streams`` streams that end one after another (decode
    steps at ``streams`` down to 1), while the ``long_prompts`` come one at a time (requests
    ``fit-0`` .., ``fit-long-0`` ..).

    The streams outlast every prefill (``prefill_s_per_token`` sizes them, with this
    machine's one-stream step), then one fewer every 8 steps; ``most_tokens`` caps the first
    one's output (a KV cache that must hold them beside the prompts)."""
    step_s = await decode_step_s(proxy, prompts, "fit-probe")
    busy_s = sum(p * prefill_s_per_token + 12 * step_s for p in long_prompts)
    base = int(busy_s / step_s) + 30
    if most_tokens is not None:
        base = min(base, most_tokens)
    print(f"\nfit run: one-stream step {step_s * 1e3:.1f} ms, base {base} tokens")
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with asyncio.TaskGroup() as group:
            for i in range(streams):
                body = chat(prompts.text(24), base + 8 * i)
                group.create_task(read_stream(session, proxy.url, body, f"fit-{i}"))
            await asyncio.sleep(20 * step_s + 1.0)
            for k, tokens in enumerate(long_prompts):
                await read_stream(
                    session, proxy.url, chat(prompts.text(tokens), 2), f"fit-long-{k}"
                )
                await asyncio.sleep(10 * step_s)


@dataclass(frozen=True, slots=True)
class WindowCells:
    """A long request's prefill window as the streams decoding through it saw it (each the
    median over the streams: one stream's bad luck with a shared machine's scheduler is not
    the engine's)."""

    worst_gap_s: float
    """Each stream's worst gap that ended in the window."""
    rate_per_s: float
    """Each stream's tokens per second over the gaps that carried the prompt."""
    steps: int
    """Each stream's gaps that carried the prompt."""
    stalls: int
    """Each stream's stalls the proxy attributed to the long request."""
    decode_step_s: float
    """The streams' gaps outside the window (all streams' together)."""


def window_cells(proxy: RecordedProxy, long_rid: str, stream_rids: Sequence[str]) -> WindowCells:
    """The cells of ``long_rid``'s window ``(forwarded, first token]`` in ``stream_rids``: the
    gaps that ended in it (the step that made the first token: up to half a step later, the
    sockets are read one after another)."""
    tf = proxy.watcher.forwarded_ns[long_rid]
    t1 = proxy.watcher.output_ns[long_rid][0]
    caused = proxy.sink.stalls_caused_by(long_rid)
    worsts, rates, steps, stalls, outside = [], [], [], [], []
    for rid in stream_rids:
        stamps = proxy.watcher.output_ns[rid]
        gaps = list(itertools.pairwise(stamps))
        assert stamps[0] < tf, f"{rid} started after {long_rid}"
        assert stamps[-1] > t1, f"{rid} did not outlast the prefill of {long_rid}"
        typical = statistics.median(b - a for a, b in gaps)
        window = [b - a for a, b in gaps if tf < b <= t1 + typical / 2]
        carried = [g for g in window if g > max(ELEVATED * typical, PIECE_SHARE * max(window))]
        outside += [b - a for a, b in gaps if b < tf or a > t1 + typical]
        worsts.append(max(window))
        rates.append(len(carried) / (sum(carried) / 1e9) if carried else 0.0)
        steps.append(len(carried))
        stalls.append(len([s for s in caused if s.request_id == rid]))
    return WindowCells(
        worst_gap_s=statistics.median(worsts) / 1e9,
        rate_per_s=statistics.median(rates),
        steps=round(statistics.median(steps)),
        stalls=round(statistics.median(stalls)),
        decode_step_s=statistics.median(outside) / 1e9,
    )

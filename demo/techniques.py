"""``tokenstamp demo --techniques``: the seed's map of optimisations, measured through the proxy.

One workload, the seed's: 40 streams decoding, then three 16,000-token prompts
arriving 0.8 s apart that share a 15,936-token prefix (a long system prompt:
only their last 64 tokens differ). It runs on a baseline (the seed's profile,
unchunked continuous batching) and once per technique, each on a fresh
simulator (its own process) behind a fresh proxy, and every figure in the
table is what the proxy measured. The simulator's ground truth of each run is
kept beside it (``engine``), on the same monotonic clock, so a test can check
each claim on both.

Figures per run (the proxy's; :mod:`demo.claims` judges and renders them):

- TTFT p50 / p99 of the arriving prompts;
- TPOT: median over the 40 streams of their TPOT (stalls included, as a
  dashboard shows it);
- decode step: median over the streams of their median gap while the prompts
  were served (the gap an unstalled stream has);
- worst gap: median over the streams of their largest gap in that window;
- tokens/s: the streams' output in the steady 0.6 s before the first prompt,
  all of them together (output events x tokens per event): decode throughput;
- tokens per output event: completion tokens / output events, all requests;
- prefill stalls and stutter cost: the stall view's records.
"""

from __future__ import annotations

import asyncio
import json
import math
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from demo.claims import judge, render_techniques
from demo.pictures import replay_snapshot, write_run_pictures
from demo.recording import RecordingSink
from demo.scenarios import chat_body, stream
from demo.truth import engine_view, free_port, percentile, start_simulator, write_profile
from proxy.config import HostPort, ProxyConfig
from proxy.core.records import Backend, RequestRecord, StallCause
from proxy.edge.server import start_proxy
from proxy.timeline.tokenlog import Timeline, TokenLog
from simulator.profile import Profile, load_profile
from simulator.techniques import Disaggregated, KvBudget, Speculative, StaticBatching, Techniques

Progress = Callable[[str], None]

STREAMS = 40
"""Streams decoding when the prompts arrive."""
STREAM_PROMPT = 64
"""Prompt tokens of each stream."""
STREAM_TOKENS = 150
"""Output tokens of each stream: enough to decode through the prompts' arrivals."""
WARM_TOKENS = 12
"""Tokens every stream has before the steady interval begins."""
STEADY_S = 0.6
"""The quiet interval before the first prompt, in which tokens/s is measured."""
LONG_COUNT = 3
"""Long prompts arriving."""
LONG_PROMPT = 16_000
"""Their length (tokens)."""
SHARED_PREFIX = 15_936
"""Tokens they share (996 prefix-cache blocks of 16); the last 64 differ."""
LONG_TOKENS = 8
"""Output tokens of each long prompt."""
LONG_SPACING_S = 0.8
"""Between two long prompts' arrivals: more than one unchunked prefill (0.6 s)."""
KV_CAPACITY = 131_072
"""KV-cache memory of the kv_budget runs (tokens): 32 caches of 4,096, or 64 of 2,048."""


@dataclass(frozen=True, slots=True)
class Technique:
    """One run of the workload: a name and the simulator it runs on."""

    name: str
    """The row's name (``baseline``, ``prefix_reuse``, ...)."""
    techniques: Techniques = field(default_factory=Techniques)
    """What the simulator models in this run."""
    prefix_cache: bool = False
    """Prefix reuse (the engine's prefix cache) on."""
    stream_tokens: int = STREAM_TOKENS
    """Output tokens per stream (more with speculative decoding: it decodes faster)."""
    streams_at_once: int = STREAMS
    """Streams that can decode at once (the warm-up waits for that many)."""


def runs() -> list[Technique]:
    """The runs, in order; ``kv_budget_full`` is the reference the kv_budget row is read against."""
    speculative = Speculative()
    return [
        Technique("baseline"),
        Technique("prefix_reuse", prefix_cache=True),
        Technique(
            "speculative",
            Techniques(speculative=speculative),
            # Decoding ~2.8 tokens per step, a stream needs as many more to last as long.
            stream_tokens=round(STREAM_TOKENS * speculative.expected_tokens_per_step()),
        ),
        Technique(
            "kv_budget_full",
            Techniques(kv_budget=KvBudget(KV_CAPACITY, 4096)),
            streams_at_once=KV_CAPACITY // 4096,
        ),
        Technique("kv_budget", Techniques(kv_budget=KvBudget(KV_CAPACITY, 2048))),
        Technique("static_batching", Techniques(static_batching=StaticBatching(fill_s=0.3))),
        Technique("disaggregated", Techniques(disaggregated=Disaggregated())),
    ]


def long_body(index: int) -> dict[str, object]:
    """The ``index``-th long prompt: the shared system prompt, then a question of its own."""
    system = "s" * (SHARED_PREFIX * 4 - len("<|system|>"))
    question = f"question {index}: ".ljust((LONG_PROMPT - SHARED_PREFIX) * 4 - len("<|user|>"), "q")
    return {
        "model": "tokenstamp-sim",
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": question},
        ],
        "stream": True,
        "max_tokens": LONG_TOKENS,
    }


@dataclass(frozen=True, slots=True)
class Window:
    """The run's intervals on the monotonic clock (the proxy's stamps)."""

    steady_start_ns: int
    """Every stream that fits is decoding: the steady interval begins."""
    first_long_ns: int
    """The first long prompt is forwarded: the steady interval ends, the window begins."""
    end_ns: int
    """The last long prompt's stream ended."""


async def _wait(predicate: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout_s:g} s waiting for {what}")
        await asyncio.sleep(0.01)


async def _load(url: str, log: TokenLog, run: Technique, show: Progress) -> Window:
    """40 streams through the proxy (a child process reads them), then the long prompts."""
    ids = stream_ids(run.name)
    spec = json.dumps({"url": url, "ids": ids, "body": chat_body(STREAM_PROMPT, run.stream_tokens)})
    child = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "demo.scenarios", spec, stdin=asyncio.subprocess.DEVNULL
    )
    try:

        def warm() -> bool:
            decoding = sum(1 for rid in ids if len(_timeline(log, rid).token_ns) >= WARM_TOKENS)
            return decoding >= run.streams_at_once

        await _wait(warm, 60, f"{run.streams_at_once} streams to be decoding")
        steady_start_ns = time.monotonic_ns()
        show(f"{run.name}: streams decoding; three {LONG_PROMPT:,}-token prompts arrive")
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:

            async def send(i: int) -> None:
                await asyncio.sleep(STEADY_S + i * LONG_SPACING_S)
                await stream(session, url, long_body(i), long_id(run.name, i))

            await asyncio.gather(*(send(i) for i in range(LONG_COUNT)))
        show(f"{run.name}: prompts answered; finishing the streams")
        if await child.wait() != 0:
            raise RuntimeError(f"{run.name}: the stream client failed")
    finally:
        if child.returncode is None:
            child.kill()
            await child.wait()
    longs = [log.timelines[long_id(run.name, i)] for i in range(LONG_COUNT)]
    first_long_ns = min(t.forwarded_ns or 0 for t in longs)
    return Window(steady_start_ns, first_long_ns, max(t.end_ns or 0 for t in longs))


def stream_ids(name: str) -> list[str]:
    """Request ids of a run's streams."""
    return [f"{name}-stream-{i:02d}" for i in range(STREAMS)]


def long_id(name: str, index: int) -> str:
    """Request id of a run's ``index``-th long prompt."""
    return f"{name}-long-{index}"


def _tokens_per_event(records: list[RequestRecord]) -> float:
    counted = [r for r in records if r.completion_tokens is not None and r.output_events]
    events = sum(r.output_events for r in counted)
    return sum(r.completion_tokens or 0 for r in counted) / events if events else float("nan")


def measure(
    name: str, sink: RecordingSink, log: TokenLog, window: Window
) -> dict[str, float | int | None]:
    """The row's figures, from the proxy's records and token timelines of one run."""
    streams = [sink.records[rid] for rid in stream_ids(name) if rid in sink.records]
    longs = [sink.records[long_id(name, i)] for i in range(LONG_COUNT)]
    ttfts = [r.ttft_s for r in longs if r.ttft_s is not None]
    worst: list[int] = []
    steps: list[float] = []
    for rid in stream_ids(name):
        # The gaps that overlap the window in which the long prompts were served.
        gaps = [
            b - a
            for a, b in _timeline(log, rid).gaps_ns()
            if b > window.first_long_ns and a < window.end_ns
        ]
        if gaps:
            worst.append(max(gaps))
            steps.append(percentile(gaps, 50))
    # Each stream's rate over its own events in the steady interval (from its first to
    # its last: whole steps, no cut at the edges), times its tokens per event; summed.
    tokens_per_s = 0.0
    for record in (*streams, *longs):
        per_event = _tokens_per_event([record])
        stamps = [
            t
            for t in _timeline(log, record.request_id).token_ns
            if window.steady_start_ns <= t <= window.first_long_ns
        ]
        if len(stamps) >= 2:
            rate = (len(stamps) - 1) / ((stamps[-1] - stamps[0]) / 1e9)
            tokens_per_s += rate * (1.0 if math.isnan(per_event) else per_event)
    tpots = [r.tpot_s for r in streams if r.tpot_s is not None]
    return {
        "ttft_p50_s": percentile(ttfts, 50),
        "ttft_p99_s": percentile(ttfts, 99),
        "tpot_s": percentile(tpots, 50),
        "decode_step_s": percentile(steps, 50) / 1e9,
        "worst_gap_s": percentile(worst, 50) / 1e9,
        "worst_gap_max_s": max(worst) / 1e9,
        "tokens_per_s": tokens_per_s,
        "tokens_per_event": _tokens_per_event([*streams, *longs]),
        "prefill_stalls": sum(1 for s in sink.stalls if s.cause is StallCause.PREFILL),
        "unattributed_stalls": sum(1 for s in sink.stalls if s.cause is StallCause.UNATTRIBUTED),
        "stutter_cost_s": sum(p.stutter_cost_s for p in sink.prefills),
    }


def _timeline(log: TokenLog, request_id: str) -> Timeline:
    return log.timelines.get(request_id) or Timeline(request_id)


def _profile(run: Technique) -> Profile:
    return load_profile("seed").with_overrides(techniques=run.techniques)


async def run_one(run: Technique, show: Progress, out: Path | None, tmp: Path) -> dict[str, Any]:
    """One run of the workload: the proxy's figures, the engine's, and the run's picture."""
    show(f"{run.name}: starting the simulator and the proxy")
    profile_path = write_profile(_profile(run), tmp / f"{run.name}.json")
    sim = await start_simulator(profile_path, run.prefix_cache)
    registry = CollectorRegistry()
    sink = RecordingSink(registry)
    log = TokenLog(capacity=4096)
    config = ProxyConfig(
        upstream=sim.url,
        listen=HostPort("127.0.0.1", free_port()),
        admin=HostPort("127.0.0.1", 0),
        backend_name="simulator",
        provider="tokenstamp-sim",
    )
    proxy = await start_proxy(config, registry=registry, sink=sink, watcher=log)
    try:
        window = await _load(proxy.url, log, run, show)
        if proxy.stalls is not None:  # the run is over: settle every pending attribution
            proxy.stalls.flush(time.monotonic_ns() + 10_000_000_000)
        row: dict[str, Any] = {"name": run.name, **measure(run.name, sink, log, window)}
        long_ids = [long_id(run.name, i) for i in range(LONG_COUNT)]
        row["engine"] = await engine_view(
            sim.url, long_ids, window.steady_start_ns, window.first_long_ns, window.end_ns
        )
        snapshot = replay_snapshot(
            Backend(config.provider, config.backend_label),
            log.timelines.values(),
            stalls=sink.stalls,
            prefills=sink.prefills,
            requests=sink.records.values(),
        )
    finally:
        await proxy.close(drain_timeout_s=2.0)
        await sim.close()
    row["pictures"] = None
    if out is not None and run.name != "kv_budget_full":
        row["pictures"] = write_run_pictures(
            snapshot,
            out / f"technique-{run.name}",
            title=f"{run.name}: {STREAMS} streams decoding, {LONG_COUNT} {LONG_PROMPT:,}-token "
            "prompts with a shared prefix arrive",
            subtitle=f"measured by the proxy: TTFT p50 {row['ttft_p50_s'] * 1000:,.0f} ms, "
            f"worst gap {row['worst_gap_s'] * 1000:,.0f} ms, "
            f"{row['tokens_per_event']:.2f} tokens per event",
            zero_id=long_ids[0],
            x_label="seconds since the first long prompt was forwarded",
            close_up_us=(-300_000, (window.end_ns - window.first_long_ns) // 1000 + 300_000),
        )
    return row


async def run_techniques(show: Progress, out: Path | None) -> dict[str, Any]:
    """Every run, judged: ``{"workload": ..., "techniques": [row, ...]}``."""
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory(prefix="tokenstamp-techniques-") as tmp:
        for run in runs():
            rows[run.name] = await run_one(run, show, out, Path(tmp))
    return {"workload": workload(), "techniques": judge(rows)}


def workload() -> dict[str, object]:
    """The workload's parameters, as the JSON reports them."""
    return {
        "streams": STREAMS,
        "stream_prompt_tokens": STREAM_PROMPT,
        "stream_output_tokens": STREAM_TOKENS,
        "long_prompts": LONG_COUNT,
        "long_prompt_tokens": LONG_PROMPT,
        "shared_prefix_tokens": SHARED_PREFIX,
        "long_output_tokens": LONG_TOKENS,
        "long_spacing_s": LONG_SPACING_S,
        "steady_s": STEADY_S,
        "profile": "seed (unchunked)",
    }


async def main(as_json: bool, out: Path | None, show: Progress) -> int:
    """``tokenstamp demo --techniques``: run, then print the table (or the JSON)."""
    results = await run_techniques(show, out)
    show("done")
    if as_json:
        print(json.dumps(results, indent=2))
    else:
        sys.stderr.write("\n" if sys.stderr.isatty() else "")
        print(render_techniques(results))
    return 0

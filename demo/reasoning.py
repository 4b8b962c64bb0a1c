"""A reasoning model through the proxy: the wait a user feels is the first answer token.

The simulator (seed profile) runs as a reasoning model (``--reasoning-tokens``:
every chat request thinks first unless it says otherwise) and six requests
arrive together: thinking for the model's default, briefly, at length, before a
tool call, until ``max_tokens`` runs out (no answer at all), and not at all. For
each, what the proxy measured (its request records: TTFT, time to first answer
token, reasoning duration and tokens) beside what the engine recorded (its
ground truth, :func:`simulator.observe.observe_phases`, on the same clock). The
engine counts from the request's arrival at the engine, the proxy from its own
arrival: the proxy's figures are the engine's plus delivery.
"""

from __future__ import annotations

import asyncio
import tempfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from demo.pictures import replay_snapshot, write_run_pictures
from demo.recording import RecordingSink
from demo.scenarios import stream
from demo.truth import start_simulator, write_profile
from proxy.config import HostPort, ProxyConfig
from proxy.core.records import Backend, RequestRecord
from proxy.edge.server import start_proxy
from proxy.timeline.tokenlog import TokenLog
from simulator.observe import observe_phases
from simulator.profile import load_profile
from simulator.records import records_from_jsonl

MODEL_REASONING_TOKENS = 64
"""The reasoning model's default: reasoning tokens of a request that does not say."""
ANSWER_TOKENS = 24
"""Answer tokens after the reasoning (the profile's output length)."""
PROMPT_TOKENS = 1000
"""Prompt of every request."""
REQUESTS: tuple[tuple[str, str, dict[str, object]], ...] = (
    ("reasoning-default", f"thinks (the model's {MODEL_REASONING_TOKENS})", {}),
    ("reasoning-brief", "thinks briefly (16)", {"sim_reasoning_tokens": 16}),
    ("reasoning-long", "thinks at length (160)", {"sim_reasoning_tokens": 160}),
    (
        "reasoning-tool",
        "thinks (32), calls a tool",
        {"sim_reasoning_tokens": 32, "sim_tool_call": True},
    ),
    (
        "reasoning-cut-off",
        "thinks until max_tokens (48)",
        {"sim_reasoning_tokens": 96, "max_tokens": 48},
    ),
    ("reasoning-none", "answers at once (0)", {"sim_reasoning_tokens": 0}),
)
"""Request id, what it does, its body's simulator extensions."""


def _body(extra: dict[str, object]) -> dict[str, object]:
    return {
        "model": "tokenstamp-sim",
        "messages": [{"role": "user", "content": "think it over"}],
        "stream": True,
        "sim_prompt_tokens": PROMPT_TOKENS,
        **extra,
    }


def proxy_view(record: RequestRecord) -> dict[str, Any]:
    """What the proxy measured about one request (its record)."""
    return {
        "ttft_s": record.ttft_s,
        "answer_ttft_s": record.answer_ttft_s,
        "reasoning_s": record.reasoning_s,
        "reasoning_tokens": record.reasoning_tokens,
        "tool_call_ttft_s": record.tool_call_ttft_s,
        "output_tokens": record.output_tokens,
    }


async def _truth(url: str) -> str:
    text = ""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as session:
        for kind in ("prefill", "finish"):
            async with session.get(url + "/sim/ground_truth", params={"type": kind}) as r:
                r.raise_for_status()
                text += await r.text()
    return text


async def run_reasoning(
    show: Callable[[str], None] = lambda _: None, out: Path | None = None
) -> dict[str, Any]:
    """Run the six requests through a proxy in front of a reasoning model; the results."""
    profile = load_profile("seed").with_overrides(
        output_tokens=ANSWER_TOKENS, reasoning_tokens=MODEL_REASONING_TOKENS
    )
    with tempfile.TemporaryDirectory(prefix="tokenstamp-reasoning-") as tmp:
        sim = await start_simulator(write_profile(profile, Path(tmp) / "reasoning.json"), False)
    try:
        registry = CollectorRegistry()
        sink = RecordingSink(registry)
        log = TokenLog(capacity=64)
        config = ProxyConfig(
            upstream=sim.url,
            listen=HostPort("127.0.0.1", 0),
            admin=HostPort("127.0.0.1", 0),
            backend_name="simulator",
            provider="tokenstamp-sim",
        )
        proxy = await start_proxy(config, registry=registry, sink=sink, watcher=log)
        try:
            show(f"reasoning: {len(REQUESTS)} requests to a reasoning model")
            async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
                await asyncio.gather(
                    *(stream(session, proxy.url, _body(extra), rid) for rid, _, extra in REQUESTS)
                )
            truth = records_from_jsonl(await _truth(sim.url))
        finally:
            await proxy.close(drain_timeout_s=2.0)
    finally:
        await sim.close()
    requests = [
        {
            "request_id": rid,
            "label": label,
            "proxy": proxy_view(sink.records[rid]),
            "engine": asdict(observe_phases(truth, rid)),
        }
        for rid, label, _ in REQUESTS
    ]
    pictures = None
    if out is not None:
        snapshot = replay_snapshot(
            Backend(config.provider, config.backend_label),
            log.timelines.values(),
            requests=sink.records.values(),
        )
        end_us = max(s["end_us"] or s["forwarded_us"] for s in snapshot["streams"])
        zero_us = min(s["forwarded_us"] for s in snapshot["streams"])
        pictures = write_run_pictures(
            snapshot,
            out / "timeline-reasoning",
            title=f"a reasoning model: {len(REQUESTS)} requests think, then answer",
            subtitle="measured by the proxy: reasoning (first reasoning to first answer "
            "event) in violet, the answer in green",
            zero_id=REQUESTS[0][0],
            x_label="seconds since the requests were forwarded",
            close_up_us=(-100_000, end_us - zero_us + 100_000),
        )
    return {
        "model_reasoning_tokens": MODEL_REASONING_TOKENS,
        "answer_tokens": ANSWER_TOKENS,
        "prompt_tokens": PROMPT_TOKENS,
        "reasoning_field": profile.reasoning_field,
        "requests": requests,
        "pictures": pictures,
    }

"""The advisor's test kit: simulator profiles, the fit workload, measured runs at a chunk size.

Everything runs for real: the simulator on a loopback socket (its own cost
profile), the proxy in front of it (``start_proxy``, the advisor wired in as
users run it), streaming clients over HTTP. The simulator shares this
process's monotonic clock, so its ground truth (every step, every token) is
comparable with the proxy's stamps.
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import dataclass, replace
from typing import Any

import aiohttp
from prometheus_client import CollectorRegistry

from exporters.prometheus import PrometheusSink
from proxy.edge.server import RunningProxy, start_proxy
from simulator.cost import CostModel
from simulator.engine import MAX_CATCH_UP_NS, EngineConfig
from simulator.profile import Profile
from simulator.server import create_app
from tests.stallkit import RecordingSink, simulator_proxy_config

MODEL = "tokenstamp-sim"


def random_profile(rng: random.Random) -> Profile:
    """A cost profile drawn at random, far from the seed's (22 ms, 0.08 ms/seq, 28,000 tok/s)."""
    cost = CostModel(
        decode_base_s=rng.uniform(0.018, 0.028),
        decode_per_seq_s=rng.uniform(0.0005, 0.0010),
        prefill_s_per_token=1 / rng.uniform(12_000, 20_000),
        chunk_size=rng.randrange(600, 1400),
    )
    return Profile(f"random-{rng.randrange(10**6)}", cost)


async def start_sim(aiohttp_server: Any, profile: Profile) -> str:
    """The simulator with ``profile`` on a real socket; its base URL."""
    sim = await aiohttp_server(create_app(EngineConfig(profile)))
    return str(sim.make_url("")).rstrip("/")


async def start_proxy_for(sim_url: str, **overrides: Any) -> tuple[RunningProxy, RecordingSink]:
    """The proxy in front of ``sim_url`` with its advisor, keeping every record."""
    registry = CollectorRegistry()
    tee = RecordingSink(PrometheusSink(registry))
    config = replace(simulator_proxy_config(sim_url), **overrides)
    return await start_proxy(config, registry=registry, sink=tee), tee


async def stream(
    session: aiohttp.ClientSession,
    url: str,
    *,
    max_tokens: int,
    prompt_tokens: int | None = None,
    request_id: str | None = None,
) -> None:
    """One streaming chat completion through ``url``, read to the end."""
    body: dict[str, Any] = {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "stream": True,
        "max_tokens": max_tokens,
    }
    if prompt_tokens is not None:
        body["sim_prompt_tokens"] = prompt_tokens
    headers = {"X-Request-Id": request_id} if request_id else {}
    async with session.post(url + "/v1/chat/completions", json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        async for _ in resp.content.iter_any():
            pass


async def fit_workload(url: str, step_s: float, prompts: list[int], streams: int = 16) -> None:
    """Decoding streams whose number falls step by step, and one long prompt at a time.

    ``streams`` short requests start together; the i-th asks for ``40 + 8 i``
    tokens, so 16, 15, ... 1 streams decode for 8 steps each (clean decode gaps
    at every count); meanwhile the ``prompts`` arrive one by one, each only
    once the one before has produced its first token and 6 steps passed.
    """
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        async with asyncio.TaskGroup() as group:
            for i in range(streams):
                group.create_task(stream(session, url, max_tokens=40 + 8 * i))
            await asyncio.sleep(20 * step_s)
            for i, tokens in enumerate(prompts):
                await stream(session, url, max_tokens=2, prompt_tokens=tokens,
                             request_id=f"fit-long-{i}")  # fmt: skip
                await asyncio.sleep(6 * step_s)


async def get_advice(admin_url: str, **query: str) -> dict[str, Any]:
    """``GET /advice`` of a running proxy."""
    async with aiohttp.ClientSession() as session:
        async with session.get(admin_url + "/advice", params=query) as resp:
            assert resp.status == 200, await resp.text()
            data: dict[str, Any] = await resp.json()
            return data


@dataclass(frozen=True)
class Measured:
    """What the simulator actually did with one long prompt at one chunk size."""

    chunk_size: int | None
    worst_gap_s: float
    """Worst gap of an existing stream during the prefill (ground truth)."""
    rate_during_prefill_per_s: float
    """An existing stream's tokens per second during the prefill (ground truth)."""
    ttft_s: float
    """The long request's TTFT as the proxy measured it."""
    prefill_steps: int
    """Steps that carried a piece of it (ground truth)."""
    late_steps: int
    """Of those, steps the engine ran late by more than ``MAX_CATCH_UP_NS`` (left out)."""


async def measure(
    aiohttp_server: Any, profile: Profile, chunk: int | None, prompt_tokens: int, streams: int
) -> Measured:
    """Run ``profile`` at ``chunk``: ``streams`` decoding, one long prompt; what happened."""
    prof = profile.with_overrides(chunk_size=chunk)
    sim_url = await start_sim(aiohttp_server, prof)
    proxy, tee = await start_proxy_for(sim_url, advisor=False, stall_detection=False)
    step_s = prof.cost.decode_s(streams)
    window_s = sum(prof.cost.step_s(streams, p) for p in prof.cost.prefill_pieces(prompt_tokens))
    tokens = int((window_s + 12 * step_s) / step_s) + 10
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            async with asyncio.TaskGroup() as group:
                for _ in range(streams):
                    group.create_task(stream(session, proxy.url, max_tokens=tokens))
                # Unchunked, the short prompts are admitted one per step: all decode after that.
                await asyncio.sleep((streams + 4) * step_s)
                await stream(session, proxy.url, max_tokens=2, prompt_tokens=prompt_tokens,
                             request_id="long")  # fmt: skip
            async with session.get(sim_url + "/sim/ground_truth") as resp:
                truth = [json.loads(line) for line in (await resp.text()).splitlines()]
    finally:
        await proxy.close(drain_timeout_s=1.0)
    (prefill,) = [t for t in truth if t["type"] == "prefill" and t["x_request_id"] == "long"]
    steps = sorted((t for t in truth if t["type"] == "step"), key=lambda t: t["step"])
    carrying = [
        i for i, t in enumerate(steps) if prefill["response_id"] in t["prefill_response_ids"]
    ]
    assert all(steps[i]["decode_batch"] == streams for i in carrying), "not all streams decoding"
    gaps = [steps[i]["end_ns"] - steps[i - 1]["end_ns"] for i in carrying]
    # A step the engine itself ran more than MAX_CATCH_UP_NS late (it waited for a CPU of
    # this shared machine, and restarted its timeline) is the machine, not the modelled
    # accelerator: left out of the worst gap, unless every step was.
    on_time = [
        g
        for g, i in zip(gaps, carrying, strict=True)
        if g - round(steps[i]["duration_s"] * 1e9) <= MAX_CATCH_UP_NS
    ]
    window_ns = steps[carrying[-1]]["end_ns"] - steps[carrying[0] - 1]["end_ns"]
    (record,) = [r for r in tee.requests.values() if r.request_id == "long"]
    assert record.ttft_s is not None
    return Measured(chunk, max(on_time or gaps) / 1e9, len(gaps) / (window_ns / 1e9),
                    record.ttft_s, len(carrying), len(gaps) - len(on_time))  # fmt: skip

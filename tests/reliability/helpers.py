"""Small helpers shared by the reliability tests: requests, recorded outcomes, streams."""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

import aiohttp
from hypothesis import HealthCheck, settings

from proxy.edge.server import RunningProxy
from tests.reliability.procs import fd_census
from tests.reliability.rawserver import LAST_CHUNK, SSE_HEAD, RawConn, chunked
from tests.reliability.streams import stream_events, visible_bytes

CHAT = "/v1/chat/completions"

# Fuzz budgets: "ci" keeps test_decoder_fuzz.py under a minute on two cores and is
# derandomized (the same examples every run: CI never goes red by luck);
# HYPOTHESIS_PROFILE=long runs 75 times as many random examples, for local use.
settings.register_profile(
    "ci",
    max_examples=800,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "long", max_examples=60_000, deadline=None, suppress_health_check=list(HealthCheck)
)


def fuzz_settings() -> settings:
    """The profile named by ``HYPOTHESIS_PROFILE`` (``ci`` when unset)."""
    return settings.get_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


def env_seconds(name: str, default: float) -> float:
    """A duration from the environment (e.g. ``TOKENSTAMP_SOAK_S=900`` for a long local run)."""
    return float(os.environ.get(name, default))


@dataclass(frozen=True)
class Snapshot:
    """Tasks of the running loop and open fds of this process at one moment."""

    tasks: int
    fds: int


def snapshot() -> Snapshot:
    """Count tasks and file descriptors now."""
    return Snapshot(len(asyncio.all_tasks()), fd_census()[0])


async def settled(baseline: Snapshot, timeout_s: float = 2.0) -> Snapshot:
    """Wait (bounded) until tasks and fds are back to ``baseline``; the last count."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while True:
        now = snapshot()
        if (now.tasks <= baseline.tasks and now.fds <= baseline.fds) or loop.time() > deadline:
            return now
        await asyncio.sleep(0.02)


def chat_body(seed: int = 1, n: int = 8, **extra: object) -> dict[str, object]:
    """A streaming chat request the load backend and ``healthy`` understand."""
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True,
            "seed": seed, "max_tokens": n, **extra}  # fmt: skip


@dataclass
class Received:
    """What a client got back."""

    status: int
    headers: dict[str, str]
    body: bytes
    error: str = ""
    """Exception class name when the body ended abnormally."""


async def fetch(url: str, payload: object, *, timeout_s: float = 10.0, **kw: Any) -> Received:
    """POST ``payload`` and read everything, recording how the body ended."""
    got = bytearray()
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        async with asyncio.timeout(timeout_s), s.post(url, json=payload, **kw) as r:
            try:
                async for chunk in r.content.iter_any():
                    got += chunk
            except aiohttp.ClientError as exc:
                return Received(r.status, dict(r.headers), bytes(got), type(exc).__name__)
            return Received(r.status, dict(r.headers), bytes(got))


def outcomes(p: RunningProxy) -> list[tuple[str, str, str, float]]:
    """Every ``tokenstamp_requests_total`` series: (outcome, status class, error type, n)."""
    return sorted(
        (s.labels["tokenstamp_outcome"], s.labels["http_response_status_code"],
         s.labels["error_type"], s.value)
        for m in p.registry.collect() if m.name == "tokenstamp_requests"
        for s in m.samples if s.name == "tokenstamp_requests_total"
    )  # fmt: skip


def decoder_errors(p: RunningProxy) -> dict[str, float]:
    """``tokenstamp_decoder_errors_total`` by kind."""
    return {
        s.labels["error_type"]: s.value
        for m in p.registry.collect() if m.name == "tokenstamp_decoder_errors"
        for s in m.samples if s.name == "tokenstamp_decoder_errors_total"
    }  # fmt: skip


def active(p: RunningProxy) -> float:
    """Sum of ``tokenstamp_streams_active``."""
    return sum(
        s.value for m in p.registry.collect() if m.name == "tokenstamp_streams_active"
        for s in m.samples
    )  # fmt: skip


async def healthy(conn: RawConn, seed: int = 1, n: int = 8, pause_s: float = 0.02) -> None:
    """A well-formed vLLM-like stream over the raw connection (usage when asked)."""
    usage = b'"include_usage": true' in conn.body or b'"include_usage":true' in conn.body
    events, _ = stream_events(seed, n, usage=usage)
    await conn.send(SSE_HEAD)
    for ev in events:
        await conn.send(chunked(ev))
        await asyncio.sleep(pause_s)
    await conn.send(LAST_CHUNK)


def expected_healthy(seed: int = 1, n: int = 8) -> bytes:
    """What a client of ``healthy`` must receive."""
    events, usage_at = stream_events(seed, n, usage=True)
    return visible_bytes(events, usage_at)


def sse_error_event(kind: str, message: str) -> bytes:
    """A vLLM-style in-stream error event."""
    err = {"object": "error", "message": message, "type": kind, "code": 500}
    return b"data: " + json.dumps({"error": err}).encode() + b"\n\n"

"""What the advisor validations on real engines share: a stream read to its end, the one-stream
decode step that sizes their workloads to the machine."""

from __future__ import annotations

import itertools
import statistics
from typing import Any

import aiohttp

from tests.realbackend.client import Prompts, chat
from tests.realbackend.recorder import RecordedProxy


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
    """One stream alone: its median gap, in seconds (sizes a workload to this machine)."""
    async with aiohttp.ClientSession() as session:
        await read_stream(session, proxy.url, chat(prompts.text(24), 24), rid)
    stamps = proxy.watcher.output_ns[rid]
    return statistics.median(b - a for a, b in itertools.pairwise(stamps)) / 1e9

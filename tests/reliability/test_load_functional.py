"""Load: 1,000 concurrent streams through the real proxy, every byte checked.

The backend (its own process) announces the sha256 of each stream before
sending it, cut at random points so reads split events, characters and CRLFs;
the proxy (its own process, asking for usage and hiding it again) sits in
between; the client here hashes what it receives. Zero bytes altered, zero
failures, and the proxy's request counter equals the requests sent.
"""

from __future__ import annotations

import asyncio
import hashlib
import resource
import time

import aiohttp

from tests.reliability.helpers import CHAT, chat_body
from tests.reliability.procs import parse_metrics, total

STREAMS = 1000
TOKENS = 40
PAUSE_MS = 20


def _raise_fd_limit(want: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = want if hard == resource.RLIM_INFINITY else min(want, hard)
    if soft < target:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


async def _scrape(s: aiohttp.ClientSession, admin_url: str) -> dict[str, float]:
    async with s.get(admin_url + "/metrics") as r:
        return parse_metrics(await r.text())


async def test_thousand_concurrent_streams_arrive_unaltered(load_backend, proxy_process, figures):
    _raise_fd_limit(16384)  # inherited by the proxy started next
    backend = await load_backend()
    p = await proxy_process(backend)
    altered: list[int] = []
    failed: list[str] = []
    received = [0]
    peak_active = [0.0]
    connect = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=60)
    started = time.monotonic()
    async with aiohttp.ClientSession(connector=connect, timeout=timeout) as s:

        async def one(i: int) -> None:
            h = hashlib.sha256()
            try:
                payload = chat_body(seed=i, n=TOKENS, pause_ms=PAUSE_MS, hold=True)
                async with s.post(p.url + CHAT, json=payload) as r:
                    head = b""
                    async for chunk in r.content.iter_any():
                        h.update(chunk)
                        received[0] += len(chunk)
                        head = head or chunk
                    if r.status != 200:
                        failed.append(f"{i}: status {r.status} {head[:120]!r}")
                    elif h.hexdigest() != r.headers["X-Expected-Sha256"]:
                        altered.append(i)
            except (aiohttp.ClientError, TimeoutError) as exc:
                failed.append(f"{i}: {type(exc).__name__} {exc}")

        async def release_when_all_open() -> None:
            # Every stream has its headers and first bytes through the proxy and is
            # held by the backend: all 1,000 are open at once. Then let them finish.
            for _ in range(1200):
                m = await _scrape(s, p.admin_url)
                peak_active[0] = max(peak_active[0], total(m, "tokenstamp_streams_active"))
                if peak_active[0] >= STREAMS or failed:
                    break
                await asyncio.sleep(0.05)
            async with s.post(backend + "/release") as r:
                assert r.status == 200

        await asyncio.gather(release_when_all_open(), *(one(i) for i in range(STREAMS)))
        elapsed = time.monotonic() - started
        m = await _scrape(s, p.admin_url)

    figures.load_streams += STREAMS - len(failed)
    figures.load_bytes += received[0]
    figures.bytes_altered += len(altered)
    figures.measures["load: concurrent streams at peak / wall time"] = (
        f"{peak_active[0]:.0f} / {elapsed:.1f} s"
    )
    assert failed == [], (len(failed), sorted({f.split(": ", 1)[1] for f in failed}))
    assert altered == []
    assert total(m, "tokenstamp_requests_total") == STREAMS
    assert total(m, "tokenstamp_requests_total", tokenstamp_outcome="ok") == STREAMS
    assert total(m, "tokenstamp_decoder_errors_total") == 0
    assert total(m, "tokenstamp_streams_active") == 0
    assert total(m, "gen_ai_server_time_to_first_token_seconds_count") == STREAMS
    assert peak_active[0] == STREAMS, "the streams were not all open at once"

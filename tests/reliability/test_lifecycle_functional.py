"""Lifecycle: SIGTERM with 100 open streams, on the real ``tokenstamp serve`` process.

On SIGTERM: readiness turns false, new connections are refused, the open
streams finish (within the drain timeout) byte for byte, and the process
exits 0. A load balancer needs readiness to go false *before* the listener
closes, or it keeps sending to a closed port for one probe period: that order
is tested with the proposed ``--drain-delay``.
"""

from __future__ import annotations

import asyncio
import hashlib
import signal
import time
from collections.abc import Coroutine
from typing import Any

import aiohttp

from tests.reliability.helpers import CHAT, chat_body
from tests.reliability.procs import parse_metrics, total

OPEN = 100


async def _active(s: aiohttp.ClientSession, admin_url: str) -> float:
    async with s.get(admin_url + "/metrics") as r:
        return total(parse_metrics(await r.text()), "tokenstamp_streams_active")


async def _refused(url: str) -> bool:
    host, port = url.removeprefix("http://").split(":")
    try:
        _, writer = await asyncio.open_connection(host, int(port))
    except ConnectionRefusedError:
        return True
    writer.close()
    return False


async def _open_streams(
    s: aiohttp.ClientSession, url: str, results: list[str]
) -> list[Coroutine[Any, Any, None]]:
    async def one(i: int) -> None:
        h = hashlib.sha256()
        try:
            async with s.post(url + CHAT, json=chat_body(seed=i, n=20, pause_ms=250)) as r:
                async for chunk in r.content.iter_any():
                    h.update(chunk)
                results.append("ok" if h.hexdigest() == r.headers["X-Expected-Sha256"] else "bad")
        except aiohttp.ClientError as exc:
            results.append(type(exc).__name__)

    return [one(i) for i in range(OPEN)]


async def test_sigterm_drains_open_streams_and_exits_zero(load_backend, proxy_process, figures):
    p = await proxy_process(await load_backend(), "--drain-timeout", "20")
    results: list[str] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as s:
        streams = asyncio.gather(*await _open_streams(s, p.url, results))
        for _ in range(200):
            if await _active(s, p.admin_url) == OPEN:
                break
            await asyncio.sleep(0.05)
        assert await _active(s, p.admin_url) == OPEN
        with figures.fault():
            signalled = time.monotonic()
            p.child.proc.send_signal(signal.SIGTERM)
            refused_after = None
            ready_503_after = None
            while refused_after is None or ready_503_after is None:
                now = time.monotonic() - signalled
                assert now < 5, "listener still open or /readyz still 200 after 5 s"
                if refused_after is None and await _refused(p.url):
                    refused_after = now
                if ready_503_after is None:
                    async with s.get(p.admin_url + "/readyz") as r:
                        if r.status == 503 and await r.text() == "draining\n":
                            ready_503_after = time.monotonic() - signalled
                await asyncio.sleep(0.02)
            await streams
            drained_after = time.monotonic() - signalled
            rc = await asyncio.wait_for(p.child.proc.wait(), 25)
            assert results == ["ok"] * OPEN
            assert rc == 0
            assert drained_after < 20
    figures.measures["SIGTERM with 100 open streams: drained in"] = f"{drained_after:.1f} s, exit 0"


async def test_readiness_goes_false_before_the_listener_closes(load_backend, proxy_process):
    p = await proxy_process(await load_backend(), "--drain-delay", "1", "--drain-timeout", "5")
    async with aiohttp.ClientSession() as s:
        p.child.proc.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        not_ready_but_serving = 0
        while time.monotonic() - signalled < 3:
            try:
                async with s.get(p.admin_url + "/readyz") as r:
                    not_ready = r.status == 503
            except aiohttp.ClientError:
                not_ready = True  # the admin listener is gone too: the process is ending
            try:
                async with s.post(p.url + CHAT, json=chat_body(n=2)) as r:
                    served = r.status == 200 and bool(await r.read())
            except aiohttp.ClientError:
                served = False
            if not_ready and served:
                not_ready_but_serving += 1
            if not served:
                break
            await asyncio.sleep(0.02)
        assert not_ready_but_serving >= 5  # about a second of "not ready, still serving"
        assert await _refused(p.url)  # and then the listener closed
    assert await asyncio.wait_for(p.child.proc.wait(), 10) == 0


async def test_kept_alive_connection_is_told_to_close_during_the_drain(load_backend,
                                                                       proxy_process):  # fmt: skip
    p = await proxy_process(await load_backend(), "--drain-timeout", "5")
    kept = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1))
    other = aiohttp.ClientSession()
    async with kept, other:
        async with kept.post(p.url + CHAT, json=chat_body(n=2)) as r:  # opens the connection
            await r.read()

        async def long_stream() -> None:  # keeps the drain going
            async with other.post(p.url + CHAT, json=chat_body(n=8, pause_ms=300)) as r:
                await r.read()

        async with asyncio.TaskGroup() as tg:
            tg.create_task(long_stream())
            await asyncio.sleep(0.3)
            p.child.proc.send_signal(signal.SIGTERM)
            await asyncio.sleep(0.3)
            async with kept.post(p.url + CHAT, json=chat_body(n=2)) as r:  # same connection
                await r.read()
                assert r.headers.get("Connection", "").lower() == "close"
    assert await asyncio.wait_for(p.child.proc.wait(), 10) == 0

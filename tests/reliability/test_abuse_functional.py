"""Abuse: label cardinality, oversized bodies, slowloris, request smuggling, header fidelity.

Clients are not trusted. A flood of distinct model names must not grow the
metrics; a huge body gets 413 without being held in memory; a client that
trickles its request head must be cut off; requests whose framing is
ambiguous are refused (400) and never reach the backend; and the proxy
re-frames what it forwards, so no smuggled second request can ride along.
"""

from __future__ import annotations

import asyncio
import json
import os

import aiohttp
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry

from exporters.prometheus import PrometheusSink
from proxy.config import HostPort, ProxyConfig
from proxy.edge.app import create_app
from tests.conftest import Script
from tests.reliability.helpers import CHAT, outcomes
from tests.reliability.procs import parse_metrics, rss_bytes

MODELS = int(os.environ.get("TOKENSTAMP_ABUSE_MODELS", "10000"))
"""Distinct model names sent (CI: 10,000 in about 8 s; set 100000 for the full run)."""

TENANTS = 10_000
"""Distinct tenant values sent (the issue's bar)."""


def _series(text: str) -> set[str]:
    return {line.rpartition(" ")[0] for line in text.splitlines() if line and line[0] != "#"}


async def test_distinct_model_names_produce_a_bounded_number_of_series(
    upstream, proxy_factory, figures
):
    answer = b'{"id":"x","object":"chat.completion","choices":[]}'
    upstream.script = Script([(0, answer)], content_type="application/json")
    p = await proxy_factory(upstream.url, model_label_limit=5)
    weird = ["x" * 10_000, "a\nb", "\x00", "model\u202eevil", " ", "🦙" * 40]
    sent = 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as s:

        async def one(model: str) -> None:
            payload = {"model": model, "messages": [{"role": "user", "content": "hi"}]}
            async with s.post(p.url + CHAT, json=payload) as r:
                assert r.status == 200
                await r.read()

        async def batch(names: list[str]) -> None:
            sem = asyncio.Semaphore(64)

            async def limited(name: str) -> None:
                async with sem:
                    await one(name)

            await asyncio.gather(*(limited(n) for n in names))

        await batch(weird + [f"model-{i}" for i in range(1000)])
        sent += len(weird) + 1000
        async with s.get(p.admin_url + "/metrics") as r:
            early = _series(await r.text())
        await batch([f"model-{i}" for i in range(1000, MODELS)])
        sent += MODELS - 1000
        async with s.get(p.admin_url + "/metrics") as r:
            text = await r.text()
    late = _series(text)
    figures.bad_inputs += sent
    models = {s.split('gen_ai_request_model="')[1].split('"')[0] for s in late
              if 'gen_ai_request_model="' in s}  # fmt: skip
    # The first 5 acceptable names (requests race, so which ones varies), then "other".
    assert "other" in models
    assert len(models) == 6
    assert all(len(m) <= 128 and m.isprintable() for m in models)
    assert late == early, "series kept growing with new model names"
    assert sum(parse_metrics(text)[k] for k in parse_metrics(text)
               if k.startswith("tokenstamp_requests_total{")) == sent  # fmt: skip
    figures.measures["distinct model names sent / series"] = f"{sent} / {len(late)}"


async def test_distinct_tenants_add_at_most_n_plus_one_label_values(
    upstream, proxy_factory, figures
):
    """10,000 distinct tenant values (``--tenant-header``, ``--max-tenants 20``): the first
    20 and ``other``, never more, and the series stop growing; every request counted."""
    answer = b'{"id":"x","object":"chat.completion","choices":[]}'
    upstream.script = Script([(0, answer)], content_type="application/json")
    p = await proxy_factory(upstream.url, tenant_headers=("x-tenant",), max_tenants=20)
    payload = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as s:
        sem = asyncio.Semaphore(64)

        async def one(tenant: str) -> None:
            async with sem, s.post(p.url + CHAT, json=payload,
                                   headers={"X-Tenant": tenant}) as r:  # fmt: skip
                assert r.status == 200
                await r.read()

        await asyncio.gather(*(one(f"tenant-{i}") for i in range(2000)))
        async with s.get(p.admin_url + "/metrics") as r:
            early = _series(await r.text())
        await asyncio.gather(*(one(f"tenant-{i}") for i in range(2000, TENANTS)))
        async with s.get(p.admin_url + "/metrics") as r:
            text = await r.text()
    late = _series(text)
    tenants = {s.split('tokenstamp_tenant="')[1].split('"')[0] for s in late
               if 'tokenstamp_tenant="' in s}  # fmt: skip
    assert "other" in tenants
    assert len(tenants) == 20 + 1
    assert late == early, "series kept growing with new tenants"
    metrics = parse_metrics(text)
    assert sum(metrics[k] for k in metrics if k.startswith("tokenstamp_requests_total{")) == TENANTS
    assert sum(metrics[k] for k in metrics
               if k.startswith("tokenstamp_tenants_overflow_total")) == TENANTS - 20  # fmt: skip
    figures.bad_inputs += TENANTS
    figures.measures["distinct tenants sent / series"] = f"{TENANTS} / {len(late)}"


async def test_body_over_the_limit_without_length_is_refused_early(
    upstream, proxy_process, figures
):
    p = await proxy_process(upstream.url, "--max-body-bytes", str(1 << 20))
    host, port = p.url.removeprefix("http://").split(":")
    async with aiohttp.ClientSession() as s:  # warm up
        async with s.post(p.url + CHAT, json={"model": "m"}) as r:
            await r.read()
    upstream.requests.clear()
    rss_before = rss_bytes(p.pid)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(f"POST {CHAT} HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\n"
                 "Transfer-Encoding: chunked\r\n\r\n".encode())  # fmt: skip
    piece = b"%x\r\n%s\r\n" % (65536, b"a" * 65536)
    sent = 0

    async def pump() -> None:
        nonlocal sent
        while sent < 256 << 20:
            writer.write(piece)
            await writer.drain()
            sent += 65536

    with figures.fault():
        feeder = asyncio.get_running_loop().create_task(pump())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 20)
        sent_at_answer = sent
        feeder.cancel()
        await asyncio.gather(feeder, return_exceptions=True)
        growth = rss_bytes(p.pid) - rss_before
        writer.transport.abort()
        assert head.startswith(b"HTTP/1.1 413 ")
        assert b"X-Tokenstamp-Error: body_too_large" in head
        assert upstream.requests == []
        assert growth < 16 << 20, f"proxy RSS grew {growth / 2**20:.1f} MiB"
        figures.measures["413: body sent before the answer / proxy RSS growth"] = (
            f"{sent_at_answer / 2**20:.0f} MiB / {growth / 2**20:.1f} MiB (limit 1 MiB)"
        )


async def _trickle_head(host: str, port: int, seconds: float) -> float | None:
    """Send a request head one byte every 0.1 s; seconds until the proxy hung up (or None)."""
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection(host, port)
    start = loop.time()
    head = f"POST {CHAT} HTTP/1.1\r\nHost: p\r\nX-Pad: {'a' * 400}\r\n\r\n".encode()
    try:
        for i in range(len(head)):
            if loop.time() - start > seconds:
                return None
            writer.write(head[i : i + 1])
            await writer.drain()
            try:
                if await asyncio.wait_for(reader.read(1), 0.1) == b"":
                    return loop.time() - start
            except TimeoutError:
                pass
    except ConnectionError:
        return loop.time() - start
    finally:
        writer.transport.abort()
    return None


async def test_keepalive_timeout_cuts_a_slowloris_but_not_a_long_stream(upstream, figures):
    """The mechanism behind the proposed --header-timeout: aiohttp's keepalive_timeout.

    It closes a connection whose handler is idle-waiting for a complete request
    head, counted from the connection's start (trickled bytes do not extend it),
    and never a connection with a request in progress, however long its stream.
    """
    parts = [(0.0, b"data: {}\n\n")] + [(0.1, b'data: {"choices":[]}\n\n')] * 25
    upstream.script = Script(parts)
    cfg = ProxyConfig(upstream=upstream.url, listen=HostPort("127.0.0.1", 0),
                      admin=HostPort("127.0.0.1", 0))  # fmt: skip
    app = create_app(cfg, sink=PrometheusSink(CollectorRegistry()))
    runner = web.AppRunner(app, keepalive_timeout=1.0, handler_cancellation=True)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        with figures.fault():
            cut_after, (status, body) = await asyncio.gather(
                _trickle_head("127.0.0.1", port, seconds=6),
                _long_stream(f"http://127.0.0.1:{port}"),
            )
            assert cut_after is not None, "slowloris not cut off"
            assert cut_after < 3
            assert (status, body) == (200, b"".join(d for _, d in parts))  # 2.5 s, intact
    finally:
        await runner.cleanup()


async def _long_stream(url: str) -> tuple[int, bytes]:
    async with aiohttp.ClientSession() as s:
        async with s.post(url + CHAT, json={"model": "m", "stream": True}) as r:
            return r.status, await r.read()


async def test_slowloris_is_cut_off_by_the_header_timeout(upstream, proxy_factory, figures):
    with figures.fault():
        p = await proxy_factory(upstream.url, header_timeout_s=1.0)
        host, port = p.url.removeprefix("http://").split(":")
        cut_after = await _trickle_head(host, int(port), seconds=5)
        assert cut_after is not None
        assert cut_after < 3


async def test_slow_body_is_cut_off_by_the_body_timeout(upstream, proxy_factory, figures):
    with figures.fault():
        p = await proxy_factory(upstream.url, body_timeout_s=1.0)
        host, port = p.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(f"POST {CHAT} HTTP/1.1\r\nHost: p\r\nContent-Length: 1000\r\n\r\n".encode())
        answer = b""
        try:
            for _ in range(50):  # one byte every 0.1 s: 5 s, far short of 1000 bytes
                writer.write(b"a")
                await writer.drain()
                try:
                    answer = await asyncio.wait_for(reader.read(4096), 0.1)
                except TimeoutError:
                    continue
                break
        except ConnectionError:
            pass
        finally:
            writer.transport.abort()
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert upstream.requests == []


# Requests whose framing is ambiguous or malformed (RFC 9112 sections 6.1-6.3, 5.2):
# aiohttp's parser (llhttp) refuses them with 400 before the handler runs.
SMUGGLING = {
    "cl_and_te": b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 6\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nG",
    "te_and_cl": b"POST /x HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n"
                 b"Content-Length: 3\r\n\r\n8\r\nSMUGGLED\r\n0\r\n\r\n",
    "duplicate_cl_differing": b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\n"
                              b"Content-Length: 5\r\n\r\nabcde",
    "duplicate_cl_equal": b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\n"
                          b"Content-Length: 2\r\n\r\nab",
    "cl_list": b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: 2, 2\r\n\r\nab",
    "cl_plus_sign": b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: +2\r\n\r\nab",
    "cl_negative": b"POST /x HTTP/1.1\r\nHost: p\r\nContent-Length: -1\r\n\r\nab",
    "obs_fold": b"GET /x HTTP/1.1\r\nHost: p\r\nX-A: a\r\n b\r\n\r\n",
    "obs_fold_te": b"POST /x HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: identity\r\n"
                   b" ,chunked\r\n\r\n0\r\n\r\n",
    "te_unknown": b"POST /x HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "te_chunked_not_last": b"POST /x HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked, identity"
                           b"\r\n\r\n0\r\n\r\n",
    "te_duplicate": b"POST /x HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n"
                    b"Transfer-Encoding: identity\r\n\r\n0\r\n\r\n",
    "space_before_colon": b"POST /x HTTP/1.1\r\nHost: p\r\nTransfer-Encoding : chunked\r\n\r\n"
                          b"0\r\n\r\n",
    "bare_lf": b"GET /x HTTP/1.1\nHost: p\n\n",
    "chunk_ext_bare_lf": b"POST /x HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n"
                         b"2;x\nab\r\n0\r\n\r\n",
    "chunk_size_overflow": b"POST /x HTTP/1.1\r\nHost: p\r\nTransfer-Encoding: chunked\r\n\r\n"
                           b"FFFFFFFFFFFFFFFFF1\r\nab\r\n0\r\n\r\n",
    "nul_in_header": b"GET /x HTTP/1.1\r\nHost: p\r\nX-A: a\x00b\r\n\r\n",
    "two_hosts": b"GET /x HTTP/1.1\r\nHost: p\r\nHost: q\r\n\r\n",
    "oversized_header": b"GET /x HTTP/1.1\r\nHost: p\r\nX-A: " + b"a" * 20_000 + b"\r\n\r\n",
    "too_many_headers": b"GET /x HTTP/1.1\r\nHost: p\r\n"
                        + b"".join(b"X-%d: a\r\n" % i for i in range(200)) + b"\r\n",
}  # fmt: skip


async def _exchange(url: str, raw: bytes) -> bytes:
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw)
    await writer.drain()
    got = b""
    try:
        async with asyncio.timeout(3):
            while chunk := await reader.read(65536):
                got += chunk
    except TimeoutError:
        pass  # kept alive: everything that came is in ``got``
    finally:
        writer.transport.abort()
    return got


@pytest.mark.parametrize("name", list(SMUGGLING))
async def test_ambiguous_framing_is_refused_not_forwarded(name, upstream, proxy_factory, figures):
    p = await proxy_factory(upstream.url)
    figures.bad_inputs += 1
    got = await _exchange(p.url, SMUGGLING[name])
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith((b"HTTP/1.0 400 Bad Request\r\n", b"HTTP/1.1 400 "))
    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
    assert len(body) == length  # one answer, and nothing after it (no smuggled second one)
    assert upstream.requests == []
    assert outcomes(p) == []


async def test_valid_but_unusual_framing_is_reframed_on_the_way_up(upstream, proxy_factory):
    """What the parser accepts is forwarded with the proxy's own framing, one for one."""
    upstream.script = Script([(0, b"ok")], content_type="text/plain")
    p = await proxy_factory(upstream.url)
    raw = (
        b"POST /a HTTP/1.1\r\nHost: p\r\nTransfer-Encoding:\tchunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n"
        b"POST /b HTTP/1.1\r\nHost: p\r\nContent-Length: 2\r\n\r\nxy"
        b"GET /c HTTP/1.1\r\nHost: p\r\nConnection: close\r\n\r\n"
    )
    got = await _exchange(p.url, raw)
    assert got.count(b"HTTP/1.1 200 OK") == 3
    seen = [(r["method"], r["path"], r["body"], {k.lower() for k in r["headers"]})
            for r in upstream.requests]  # fmt: skip
    assert [s[:3] for s in seen] == [("POST", "/a", b"abc"), ("POST", "/b", b"xy"),
                                     ("GET", "/c", b"")]  # fmt: skip
    for _, _, _body, names in seen:
        assert "transfer-encoding" not in names
    assert json.dumps(upstream.requests[0]["headers"]).count("Content-Length") == 1


async def test_forwarded_request_carries_no_header_the_client_did_not_send(upstream,
                                                                           proxy_factory):  # fmt: skip
    upstream.script = Script([(0, b"ok")], content_type="text/plain")
    p = await proxy_factory(upstream.url)
    await _exchange(p.url, b"POST /v1/embeddings HTTP/1.1\r\nHost: p\r\nX-Client: 1\r\n"
                           b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")  # fmt: skip
    names = {k.lower() for k in upstream.requests[0]["headers"]}
    assert names == {"host", "content-length", "x-client", "x-forwarded-for",
                     "x-forwarded-proto"}  # fmt: skip

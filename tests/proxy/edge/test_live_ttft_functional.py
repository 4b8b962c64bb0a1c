"""TTFT is observed live, at the first output event, once per request whatever its end.

A scripted upstream sends the first token and then holds the stream open: the
TTFT must already be in ``/metrics`` (scraped over HTTP and by a real
Prometheus) and equal what the client measured. Then every outcome after a
first token (ok, client disconnect, upstream error, timeout) counts exactly
one TTFT, and a request without output counts none. Also here, from the same
scripted streams: tokens per output event, and the engine's own timings
(vLLM ``metrics``, SGLang ``meta_info``) turned into the queue-time and
acceptance-length histograms.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import aiohttp
import pytest
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from exporters import names
from proxy.edge.server import RunningProxy
from tests.promserver import PrometheusServer
from tests.proxy.edge.test_app_functional import LABELS, body, chat_chunk, sse

CHAT = "/v1/chat/completions"
PREFILL_S = 0.15
TTFT_AGREEMENT_S = 0.005  # client's TTFT minus the proxy's: request upload + one write, loopback
TTFT = names.TTFT.prom_name


def _ttft_count(p: RunningProxy) -> float:
    return p.registry.get_sample_value(TTFT + "_count", LABELS) or 0.0


def _outcomes(p: RunningProxy) -> dict[str, float]:
    """Finished requests by outcome (status class and error type summed)."""
    out: dict[str, float] = {}
    for family in p.registry.collect():
        for s in family.samples:
            if s.name == "tokenstamp_requests_total":
                o = s.labels["tokenstamp_outcome"]
                out[o] = out.get(o, 0.0) + s.value
    return out


async def _scrape_ttft(p: RunningProxy) -> tuple[float, float]:
    """TTFT ``_count`` and ``_sum`` as ``GET /metrics`` on the admin port exposes them."""
    async with aiohttp.ClientSession() as s, s.get(p.admin_url + "/metrics") as r:
        text = await r.text()
    got = {"count": 0.0, "sum": 0.0}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in (TTFT + "_count", TTFT + "_sum"):
                got[sample.name.rsplit("_", 1)[1]] += sample.value
    return got["count"], got["sum"]


class HeldStream:
    """An upstream that sends a role chunk, the first token after ``PREFILL_S``, then waits.

    ``release`` lets it finish: the remaining tokens, a usage chunk, ``[DONE]``.
    ``after_first`` (when given) replaces the waiting: it ends the stream its own way.
    """

    def __init__(
        self,
        after_first: Callable[[web.Request, web.StreamResponse], Awaitable[None]] | None = None,
    ) -> None:
        self.release = asyncio.Event()
        self.after_first = after_first

    async def __call__(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chat_chunk("", role=True))
        await asyncio.sleep(PREFILL_S)
        await resp.write(chat_chunk("t0"))
        if self.after_first is not None:
            await self.after_first(request, resp)
            return resp
        await self.release.wait()
        for i in range(1, 4):
            await resp.write(chat_chunk(f"t{i}", finish="stop" if i == 3 else None))
        usage = {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
        await resp.write(sse({"id": "chatcmpl-1", "choices": [], "usage": usage}))
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp


async def _server(aiohttp_server, handler) -> str:
    async def handle(request: web.Request) -> web.StreamResponse:
        return await handler(request)

    app = web.Application()
    app.router.add_post(CHAT, handle)
    server = await aiohttp_server(app)
    return str(server.make_url("")).rstrip("/")


async def _read_first_token(r: aiohttp.ClientResponse, sent_s: float) -> tuple[float, bytes]:
    """Read until the first token's bytes arrived; the client's TTFT and what it read."""
    got = b""
    while b'"t0"' not in got:
        chunk = await r.content.readany()
        assert chunk, got
        got += chunk
    return time.perf_counter() - sent_s, got


async def test_ttft_is_in_metrics_while_the_stream_decodes(aiohttp_server, proxy_factory):
    held = HeldStream()
    p = await proxy_factory(await _server(aiohttp_server, held))
    async with aiohttp.ClientSession() as s:
        await (await s.get(p.url + "/v1/models")).read()  # a pooled client connection
        sent_s = time.perf_counter()
        async with s.post(p.url + CHAT, json=body()) as r:
            client_ttft_s, _ = await _read_first_token(r, sent_s)
            # The stream is still open: the upstream waits for the release.
            count, total_s = await _scrape_ttft(p)
            assert count == 1
            assert total_s == pytest.approx(PREFILL_S, abs=0.05)
            assert client_ttft_s - TTFT_AGREEMENT_S <= total_s <= client_ttft_s
            assert p.registry.get_sample_value("tokenstamp_requests_total", {
                **LABELS, "tokenstamp_outcome": "ok", "http_response_status_code": "2xx",
                "error_type": ""}) is None  # fmt: skip
            held.release.set()
            await r.read()
    for _ in range(100):
        if _outcomes(p):
            break
        await asyncio.sleep(0.01)
    assert _outcomes(p) == {"ok": 1.0}
    assert _ttft_count(p) == 1  # not observed a second time at the end
    # The prefix-cache split is observed at the end, with the same TTFT.
    cache = p.registry.get_sample_value(
        names.PREFIX_CACHE_TTFT.prom_name + "_sum", {**LABELS, "tokenstamp_prefix_cache": "unknown"}
    )
    assert cache == p.registry.get_sample_value(TTFT + "_sum", LABELS)


@pytest.mark.prometheus
@pytest.mark.timeout(60)
async def test_prometheus_has_the_ttft_before_the_stream_ends(aiohttp_server, proxy_factory):
    held = HeldStream()
    p = await proxy_factory(await _server(aiohttp_server, held))
    target = p.admin_url.removeprefix("http://")
    async with PrometheusServer({"tokenstamp": [target]}) as prom:
        await prom.scraped("tokenstamp")
        async with aiohttp.ClientSession() as s, s.post(p.url + CHAT, json=body()) as r:
            await _read_first_token(r, time.perf_counter())
            count = f'sum({TTFT}_count{{job="tokenstamp"}})'
            await prom.wait_for(count, lambda res: res and float(res[0]["value"][1]) == 1)
            active = await prom.query('sum(tokenstamp_streams_active{job="tokenstamp"})')
            assert float(active[0]["value"][1]) == 1  # Prometheus saw it mid-stream
            ttft = await prom.query(f'sum({TTFT}_sum{{job="tokenstamp"}})')
            assert float(ttft[0]["value"][1]) == pytest.approx(PREFILL_S, abs=0.05)
            held.release.set()
            await r.read()


async def _cut(request: web.Request, resp: web.StreamResponse) -> None:
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.close()  # mid-body: the chunked response never completes


async def _silent(request: web.Request, resp: web.StreamResponse) -> None:
    await asyncio.sleep(5)  # far beyond read_timeout_s


@pytest.mark.parametrize(
    ("after_first", "outcome", "client_leaves"),
    [
        (None, "ok", False),
        (None, "client_disconnect", True),
        (_cut, "upstream_error", False),
        (_silent, "timeout", False),
    ],
    ids=["ok", "client_disconnect", "upstream_error", "timeout"],
)
async def test_one_ttft_per_request_whatever_the_outcome(
    aiohttp_server, proxy_factory, after_first, outcome, client_leaves
):
    held = HeldStream(after_first)
    p = await proxy_factory(await _server(aiohttp_server, held), read_timeout_s=0.4)
    async with aiohttp.ClientSession() as s:
        r = await s.post(p.url + CHAT, json=body())
        await _read_first_token(r, time.perf_counter())
        assert _ttft_count(p) == 1  # live, before any end
        if client_leaves:
            r.close()
        else:
            held.release.set()
            # The proxy aborts a stream whose upstream failed.
            with contextlib.suppress(aiohttp.ClientPayloadError):
                await r.read()
            r.close()
    for _ in range(300):
        if _outcomes(p):
            break
        await asyncio.sleep(0.01)
    assert _outcomes(p) == {outcome: 1.0}
    assert _ttft_count(p) == 1
    assert p.registry.get_sample_value(TTFT + "_sum", LABELS) == pytest.approx(PREFILL_S, abs=0.05)


async def _role_then_done(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(chat_chunk("", role=True))
    await resp.write(chat_chunk("", finish="stop"))
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _role_then_cut(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(chat_chunk("", role=True))
    await asyncio.sleep(0.05)
    assert request.transport is not None
    request.transport.close()
    return resp


async def _error_status(request: web.Request) -> web.StreamResponse:
    return web.json_response({"error": {"type": "BadRequestError"}}, status=400)


async def _non_streaming(request: web.Request) -> web.StreamResponse:
    return web.json_response({
        "id": "c", "model": "m", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    })  # fmt: skip


@pytest.mark.parametrize(
    ("handler", "stream", "outcome"),
    [
        (_role_then_done, True, "ok"),
        (_role_then_cut, True, "upstream_error"),
        (_error_status, True, "ok"),
        (_non_streaming, False, "ok"),
    ],
    ids=["no_output", "cut_before_output", "error_status", "not_streamed"],
)
async def test_no_ttft_for_a_request_without_output(
    aiohttp_server, proxy_factory, handler, stream, outcome
):
    p = await proxy_factory(await _server(aiohttp_server, handler))
    async with aiohttp.ClientSession() as s, s.post(p.url + CHAT, json=body(stream=stream)) as r:
        with contextlib.suppress(aiohttp.ClientPayloadError):
            await r.read()
    for _ in range(100):
        if _outcomes(p):
            break
        await asyncio.sleep(0.01)
    assert _outcomes(p) == {outcome: 1.0}
    assert p.registry.get_sample_value(TTFT + "_count", LABELS) is None
    cache_ttft = names.PREFIX_CACHE_TTFT.prom_name + "_count"
    assert not any(s.name == cache_ttft for family in p.registry.collect() for s in family.samples)

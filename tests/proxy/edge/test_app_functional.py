"""The proxy over real sockets: exact bytes, recorded values, errors, disconnects."""

from __future__ import annotations

import asyncio
import json
import socket

import aiohttp
import pytest
from aiohttp import web

from proxy.core.labels import ERROR_KIND_LIMIT, ERROR_OTHER
from tests.conftest import Script

LABELS = {
    "gen_ai_operation_name": "chat",
    "gen_ai_provider_name": "vllm",
    "gen_ai_request_model": "m",
    "server_address": "test-backend",
}


def sse(obj: object) -> bytes:
    return b"data: " + (obj if isinstance(obj, bytes) else json.dumps(obj).encode()) + b"\n\n"


def chat_chunk(content: str | None, *, role: bool = False, finish: str | None = None) -> bytes:
    delta: dict[str, str] = {}
    if role:
        delta["role"] = "assistant"
    if content is not None:
        delta["content"] = content
    return sse(
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "model": "m",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        }
    )


USAGE = sse(
    {
        "id": "chatcmpl-1",
        "choices": [],
        "usage": {
            "prompt_tokens": 11,
            "completion_tokens": 4,
            "total_tokens": 15,
            "prompt_tokens_details": {"cached_tokens": 8},
        },
    }
)


def vllm_like(delays: list[float], *, usage: bool) -> list[tuple[float, bytes]]:
    """Role chunk, content tokens after the given delays, finish on the last, [DONE]."""
    parts = [(0.0, chat_chunk("", role=True))]
    for i, d in enumerate(delays):
        last = i == len(delays) - 1
        parts.append((d, chat_chunk(f"t{i}", finish="length" if last else None)))
    if usage:
        parts.append((0.0, USAGE))
    parts.append((0.0, b"data: [DONE]\n\n"))
    return parts


def body(stream: bool = True, **extra: object) -> dict[str, object]:
    return {
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "stream": stream,
        **extra,
    }


def sample(proxy, name: str, **labels: str) -> float | None:
    return proxy.registry.get_sample_value(name, {**LABELS, **labels})


async def post(url: str, payload: object, **kw: object) -> tuple[int, bytes, dict[str, str]]:
    async with aiohttp.ClientSession(auto_decompress=False) as s:
        async with s.post(url, json=payload, **kw) as r:
            return r.status, await r.read(), dict(r.headers)


async def test_stream_bytes_exact_and_timing_recorded(upstream, proxy_factory):
    delays = [0.20, 0.05, 0.05, 0.30]
    upstream.script = Script(vllm_like(delays, usage=True))
    p = await proxy_factory(upstream.url, slo_tpot_s=0.2)
    status, got, headers = await post(p.url + "/v1/chat/completions", body())
    # The proxy asked for usage; the client sees the stream it would have seen.
    expected = b"".join(d for _, d in vllm_like(delays, usage=False))
    assert status == 200
    assert got == expected
    assert headers["X-Accel-Buffering"] == "no"
    sent = json.loads(upstream.requests[0]["body"])
    assert sent["stream_options"] == {"include_usage": True}

    ttft_sum = sample(p, "gen_ai_server_time_to_first_token_seconds_sum")
    assert ttft_sum == pytest.approx(0.20, abs=0.05)
    cache_ttft = "tokenstamp_prefix_cache_time_to_first_token_seconds_sum"
    assert sample(p, cache_ttft, tokenstamp_prefix_cache="hit") == ttft_sum
    # One token per chunk: completion tokens (4) / output events (4).
    assert sample(p, "tokenstamp_stream_tokens_per_event_sum") == 1.0
    assert sample(p, "tokenstamp_stream_tokens_per_event_count") == 1
    gap = "gen_ai_client_operation_time_per_output_chunk_seconds"
    assert sample(p, gap + "_count") == 3
    assert sample(p, gap + "_sum") == pytest.approx(0.40, abs=0.06)
    assert sample(p, gap + "_bucket", le="0.1") == 2  # the two 50 ms gaps
    assert sample(p, "tokenstamp_stream_max_gap_seconds_sum") == pytest.approx(0.30, abs=0.05)
    # TPOT = (t_last - t1) / (n_out - 1) with n_out = usage.completion_tokens = 4
    tpot = sample(p, "gen_ai_server_time_per_output_token_seconds_sum")
    assert tpot == pytest.approx(0.40 / 3, abs=0.03)
    tokens = "gen_ai_client_token_usage_sum"
    assert sample(p, tokens, gen_ai_token_type="input") == 11
    assert sample(p, tokens, gen_ai_token_type="output") == 4
    ok = sample(
        p,
        "tokenstamp_requests_total",
        tokenstamp_outcome="ok",
        http_response_status_code="2xx",
        error_type="",
    )
    assert ok == 1
    assert sample(p, "tokenstamp_streams_active") == 0
    assert sample(p, "tokenstamp_requests_slo_total", tokenstamp_slo="met",
                  tokenstamp_slo_source="default") == 1  # fmt: skip


async def test_usual_tokens_recognised_by_shape_count_as_the_parse_would(upstream, proxy_factory):
    """After the first plain token the relay recognises the next by their bytes
    (``proxy.core.decoders.shape``); escapes, an empty delta, a malformed twin and the
    finish still take the general path: counts and bytes are what decoding gives."""
    contents = ["a", "b", r"say \"hi\"", "c", r"line\n", "", "d", "e"]
    parts = [(0.0, chat_chunk("", role=True))]
    for i, c in enumerate(contents):
        raw = (
            b'data: {"id":"chatcmpl-1","model":"m","created":%d,"choices":[{"index":0,'
            b'"delta":{"content":"%s"},"finish_reason":null}]}\n\n' % (1700000000 + i, c.encode())
        )
        parts.append((0.01, raw))
    # Shaped like a plain token, but not JSON: counted, never timed.
    plain = parts[-1][1]
    parts.append((0.01, plain.replace(b'"index"', b"'index'")))
    parts.append((0.01, plain.replace(b'"content":"e"', b'"content":"e"e"')))
    parts.append((0.01, chat_chunk("", finish="stop")))
    parts.append((0.0, USAGE))
    parts.append((0.0, b"data: [DONE]\n\n"))
    upstream.script = Script(parts)
    p = await proxy_factory(upstream.url)
    status, got, _ = await post(p.url + "/v1/chat/completions", body())
    assert status == 200
    assert got == b"".join(d for _, d in parts if d != USAGE)
    outputs = sum(1 for c in contents if c)
    gap = "gen_ai_client_operation_time_per_output_chunk_seconds"
    assert sample(p, gap + "_count") == outputs - 1
    errors = {
        s.labels["error_type"]: s.value
        for m in p.registry.collect() if m.name == "tokenstamp_decoder_errors"
        for s in m.samples if s.name == "tokenstamp_decoder_errors_total"
    }  # fmt: skip
    assert errors == {"invalid_json": 2}
    assert sample(p, "gen_ai_client_token_usage_sum", gen_ai_token_type="output") == 4


async def test_client_choice_of_usage_is_respected(upstream, proxy_factory):
    upstream.script = Script(vllm_like([0.01, 0.01], usage=True))
    p = await proxy_factory(upstream.url)
    payload = body(stream_options={"include_usage": True})
    _status, got, _ = await post(p.url + "/v1/chat/completions", payload)
    assert got == b"".join(d for _, d in vllm_like([0.01, 0.01], usage=True))
    assert upstream.requests[0]["body"] == json.dumps(payload).encode()


async def test_injection_can_be_switched_off(upstream, proxy_factory):
    upstream.script = Script(vllm_like([0.01, 0.01], usage=False))
    p = await proxy_factory(upstream.url, inject_usage=False)
    payload = body()
    await post(p.url + "/v1/chat/completions", payload)
    assert upstream.requests[0]["body"] == json.dumps(payload).encode()
    # Without usage, n_out falls back to the count of output events.
    assert sample(p, "gen_ai_client_token_usage_count", gen_ai_token_type="output") is None
    assert sample(p, "gen_ai_server_time_per_output_token_seconds_count") == 1


async def test_upstream_refusing_stream_options_gets_the_original_request(upstream, proxy_factory):
    calls = []

    async def picky(request: web.Request) -> web.StreamResponse:
        payload = await request.json()
        calls.append(payload)
        if "stream_options" in payload:
            return web.json_response({"error": "unknown field stream_options"}, status=422)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for _, d in vllm_like([0.01], usage=False):
            await resp.write(d)
        return resp

    upstream.handler = picky
    p = await proxy_factory(upstream.url)
    status, got, _ = await post(p.url + "/v1/chat/completions", body())
    assert status == 200
    assert got == b"".join(d for _, d in vllm_like([0.01], usage=False))
    assert [("stream_options" in c) for c in calls] == [True, False]
    await post(p.url + "/v1/chat/completions", body())
    assert "stream_options" not in calls[-1]  # remembered: injection off for this backend


async def test_completions_route_and_text_output(upstream, proxy_factory):
    chunks = [
        sse({"id": "cmpl-1", "object": "text_completion", "model": "m",
             "choices": [{"index": 0, "text": "a", "finish_reason": None}]}),
        sse({"id": "cmpl-1", "object": "text_completion", "model": "m",
             "choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}),
        b"data: [DONE]\n\n",
    ]  # fmt: skip
    upstream.script = Script([(0.05, chunks[0]), (0.05, chunks[1]), (0, chunks[2])])
    p = await proxy_factory(upstream.url, inject_usage=False)
    _status, got, _ = await post(
        p.url + "/v1/completions", {"model": "m", "prompt": "x", "stream": True}
    )
    assert got == b"".join(chunks)
    labels = {**LABELS, "gen_ai_operation_name": "text_completion"}
    assert (
        p.registry.get_sample_value(
            "gen_ai_client_operation_time_per_output_chunk_seconds_count", labels
        )
        == 1
    )


async def test_non_streaming_usage_and_duration(upstream, proxy_factory):
    answer = json.dumps({
        "id": "chatcmpl-9", "object": "chat.completion", "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"},
                     "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6},
    }).encode()  # fmt: skip
    upstream.script = Script([(0.1, answer)], content_type="application/json")
    p = await proxy_factory(upstream.url)
    status, got, _headers = await post(p.url + "/v1/chat/completions", body(stream=False))
    assert (status, got) == (200, answer)
    assert "stream_options" not in json.loads(upstream.requests[0]["body"])
    assert sample(p, "gen_ai_client_token_usage_sum", gen_ai_token_type="input") == 5
    assert sample(p, "gen_ai_server_request_duration_seconds_sum", error_type="") >= 0.1
    assert sample(p, "gen_ai_server_time_to_first_token_seconds_count") is None
    assert sample(p, "tokenstamp_prefix_cache_time_to_first_token_seconds_count",
                  tokenstamp_prefix_cache="unknown") is None  # fmt: skip
    assert sample(p, "tokenstamp_stream_tokens_per_event_count") is None


async def test_other_routes_forwarded_with_headers_and_query(upstream, proxy_factory):
    upstream.script = Script([(0, b'{"data":[]}')], content_type="application/json",
                             headers={"X-Upstream": "yes"})  # fmt: skip
    p = await proxy_factory(upstream.url)
    async with aiohttp.ClientSession() as s, s.get(
        p.url + "/v1/models?x=1&y=%20",
        headers={"Authorization": "Bearer sk-secret", "Connection": "keep-alive, X-Hop",
                 "X-Hop": "drop-me", "Keep-Alive": "timeout=5", "X-Custom": "kept"},
    ) as r:  # fmt: skip
        assert r.status == 200
        assert await r.read() == b'{"data":[]}'
        assert r.headers["X-Upstream"] == "yes"
    seen = upstream.requests[0]
    assert seen["method"] == "GET"
    assert seen["path"] == "/v1/models?x=1&y=%20"
    h = {k.lower(): v for k, v in seen["headers"].items()}
    assert h["authorization"] == "Bearer sk-secret"
    assert h["x-custom"] == "kept"
    assert "x-hop" not in h
    assert "keep-alive" not in h
    assert h["x-forwarded-for"] == "127.0.0.1"
    assert h["x-forwarded-proto"] == "http"
    assert h["host"] == upstream.url.removeprefix("http://")


async def test_upstream_error_status_and_body_passed_through(upstream, proxy_factory):
    err = b'{"object":"error","message":"too long","type":"BadRequestError","code":400}'
    upstream.script = Script([(0, err)], status=400, content_type="application/json")
    p = await proxy_factory(upstream.url, inject_usage=False)
    status, got, _ = await post(p.url + "/v1/chat/completions", body())
    assert (status, got) == (400, err)
    assert sample(p, "tokenstamp_requests_total", tokenstamp_outcome="ok",
                  http_response_status_code="4xx", error_type="400") == 1  # fmt: skip


async def test_body_over_limit_is_413_with_reason(upstream, proxy_factory):
    p = await proxy_factory(upstream.url, max_body_bytes=1000)
    status, got, _ = await post(p.url + "/v1/chat/completions", body(pad="x" * 2000))
    assert status == 413
    assert b"--max-body-bytes" in got
    assert upstream.requests == []
    # The body was never read, so the model is unknown.
    assert sample(p, "tokenstamp_requests_total", tokenstamp_outcome="rejected",
                  http_response_status_code="4xx", error_type="body_too_large",
                  gen_ai_request_model="unknown") == 1  # fmt: skip


async def test_body_that_is_not_json_is_forwarded_and_counted(upstream, proxy_factory):
    upstream.script = Script([(0, b"whatever")], content_type="text/plain")
    p = await proxy_factory(upstream.url)
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/chat/completions", data=b"not json{") as r:
            assert await r.read() == b"whatever"
    assert upstream.requests[0]["body"] == b"not json{"
    assert p.registry.get_sample_value(
        "tokenstamp_requests_unobserved_total",
        {"gen_ai_provider_name": "vllm", "server_address": "test-backend",
         "tokenstamp_reason": "body_not_json"},
    ) == 1  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_unreachable_upstream_is_502_json(proxy_factory):
    p = await proxy_factory(f"http://127.0.0.1:{free_port()}")
    status, got, _headers = await post(p.url + "/v1/chat/completions", body())
    assert status == 502
    err = json.loads(got)["error"]
    assert err["type"] == "upstream_unreachable"
    assert sample(p, "tokenstamp_requests_total", tokenstamp_outcome="upstream_error",
                  http_response_status_code="5xx", error_type="ClientConnectorError") == 1  # fmt: skip


async def test_silent_upstream_is_504(upstream, proxy_factory):
    upstream.script = Script([(2.0, b"late")], content_type="text/plain")

    async def slow(request: web.Request) -> web.StreamResponse:
        await asyncio.sleep(2.0)
        return web.Response(text="late")

    upstream.handler = slow
    p = await proxy_factory(upstream.url, read_timeout_s=0.3)
    status, got, _ = await post(p.url + "/v1/chat/completions", body())
    assert status == 504
    assert json.loads(got)["error"]["type"] == "upstream_timeout"


async def test_read_timeout_on_a_reused_connection_counts_from_that_request(
    upstream, proxy_factory
):
    """--read-timeout for the head counts from each request, on a pooled connection too:
    a head 0.7 s late is in time though the connection's previous request began 1.2 s
    before it; a head later than the timeout is a 504."""
    delays = [0.0, 0.7, 3.0]
    ports: list[int] = []

    async def late(request: web.Request) -> web.StreamResponse:
        assert request.transport is not None
        ports.append(request.transport.get_extra_info("peername")[1])
        await asyncio.sleep(delays[len(ports) - 1])
        return web.Response(text="ok", content_type="application/json")

    upstream.handler = late
    p = await proxy_factory(upstream.url, read_timeout_s=1.0)
    status, _, _ = await post(p.url + "/v1/chat/completions", body(stream=False))
    assert status == 200
    await asyncio.sleep(0.5)
    status, _, _ = await post(p.url + "/v1/chat/completions", body(stream=False))
    assert status == 200
    status, got, _ = await post(p.url + "/v1/chat/completions", body(stream=False))
    assert status == 504
    assert json.loads(got)["error"]["type"] == "upstream_timeout"
    assert len(ports) == 3
    assert len(set(ports)) == 1  # one pooled connection throughout


async def test_upstream_dying_mid_stream_cuts_the_client(upstream, proxy_factory):
    first = chat_chunk("", role=True) + chat_chunk("a")

    async def dies(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(first)
        await asyncio.sleep(0.05)
        assert request.transport is not None
        request.transport.close()  # no terminating chunk
        return resp

    upstream.handler = dies
    p = await proxy_factory(upstream.url, inject_usage=False)
    received = bytearray()
    async with aiohttp.ClientSession() as s:
        async with s.post(p.url + "/v1/chat/completions", json=body()) as r:
            with pytest.raises(aiohttp.ClientPayloadError):
                async for chunk in r.content.iter_any():
                    received += chunk
    assert bytes(received) == first
    await asyncio.sleep(0.05)
    counted = [
        s.labels for m in p.registry.collect() if m.name == "tokenstamp_requests"
        for s in m.samples if s.name == "tokenstamp_requests_total"
    ]  # fmt: skip
    assert [c["tokenstamp_outcome"] for c in counted] == ["upstream_error"]


async def test_upstream_error_types_are_bounded_in_number(upstream, proxy_factory):
    """A backend inventing a new error type per request cannot grow the series without end."""
    served = 0

    async def new_kind_each_time(request: web.Request) -> web.StreamResponse:
        nonlocal served
        served += 1
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(chat_chunk("a") + sse({"error": {"type": f"kind_{served}"}}))
        await resp.write(b"data: [DONE]\n\n")
        return resp

    upstream.handler = new_kind_each_time
    p = await proxy_factory(upstream.url, inject_usage=False)
    sent: list[bytes] = []
    for _ in range(ERROR_KIND_LIMIT + 8):
        status, got, _ = await post(p.url + "/v1/chat/completions", body())
        assert status == 200
        sent.append(got)
    # Every byte still reaches the client, the 40th error like the first.
    assert sent[-1].endswith(
        sse({"error": {"type": f"kind_{ERROR_KIND_LIMIT + 8}"}}) + b"data: [DONE]\n\n"
    )
    await asyncio.sleep(0.05)
    kinds = {
        s.labels["error_type"] for m in p.registry.collect() if m.name == "tokenstamp_requests"
        for s in m.samples if s.name == "tokenstamp_requests_total"
    }  # fmt: skip
    assert kinds == {f"kind_{i}" for i in range(1, ERROR_KIND_LIMIT + 1)} | {ERROR_OTHER}
    assert sample(p, "tokenstamp_requests_total", tokenstamp_outcome="upstream_error",
                  http_response_status_code="2xx", error_type=ERROR_OTHER) == 8  # fmt: skip


async def test_client_disconnect_closes_upstream_quickly(upstream, proxy_factory):
    parts = vllm_like([0.05] + [0.05] * 100, usage=False)
    upstream.script = Script(parts)
    p = await proxy_factory(upstream.url, inject_usage=False)
    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession() as s:
        r = await s.post(p.url + "/v1/chat/completions", json=body())
        await r.content.readany()
        await asyncio.sleep(0.1)
        r.close()  # client goes away mid-stream
        gone_at = loop.time()
    for _ in range(40):
        if upstream.closed:
            break
        await asyncio.sleep(0.01)
    assert upstream.closed, "upstream request was not closed"
    assert upstream.closed[0] - gone_at < 0.1
    await asyncio.sleep(0.05)
    outcomes = [
        s.labels for m in p.registry.collect() if m.name == "tokenstamp_requests"
        for s in m.samples if s.name == "tokenstamp_requests_total"
    ]  # fmt: skip
    assert [(o["tokenstamp_outcome"], o["http_response_status_code"]) for o in outcomes] == [
        ("client_disconnect", "2xx")
    ]
    assert sample(p, "tokenstamp_streams_active") == 0


async def test_slow_client_backpressure_keeps_memory_bounded(upstream, proxy_factory):
    # 48 MiB in 64 KiB pieces; the client stops reading. The upstream may only get
    # ahead of the client by the kernel's socket buffers (two loopback sockets,
    # a few MiB each), never by the whole body.
    piece = b"x" * 65536
    written: list[int] = []

    async def big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        for i in range(768):
            await resp.write(piece)
            written.append(i)
        return resp

    upstream.handler = big
    p = await proxy_factory(upstream.url)
    async with aiohttp.ClientSession() as s, s.get(p.url + "/big", read_bufsize=65536) as r:
        got = await r.content.read(65536)
        await asyncio.sleep(0.5)
        ahead = len(written) * 65536 - len(got)
        rest = await r.read()
    assert len(got) + len(rest) == 768 * 65536
    assert ahead < 24 * 1024 * 1024, f"upstream ran {ahead} bytes ahead of a stalled client"


async def test_a_client_pausing_longer_than_the_read_timeout_is_not_cut(upstream, proxy_factory):
    """--read-timeout is about the upstream's silence: a client that stops reading for a
    while (the proxy waits on its socket, not on the upstream) still gets every byte."""
    piece = b"y" * 65536

    async def big(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        await resp.prepare(request)
        for _ in range(256):  # 16 MiB: far more than the sockets between them hold
            await resp.write(piece)
        return resp

    upstream.handler = big
    p = await proxy_factory(upstream.url, read_timeout_s=0.2)
    async with aiohttp.ClientSession() as s, s.get(p.url + "/big", read_bufsize=65536) as r:
        got = await r.content.read(65536)
        await asyncio.sleep(1.0)  # 5x the read timeout
        rest = await r.read()
    assert len(got) + len(rest) == 256 * 65536


async def test_metrics_and_health_endpoints(upstream, proxy_factory):
    p = await proxy_factory(upstream.url)
    async with aiohttp.ClientSession() as s:
        async with s.get(p.admin_url + "/healthz") as r:
            assert r.status == 200
        async with s.get(p.admin_url + "/readyz") as r:
            assert r.status == 200
        async with s.get(p.admin_url + "/metrics") as r:
            assert r.headers["Content-Type"].startswith("text/plain")
            assert "gen_ai_server_time_to_first_token_seconds" in await r.text()
        async with s.get(
            p.admin_url + "/metrics", headers={"Accept": "application/openmetrics-text"}
        ) as r:
            assert r.headers["Content-Type"].startswith("application/openmetrics-text")
            assert (await r.text()).endswith("# EOF\n")


async def test_readyz_false_when_upstream_down_or_draining(proxy_factory, upstream):
    p = await proxy_factory(f"http://127.0.0.1:{free_port()}")
    async with aiohttp.ClientSession() as s, s.get(p.admin_url + "/readyz") as r:
        assert r.status == 503
    q = await proxy_factory(upstream.url)
    q.state.draining = True
    async with aiohttp.ClientSession() as s, s.get(q.admin_url + "/readyz") as r:
        assert (r.status, await r.text()) == (503, "draining\n")

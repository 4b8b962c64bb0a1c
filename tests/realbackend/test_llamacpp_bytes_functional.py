"""llama.cpp's server behind tokenstamp: the client gets the server's bytes.

Two comparisons. Same request: a tee between the proxy and llama.cpp keeps
the bytes the proxy read, and the client's bytes must equal them (minus the
usage chunk the proxy itself asked for). Same question, asked directly and
through the proxy (greedy, ``cache_prompt`` off so both compute alike): equal
after normalising what differs per request (``id``, ``created``, the values
of llama.cpp's ``timings``).
"""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest

from tests.realbackend.client import Capture, Prompts, chat, session, stream
from tests.realbackend.llamacpp_server import LlamaCppServer
from tests.realbackend.recorder import ProxyFactory
from tests.realbackend.tee import HttpResponse, TcpTee

pytestmark = [pytest.mark.realbackend, pytest.mark.timeout(120)]

TOKENS = 24


async def settle() -> None:
    """Let a streamed response's connection close before the next request.

    llama.cpp closes the connection after every streamed response although it
    announced keep-alive; a request sent at once may get that dead pooled
    connection and a 502 (``test_llamacpp_quirks_functional`` shows it).
    """
    await asyncio.sleep(0.2)


def normalise(body: bytes) -> bytes:
    """Blank what differs between two runs of one greedy request."""
    body = re.sub(rb'"id":"[^"]*"', b'"id":"-"', body)
    body = re.sub(rb'"created":\d+', b'"created":0', body)
    return re.sub(rb'"timings":\{[^{}]*\}', b'"timings":{}', body)


def split_events(body: bytes) -> list[bytes]:
    """The SSE events of a body, each with its ``\\n\\n`` terminator (joined: the body)."""
    parts = body.split(b"\n\n")
    events = [p + b"\n\n" for p in parts[:-1]]
    if parts[-1]:
        events.append(parts[-1])
    assert b"".join(events) == body
    return events


def is_usage_only(event: bytes) -> bool:
    """The usage chunk: ``choices`` empty, ``usage`` set."""
    if not event.startswith(b"data: {"):
        return False
    obj = json.loads(event[6:])
    return obj.get("choices") == [] and obj.get("usage") is not None


def response_for(responses: list[HttpResponse], cap: Capture) -> HttpResponse:
    """The upstream response the capture's proxy relayed (matched by the response id)."""
    ids = re.findall(rb'"id":"([^"]+)"', bytes(cap.body))
    assert ids, cap.body[:300]
    found = [r for r in responses if b'"id":"' + ids[0] + b'"' in r.body]
    assert len(found) == 1, f"{len(found)} upstream responses carry id {ids[0]!r}"
    return found[0]


async def test_client_bytes_are_the_bytes_the_proxy_read(
    llamacpp: LlamaCppServer, recorded_proxy: ProxyFactory, tokenizer_json: Path
) -> None:
    prompts = Prompts(tokenizer_json, "bytes-tee")
    async with TcpTee("127.0.0.1", llamacpp.port) as tee:
        proxy = await recorded_proxy(tee.url, provider="llama.cpp")
        async with session() as http:
            asked = await stream(
                http, proxy.url, chat(prompts.text(40), TOKENS,
                                      stream_options={"include_usage": True}), "asked",
            )  # fmt: skip
            await settle()
            plain = await stream(http, proxy.url, chat(prompts.text(40), TOKENS), "plain")
            await settle()
            whole = await stream(
                http, proxy.url, chat(prompts.text(40), TOKENS, stream=False), "whole"
            )
        upstream = tee.responses()
        sent = b"".join(bytes(c.to_server) for c in tee.connections)
    assert len(upstream) == 3
    assert all(r.complete for r in upstream)
    records = proxy.sink.requests

    # The client asked for usage itself: nothing may change, not one byte.
    up = response_for(upstream, asked)
    assert bytes(asked.body) == up.body
    assert sum(is_usage_only(e) for e in split_events(up.body)) == 1
    assert up.body.endswith(b"data: [DONE]\n\n")

    # The client did not ask: with provider llama.cpp the proxy does not ask either
    # (llama.cpp would move its timings into the usage chunk), so the client gets
    # the upstream bytes unchanged and the counts come from the events.
    assert sent.count(b'"stream_options"') == 1  # only the client's own request carries it
    up = response_for(upstream, plain)
    assert bytes(plain.body) == up.body
    assert not any(is_usage_only(e) for e in split_events(up.body))

    # Not streamed: relayed as is.
    up = response_for(upstream, whole)
    assert bytes(whole.body) == up.body
    assert json.loads(whole.body)["usage"]["completion_tokens"] == TOKENS

    for cap in (asked, plain):
        rec = records[cap.request_id]
        assert rec.streamed
        assert rec.outcome == "ok"
        assert rec.status_code == 200
        assert rec.output_tokens == TOKENS
        assert rec.completion_tokens == (TOKENS if cap is asked else None)
        # Every generated token of the test model carries text: one event per token.
        assert rec.output_events == len(cap.output_ns) == TOKENS
        if cap is asked:
            assert rec.prompt_tokens is not None
            assert rec.prompt_tokens > 40
        assert rec.finish_reasons == ("length",)
    rec = records["whole"]
    assert not rec.streamed
    assert rec.completion_tokens == TOKENS


async def test_client_sees_what_it_sees_directly(
    llamacpp: LlamaCppServer, recorded_proxy: ProxyFactory, tokenizer_json: Path
) -> None:
    """Without usage injection, direct and proxied answers are the same bytes."""
    prompts = Prompts(tokenizer_json, "bytes-direct")
    proxy = await recorded_proxy(llamacpp.url, provider="llama.cpp", inject_usage=False)
    async with session() as http:
        for i, extra in enumerate(({}, {"stream_options": {"include_usage": True}})):
            body = chat(prompts.text(60), TOKENS, cache_prompt=False, **extra)
            direct = await stream(http, llamacpp.url, body, f"direct-{i}")
            proxied = await stream(http, proxy.url, body, f"proxied-{i}")
            await settle()
            assert direct.status == proxied.status == 200
            assert normalise(bytes(proxied.body)) == normalise(bytes(direct.body))
            assert proxied.output_text == direct.output_text
            assert len(proxied.output_text) == TOKENS
            rec = proxy.sink.requests[f"proxied-{i}"]
            assert rec.output_events == TOKENS
            # Without injection the count is known only when the client asked for it.
            assert rec.completion_tokens == (TOKENS if extra else None)


async def test_usage_injection_is_invisible_to_a_llamacpp_client(
    llamacpp: LlamaCppServer, recorded_proxy: ProxyFactory, tokenizer_json: Path
) -> None:
    prompts = Prompts(tokenizer_json, "bytes-inject")
    proxy = await recorded_proxy(llamacpp.url, provider="llama.cpp")
    body = chat(prompts.text(60), 8, cache_prompt=False)
    async with session() as http:
        direct = await stream(http, llamacpp.url, body, "direct")
        proxied = await stream(http, proxy.url, body, "proxied")
    assert proxied.output_text == direct.output_text
    assert b'"timings"' in direct.body
    assert normalise(bytes(proxied.body)) == normalise(bytes(direct.body))


async def test_generic_provider_stops_injecting_when_usage_carries_timings(
    llamacpp: LlamaCppServer, recorded_proxy: ProxyFactory, tokenizer_json: Path
) -> None:
    """Not told it is llama.cpp, the proxy asks once, sees timings in the usage
    chunk, lets that chunk through whole and asks no more."""
    prompts = Prompts(tokenizer_json, "bytes-generic")
    proxy = await recorded_proxy(llamacpp.url, provider="openai")
    async with session() as http:
        first = await stream(http, proxy.url, chat(prompts.text(40), TOKENS), "first")
        await settle()
        body = chat(prompts.text(60), 8, cache_prompt=False)
        direct = await stream(http, llamacpp.url, body, "direct")
        second = await stream(http, proxy.url, body, "second")
    # The first answer kept its timings (in the usage chunk the proxy asked for).
    assert b'"timings"' in first.body
    assert sum(is_usage_only(e) for e in split_events(bytes(first.body))) == 1
    assert proxy.sink.requests["first"].completion_tokens == TOKENS
    # From then on the client sees exactly what it sees directly.
    assert normalise(bytes(second.body)) == normalise(bytes(direct.body))


async def test_native_completion_route_and_backend_timings(
    llamacpp: LlamaCppServer, recorded_proxy: ProxyFactory, tokenizer_json: Path
) -> None:
    """llama.cpp's own ``POST /completion``: bytes as direct, timed, and its own
    prefill time (``timings.prompt_ms``) recorded beside the proxy's TTFT."""
    prompts = Prompts(tokenizer_json, "native")
    proxy = await recorded_proxy(llamacpp.url, provider="llama.cpp")
    body = {"prompt": prompts.text(300), "n_predict": TOKENS, "temperature": 0, "seed": 7,
            "stream": True, "cache_prompt": False}  # fmt: skip
    async with session() as http:
        direct = await stream(http, llamacpp.url, body, "native-direct", path="/completion")
        await settle()
        proxied = await stream(http, proxy.url, body, "native-proxied", path="/completion")
    assert direct.status == proxied.status == 200
    assert normalise(bytes(proxied.body)) == normalise(bytes(direct.body))
    rec = proxy.sink.requests["native-proxied"]
    assert rec.streamed
    assert rec.outcome == "ok"
    assert rec.output_events == TOKENS
    assert rec.completion_tokens == TOKENS
    assert rec.prompt_tokens is not None
    assert rec.prompt_tokens > 200
    timings = rec.backend_timings
    assert timings is not None
    assert timings.prefill_s is not None
    # The backend's prefill is part of what the proxy saw as TTFT; the rest is
    # queueing and transport: small on an idle loopback, never negative.
    queue = rec.queue_time_s
    assert queue is not None
    assert rec.ttft_s is not None
    assert 0 <= queue < rec.ttft_s
    assert queue < 0.25, (rec.ttft_s, timings.prefill_s)

"""Bad input from a real server: the client still gets the right bytes, the records are right.

Provoked on llama.cpp where it can be: the server killed mid-stream, usage sent
unasked (llama.cpp's ``/v1/completions`` puts it in the finish chunk), a
connection closed after every stream although keep-alive was announced.
Where the real server will not misbehave on demand, its own bytes are replayed
by a scripted upstream with the quirk added: no ``[DONE]``, a usage chunk the
client did not ask for.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.edge.tasks import TaskSet
from tests.conftest import Script, Upstream
from tests.realbackend.client import Capture, Prompts, chat, session, stream
from tests.realbackend.llamacpp_server import LlamaCppServer
from tests.realbackend.recorder import ProxyFactory
from tests.realbackend.tee import TcpTee
from tests.realbackend.test_llamacpp_bytes_functional import (
    is_usage_only,
    response_for,
    settle,
    split_events,
)

pytestmark = [pytest.mark.realbackend, pytest.mark.timeout(120)]


async def test_server_killed_mid_stream(
    llamacpp_factory: Callable[..., LlamaCppServer],
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
) -> None:
    server = llamacpp_factory()
    prompts = Prompts(tokenizer_json, "killed")
    tasks = TaskSet()
    async with TcpTee("127.0.0.1", server.port) as tee:
        proxy = await recorded_proxy(tee.url, provider="llama.cpp")
        async with session() as http:
            task = tasks.spawn(stream(http, proxy.url, chat(prompts.text(30), 2000), "doomed"))
            for _ in range(2000):  # bounded wait: about 10 s
                if len(proxy.watcher.output_ns.get("doomed", ())) >= 10 or task.done():
                    break
                await asyncio.sleep(0.005)
            server.kill()
            cap: Capture = await asyncio.wait_for(task, 30)
        await asyncio.sleep(0.1)  # the proxy records the end right after cutting the client
        upstream = tee.responses()
    assert len(upstream) == 1
    up = upstream[0]
    assert not up.complete, "the server died: its body never ended"
    assert cap.status == 200
    assert cap.error, "the client must see a broken stream, not a clean end"
    # Every byte the server sent before it died reached the client, unchanged.
    assert bytes(cap.body) == up.body
    assert b"[DONE]" not in cap.body
    rec = proxy.sink.requests["doomed"]
    assert rec.outcome == "upstream_error"
    assert rec.status_code == 200
    assert rec.error_type
    assert rec.output_events == len(cap.output_ns) >= 10
    assert rec.completion_tokens is None
    assert proxy.running.state.in_flight == 0


async def test_back_to_back_streams_never_fail(
    llamacpp: LlamaCppServer, recorded_proxy: ProxyFactory
) -> None:
    proxy = await recorded_proxy(llamacpp.url, provider="llama.cpp")
    statuses = []
    async with session() as http:
        for i in range(30):
            cap = await stream(http, proxy.url, chat(f"back to back {i} {time.time_ns()}", 2),
                               f"b2b-{i}")  # fmt: skip
            statuses.append(cap.status)
    assert statuses == [200] * 30


async def test_completions_usage_sent_unasked(
    llamacpp: LlamaCppServer, recorded_proxy: ProxyFactory, tokenizer_json: Path
) -> None:
    """llama.cpp's completions stream carries usage in its finish chunk, asked or not."""
    prompts = Prompts(tokenizer_json, "unasked")
    async with TcpTee("127.0.0.1", llamacpp.port) as tee:
        injecting = await recorded_proxy(tee.url, provider="llama.cpp")
        passive = await recorded_proxy(tee.url, provider="llama.cpp", inject_usage=False)
        caps = []
        async with session() as http:
            for proxy, rid in ((injecting, "inject"), (passive, "passive")):
                body = {"model": "tiny", "prompt": prompts.text(30), "max_tokens": 12,
                        "temperature": 0, "stream": True}  # fmt: skip
                caps.append(await stream(http, proxy.url, body, rid, path="/v1/completions"))
                await settle()
        upstream = tee.responses()
    for cap, proxy in zip(caps, (injecting, passive), strict=True):
        up = response_for(upstream, cap)
        finish = [json.loads(e[6:]) for e in split_events(up.body) if b'"usage"' in e]
        assert finish
        assert finish[-1]["choices"], "usage rides in a chunk with choices"
        # Not a usage-only chunk: nothing is removed, whether the proxy asked or not.
        assert bytes(cap.body) == up.body
        rec = proxy.sink.requests[cap.request_id]
        assert rec.completion_tokens == 12
        assert rec.output_events == len(cap.output_ns) == 12
        assert rec.labels.operation == "text_completion"


async def _real_events(llamacpp: LlamaCppServer, prompts: Prompts, tokens: int) -> list[bytes]:
    """A real llama.cpp stream (usage included), as its SSE events."""
    async with session() as http:
        body = chat(prompts.text(30), tokens, stream_options={"include_usage": True})
        cap = await stream(http, llamacpp.url, body, "source")
    events = split_events(bytes(cap.body))
    assert events[-1] == b"data: [DONE]\n\n"
    assert sum(is_usage_only(e) for e in events) == 1
    return events


async def test_stream_without_done(
    llamacpp: LlamaCppServer, upstream: Upstream, recorded_proxy: ProxyFactory, tokenizer_json: Path
) -> None:
    """A server that ends the body cleanly but never sends ``[DONE]``."""
    events = (await _real_events(llamacpp, Prompts(tokenizer_json, "nodone"), 10))[:-1]
    upstream.script = Script([(0.01, e) for e in events])
    proxy = await recorded_proxy(upstream.url, provider="llama.cpp")
    async with session() as http:
        cap = await stream(http, proxy.url, chat("anything", 10,
                           stream_options={"include_usage": True}), "nodone")  # fmt: skip
    assert cap.status == 200
    assert not cap.error
    assert bytes(cap.body) == b"".join(events)
    rec = proxy.sink.requests["nodone"]
    assert rec.outcome == "ok"
    assert rec.completion_tokens == 10
    assert rec.output_events == len(cap.output_ns) == 10
    assert rec.finish_reasons == ("length",)


@pytest.mark.parametrize(
    ("inject", "stream_options"),
    [(False, None), (True, {"include_usage": False})],
    ids=["injection-off", "client-said-no"],
)
async def test_usage_chunk_unasked(
    llamacpp: LlamaCppServer,
    upstream: Upstream,
    recorded_proxy: ProxyFactory,
    tokenizer_json: Path,
    inject: bool,
    stream_options: dict[str, bool] | None,
) -> None:
    """A usage-only chunk the proxy did not ask for is the client's: it passes, and counts."""
    events = await _real_events(llamacpp, Prompts(tokenizer_json, f"unasked-{inject}"), 10)
    upstream.script = Script([(0.01, e) for e in events])
    proxy = await recorded_proxy(upstream.url, provider="llama.cpp", inject_usage=inject)
    extra = {} if stream_options is None else {"stream_options": stream_options}
    async with session() as http:
        cap = await stream(http, proxy.url, chat("anything", 10, **extra), "unasked")
    assert json.loads(upstream.requests[0]["body"]).get("stream_options") == stream_options
    assert bytes(cap.body) == b"".join(events)
    rec = proxy.sink.requests["unasked"]
    assert rec.completion_tokens == 10
    assert rec.output_events == 10

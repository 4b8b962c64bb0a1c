"""Every scripted format (``formats_data``) through the real proxy over real sockets.

The upstream plays each documented stream; the client must get the exact bytes,
and the proxy's Prometheus metrics must hold what the pure tests assert of the
same stream (counts, not timings: the clock is real here).
"""

from __future__ import annotations

import json

import aiohttp
import pytest

from exporters import names
from proxy.core.decoders.registry import route
from tests.conftest import Script
from tests.proxy.core.decoders import formats_data as fd

SCALE = 0.25  # the scripts' delays, shortened: only counts are asserted here


def _labels(s: fd.Scripted) -> dict[str, str]:
    fmt = route("POST", s.path)
    assert fmt is not None
    model = fmt.request_model(s.request)
    return {
        "gen_ai_operation_name": fmt.operation.value,
        "gen_ai_provider_name": "vllm",
        "gen_ai_request_model": model if isinstance(model, str) else "unknown",
        "server_address": "test-backend",
    }


@pytest.mark.parametrize("s", fd.ALL, ids=lambda s: s.name)
async def test_format_through_the_proxy(upstream, proxy_factory, s: fd.Scripted):
    upstream.script = Script(
        [(d * SCALE, b) for d, b in s.parts],
        content_type=s.content_type,
        headers=s.headers,
    )
    p = await proxy_factory(upstream.url)
    async with aiohttp.ClientSession(auto_decompress=False) as session:
        async with session.post(p.url + s.path, json=s.request) as r:
            got = await r.read()
            status = r.status
    assert status == 200
    assert got == s.body
    # Only OpenAI-compatible bodies get stream_options; every other body goes up untouched.
    if "/v1/chat/completions" not in s.path:
        assert upstream.requests[0]["body"] == json.dumps(s.request).encode()

    labels, e = _labels(s), s.expect

    def sample(inst: names.Instrument, suffix: str, **extra: str) -> float:
        v = p.registry.get_sample_value(inst.prom_name + suffix, {**labels, **extra})
        return v or 0.0

    assert sample(names.GAP, "_count") == len(e.gaps_s)
    assert sample(names.TTFT, "_count") == (1 if e.ttft_s is not None else 0)
    assert sample(names.PREFIX_CACHE_TTFT, "_count", tokenstamp_prefix_cache=_cache(e)) == (
        1 if e.ttft_s is not None else 0
    )
    for kind, count in (("input", e.prompt_tokens), ("output", e.completion_tokens)):
        assert sample(names.TOKEN_USAGE, "_sum", gen_ai_token_type=kind) == (count or 0)
    outcome = "upstream_error" if e.error else "ok"
    assert (
        sample(names.REQUESTS, "_total", tokenstamp_outcome=outcome,
               http_response_status_code="2xx", error_type=e.error)
        == 1
    )  # fmt: skip
    expect_queue = 1 if e.queue_time_s is not None and s.streamed else 0
    assert sample(names.QUEUE_TIME, "_count") == expect_queue
    errors = p.registry.get_sample_value(
        names.DECODER_ERRORS.prom_name + "_total",
        {"gen_ai_provider_name": "vllm", "server_address": "test-backend",
         "error_type": "invalid_json"},
    )  # fmt: skip
    assert (errors or 0) == e.decoder_errors


def _cache(e: fd.Expect) -> str:
    if e.cached_tokens is None:
        return "unknown"
    return "hit" if e.cached_tokens > 0 else "miss"


async def test_unexpected_content_type_is_relayed_and_counted_unobserved(upstream, proxy_factory):
    s = fd.OLLAMA_GENERATE
    upstream.script = Script([(0, s.body)], content_type="text/plain")
    p = await proxy_factory(upstream.url)
    async with aiohttp.ClientSession() as session:
        async with session.post(p.url + s.path, json=s.request) as r:
            assert await r.read() == s.body
    unobserved = p.registry.get_sample_value(
        names.UNOBSERVED.prom_name + "_total",
        {"gen_ai_provider_name": "vllm", "server_address": "test-backend",
         "tokenstamp_reason": "content_type"},
    )  # fmt: skip
    assert unobserved == 1

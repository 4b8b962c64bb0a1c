"""Spans through real HTTP: client -> proxy (injected in-memory exporter) -> scripted upstream.

What the span says (name, kind, GenAI and tokenstamp attributes, first-token
event, status), how trace context goes in and out (an incoming ``traceparent``
makes the span a child; the upstream receives the span's own), exemplars in
the OpenMetrics exposition, content capture (off by default, capped), and that
no key or Authorization header ever lands in a span.
"""

from __future__ import annotations

import asyncio
import json
import re

import aiohttp
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, Sampler
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client import CollectorRegistry

from exporters import otel_spans as keys
from exporters.otel_content import TRUNCATED
from proxy.config import HostPort, ProxyConfig
from proxy.edge.server import RunningProxy, start_proxy
from tests.conftest import Script
from tests.proxy.edge.test_app_functional import USAGE, body, chat_chunk, post, sse, vllm_like

CLIENT_TRACE = "0af7651916cd43dd8448eb211c80319c"
CLIENT_SPAN = "b7ad6b7169203331"
TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


class Traced:
    """A started proxy and the spans it exported."""

    def __init__(self, proxy: RunningProxy, exporter: InMemorySpanExporter) -> None:
        self.proxy = proxy
        self.exporter = exporter

    async def spans(self, n: int = 1) -> list[ReadableSpan]:
        """The first ``n`` finished spans; lingering ones are ended first."""
        tracing = self.proxy.state.tracing
        assert tracing is not None
        for _ in range(200):
            tracing.sweep(1 << 62)  # end every lingering span now
            got = list(self.exporter.get_finished_spans())
            if len(got) >= n:
                return got
            await asyncio.sleep(0.025)
        raise AssertionError(f"expected {n} spans, got {len(self.exporter.get_finished_spans())}")


@pytest.fixture
async def traced():
    started: list[RunningProxy] = []

    async def make(upstream_url: str, *, sampler: Sampler = ALWAYS_ON, **overrides) -> Traced:
        exporter = InMemorySpanExporter()
        provider = TracerProvider(sampler=sampler)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        cfg = ProxyConfig(
            upstream=upstream_url,
            listen=HostPort("127.0.0.1", 0),
            admin=HostPort("127.0.0.1", 0),
            backend_name="test-backend",
            provider="vllm",
            **overrides,
        )
        p = await start_proxy(cfg, registry=CollectorRegistry(), tracer_provider=provider)
        started.append(p)
        return Traced(p, exporter)

    yield make
    for p in started:
        await p.close(drain_timeout_s=1.0)


def upstream_traceparent(upstream, i: int = 0) -> tuple[str, str, bool]:
    """Trace id, parent span id and the sampled flag the upstream received."""
    headers = {k.lower(): v for k, v in upstream.requests[i]["headers"].items()}
    m = TRACEPARENT.match(headers["traceparent"])
    assert m is not None, headers["traceparent"]
    return m.group(1), m.group(2), bool(int(m.group(3), 16) & 1)


async def test_stream_span_names_attributes_event_and_upstream_context(upstream, traced):
    upstream.script = Script(vllm_like([0.10, 0.03, 0.03, 0.06], usage=True))
    t = await traced(upstream.url)
    payload = body(max_tokens=4, temperature=0.5, top_p=0.9, stop=["\n"])
    status, got, _ = await post(t.proxy.url + "/v1/chat/completions", payload)
    assert status == 200
    assert got == b"".join(d for _, d in vllm_like([0.10, 0.03, 0.03, 0.06], usage=False))
    (span,) = await t.spans()

    assert span.name == "chat m"
    assert span.kind is SpanKind.SERVER
    assert span.parent is None
    assert span.status.status_code is StatusCode.UNSET
    a = dict(span.attributes or {})
    assert {k: a[k] for k in ("gen_ai.operation.name", "gen_ai.provider.name",
                              "gen_ai.request.model", "server.address")} == {
        "gen_ai.operation.name": "chat", "gen_ai.provider.name": "vllm",
        "gen_ai.request.model": "m", "server.address": "test-backend",
    }  # fmt: skip
    assert a["gen_ai.request.max_tokens"] == 4
    assert a["gen_ai.request.temperature"] == 0.5
    assert a["gen_ai.request.top_p"] == 0.9
    assert a["gen_ai.request.stop_sequences"] == ("\n",)
    assert a[keys.RESPONSE_ID] == "chatcmpl-1"
    assert a[keys.RESPONSE_MODEL] == "m"
    assert a[keys.FINISH_REASONS] == ("length",)
    assert a[keys.INPUT_TOKENS] == 11
    assert a[keys.OUTPUT_TOKENS] == 4
    assert a[keys.CACHE_READ_TOKENS] == 8
    assert a["tokenstamp.prefix_cache"] == "hit"
    assert a["tokenstamp.outcome"] == "ok"
    assert a["http.response.status_code"] == 200
    assert "error.type" not in a
    assert a[keys.TTFT] == pytest.approx(0.10, abs=0.08)
    assert a[keys.TIME_TO_FIRST_CHUNK] == a[keys.TTFT]
    assert 0 < a[keys.UPSTREAM_TTFT] <= a[keys.TTFT]
    assert a[keys.GAPS] == 3
    assert a[keys.OUTPUT_EVENTS] == 4
    assert a[keys.MAX_GAP] >= 0.05
    assert a[keys.TPOT] == pytest.approx(0.12 / 3, abs=0.04)
    assert a[keys.REQUEST_ID]
    assert a[keys.TOKENS_PER_EVENT] == 1.0
    assert keys.QUEUE_TIME not in a  # the backend reported no timings of its own
    assert keys.BACKEND_QUEUE not in a
    assert keys.INPUT_MESSAGES not in a
    assert keys.OUTPUT_MESSAGES not in a

    (event,) = span.events
    assert event.name == keys.FIRST_TOKEN_EVENT
    assert event.attributes is not None
    assert event.attributes[keys.TTFT] == a[keys.TTFT]
    assert span.start_time is not None
    assert span.end_time is not None
    assert span.start_time < event.timestamp < span.end_time

    trace_id, parent_id, sampled = upstream_traceparent(upstream)
    assert trace_id == format(span.context.trace_id, "032x")
    assert parent_id == format(span.context.span_id, "016x")
    assert sampled


async def test_engine_timings_are_span_attributes(upstream, traced):
    metrics = {"time_to_first_token_ms": 30.0, "generation_time_ms": 90.0,
               "queue_time_ms": 7.0, "mean_itl_ms": 30.0,
               "speculative_decoding": {"mean_acceptance_length": 2.0}}  # fmt: skip
    usage = {"prompt_tokens": 3, "completion_tokens": 8, "total_tokens": 11}
    parts = vllm_like([0.06, 0.02, 0.02, 0.02], usage=False)
    parts.insert(-1, (0.0, sse({"id": "chatcmpl-1", "choices": [], "usage": usage,
                                "metrics": metrics})))  # fmt: skip
    upstream.script = Script(parts)
    t = await traced(upstream.url)
    status, _, _ = await post(t.proxy.url + "/v1/chat/completions", body())
    assert status == 200
    (span,) = await t.spans()
    a = dict(span.attributes or {})
    assert a[keys.BACKEND_PREFILL] == pytest.approx(0.030)
    assert a[keys.BACKEND_DECODE] == pytest.approx(0.090)
    assert a[keys.BACKEND_PER_TOKEN] == pytest.approx(0.030)
    assert a[keys.BACKEND_QUEUE] == pytest.approx(0.007)
    assert a[keys.ACCEPTANCE_LENGTH] == 2.0
    assert a[keys.QUEUE_TIME] == pytest.approx(a[keys.TTFT] - 0.030)
    assert a[keys.TOKENS_PER_EVENT] == 2.0  # 8 tokens in 4 output events
    assert keys.BACKEND_LOAD not in a


async def test_incoming_traceparent_makes_the_span_a_child(upstream, traced):
    upstream.script = Script(vllm_like([0.01, 0.01], usage=False))
    t = await traced(upstream.url)
    headers = {
        "traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
        "tracestate": "vendor=opaque",
    }
    await post(t.proxy.url + "/v1/chat/completions", body(), headers=headers)
    (span,) = await t.spans()
    assert format(span.context.trace_id, "032x") == CLIENT_TRACE
    assert span.parent is not None
    assert span.parent.is_remote
    assert format(span.parent.span_id, "016x") == CLIENT_SPAN
    trace_id, parent_id, _ = upstream_traceparent(upstream)
    assert (trace_id, parent_id) == (CLIENT_TRACE, format(span.context.span_id, "016x"))
    sent = {k.lower(): v for k, v in upstream.requests[0]["headers"].items()}
    assert sent["tracestate"] == "vendor=opaque"


async def test_unsampled_request_still_propagates_and_records_nothing(upstream, traced):
    upstream.script = Script(vllm_like([0.01, 0.01], usage=False))
    t = await traced(upstream.url, sampler=ALWAYS_OFF)
    await post(
        t.proxy.url + "/v1/chat/completions",
        body(),
        headers={"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-00"},
    )
    trace_id, parent_id, sampled = upstream_traceparent(upstream)
    assert trace_id == CLIENT_TRACE
    assert parent_id != CLIENT_SPAN  # the proxy's own (unrecorded) span id
    assert not sampled
    await asyncio.sleep(0.1)
    assert t.exporter.get_finished_spans() == ()
    metrics = await openmetrics(t.proxy)
    assert "trace_id" not in metrics  # no exemplar without a sampled trace


async def test_unobserved_routes_get_no_span_and_keep_the_clients_context(upstream, traced):
    t = await traced(upstream.url)
    parent = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"
    async with aiohttp.ClientSession() as s:
        async with s.get(t.proxy.url + "/v1/models", headers={"traceparent": parent}) as r:
            await r.read()
    assert {k.lower(): v for k, v in upstream.requests[0]["headers"].items()}[
        "traceparent"
    ] == parent
    await asyncio.sleep(0.1)
    assert t.exporter.get_finished_spans() == ()


async def test_upstream_error_sets_error_status_and_type(upstream, traced):
    upstream.script = Script(
        [(0, b'{"error": "boom"}')], status=500, content_type="application/json"
    )
    t = await traced(upstream.url)
    status, _, _ = await post(t.proxy.url + "/v1/chat/completions", body(stream=False))
    assert status == 500
    (span,) = await t.spans()
    assert span.status.status_code is StatusCode.ERROR
    a = dict(span.attributes or {})
    assert a["error.type"] == "500"
    assert a["tokenstamp.outcome"] == "upstream_error"
    assert a["http.response.status_code"] == 500


async def test_unreachable_upstream_is_an_error_span(traced):
    from tests.promserver import free_port

    t = await traced(f"http://127.0.0.1:{free_port()}")
    status, _, _ = await post(t.proxy.url + "/v1/chat/completions", body())
    assert status == 502
    (span,) = await t.spans()
    assert span.status.status_code is StatusCode.ERROR
    assert (span.attributes or {})["error.type"] == "ClientConnectorError"


SECRETS = ("sk-live-SECRET-123", "azure-SECRET-456", "xapi-SECRET-789")


async def test_keys_and_authorization_never_reach_a_span(upstream, traced):
    upstream.script = Script(vllm_like([0.01, 0.01], usage=True))
    t = await traced(upstream.url, capture_content=True)
    headers = {
        "Authorization": f"Bearer {SECRETS[0]}",
        "api-key": SECRETS[1],
        "x-api-key": SECRETS[2],
    }
    await post(t.proxy.url + "/v1/chat/completions", body(), headers=headers)
    (span,) = await t.spans()
    dumped = span.to_json()
    for secret in SECRETS:
        assert secret not in dumped
    sent = upstream.requests[0]["headers"]
    assert sent["Authorization"] == f"Bearer {SECRETS[0]}"  # passed through, never recorded


async def test_capture_content_records_prompt_and_completion(upstream, traced):
    upstream.script = Script(vllm_like([0.01, 0.01, 0.01], usage=True))
    t = await traced(upstream.url, capture_content=True)
    payload = body(messages=[{"role": "system", "content": "be brief"},
                             {"role": "user", "content": [{"type": "text", "text": "hi"}]}])  # fmt: skip
    await post(t.proxy.url + "/v1/chat/completions", payload)
    (span,) = await t.spans()
    a = dict(span.attributes or {})
    assert json.loads(a[keys.INPUT_MESSAGES]) == [
        {"role": "system", "parts": [{"type": "text", "content": "be brief"}]},
        {"role": "user", "parts": [{"type": "text", "content": "hi"}]},
    ]
    assert json.loads(a[keys.OUTPUT_MESSAGES]) == [
        {"role": "assistant", "parts": [{"type": "text", "content": "t0t1t2"}],
         "finish_reason": "length"}
    ]  # fmt: skip


async def test_captured_content_is_capped(upstream, traced):
    long_answer = "y" * 40_000
    parts = [(0.0, chat_chunk("", role=True)), (0.01, chat_chunk(long_answer[:20_000])),
             (0.01, chat_chunk(long_answer[20_000:], finish="stop")), (0.0, USAGE),
             (0.0, b"data: [DONE]\n\n")]  # fmt: skip
    upstream.script = Script(parts)
    t = await traced(upstream.url, capture_content=True)
    await post(t.proxy.url + "/v1/chat/completions", body(messages=[
        {"role": "user", "content": "x" * 50_000}]))  # fmt: skip
    (span,) = await t.spans()
    a = dict(span.attributes or {})
    (prompt,) = json.loads(a[keys.INPUT_MESSAGES])
    assert prompt["parts"][0]["content"] == "x" * 16384 + TRUNCATED
    (answer,) = json.loads(a[keys.OUTPUT_MESSAGES])
    assert answer["parts"][0]["content"] == "y" * 16384 + TRUNCATED


async def openmetrics(proxy: RunningProxy) -> str:
    async with aiohttp.ClientSession() as s:
        async with s.get(
            proxy.admin_url + "/metrics", headers={"Accept": "application/openmetrics-text"}
        ) as r:
            return await r.text()


async def test_histograms_carry_the_sampled_trace_id_as_exemplar(upstream, traced):
    upstream.script = Script(vllm_like([0.02, 0.02, 0.08], usage=True))
    t = await traced(upstream.url)
    await post(t.proxy.url + "/v1/chat/completions", body())
    (span,) = await t.spans()
    trace_id = format(span.context.trace_id, "032x")
    metrics = await openmetrics(t.proxy)
    with_exemplar = {
        line.split("{")[0]
        for line in metrics.splitlines()
        if f'# {{trace_id="{trace_id}"}}' in line
    }
    assert with_exemplar == {
        "gen_ai_server_time_to_first_token_seconds_bucket",
        "tokenstamp_time_to_first_answer_token_seconds_bucket",  # observed live, as TTFT
        "gen_ai_client_operation_time_per_output_chunk_seconds_bucket",
        "tokenstamp_stream_max_gap_seconds_bucket",
    }
    # Plain text exposition (what a scrape without OpenMetrics gets) has none.
    async with aiohttp.ClientSession() as s:
        async with s.get(t.proxy.admin_url + "/metrics") as r:
            assert "trace_id" not in await r.text()


async def test_the_span_carries_the_tenant_when_tenants_are_labelled(upstream, traced):
    upstream.script = Script(vllm_like([0.01, 0.01], usage=True))
    t = await traced(upstream.url, tenant_headers=("x-tenant",))
    status, _, _ = await post(
        t.proxy.url + "/v1/chat/completions", body(max_tokens=2), headers={"X-Tenant": "acme"}
    )
    assert status == 200
    (span,) = await t.spans()
    assert span.attributes["tokenstamp.tenant"] == "acme"


async def test_a_reasoning_stream_span_has_each_phase(upstream, traced):
    """Thinking, then a tool call: events at the first token, the first answer (the call)
    and the first tool call; the reasoning figures as attributes (GenAI's reasoning
    token count, tokenstamp's timings)."""
    from tests.proxy.edge.test_phases_functional import VLLM, play

    played = play(upstream, VLLM, [("think", 0.02)] * 4 + [("tool", 0.1), ("tool", 0.02)])
    t = await traced(upstream.url)
    status, _, _ = await post(t.proxy.url + VLLM.path, VLLM.request)
    assert status == 200
    (span,) = await t.spans()
    a = dict(span.attributes or {})
    truth = played.tool[0] - played.reasoning[0]
    assert a[keys.REASONING_TOKENS] == 4  # from usage
    assert a[keys.REASONING_EVENTS] == 4
    assert a[keys.REASONING_DURATION] == pytest.approx(truth, abs=0.001)
    assert a[keys.ANSWER_TTFT] - a[keys.TTFT] == pytest.approx(truth, abs=0.001)
    assert a[keys.TOOL_CALL_TTFT] == a[keys.ANSWER_TTFT]
    assert keys.CHOICES not in a
    names = [e.name for e in span.events]
    assert names == [keys.FIRST_TOKEN_EVENT, keys.FIRST_ANSWER_EVENT, keys.FIRST_TOOL_CALL_EVENT]
    first, answer, tool = span.events
    assert first.timestamp < answer.timestamp == tool.timestamp
    assert answer.attributes is not None
    assert answer.attributes[keys.ANSWER_TTFT] == a[keys.ANSWER_TTFT]

"""Real client libraries read the scripted streams through the proxy.

This keeps ``formats_data`` honest: if a vendor's own SDK parses a script, the
script is what that vendor sends. Each test also checks that the proxy timed it.
"""

from __future__ import annotations

import asyncio

import pytest
from huggingface_hub import InferenceClient
from openai import AsyncOpenAI

from exporters import names
from tests.conftest import Script
from tests.proxy.core.decoders import formats_data as fd

anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")


def gaps(p, operation: str, model: str) -> float | None:
    return p.registry.get_sample_value(
        names.GAP.prom_name + "_count",
        {"gen_ai_operation_name": operation, "gen_ai_provider_name": "vllm",
         "gen_ai_request_model": model, "server_address": "test-backend"},
    )  # fmt: skip


async def test_openai_sdk_reads_the_responses_script(upstream, proxy_factory):
    s = fd.RESPONSES_TEXT
    upstream.script = Script(s.parts, content_type=s.content_type)
    p = await proxy_factory(upstream.url)
    client = AsyncOpenAI(base_url=p.url + "/v1", api_key="x", max_retries=0)
    stream = await client.responses.create(model="gpt-4.1", input="Say hi", stream=True)
    deltas, final = [], None
    async for event in stream:
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        if event.type == "response.completed":
            final = event.response
    await client.close()
    assert "".join(deltas) == "Hi there!"
    assert final is not None
    assert final.usage is not None
    assert final.usage.input_tokens == 36
    assert gaps(p, "chat", "gpt-4.1") == len(s.expect.gaps_s)


@pytest.mark.parametrize("s", [fd.ANTHROPIC_TEXT, fd.ANTHROPIC_THINKING_TOOL], ids=lambda s: s.name)
async def test_anthropic_sdk_reads_the_messages_script(upstream, proxy_factory, s):
    upstream.script = Script(s.parts, content_type=s.content_type)
    p = await proxy_factory(upstream.url)
    client = anthropic.AsyncAnthropic(base_url=p.url, api_key="x", max_retries=0)
    kwargs = {k: v for k, v in s.request.items() if k != "stream"}
    async with client.messages.stream(**kwargs) as stream:
        async for _ in stream:
            pass
        message = await stream.get_final_message()
    await client.close()
    assert message.stop_reason == s.expect.finish_reasons[0]
    assert message.usage.output_tokens == s.expect.completion_tokens
    if s is fd.ANTHROPIC_THINKING_TOOL:
        assert message.content[-1].input == {"location": "Paris"}
    assert gaps(p, "chat", "claude-opus-4-7") == len(s.expect.gaps_s)


async def test_ollama_client_reads_the_generate_script(upstream, proxy_factory):
    s = fd.OLLAMA_GENERATE
    upstream.script = Script(s.parts, content_type=s.content_type)
    p = await proxy_factory(upstream.url)
    async with ollama.AsyncClient(host=p.url) as client:
        stream = await client.generate(model="llama3.2", prompt="Why?", stream=True)
        parts = [part async for part in stream]
    assert "".join(part.response for part in parts) == "The sky is blue."
    assert parts[-1].done
    assert parts[-1].eval_count == 5
    assert gaps(p, "text_completion", "llama3.2") == len(s.expect.gaps_s)


async def test_ollama_client_reads_the_chat_script(upstream, proxy_factory):
    s = fd.OLLAMA_CHAT_THINKING_TOOLS
    upstream.script = Script(s.parts, content_type=s.content_type)
    p = await proxy_factory(upstream.url)
    async with ollama.AsyncClient(host=p.url) as client:
        messages = s.request["messages"]
        stream = await client.chat(model="qwen3", messages=messages, think=True, stream=True)
        parts = [part async for part in stream]
    assert "".join(part.message.thinking or "" for part in parts) == "Let me compute."
    assert "".join(part.message.content or "" for part in parts) == "17 × 23 = 391"
    assert any(part.message.tool_calls for part in parts)
    assert gaps(p, "chat", "qwen3") == len(s.expect.gaps_s)


async def test_huggingface_client_reads_the_tgi_script(upstream, proxy_factory):
    s = fd.TGI_STREAM
    upstream.script = Script(s.parts, content_type=s.content_type)
    p = await proxy_factory(upstream.url)
    client = InferenceClient(model=p.url + "/generate_stream")

    def read() -> list:
        return list(client.text_generation("What?", stream=True, details=True, max_new_tokens=20))

    out = await asyncio.to_thread(read)
    assert [o.token.text for o in out] == ["The", " answer", " is", " 42", "</s>"]
    assert out[-1].details is not None
    assert out[-1].details.generated_tokens == 5
    assert gaps(p, "text_completion", "unknown") == len(s.expect.gaps_s)

"""The official openai SDK through the proxy gets exactly what it gets directly."""

from __future__ import annotations

import asyncio
import json

import openai
from aiohttp import web

WORDS = ["Hello", ",", " world", "!"]


async def backend(request: web.Request) -> web.StreamResponse:
    """A small OpenAI-compatible backend: chat and completions, streamed or not."""
    req = await request.json()
    chat = request.path.endswith("/chat/completions")
    base = {"id": "cmpl-7", "created": 1, "model": req["model"]}
    usage = {"prompt_tokens": 3, "completion_tokens": len(WORDS), "total_tokens": 3 + len(WORDS)}
    if not req.get("stream"):
        if chat:
            choice = {"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "".join(WORDS)}}  # fmt: skip
        else:
            choice = {"index": 0, "finish_reason": "stop", "text": "".join(WORDS)}
        obj = "chat.completion" if chat else "text_completion"
        return web.json_response({**base, "object": obj, "choices": [choice], "usage": usage})
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    obj = "chat.completion.chunk" if chat else "text_completion"

    async def send(payload: dict) -> None:
        await resp.write(
            b"data: " + json.dumps({**base, "object": obj, **payload}).encode() + b"\n\n"
        )

    if chat:
        await send({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    for i, w in enumerate(WORDS):
        await asyncio.sleep(0.01)
        fin = "stop" if i == len(WORDS) - 1 else None
        c = {"index": 0, "delta": {"content": w}} if chat else {"index": 0, "text": w}
        await send({"choices": [{**c, "finish_reason": fin}]})
    if (req.get("stream_options") or {}).get("include_usage"):
        await send({"choices": [], "usage": usage})
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _collect(base_url: str) -> dict[str, object]:
    client = openai.AsyncOpenAI(base_url=base_url + "/v1", api_key="sk-test", max_retries=0)
    try:
        out: dict[str, object] = {}
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True
        )
        out["chat_stream"] = [c.model_dump() async for c in stream]
        stream = await client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "hi"}], stream=True,
            stream_options={"include_usage": True},
        )  # fmt: skip
        out["chat_stream_usage"] = [c.model_dump() async for c in stream]
        out["chat"] = (
            await client.chat.completions.create(
                model="tiny", messages=[{"role": "user", "content": "hi"}]
            )
        ).model_dump()
        stream2 = await client.completions.create(model="tiny", prompt="x", stream=True)
        out["completion_stream"] = [c.model_dump() async for c in stream2]
        out["completion"] = (await client.completions.create(model="tiny", prompt="x")).model_dump()
        out["models_error"] = None
        return out
    finally:
        await client.close()


async def test_sdk_sees_the_same_through_the_proxy(aiohttp_server, proxy_factory):
    app = web.Application()
    app.router.add_post("/v1/chat/completions", backend)
    app.router.add_post("/v1/completions", backend)
    server = await aiohttp_server(app)
    direct_url = str(server.make_url("")).rstrip("/")
    p = await proxy_factory(direct_url)
    direct = await _collect(direct_url)
    proxied = await _collect(p.url)
    assert proxied == direct
    text = "".join(c["choices"][0]["delta"]["content"] or "" for c in proxied["chat_stream"])
    assert text == "Hello, world!"
    # No usage chunk leaked into the stream the client did not ask usage for...
    assert all(c["usage"] is None for c in proxied["chat_stream"])
    # ...yet the proxy knows the exact token counts of every request.
    labels = {"gen_ai_operation_name": "chat", "gen_ai_provider_name": "vllm",
              "gen_ai_request_model": "tiny", "server_address": "test-backend"}  # fmt: skip
    got = p.registry.get_sample_value(
        "gen_ai_client_token_usage_count", {**labels, "gen_ai_token_type": "output"}
    )
    assert got == 3  # two streams and one non-streaming chat

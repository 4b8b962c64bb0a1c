"""HTTP face of the simulator: an OpenAI-compatible server in the manner of vLLM's.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (SSE when
``stream`` is true, else one JSON body), ``GET /v1/models``, ``GET /health``,
and for tests and benchmarks ``GET /sim/ground_truth`` (records as JSON lines,
``?type=step|token|prefill|finish`` filters), ``POST /sim/reset`` (drop the
records; ``?prefix_cache=1`` also empties the prefix cache) and ``GET /sim/state``.

Each token's event is written as soon as the engine emits it. A client that
disconnects is aborted in the engine, so the batch shrinks: noticed when a
write fails, and while waiting for a token by polling the connection.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import asdict

from aiohttp import web

from simulator.engine import Engine, EngineConfig, RequestHandle, TokenEvent
from simulator.openai_format import (
    DONE,
    Operation,
    ParsedRequest,
    RequestError,
    ResponseFormat,
    dumps,
    error_body,
    parse_request,
    usage,
)
from simulator.profile import Profile

ENGINE_KEY = web.AppKey("simulator.engine", Engine)
"""The app's engine."""

_DISCONNECT_POLL_S = 0.1
_RECORD_TYPES = frozenset({"step", "token", "prefill", "finish"})


class _ClientGone(Exception):
    """The client closed the connection while waiting for a token."""


def _error(status: int, message: str, param: str | None = None) -> web.Response:
    return web.json_response(error_body(message, status, param), status=status, dumps=dumps)


async def _next_event(request: web.Request, handle: RequestHandle) -> TokenEvent | None:
    """The handle's next token; raises _ClientGone if the client left meanwhile."""
    while True:
        if handle.ready():
            return await handle.next_event()
        try:
            async with asyncio.timeout(_DISCONNECT_POLL_S):
                return await handle.next_event()
        except TimeoutError:
            transport = request.transport
            if transport is None or transport.is_closing():
                raise _ClientGone from None


def _response_headers(x_request_id: str | None) -> dict[str, str]:
    return {} if x_request_id is None else {"X-Request-Id": x_request_id}


async def _stream(
    request: web.Request, parsed: ParsedRequest, fmt: ResponseFormat, handle: RequestHandle
) -> web.StreamResponse:
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream; charset=utf-8",
            "Cache-Control": "no-cache",
            **_response_headers(handle.spec.x_request_id),
        }
    )
    await response.prepare(request)
    emitted = 0
    choices = range(parsed.choices)
    try:
        while (event := await _next_event(request, handle)) is not None:
            if emitted == 0 and parsed.operation is Operation.CHAT:
                # vLLM sends the role chunks (one per choice) when the first output arrives.
                await response.write(b"".join(fmt.role_chunk(i) for i in choices))
            finish: str | None = event.finish_reason
            if finish is not None:
                finish = parsed.shape.finish_reason(finish)
            # One chunk per choice, as vLLM streams n > 1 (a step's chunks in one write).
            await response.write(
                b"".join(fmt.token_chunk(event.index, finish, event.tokens, i) for i in choices)
            )
            emitted += event.tokens
            if finish is not None:
                if parsed.include_usage:
                    await response.write(fmt.usage_chunk(_usage(parsed, handle, emitted)))
                await response.write(DONE)
                break
        await response.write_eof()
    except (_ClientGone, ConnectionResetError):
        # Status and headers are out: nothing to tell; the caller aborts the sequence.
        pass
    return response


def _usage(parsed: ParsedRequest, handle: RequestHandle, emitted: int) -> dict[str, object]:
    """The usage of ``emitted`` tokens per choice, all choices counted."""
    n = parsed.choices
    reasoning = min(parsed.reasoning_tokens, emitted) * n if parsed.reasoning_tokens else None
    return usage(parsed.prompt_tokens, emitted * n, handle.cached_tokens, reasoning)


async def _whole(
    request: web.Request, parsed: ParsedRequest, fmt: ResponseFormat, handle: RequestHandle
) -> web.StreamResponse:
    emitted = 0
    finish_reason: str | None = None
    while finish_reason is None:
        event = await _next_event(request, handle)
        if event is None:
            return _error(503, "the simulator engine stopped")
        emitted += event.tokens
        finish_reason = event.finish_reason
    finish_reason = parsed.shape.finish_reason(finish_reason)
    return web.Response(
        text=fmt.body(emitted, finish_reason, _usage(parsed, handle, emitted), parsed.choices),
        content_type="application/json",
        headers=_response_headers(handle.spec.x_request_id),
    )


async def _complete(request: web.Request, operation: Operation) -> web.StreamResponse:
    engine = request.app[ENGINE_KEY]
    try:
        body = json.loads(await request.read())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        return _error(400, f"invalid JSON body: {exc}")
    try:
        parsed = parse_request(
            body, operation, engine.profile, want_hashes=engine.config.prefix_cache
        )
    except RequestError as exc:
        return _error(400, str(exc), exc.param)
    prefix = "chatcmpl-" if operation is Operation.CHAT else "cmpl-"
    fmt = ResponseFormat(
        operation, prefix + uuid.uuid4().hex, int(time.time()), parsed.model, parsed.shape
    )
    handle = engine.submit(
        fmt.response_id,
        prompt_tokens=parsed.prompt_tokens,
        output_tokens=parsed.output_tokens,
        finish_reason=parsed.finish_reason,
        x_request_id=request.headers.get("X-Request-Id"),
        block_hashes=parsed.block_hashes,
        reasoning_tokens=parsed.reasoning_tokens,
        choices=parsed.choices,
    )
    try:
        if parsed.stream:
            return await _stream(request, parsed, fmt, handle)
        return await _whole(request, parsed, fmt, handle)
    except (_ClientGone, ConnectionResetError):
        # The client left before the answer: nobody to tell (499 as nginx logs it).
        return web.Response(status=499)
    finally:
        if not handle.done:
            engine.abort(handle.response_id)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    return await _complete(request, Operation.CHAT)


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    return await _complete(request, Operation.TEXT_COMPLETION)


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the one served model."""
    profile = request.app[ENGINE_KEY].profile
    card = {
        "id": profile.model,
        "object": "model",
        "created": int(time.time()),
        "owned_by": "tokenstamp-simulator",
        "root": profile.model,
        "parent": None,
        "max_model_len": profile.max_model_len,
    }
    return web.json_response({"object": "list", "data": [card]}, dumps=dumps)


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 with an empty body while the server runs."""
    return web.Response(status=200)


async def ground_truth(request: web.Request) -> web.Response:
    """``GET /sim/ground_truth``: in-memory records as JSON lines (``?type=`` filters)."""
    kind = request.query.get("type")
    if kind is not None and kind not in _RECORD_TYPES:
        return _error(400, f"type must be one of {sorted(_RECORD_TYPES)}", "type")
    text = request.app[ENGINE_KEY].ground_truth.to_jsonl(kind)
    return web.Response(text=text, content_type="application/x-ndjson")


async def reset(request: web.Request) -> web.Response:
    """``POST /sim/reset``: drop the records (``?prefix_cache=1``: the cache too)."""
    engine = request.app[ENGINE_KEY]
    engine.ground_truth.clear()
    if request.query.get("prefix_cache") in ("1", "true"):
        engine.clear_prefix_cache()
    return web.Response(status=204)


async def state(request: web.Request) -> web.Response:
    """``GET /sim/state``: the profile and the batch right now."""
    engine = request.app[ENGINE_KEY]
    profile = engine.profile
    return web.json_response(
        {
            "profile": profile.name,
            "model": profile.model,
            "cost": asdict(profile.cost),
            "output_tokens": profile.output_tokens,
            "reasoning_tokens": profile.reasoning_tokens,
            "prefix_cache": engine.config.prefix_cache,
            "techniques": profile.techniques.to_mapping(),
            "num_waiting": engine.num_waiting,
            "num_running": engine.num_running,
            "num_decoding": engine.num_decoding,
        },
        dumps=dumps,
    )


def create_app(engine: Engine | EngineConfig | Profile) -> web.Application:
    """The simulator's aiohttp application; it starts and closes the engine with the app."""
    if isinstance(engine, Profile):
        engine = EngineConfig(engine)
    if isinstance(engine, EngineConfig):
        engine = Engine(engine)
    app = web.Application(client_max_size=16 * 1024 * 1024)
    app[ENGINE_KEY] = engine

    async def engine_ctx(app: web.Application) -> AsyncIterator[None]:
        await app[ENGINE_KEY].start()
        yield
        await app[ENGINE_KEY].close()

    app.cleanup_ctx.append(engine_ctx)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/sim/ground_truth", ground_truth)
    app.router.add_post("/sim/reset", reset)
    app.router.add_get("/sim/state", state)
    return app

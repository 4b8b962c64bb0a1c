"""The proxy's HTTP application: forward everything, time the token streams.

``exchange`` forwards one request, whichever side read it: the proxy
listener's own connections (``proxy.edge.front``) or aiohttp's server
(``handle``, the application ``create_app`` wires for one upstream). Every
method and path is forwarded; the routes of ``proxy.core.decoders.registry``
(OpenAI chat and completions, Anthropic Messages, OpenAI Responses, Ollama,
TGI and llama.cpp native) are also observed, when the response's content
type is the format's framing or JSON (anything else is relayed untouched and
counted as unobserved). Bytes go to the client as they are read, unchanged;
the stamp is taken right after each read, before the bytes are written or
looked at (``proxy.core.timing`` explains what shares a stamp).

Errors are mapped in a fixed order, most specific first. Before the response
starts: upstream timeout 504, any other upstream failure 502, both with a
short JSON body. After it started the status is gone: the client connection is
cut (no clean end of stream) and the outcome recorded. ``CancelledError`` is
always re-raised; the ``finally`` always records the request once.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Handler
from multidict import CIMultiDict

from proxy.config import ProxyConfig
from proxy.core.backend_view import BackendView
from proxy.core.decoders.registry import Decoding, Format, choose, route
from proxy.core.labels import ModelLabeler
from proxy.core.prompt_size import estimate_prompt_tokens
from proxy.core.records import Backend, Outcome, RequestLabels, Sink
from proxy.core.timing import StreamTimer, StreamWatcher, gap_targets
from proxy.core.usage import inject, wants_injection
from proxy.edge.budget import BodyBudget, default_budget
from proxy.edge.headers import Headers, client_response_headers, upstream_request_headers
from proxy.edge.inbound import AiohttpInbound, Inbound, Refused, json_error
from proxy.edge.pool import UpstreamPool, request_head
from proxy.edge.relay import (
    BodyRelay,
    JsonRelay,
    NdjsonRelay,
    RelayResult,
    SseRelay,
    by_status,
    stream_failed,
)
from proxy.edge.state import STATE, ProxyState
from proxy.edge.unobserved import Progress, forward_unobserved, no_answer, no_answer_in_time
from proxy.edge.upstream import UpstreamConnection
from proxy.edge.upstream_errors import DisconnectedBeforeHead, ResetBeforeHead, UpstreamError
from proxy.edge.watchdog import Watchdogs

if TYPE_CHECKING:
    from proxy.edge.tracing import Tracing

log = logging.getLogger("tokenstamp.proxy")

NO_USAGE_INJECTION = frozenset({"llama.cpp"})
"""Providers whose usage chunk carries more than usage (llama.cpp: its timings)."""


async def _read_body(client: Inbound, limit: int, timeout_s: float) -> bytes:
    """The request body: 413 as soon as it passes ``limit`` bytes, 408 past ``timeout_s``."""
    try:
        async with asyncio.timeout(timeout_s):
            return await client.read_body(limit)
    except TimeoutError:
        raise Refused(408, "body_timeout", f"request body not received within {timeout_s:g} s "
                      "(--body-timeout)") from None  # fmt: skip


def request_id(headers: Headers) -> str:
    """The client's ``X-Request-Id`` when it is a sane token, else a fresh random id.

    Used in logs and spans (so an operator can find the culprit a client knows),
    never as a metric label.
    """
    given = headers.get("X-Request-Id", "")
    if 0 < len(given) <= 128 and given.isascii() and given.isprintable() and " " not in given:
        return given
    return uuid.uuid4().hex


def _start_timer(
    client: Inbound, state: ProxyState, fmt: Format, body: dict[str, object] | None
) -> StreamTimer:
    model = None if body is None else fmt.request_model(body)
    labels = RequestLabels(fmt.operation.value, state.labeler.label(model), state.backend)
    request_model = model if isinstance(model, str) else ""
    clock = state.clock
    if state.tracing is not None:
        return state.tracing.start_timer(
            request_id(client.headers),
            labels,
            arrival_ns=clock(),
            start_unix_ns=time.time_ns(),
            sink=state.sink,
            watcher=state.watcher,
            request_model=request_model,
            headers=client.headers,
            body=body,
            watcher_gaps=state.watcher_gaps,
        )
    return StreamTimer(
        request_id(client.headers),
        labels,
        arrival_ns=clock(),
        start_unix_ns=time.time_ns(),
        sink=state.sink,
        watcher=state.watcher,
        request_model=request_model,
        watcher_gaps=state.watcher_gaps,
    )


async def handle(request: web.Request) -> web.StreamResponse:
    """aiohttp's handler: forward one request (``exchange``)."""
    state = request.app[STATE]
    client = AiohttpInbound(request, state.body_budget)
    await exchange(client, state)
    assert client.response is not None, "an exchange always answers"
    return client.response


async def exchange(client: Inbound, state: ProxyState) -> None:
    """Forward one request; observe it when it is a completion call.

    On return the client has its answer: a relayed response, or an error of
    ours (``client.refuse``). Memory per open stream is the point of a few
    choices here: no closure, one coroutine less for an observed request, and
    neither the parsed body nor the body bytes kept by this frame while the
    stream runs (a long prompt is hundreds of KiB, held for the whole stream
    otherwise).
    """
    cfg = state.config
    clock = state.clock
    fmt = route(client.method, client.path)
    state.in_flight += 1
    timer: StreamTimer | None = None
    progress = Progress()
    outcome, error_type = Outcome.OK, ""

    try:
        try:
            body = await _read_body(client, cfg.max_body_bytes, cfg.body_timeout_s)
        except Refused as exc:
            if fmt is not None:
                timer = _start_timer(client, state, fmt, None)
            outcome, progress.status, error_type = Outcome.REJECTED, exc.status, exc.error_type
            client.refuse(exc.status, exc.error_type, str(exc), exc.retry_after_s)
            return
        upstream_body, injected = body, False
        if fmt is not None:
            parsed = _parse_json_object(body)
            if parsed is None:
                state.sink.unobserved(state.backend, "body_not_json")
            else:
                timer = _start_timer(client, state, fmt, parsed)
                if state.stalls is not None:
                    state.stalls.describe(
                        timer.request_id,
                        timer.labels,
                        prompt_tokens_hint=estimate_prompt_tokens(parsed),
                        streamed=fmt.streams(parsed),
                    )
                if fmt.injects_usage and state.inject_usage and wants_injection(parsed):
                    new_body = inject(body)
                    if new_body is not None:
                        upstream_body, injected = new_body, True
                    del new_body
            parsed = None
        if timer is not None and fmt is not None and state.pool is not None:
            forward = _forward_observed(
                client, state, fmt, upstream_body, timer, injected, body, progress
            )
        else:
            forward = forward_unobserved(client, state, upstream_body, progress)
        body = upstream_body = b""  # the coroutine holds them as long as it needs them
        result = await forward
        outcome, progress.status, error_type = result.outcome, result.status, result.error_type
    except asyncio.CancelledError:
        outcome = Outcome.CLIENT_DISCONNECT if client.gone() else Outcome.UPSTREAM_ERROR
        error_type = "client_disconnect" if outcome is Outcome.CLIENT_DISCONNECT else "cancelled"
        raise
    finally:
        state.in_flight -= 1
        client.release_body()
        if timer is not None:
            try:
                timer.finish(clock(), outcome, progress.status, error_type)
            except Exception:  # telemetry never breaks traffic
                log.exception("recording request failed")


def _parse_json_object(body: bytes) -> dict[str, object] | None:
    try:
        obj = json.loads(body)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


async def _forward_observed(
    client: Inbound,
    state: ProxyState,
    fmt: Format,
    body: bytes,
    timer: StreamTimer,
    injected: bool,
    original_body: bytes,
    progress: Progress,
) -> RelayResult:
    """An observed request: sent on the proxy's own upstream client, its body relayed and
    observed read by read inside the upstream connection's callbacks (``proxy.edge.relay``)."""
    cfg = state.config
    headers = upstream_request_headers(
        client.headers,
        client_ip=client.remote,
        scheme=client.scheme,
        identity=True,
        trust=cfg.trust_forwarded,
    )
    client.forget_headers()  # copied into ``headers``: not kept while the body streams
    started = False
    conn: UpstreamConnection | None = None
    clean = False
    try:
        conn = await _send_observed(state, client, headers, body, timer)
        if injected and conn.status in (400, 422):
            # The backend may not know stream_options: ask again exactly as the client did.
            await conn.discard_body()
            refused = conn.status
            _release(state, conn)
            conn = await _send_observed(state, client, headers, original_body, timer)
            if conn.status < 400:
                state.inject_usage = False
                log.warning(
                    "upstream refused stream_options.include_usage (status %d); "
                    "usage injection is now off for this backend",
                    refused,
                )
            injected = False
        del body, original_body, headers  # not sent again: not kept while the body streams
        client.release_body()
        up_headers = conn.headers
        content_type = up_headers.get("Content-Type", "")
        is_sse = content_type.startswith("text/event-stream")
        encoded = up_headers.get("Content-Encoding", "identity").lower() != "identity"
        decoding = choose(fmt, content_type)
        if encoded:
            state.sink.unobserved(state.backend, "encoded_response")
        elif decoding is None:
            state.sink.unobserved(state.backend, "content_type")
        out_headers = client_response_headers(up_headers, keep_length=not (is_sse and injected))
        del up_headers
        conn.forget_headers()  # copied into ``out_headers``: not kept while the body streams
        if is_sse or decoding is Decoding.NDJSON:
            out_headers["X-Accel-Buffering"] = "no"
        status = conn.status
        await client.start(status, conn.reason, out_headers)
        del out_headers
        started = True
        progress.status = status
        transport = client.transport
        if transport is None or transport.is_closing():
            return _client_left(status)
        chunked = client.chunked
        capture = state.tracing.capture_buffer(timer) if state.tracing is not None else None
        relay: BodyRelay
        if encoded or decoding is None:
            relay = BodyRelay(conn, transport, chunked=chunked, capture=capture)
        elif decoding is Decoding.SSE:
            timer.streamed = True
            relay = SseRelay(conn, transport, timer, state, fmt, chunked=chunked,
                             strip_usage=injected, capture=capture)  # fmt: skip
        elif decoding is Decoding.NDJSON:
            timer.streamed = True
            relay = NdjsonRelay(conn, transport, timer, state, fmt, chunked=chunked,
                                capture=capture)  # fmt: skip
        else:
            relay = JsonRelay(conn, transport, timer, state, fmt, chunked=chunked, capture=capture)
        del transport
        # A body is cut (outcome timeout) after --max-stream-duration, or by the
        # watchdog once it falls silent.
        limit = cfg.max_stream_duration_s or None
        async with asyncio.timeout(limit) as deadline, state.watchdogs.watch(relay, deadline):
            complete = await relay.run(client)
        if not complete:
            return _client_left(status)
        if timer.stream_error and (decoding is not Decoding.JSON or status < 400):
            result = stream_failed(status, timer, state)
        else:
            result = by_status(status)
        try:
            await client.end()
        except ConnectionError:
            return _client_left(status)
        clean = True
        return result
    except TimeoutError:
        if not started:
            return no_answer_in_time(client, cfg.read_timeout_s)
        client.abort()
        return RelayResult(Outcome.TIMEOUT, progress.status, "timeout")
    except UpstreamError as exc:
        if not started:
            return no_answer(client, cfg.backend_label, exc.kind)
        client.abort()
        return RelayResult(Outcome.UPSTREAM_ERROR, progress.status, exc.kind)
    finally:
        # A response not read to its end must not go back to the pool: close it,
        # which also tells the backend to stop generating.
        if conn is not None:
            if clean:
                _release(state, conn)
            else:
                conn.detach()
                conn.close()


def _client_left(status: int) -> RelayResult:
    return RelayResult(Outcome.CLIENT_DISCONNECT, status, "client_disconnect", complete=False)


def _release(state: ProxyState, conn: UpstreamConnection) -> None:
    conn.detach()
    if state.pool is not None:
        state.pool.release(conn)
    else:
        conn.close()


async def _send_observed(
    state: ProxyState,
    client: Inbound,
    headers: CIMultiDict[str],
    body: bytes,
    timer: StreamTimer,
) -> UpstreamConnection:
    """Send an observed request and wait for the response head (at most --read-timeout)."""
    pool = state.pool
    assert pool is not None
    if state.tracing is not None:
        state.tracing.inject(timer, headers)  # the proxy's span becomes the upstream's parent
    target = pool.path_prefix + client.target
    head = request_head(client.method, target, pool.host_header, headers, len(body))
    conn = await pool.acquire()
    for attempt in (0, 1):
        pooled = conn.idle_since > 0
        # Stamped as the request is handed to the connection: on a pooled
        # keep-alive connection the bytes leave within microseconds.
        timer.forwarded(state.clock())
        try:
            async with asyncio.timeout(state.config.read_timeout_s):
                await conn.send(head, body, client.interim)
        except (DisconnectedBeforeHead, ResetBeforeHead) as exc:
            conn.close()
            # A pooled keep-alive connection the backend had already closed (llama.cpp
            # closes after every stream while announcing keep-alive): the request never
            # got an answer, so it goes once more, on a fresh connection.
            if attempt or not (pooled or isinstance(exc, DisconnectedBeforeHead)):
                raise
            log.debug("upstream closed a connection before answering; retrying once")
            conn = await pool.connect()
            continue
        except BaseException:
            conn.close()
            raise
        return conn
    raise AssertionError("unreachable")


TUNNEL_ALLOW = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
"""What a refused ``CONNECT`` is told the proxy forwards (``Allow``)."""


@web.middleware
async def _no_tunnels(request: web.Request, handler: Handler) -> web.StreamResponse:
    """``CONNECT`` is refused with 405: the proxy forwards requests, it opens no tunnels
    (RFC 9110 section 9.3.6). Before routing, which would answer 404 to its target."""
    if request.method == "CONNECT":
        resp = json_error(405, "method_not_allowed", "the proxy forwards HTTP requests; it "
                          "opens no tunnels (CONNECT)")  # fmt: skip
        resp.headers["Allow"] = TUNNEL_ALLOW
        resp.force_close()  # what follows a CONNECT would be the tunnel's bytes
        return resp
    return await handler(request)


def create_app(
    config: ProxyConfig,
    *,
    sink: Sink,
    clock: Callable[[], int] = time.monotonic_ns,
    watcher: StreamWatcher | None = None,
    stalls: BackendView | None = None,
    tracing: Tracing | None = None,
) -> web.Application:
    """The proxy application for one upstream; the session opens and closes with it.

    ``tracing`` (built on an injected tracer provider) adds a span per observed
    request and propagates W3C trace context upstream; without it, none.
    """
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[_no_tunnels])
    state = ProxyState(
        config=config,
        sink=sink,
        clock=clock,
        backend=Backend(provider=config.provider, address=config.backend_label),
        labeler=ModelLabeler(config.model_label_limit, config.model_allowlist),
        watchdogs=Watchdogs(config.read_timeout_s),
        body_budget=BodyBudget(config.body_budget_bytes or default_budget(config.max_body_bytes)),
        watcher=watcher,
        watcher_gaps=gap_targets(watcher),
        stalls=stalls,
        tracing=tracing,
        # llama.cpp moves its `timings` into the usage chunk it is asked for, so
        # hiding that chunk would hide them: no injection there.
        inject_usage=config.inject_usage and config.provider not in NO_USAGE_INJECTION,
    )
    app[STATE] = state

    async def session_ctx(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=config.connect_timeout_s, sock_read=config.read_timeout_s
        )
        connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=60)
        state.session = aiohttp.ClientSession(
            timeout=timeout, connector=connector, auto_decompress=False, trust_env=False
        )
        state.pool = UpstreamPool(
            config.upstream, connect_timeout_s=config.connect_timeout_s, clock=clock
        )
        yield
        await state.tasks.cancel_all()
        state.pool.close()
        await state.session.close()

    app.cleanup_ctx.append(session_ctx)

    async def close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
        if state.draining:  # tell kept-alive clients to move on before the drain ends
            response.force_close()
            # The hook runs after the headers were computed: say it explicitly.
            response.headers["Connection"] = "close"

    app.on_response_prepare.append(close_when_draining)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app

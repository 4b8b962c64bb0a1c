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
import logging
import random
import time
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Handler

from proxy.config import ProxyConfig
from proxy.core.backend_view import BackendView
from proxy.core.body_json import parse_object
from proxy.core.decoders.registry import Format, route
from proxy.core.labels import ModelLabeler, TenantLabeler
from proxy.core.prompt_size import estimate_prompt_tokens
from proxy.core.records import Backend, Outcome, RequestLabels, Sink
from proxy.core.timing import StreamTimer, StreamWatcher, gap_targets
from proxy.core.usage import inject, wants_injection
from proxy.edge.budget import BodyBudget, default_budget
from proxy.edge.forward import Progress, forward
from proxy.edge.headers import Headers
from proxy.edge.inbound import AiohttpInbound, Inbound, Refused, json_error
from proxy.edge.pool import UpstreamPool
from proxy.edge.request_head import unknown_coding, valid_host
from proxy.edge.state import STATE, ProxyState
from proxy.edge.tenancy import request_slo, tenant_of
from proxy.edge.watchdog import Watchdogs

if TYPE_CHECKING:
    from proxy.edge.tracing import Tracing

log = logging.getLogger("tokenstamp.proxy")

NO_USAGE_INJECTION = frozenset({"llama.cpp"})
"""Providers whose usage chunk carries more than usage (llama.cpp: its timings)."""


async def _read_body(client: Inbound, limit: int, timeout_s: float) -> bytes:
    """The request body still to come: 413 as soon as it passes ``limit`` bytes, 408 past
    ``timeout_s`` (a body that arrived with its head, the usual one, is ``body_now``'s)."""
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
    # 128 random bits, as a UUID4's hex has: an id to find a request by, not a secret, so
    # from the seeded generator (os.urandom is a getrandom() system call per request).
    return f"{random.getrandbits(128):032x}"


def _start_timer(
    client: Inbound, state: ProxyState, fmt: Format, body: dict[str, object] | None
) -> StreamTimer:
    model = None if body is None else fmt.request_model(body)
    headers = client.headers
    tenant = tenant_of(headers, state.config, state.tenants)
    labels = RequestLabels(fmt.operation.value, state.labeler.label(model), state.backend, tenant)
    request_model = model if isinstance(model, str) else ""
    timer = _new_timer(client, state, labels, request_model, body)
    timer.slo_ttft_s, timer.slo_tpot_s = request_slo(headers, state.config)
    return timer


def _new_timer(
    client: Inbound,
    state: ProxyState,
    labels: RequestLabels,
    request_model: str,
    body: dict[str, object] | None,
) -> StreamTimer:
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
    if fmt is not None and not cfg.observe:
        state.sink.unobserved(state.backend, "observation_off")  # --observe false
        fmt = None
    state.in_flight += 1
    timer: StreamTimer | None = None
    progress = Progress()
    outcome, error_type = Outcome.OK, ""

    try:
        try:
            body = client.body_now(cfg.max_body_bytes)
            if body is None:
                body = await _read_body(client, cfg.max_body_bytes, cfg.body_timeout_s)
        except Refused as exc:
            if fmt is not None:
                timer = _start_timer(client, state, fmt, None)
            outcome, progress.status, error_type = Outcome.REJECTED, exc.status, exc.error_type
            client.refuse(exc.status, exc.error_type, str(exc), exc.retry_after_s)
            return
        upstream_body, injected = body, False
        if fmt is not None:
            parsed = parse_object(body)
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
        if timer is not None:
            sending = forward(client, state, upstream_body, progress, fmt, timer, injected, body)
        else:
            sending = forward(client, state, upstream_body, progress)
        body = upstream_body = b""  # the coroutine holds them as long as it needs them
        result = await sending
        outcome, progress.status, error_type = result.outcome, result.status, result.error_type
    except asyncio.CancelledError:
        if timer is not None and timer.terminal_seen and client.gone():
            # It left after the stream's terminal event: it had the whole answer.
            outcome, error_type = Outcome.OK, ""
        else:
            outcome = Outcome.CLIENT_DISCONNECT if client.gone() else Outcome.UPSTREAM_ERROR
            error_type = "client_disconnect" if client.gone() else "cancelled"
        raise
    finally:
        state.in_flight -= 1
        client.release_body()
        if timer is not None:
            try:
                timer.finish(clock(), outcome, progress.status, error_type)
            except Exception:  # telemetry never breaks traffic
                log.exception("recording request failed")


TUNNEL_ALLOW = "GET, HEAD, POST, PUT, PATCH, DELETE, OPTIONS"
"""What a refused ``CONNECT`` is told the proxy forwards (``Allow``)."""


@web.middleware
async def _refusals(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What the proxy refuses of any request aiohttp's server parsed, before routing (which
    would answer 404 to a ``CONNECT`` target): ``CONNECT`` (405: the proxy forwards
    requests, it opens no tunnels; RFC 9110 section 9.3.6), a transfer coding other than
    chunked (501: RFC 9112 section 6.1; it would go upstream still encoded and unnamed),
    a ``Host`` that is not a host (400: RFC 9112 section 3.2)."""
    if request.method == "CONNECT":
        resp = json_error(405, "method_not_allowed", "the proxy forwards HTTP requests; it "
                          "opens no tunnels (CONNECT)")  # fmt: skip
        resp.headers["Allow"] = TUNNEL_ALLOW
    elif unknown_coding(",".join(request.headers.getall("Transfer-Encoding", ()))):
        resp = json_error(501, "transfer_coding", "the proxy decodes no transfer coding but "
                          "chunked")  # fmt: skip
    elif not valid_host(request.headers.get("Host", "")):
        resp = json_error(400, "invalid_host", "the Host header is not a host[:port]")
    else:
        return await handler(request)
    resp.force_close()  # what follows may be a tunnel's bytes, or an unread body
    return resp


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
    app = web.Application(client_max_size=config.max_body_bytes, middlewares=[_refusals])
    state = ProxyState(
        config=config,
        sink=sink,
        clock=clock,
        backend=Backend(provider=config.provider, address=config.backend_label),
        labeler=ModelLabeler(config.model_label_limit, config.model_allowlist),
        tenants=(
            TenantLabeler(config.max_tenants, config.tenant_allowlist)
            if config.tenant_headers
            else None
        ),
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

    async def pool_ctx(app: web.Application) -> AsyncIterator[None]:
        state.pool = UpstreamPool(
            config.upstream, connect_timeout_s=config.connect_timeout_s, clock=clock
        )
        yield
        await state.tasks.cancel_all()
        state.pool.close()

    app.cleanup_ctx.append(pool_ctx)

    async def close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
        if state.draining:  # tell kept-alive clients to move on before the drain ends
            response.force_close()
            # The hook runs after the headers were computed: say it explicitly.
            response.headers["Connection"] = "close"

    app.on_response_prepare.append(close_when_draining)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app

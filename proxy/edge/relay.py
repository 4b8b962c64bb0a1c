"""Relaying an upstream response body to the client: plain, timed SSE or NDJSON, timed JSON.

The hot path. Per read: stamp, write, then look (with usage stripping on, the
read is split at event boundaries before writing: see ``proxy.core.usage``).
``resp.write`` waits when the client's socket buffer is full, so a slow client
slows the upstream read of its own stream only, and memory stays bounded.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import aiohttp
from aiohttp import web

from proxy.core.decoders.ndjson import NdjsonDecoder
from proxy.core.decoders.openai import OUTPUT, ChunkInfo
from proxy.core.decoders.registry import OPENAI_CHAT, Format, interpret_json_body
from proxy.core.decoders.sse import SseDecoder
from proxy.core.records import Outcome
from proxy.core.timing import StreamTimer
from proxy.core.usage import EventCutter

if TYPE_CHECKING:
    from proxy.edge.state import ProxyState


log = logging.getLogger("tokenstamp.proxy")


@dataclass(frozen=True, slots=True)
class RelayResult:
    """How relaying a response ended."""

    response: web.StreamResponse
    """What the handler returns to aiohttp."""
    outcome: Outcome
    """Outcome to record."""
    status: int
    """Status sent to the client."""
    error_type: str = ""
    """Failure class, empty on success."""
    complete: bool = True
    """The body was relayed to its end (so the response may end cleanly)."""


def _disconnected(resp: web.StreamResponse) -> RelayResult:
    return RelayResult(
        resp, Outcome.CLIENT_DISCONNECT, resp.status, "client_disconnect", complete=False
    )


async def relay_plain(
    up: aiohttp.ClientResponse, resp: web.StreamResponse, *, judge_status: bool = False
) -> RelayResult:
    """Copy the body unchanged, read by read (``judge_status``: a 5xx is an upstream error)."""
    content = up.content
    while True:
        chunk = await content.readany()
        if not chunk:
            return _by_status(resp) if judge_status else RelayResult(resp, Outcome.OK, resp.status)
        try:
            await resp.write(chunk)
        except ConnectionError:
            return _disconnected(resp)


async def relay_sse(
    up: aiohttp.ClientResponse,
    resp: web.StreamResponse,
    timer: StreamTimer,
    state: ProxyState,
    *,
    strip_usage: bool,
    fmt: Format = OPENAI_CHAT,
) -> RelayResult:
    """Copy an event stream unchanged while timing every output event of ``fmt``."""
    interpret = fmt.interpret
    clock = state.clock
    sink = state.sink
    backend = state.backend
    decoder = SseDecoder(state.config.max_event_bytes)
    cutter = EventCutter() if strip_usage else None
    content = up.content
    oversized = 0
    while True:
        chunk = await content.readany()
        now_ns = clock()
        if not chunk:
            break
        if cutter is None:
            try:
                await resp.write(chunk)
            except ConnectionError:
                return _disconnected(resp)
            events = decoder.feed(chunk)
            known = bool(timer.response_id or timer.response_model)
            infos: list[ChunkInfo | None] = [
                interpret(ev.data, ev.event, known_ids=known) for ev in events
            ]
        else:
            events = decoder.feed(chunk)
            infos = []
            known = bool(timer.response_id or timer.response_model)
            for ev in events:
                info = interpret(ev.data, ev.event, known_ids=known)
                infos.append(info)
                if info is not None and info.usage_only:
                    if '"timings"' in ev.data:
                        # The backend moved more than usage into the chunk we asked
                        # for (llama.cpp): hiding it would hide that too. Let it
                        # through, and stop asking this backend.
                        if state.inject_usage:
                            state.inject_usage = False
                            log.warning(
                                "upstream put timings into the usage chunk; usage "
                                "injection is now off for this backend"
                            )
                    else:
                        cutter.cut(ev.start_offset, ev.end_offset, ev.open_cr)
            out = cutter.push(chunk, decoder.boundary_offset)
            if out:
                try:
                    await resp.write(out)
                except ConnectionError:
                    return _disconnected(resp)
        for info in infos:
            if info is OUTPUT:
                timer.output(now_ns)
            elif info is None:
                sink.decoder_error(backend, "invalid_json")
            else:
                timer.chunk(info, now_ns)
        if decoder.errors != oversized:
            for _ in range(decoder.errors - oversized):
                sink.decoder_error(backend, "oversized_event")
            oversized = decoder.errors
    if cutter is not None:
        rest = cutter.flush()
        if rest:
            try:
                await resp.write(rest)
            except ConnectionError:
                return _disconnected(resp)
    if timer.stream_error:
        return _stream_failed(resp, timer, state)
    return _by_status(resp)


async def relay_ndjson(
    up: aiohttp.ClientResponse,
    resp: web.StreamResponse,
    timer: StreamTimer,
    state: ProxyState,
    fmt: Format,
) -> RelayResult:
    """Copy a newline-delimited JSON stream unchanged while timing every output event."""
    interpret = fmt.interpret
    clock = state.clock
    sink = state.sink
    backend = state.backend
    decoder = NdjsonDecoder(state.config.max_event_bytes)
    content = up.content
    oversized = 0
    while True:
        chunk = await content.readany()
        now_ns = clock()
        if chunk:
            try:
                await resp.write(chunk)
            except ConnectionError:
                return _disconnected(resp)
            lines = decoder.feed(chunk)
        else:
            lines = decoder.close()  # the last line may lack its LF
        known = bool(timer.response_id or timer.response_model)
        for line in lines:
            info = interpret(line.text, "", known_ids=known)
            if info is OUTPUT:
                timer.output(now_ns)
            elif info is None:
                sink.decoder_error(backend, "invalid_json")
            else:
                timer.chunk(info, now_ns)
        if decoder.errors != oversized:
            for _ in range(decoder.errors - oversized):
                sink.decoder_error(backend, "oversized_event")
            oversized = decoder.errors
        if not chunk:
            break
    if timer.stream_error:
        return _stream_failed(resp, timer, state)
    return _by_status(resp)


async def relay_json(
    up: aiohttp.ClientResponse,
    resp: web.StreamResponse,
    timer: StreamTimer,
    state: ProxyState,
    fmt: Format = OPENAI_CHAT,
) -> RelayResult:
    """Copy a non-streaming body unchanged; read usage from it at the end.

    A copy of at most ``max_event_bytes`` is kept for parsing; a larger body
    is relayed all the same and counted as undecodable.
    """
    limit = state.config.max_event_bytes
    content = up.content
    copy = bytearray()
    too_big = False
    while True:
        chunk = await content.readany()
        if not chunk:
            break
        try:
            await resp.write(chunk)
        except ConnectionError:
            return _disconnected(resp)
        if not too_big:
            if len(copy) + len(chunk) > limit:
                too_big = True
                copy.clear()
            else:
                copy += chunk
    now_ns = state.clock()
    if too_big:
        state.sink.decoder_error(state.backend, "oversized_event")
    elif copy:
        info = interpret_json_body(fmt, bytes(copy))
        if info is None:
            state.sink.decoder_error(state.backend, "invalid_json")
        else:
            # Not a stream: no first token to see, only what the body reports.
            timer.chunk(replace(info, output=False), now_ns)
    if timer.stream_error and resp.status < 400:
        return _stream_failed(resp, timer, state)
    return _by_status(resp)


def _stream_failed(resp: web.StreamResponse, timer: StreamTimer, state: ProxyState) -> RelayResult:
    """The upstream reported an error inside its body: its type, bounded in number."""
    kind = state.error_kinds.label(timer.stream_error)
    return RelayResult(resp, Outcome.UPSTREAM_ERROR, resp.status, kind)


def _by_status(resp: web.StreamResponse) -> RelayResult:
    """A relayed response is the upstream's error when its status says so."""
    status = resp.status
    if status >= 500:
        return RelayResult(resp, Outcome.UPSTREAM_ERROR, status, str(status))
    if status >= 400:
        return RelayResult(resp, Outcome.OK, status, str(status))
    return RelayResult(resp, Outcome.OK, status)
